"""The interface the scheduler steps every kind of running sequence through.

A runner holds the sequences of one kind (the continuous batch, solo runs, image prompts
being prefilled: `engine.sequences`, `engine.vision`) and answers the same calls, so the
scheduler never asks which kind a job is (TGI's `Batch` interface over its batch kinds is
the model). `Runner` is what every kind answers; `Batch` adds what the continuous batch
also does (take sequences prefilled elsewhere, tell which requests it can hold). Both are
`typing.Protocol`s: a kind matches by its methods, no base class.

All of it runs on the engine thread.
"""

from __future__ import annotations

import collections.abc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from decoding.finish import FinishReason
from engine.jobs import KV, Handover
from engine.sequence import Sequence, SequenceRunner

if TYPE_CHECKING:
    import mlx.core as mx

    from engine.step_budget import PrefillBudget
    from params import GenerationParams
    from prompt_cache import CacheLookup

    Sampler = Callable[[mx.array], mx.array]
    LogitsProcessor = Callable[[mx.array, mx.array], mx.array]

__all__ = ["KV", "Batch", "Handover", "Runner", "Token"]


class Token(Protocol):
    """One decoded token of one sequence, as a runner reports it (`engine.sequences.Token`).

    ``token`` None: the sequence ended without one. ``finish``: the runner ended it
    (STOP, LENGTH); ``kv``: (cache, tokens) when it handed the KV over as it ended;
    ``drafted``: the token came from an accepted draft; ``error``: the runner failed this
    sequence alone (a `BackendError` its request ends with); ``delivered``: a queued
    token (``pending``) already returned as its row left prefill."""

    @property
    def uid(self) -> int: ...
    @property
    def token(self) -> int | None: ...
    @property
    def logprobs(self) -> Any: ...
    @property
    def finish(self) -> FinishReason | None: ...
    @property
    def kv(self) -> Any: ...
    @property
    def drafted(self) -> bool: ...
    @property
    def error(self) -> Any: ...
    @property
    def delivered(self) -> bool: ...


class Runner(SequenceRunner, Protocol):
    """Sequences of one kind, stepped together by the scheduler (module doc); with
    `SequenceRunner`'s ``drafts``, ``release``, ``drop`` and ``proposed``."""

    @property
    def rows(self) -> int:
        """Sequences it holds now."""
        ...

    @property
    def nbytes(self) -> int:
        """KV bytes of its sequences."""
        ...

    def start(
        self,
        job: Sequence,
        ids: list[int],
        lookup: CacheLookup,
        sampler: Sampler,
        processors: list[LogitsProcessor],
        diverges: int,
    ) -> int:
        """Start an admitted ``job`` on prompt ``ids`` from the prompt cache's ``lookup``;
        ``diverges``: where its prompt leaves the longest cached one (checkpoints).
        Returns its uid, unique among the runners."""
        ...

    def step(self, jobs: dict[int, Sequence]) -> collections.abc.Sequence[Token]:
        """One step of every sequence (``jobs``: the scheduler's active set, by uid)."""
        ...

    def mirror_step(self) -> dict[int, Handover]:
        """A distributed follower's step: the same decode, no output; the sequences it
        ended itself, by uid."""
        ...

    def reset(self) -> None:
        """Drop every sequence: fresh and empty (after a failed step)."""
        ...

    def close(self) -> None:
        """Drop every sequence for good (the model is being unloaded)."""
        ...


class Batch(Runner, Protocol):
    """The continuous batch: a `Runner` that also adopts sequences prefilled elsewhere."""

    budget: PrefillBudget  # how much prefill one step may do

    def holds(self, params: GenerationParams) -> bool:
        """Whether a request with ``params`` decodes in this batch (else: solo)."""
        ...

    def row_cache(self, params: GenerationParams) -> KV | None:
        """A new sequence's empty KV for this batch; None: the batch makes its own."""
        ...

    def adopt(
        self,
        job: Sequence,
        kv: KV,
        tokens: list[int],
        last: int,
        sampler: Sampler,
        processors: list[LogitsProcessor],
    ) -> int:
        """Add a sequence prefilled elsewhere: ``kv`` holds ``tokens``; it decodes from
        ``last``, the prompt's last token. Returns its uid."""
        ...

    def pending(self, job: Sequence) -> Token | None:
        """``job``'s next token, sampled and queued but not returned yet (a preemption
        delivers it first); None while its row prefills."""
        ...

    def share(self, job: Sequence, position: int) -> str:
        """Put the KV of ``job``'s first ``position`` prompt tokens in the prompt cache:
        "stored" (now), "later" (when its prefill gets there: `take_shared`), "" (never)."""
        ...

    def take_shared(self) -> list[tuple[int, int | None]]:
        """(uid, position) stored since the last call; (uid, None): no more from uid."""
        ...
