"""The step plan: the typed values rank 0 sends the other ranks once per engine iteration.

A ``Plan`` is what one iteration of rank 0's engine loop did to its running set, in
order: ``Join`` (a sequence started: its prompt ids, sampling parameters with a concrete
seed, max tokens, how many prompt tokens came from the prompt cache, the logits
processors' initial state), ``Leave`` (a sequence retired, for any reason) and ``Share``
(a running sequence's prefix is stored for requests waiting on it); then
either a ``Call`` (an engine operation that runs the model on every rank: load, free,
score, embed; or ``SHUTDOWN``) or a step. The followers apply it with the same
scheduler methods (``distributed/follower.py``), so every rank runs the same batch.

Like vLLM's ``SchedulerOutput`` / ``EngineCoreRequest``, these small frozen dataclasses
are the only values that cross the process boundary. On the wire (``encode`` /
``decode``) a plan is a header of two integers (payload length, flags: step, idle) and,
when it has ops or a call, the pickled ``(ops, call)``: plans come from our own ranks
only. No MLX here: the coordinator moves the bytes.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

from params import GenerationParams

SHUTDOWN = "shutdown"  # the Call that stops the followers

STEP = 1  # header flag: the followers step after applying the plan
IDLE = 2  # header flag: rank 0 has nothing to do; followers nap before the next sync


@dataclass(frozen=True)
class Join:
    """Rank 0 started sequence ``uid`` on prompt ``ids`` (``cached_tokens`` of them from
    its prompt cache); ``params`` carry a concrete seed, so every rank samples alike."""

    uid: int
    ids: tuple[int, ...]
    params: GenerationParams
    max_tokens: int
    cached_tokens: int
    initial_state: str  # logits processors (reasoning budget) start from it


@dataclass(frozen=True)
class Leave:
    """Rank 0 retired sequence ``uid`` (finished, stopped, cancelled or failed)."""

    uid: int


@dataclass(frozen=True)
class Share:
    """Rank 0 asked sequence ``uid`` for the KV of its first ``position`` prompt tokens,
    for requests sharing them (`engine.sharing`): every rank's batch cuts its prefill
    there, or copies it now, alike."""

    uid: int
    position: int


Op = Join | Leave | Share


@dataclass(frozen=True)
class Call:
    """An engine operation every rank runs: ``op`` (``engine.core`` names, or
    ``SHUTDOWN``) with positional ``args``."""

    op: str
    args: tuple = ()


@dataclass(frozen=True)
class Plan:
    """What rank 0 sends each iteration: ``ops`` to apply in order, then ``call`` or, with
    ``step``, one step of the batch. ``idle``: rank 0 has nothing to do, so the
    followers may nap before the next sync."""

    ops: tuple[Op, ...] = ()
    step: bool = False
    call: Call | None = None
    idle: bool = False


def encode(plan: Plan) -> tuple[bytes, int]:
    """(payload, flags) of ``plan``; the payload is empty when it has no ops and no call."""
    payload = b""
    if plan.ops or plan.call is not None:
        payload = pickle.dumps((plan.ops, plan.call), protocol=pickle.HIGHEST_PROTOCOL)
    return payload, (STEP if plan.step else 0) | (IDLE if plan.idle else 0)


def decode(payload: bytes, flags: int) -> Plan:
    """The plan ``encode`` gave ``payload`` and ``flags`` for (from our own ranks only)."""
    ops: Any = ()
    call = None
    if payload:
        ops, call = pickle.loads(payload)
    return Plan(tuple(ops), bool(flags & STEP), call, bool(flags & IDLE))
