"""How a sequence ends: the reasons (`FinishReason`) and the one decision a token makes
(`finish_of`), which the continuous batch, the speculative batch, the solo runner and a
distributed follower's batch all call.

A reason is a ``str`` as well: the metrics' ``finish_reason`` label, the request log's
``finish=`` and every comparison with "stop" / "length" / "cancelled" see the same words
as before. An error is no finish reason: a request that fails ends with its error.
"""

from __future__ import annotations

from collections.abc import Container
from enum import Enum


class FinishReason(str, Enum):
    """Why a request ended (OpenAI's words, as llama.cpp and vLLM use them)."""

    STOP = "stop"  # EOS, or a stop string matched
    LENGTH = "length"  # its max_tokens-th token, or the generator ran out
    CANCELLED = "cancelled"  # the client went away or stopped reading

    def __str__(self) -> str:
        return self.value

    # The value's hash (equal to "stop"'s), as on every Python the project supports.
    __hash__ = str.__hash__


def finish_of(
    token: int, emitted: int, max_tokens: int, *, stops: bool, eos: Container[int]
) -> FinishReason | None:
    """How ``token``, a sequence's ``emitted``-th generated token, ends it: STOP when it is
    an EOS id and EOS ends this sequence (``stops``: `engine.sequences.stops_at_eos`),
    else LENGTH when it is the ``max_tokens``-th, else None (it goes on)."""
    if stops and token in eos:
        return FinishReason.STOP
    if emitted >= max_tokens:
        return FinishReason.LENGTH
    return None


def settled(reason: FinishReason, stop_matched: bool) -> FinishReason:
    """The reason a request reports: STOP once one of its stop strings matched (also when
    the final flush completed it), else the reason its sequence ended with."""
    return FinishReason.STOP if stop_matched else reason
