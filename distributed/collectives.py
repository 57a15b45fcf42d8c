"""The group's collectives: what the ranks exchange over MLX, and the group's failure.

``Collectives`` wraps one MLX group. The coordinator sends its step plans through it
(``broadcast_plan``) and the split step of a load (``distributed/sharding.py``) agrees
through it (``agree``, ``broadcast_int``); both use this class, neither imports the
other for it.

A plan is an ``all_sum`` of a header (payload length, flags) and then of the pickled
payload as uint8 (``distributed/plan.py``), as ``mlx_lm.server`` shares requests.
Collectives are issued on mlx-lm's ``generation_stream``, the stream the model's own
collectives run on: ``BatchGenerator`` starts the next step asynchronously, and ops on
one stream run in order, so a plan never overtakes (or interleaves with) a step's
collectives.

A collective that raises (the ring backend raises when a peer's socket closes) marks the
group failed for good (``failed``) and raises ``GroupLost`` (UNAVAILABLE).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generation_stream

from distributed import plan as wire
from distributed.plan import Plan
from errors import ModelLoadError, Unavailable
from seam.arrays import ints, scalar

logger = logging.getLogger("localai.mlx.distributed")
_T = TypeVar("_T")

# What to do once a rank is lost (ends every message that says so).
RESTART = (
    "Restart that rank (`local-ai worker mlx-distributed --hostfile FILE --rank N`, or the "
    "whole `mlx.launch` group); this backend exits so that LocalAI starts it again and it "
    "rejoins at the next LoadModel"
)
_STATUS_BYTES = 1024  # per-rank record of a load agreement: weights (int64), error text


class GroupLost(Unavailable):
    """A rank is gone or hung: the group cannot serve until it is restarted."""


class Collectives:
    """One rank's collectives over the MLX ``group`` (rank 0 is the ``leader``)."""

    def __init__(self, group: mx.distributed.Group) -> None:
        self.group = group
        self.rank, self.size = group.rank(), group.size()
        self.leader = self.rank == 0
        self.failed: str | None = None  # why the group broke; None while healthy

    def check(self) -> None:
        """Raise GroupLost (UNAVAILABLE) once the group has failed."""
        if self.failed:
            raise GroupLost(self.failed)

    def mark_failed(self, reason: str) -> None:
        """The group is broken for good (the first reason is kept)."""
        if not self.failed:
            self.failed = reason
            logger.error("rank %d: %s", self.rank, reason)

    def broadcast_plan(self, plan: Plan | None) -> Plan:
        """Rank 0's ``plan`` on every rank (the others pass None and get it back)."""
        return self._run(self.exchange, plan)

    def broadcast_int(self, value: int) -> int:
        """Rank 0's ``value`` on every rank (the others pass anything)."""
        mine = value if self.leader else 0

        def share() -> int:
            summed = mx.distributed.all_sum(
                mx.array([mine], dtype=mx.int32), group=self.group, stream=generation_stream
            )
            return scalar(summed)

        return self._run(share)

    def agree(self, error: str, weights: int) -> list[tuple[str, int]]:
        """All ranks share (error, weight bytes); raises ModelLoadError if any failed."""
        record = np.zeros(_STATUS_BYTES, dtype=np.uint8)
        text = error.encode("utf-8")[: _STATUS_BYTES - 16]
        record[:8] = np.frombuffer(np.int64(weights).tobytes(), dtype=np.uint8)
        record[8:12] = np.frombuffer(np.uint32(len(text)).tobytes(), dtype=np.uint8)
        record[16 : 16 + len(text)] = np.frombuffer(text, dtype=np.uint8)

        def gather() -> np.ndarray:
            out = mx.distributed.all_gather(
                mx.array(record), group=self.group, stream=generation_stream
            )
            return np.array(out).reshape(self.size, _STATUS_BYTES)

        rows = self._run(gather)
        results = []
        for row in rows:
            length = int(np.frombuffer(row[8:12].tobytes(), dtype=np.uint32)[0])
            text = row[16 : 16 + length].tobytes().decode("utf-8", errors="replace")
            results.append((text, int(np.frombuffer(row[:8].tobytes(), dtype=np.int64)[0])))
        failures = [(r, text) for r, (text, _) in enumerate(results) if text]
        if failures:
            texts = {text for _, text in failures}
            if len(texts) == 1 and len(failures) == self.size:
                message = texts.pop()  # the usual case: the same reason on every rank
            else:
                message = "; ".join(f"rank {r}: {text}" for r, text in failures)
            raise ModelLoadError(message)
        return results

    def exchange(self, plan: Plan | None) -> Plan:
        """``broadcast_plan`` without marking the group failed when it raises (shutdown)."""
        if self.leader:
            assert plan is not None
            payload, flags = wire.encode(plan)
            header = [len(payload), flags]
        else:
            payload, header = b"", [0, 0]
        summed = mx.distributed.all_sum(
            mx.array(header, dtype=mx.int32), group=self.group, stream=generation_stream
        )
        size, flags = ints(summed)
        if size:
            data = (
                mx.array(np.frombuffer(payload, dtype=np.uint8))
                if self.leader
                else mx.zeros((size,), dtype=mx.uint8)
            )
            data = mx.distributed.all_sum(data, group=self.group, stream=generation_stream)
            mx.eval(data)  # rank 0 too: a collective only runs when evaluated
            if not self.leader:
                payload = np.array(data).tobytes()
        if self.leader:
            assert plan is not None
            return plan
        return wire.decode(payload, flags)

    def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run a collective; a failure (a lost peer) marks the group failed."""
        try:
            return fn(*args)
        except Exception as exc:
            self.mark_failed(f"lost the distributed group ({self.size} ranks): {exc}. {RESTART}")
            raise GroupLost(self.failed) from exc
