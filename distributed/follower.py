"""The ranks other than 0: follow rank 0's plans with the same engine, step by step.

``follow`` receives each ``Plan`` through the ``Coordinator`` and applies it to this
rank's ``Engine`` (its model part, ``BatchGenerator`` and prompt cache): every ``Join``
starts a shadow of rank 0's job (same parameters and seed, no listener: rank 0 alone
decides stops and answers clients), every ``Leave`` retires one, a ``Call`` runs the
engine operation rank 0 runs (load, free, score, embed), a step steps the batch. A
follower's prompt cache (``FollowerPromptCache``) reuses exactly the tokens rank 0
reused, so both compute the same positions. Anything that does not match rank 0
(``Desync``) ends the follower: the group must be restarted.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from caches.prompt_tiers import entry_bound
from decoding.finish import FinishReason
from decoding.output import Delta
from distributed.coordinator import NAP, Coordinator, GroupLost
from distributed.plan import SHUTDOWN, Join, Leave, Op, Share
from engine.core import LOAD, REPLICATED_OPS, Engine
from engine.jobs import Job
from engine.sequence import Sequence
from params import GenerationParams, GenerationRequest, LoadParams, PromptSpec
from prompt_cache import CacheLookup, PromptCache

logger = logging.getLogger("localai.mlx.distributed")


class Desync(RuntimeError):
    """A follower's state no longer matches rank 0's (a bug, or diverging files)."""


class FollowerPromptCache(PromptCache):
    """A follower's prompt cache: reuses exactly as many tokens as rank 0 did.

    Before each ``Scheduler.start`` the follower sets ``expect`` to rank 0's cached-token
    count; a longer match is trimmed to it. A shorter one means the caches diverged:
    ``Desync`` (the follower exits, and rank 0 reports the lost rank).
    """

    def __init__(self, max_entries: int | None, max_bytes: int | None) -> None:
        super().__init__(max_entries, max_bytes)
        self.expect: int | None = None

    def fetch(self, model_key: str, tokens: Any, disk_dir: str = "") -> CacheLookup:
        want, self.expect = self.expect, None
        lookup = super().fetch(model_key, tokens)
        if want is None or lookup.cached_tokens == want:
            return lookup
        toks = [int(t) for t in tokens]
        if want == 0:
            return CacheLookup(kv=None, cached_tokens=0, rest=toks)
        extra, kv = lookup.cached_tokens - want, lookup.kv
        trimmable = extra > 0 and kv is not None and all(layer.is_trimmable() for layer in kv)
        if trimmable and kv is not None and all(layer.trim(extra) == extra for layer in kv):
            return CacheLookup(kv=kv, cached_tokens=want, rest=toks[want:])
        raise Desync(
            f"rank 0 reused {want} cached prompt tokens but this rank has {lookup.cached_tokens}"
        )

    def trim_to(self, *, max_entries: int | None = None, max_bytes: int | None = None) -> int:
        """Evict by entry count only: memory is measured and admitted on by rank 0
        alone, and a follower that evicted an entry rank 0 still reuses would desync
        (keeping more is harmless: ``fetch`` trims to rank 0's reuse)."""
        return super().trim_to(max_entries=max_entries) if max_entries is not None else 0


def follower_cache(params: LoadParams, mode: str) -> FollowerPromptCache:
    """The prompt cache of a follower's model, loaded with ``params`` split in ``mode``."""
    # Pipeline ranks hold different layers, so their KV sizes differ from rank 0's:
    # bound followers by entries only and let them match rank 0's reuse exactly.
    max_bytes = params.max_cache_bytes if mode == "tensor" else None
    return FollowerPromptCache(entry_bound(params, False), max_bytes)  # as rank 0's


class _NullPipeline:
    """A follower's stand-in for the output pipeline: rank 0 alone decides stops."""

    finish_reason: FinishReason | None = None
    failure: str | None = None  # a broken tool-call schema is rank 0's to report
    stopped = False

    def finish(self, reason: FinishReason) -> Delta:
        return Delta()


def _shadow_job(params: GenerationParams, max_tokens: int, initial_state: str) -> Sequence:
    """A follower's copy of one of rank 0's sequences: same parameters, no listener."""
    job = Job(
        GenerationRequest(params, PromptSpec()), initial_state=initial_state, max_tokens=max_tokens
    )
    return Sequence(job, pipeline=_NullPipeline())


def follow(coordinator: Coordinator, engine: Engine | None = None) -> int:
    """Ranks other than 0: apply rank 0's plans until it stops; returns the exit code.

    0 when rank 0 shut down; 1 when the group broke (a rank was lost) or this rank
    could not keep up with rank 0 (its state diverged); the launcher then stops the rest.
    """
    engine = engine or Engine(coordinator)
    finished: dict[int, tuple] = {}  # uid -> (kv, tokens) of sequences the batch ended
    try:
        coordinator.open_lifelines()  # rank 0 does the same in Coordinator.attach
    except GroupLost as exc:
        logger.error("rank %d exits: %s", coordinator.rank, exc)
        return 1
    logger.info(
        "rank %d of %d (pid %d): following rank 0", coordinator.rank, coordinator.size, os.getpid()
    )
    while True:
        try:
            plan = coordinator.receive()
            for op in plan.ops:
                _apply(engine, op, finished)
            if plan.call is not None:
                name, args = plan.call.op, plan.call.args
                if name == SHUTDOWN:
                    coordinator.close()  # its lifeline: rank 0 leaving is no loss now
                    engine.shutdown()
                    logger.info("rank 0 stopped; rank %d exits", coordinator.rank)
                    return 0
                if name in (LOAD, "free"):
                    finished.clear()  # they end every sequence
                try:
                    if name == LOAD:
                        coordinator.load(engine.host, args[0], cache=follower_cache)
                    elif name in REPLICATED_OPS:
                        engine.local_op(name)(*args)
                    else:
                        raise Desync(f"rank 0 sent operation {name!r}, which is not replicated")
                except (GroupLost, Desync):
                    raise
                except Exception as exc:  # rank 0 meets the same error and reports it
                    logger.info("%s failed on rank %d too: %s", name, coordinator.rank, exc)
            if plan.step:
                if engine.scheduler is None:
                    raise Desync("rank 0 sent a step but this rank has no model loaded")
                finished.update(engine.scheduler.mirror_step())
            elif plan.idle:
                time.sleep(coordinator.heartbeat * NAP)
        except GroupLost as exc:
            logger.error("rank %d exits: %s", coordinator.rank, exc)
            return 1
        except Exception:
            logger.exception("rank %d cannot follow rank 0 any more; exiting", coordinator.rank)
            return 1


def _apply(engine: Engine, op: Op, finished: dict[int, tuple]) -> None:
    """Apply one of rank 0's ops to a follower's engine."""
    sched = engine.scheduler
    if sched is None:
        raise Desync(f"rank 0 sent {type(op).__name__} but this rank has no model loaded")
    if isinstance(op, Join):
        job = _shadow_job(op.params, op.max_tokens, op.initial_state)
        if isinstance(sched.cache, FollowerPromptCache):
            sched.cache.expect = op.cached_tokens
        sched.start(job, list(op.ids))
        if job.uid != op.uid:
            raise Desync(f"rank 0 started sequence {op.uid}, this rank {job.uid}")
    elif isinstance(op, Leave):
        leaving = sched.active.get(op.uid)
        if leaving is None:
            raise Desync(f"rank 0 retired sequence {op.uid}, which this rank does not run")
        sched.retire(leaving, FinishReason.STOP, kv=finished.pop(op.uid, None))
    elif isinstance(op, Share):
        sharing = sched.active.get(op.uid)
        if sharing is None:
            raise Desync(
                f"rank 0 shared a prefix of sequence {op.uid}, which this rank does not run"
            )
        sched.share(sharing, op.position)
    else:
        raise Desync(f"unknown plan op {op!r}")
