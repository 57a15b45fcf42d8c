"""Rank 0's coordinator: the engine's ``GroupHooks`` over MLX collectives, and the watchdog.

Every rank holds one ``Coordinator`` over its MLX group. On rank 0 it is the engine's
``GroupHooks``: the engine calls ``sync`` once per loop iteration, ``joined``/``left`` as
jobs start and retire (they become the next ``Plan``'s ``Join``/``Leave``), ``run`` for
each engine operation (replicated ones become the plan's ``Call`` and run on every
rank), ``close`` at shutdown. The followers (``distributed/follower.py``) ``receive``
those plans through it; every rank loads its part of a model through ``load``.

The collectives themselves (plans, load agreements) are ``Collectives``
(``distributed/collectives.py``), which the split step of a load uses too.

Failure: a collective that raises (the ring backend raises when a peer's socket closes)
or a step that outlives the watchdog's timeout (a hung rank) marks the group failed.
Rank 0 then fails every in-flight and queued request with UNAVAILABLE, Status says
ERROR and health NOT_SERVING; followers exit non-zero. A broken group cannot be
repaired in-process: restart it. While rank 0 is idle it still syncs every
``HEARTBEAT`` seconds, so a lost rank shows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distributed import lifeline, sharding
from distributed.collectives import RESTART, Collectives, GroupLost
from distributed.plan import SHUTDOWN, Call, Join, Leave, Op, Plan, Share
from engine.core import LOAD, LOCAL_OPS, REPLICATED_OPS, Engine
from engine.scheduler import GroupHooks
from engine.sequence import Sequence
from errors import BackendError, FailedPrecondition, ModelLoadError, Unavailable
from params import GenerationParams, LoadParams
from prompt_cache import PromptCache

if TYPE_CHECKING:
    import mlx.core as mx

    from engine.model_host import ModelHost

logger = logging.getLogger("localai.mlx.distributed")

MODES = sharding.MODES
DEFAULT_TIMEOUT = 60.0  # seconds one step (or heartbeat) may take before rank 0 gives up
LOAD_TIMEOUT = 3600.0  # seconds a replicated load (GGUF conversion included) may take
# While rank 0 is idle it syncs every HEARTBEAT seconds (so a lost rank shows) and the
# followers nap between syncs: the ring backend busy-polls while a rank waits in a
# collective, so an idle follower would otherwise burn a core. New work waits for the
# followers' nap to end: at most HEARTBEAT seconds more time to first token.
HEARTBEAT = 0.1
NAP = 0.8  # followers nap this fraction of HEARTBEAT, to be waiting when rank 0 syncs
SHUTDOWN_TIMEOUT = 5.0  # seconds rank 0 waits to tell the others to exit
# As a single process does (engine/model_host.py): UNAVAILABLE, gRPC's retryable code.
_REPLACED = "the model is being replaced by LoadModel; retry the request"


def _lost_peer(exc: BaseException) -> bool:
    """Whether ``exc`` is MLX's distributed backend losing a peer (e.g. "[ring]
    connection to a peer was lost"), raised where the model's collectives run."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and text.startswith(("[ring]", "[jaccl]", "[mpi]"))


class Coordinator(GroupHooks):
    """One rank's view of the group: the ``GroupHooks`` of rank 0's ``Engine``.

    ``mode``: the default split ("tensor" or "pipeline"); ``timeout`` (seconds) bounds
    each step and heartbeat; ``heartbeat`` (seconds) is rank 0's idle sync interval.
    """

    # The ranks must run the same steps: no call stops midway, no prefill checkpoints,
    # no disk tier of the prompt cache, no warm-up (engine and scheduler read this).
    single_process = False

    def __init__(
        self,
        group: mx.distributed.Group,
        mode: str = "tensor",
        timeout: float = DEFAULT_TIMEOUT,
        heartbeat: float = HEARTBEAT,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"distributed mode must be one of {', '.join(MODES)}, got {mode!r}")
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"the distributed timeout must be a positive number, got {timeout}")
        self.net = Collectives(group)
        self.group, self.rank, self.size = group, self.net.rank, self.net.size
        self.leader = self.net.leader
        self.mode = mode
        self.timeout = timeout
        self.heartbeat: float = min(heartbeat, timeout / 2)
        self.weights: list[int] = [0] * self.size  # bytes of weights per rank (last load)
        self.model_mode = ""  # how the loaded model is split: "tensor" or "pipeline"
        self._journal: list[Op] = []
        self._deadline: tuple[float, float] | None = None  # (monotonic deadline, allowance)
        self._engine: Engine | None = None
        self.lifelines: lifeline.Lifelines | None = None

    # ------------------------------------------------------------------ rank 0 wiring
    def attach(self, engine: Engine) -> None:
        """Serve ``engine`` (built with this coordinator) as rank 0; start the watchdog
        and open the lifelines (a collective: the other ranks call ``open_lifelines``)."""
        self._engine = engine
        threading.Thread(
            target=self._watch, args=(engine,), name="mlx-dist-watchdog", daemon=True
        ).start()
        self._arm(self.timeout)
        try:
            self.open_lifelines()
        finally:
            self._deadline = None

    def open_lifelines(self) -> None:
        """Every rank, once, right after the group formed (rank 0 from ``attach``): one
        idle connection per rank to rank 0 (``distributed/lifeline.py``)."""
        self.lifelines = lifeline.connect(self.net, self._lifeline_lost)

    def _lifeline_lost(self, reason: str) -> None:
        """A lifeline closed: on rank 0 a rank died (fail the group now, from this
        thread: the engine thread may wait in a collective that never returns); on the
        others rank 0 died (exit, unless this rank finishes by itself first)."""
        if not self.leader:
            time.sleep(lifeline.ORPHAN_GRACE)
            logger.error("rank %d exits: %s", self.rank, reason)
            logging.shutdown()
            os._exit(1)
        if self.failed:
            return
        self._mark_failed(f"lost the distributed group ({self.size} ranks): {reason}. {RESTART}")
        engine = self._engine
        if engine is not None:
            with contextlib.suppress(RuntimeError):  # a job list the engine thread changes
                engine.fail_from_outside(GroupLost(self.failed))

    @property
    def failed(self) -> str | None:  # type: ignore[override]
        """Why the group broke; None while healthy."""
        return self.net.failed

    def check(self) -> None:
        """Raise GroupLost (UNAVAILABLE) once the group has failed."""
        self.net.check()

    def pin_seed(self, params: GenerationParams) -> GenerationParams:
        """``params`` with a concrete seed, so every rank's sampler draws the same tokens."""
        if params.seed is not None:
            return params
        return dataclasses.replace(params, seed=secrets.randbits(63))

    def joined(self, job: Sequence, ids: list[int]) -> None:
        """Rank 0 started ``job``: the followers start it at the next sync."""
        if self.leader:
            assert job.uid is not None  # Sequence.running set it before the scheduler calls this
            self._journal.append(
                Join(
                    uid=job.uid,
                    ids=tuple(ids),
                    params=job.params,
                    max_tokens=job.max_tokens,
                    cached_tokens=job.cached_tokens,
                    initial_state=job.initial_state,
                )
            )

    def shared(self, job: Sequence, position: int) -> None:
        """Rank 0 asked ``job``'s row for its prefix: the followers ask theirs alike."""
        if self.leader and job.uid is not None:
            self._journal.append(Share(job.uid, position))

    def left(self, job: Sequence) -> None:
        """Rank 0 retired ``job`` (any reason): the followers retire it at the next sync."""
        if self.leader:
            assert job.uid is not None  # only a job that ran (has a row) is retired
            self._journal.append(Leave(job.uid))

    def sync(self, step: bool, idle: bool) -> None:
        """Rank 0, once per engine iteration: send the ops since the last sync, and
        whether a step follows (``idle``: nothing runs or waits). Raises GroupLost when
        a rank is lost."""
        self.check()
        ops = self._take_journal()
        self._arm(self.timeout)
        self.net.broadcast_plan(Plan(ops, step, idle=idle and not step and not ops))
        self._arm(self.timeout)  # the step that follows gets the same allowance

    def run(self, op: str, args: tuple, local: Callable[..., Any]) -> Any:
        """Rank 0's engine thread runs operation ``op``: on every rank when it runs or
        changes the model, here alone when it only reads the tokenizer; refused otherwise."""
        if op in REPLICATED_OPS:
            return self._replicate(op, args, local)
        if op in LOCAL_OPS:
            return local(*args)
        raise FailedPrecondition(
            f"{op} is not supported in distributed mode (it would run the model on rank 0 alone)"
        )

    def _replicate(self, op: str, args: tuple, local: Callable[..., Any]) -> Any:
        self.check()
        ops = self._take_journal()
        self._arm(LOAD_TIMEOUT if op == LOAD else self.timeout)
        try:
            self.net.broadcast_plan(Plan(ops, False, Call(op, tuple(args))))
            if op == LOAD:
                engine = self._engine
                assert engine is not None  # rank 0 replicates only once attached
                return self.load(engine.host, args[0])
            result = local(*args)
            if op == "free":
                self.weights = [0] * self.size
            return result
        finally:
            self._arm(self.timeout)

    def close(self) -> None:
        """At shutdown: close this rank's lifelines; rank 0 then tells the other ranks to
        exit (best effort, bounded)."""
        if self.lifelines is not None:
            self.lifelines.close()  # first: the ranks that now exit are not lost
        if not self.leader or self.failed:
            return
        self._arm(SHUTDOWN_TIMEOUT)
        try:
            self.net.exchange(Plan(call=Call(SHUTDOWN)))
        except Exception as exc:  # a rank already gone: nothing left to tell
            logger.warning("could not tell the other ranks to stop: %s", exc)
        self._deadline = None

    def abort(self, exc: BaseException) -> BackendError:
        """Rank 0's engine thread after a failed step: the group is failed for good;
        returns the error that ends every request (the engine thread then stops)."""
        if isinstance(exc, GroupLost):
            logger.error("%s", exc)
        elif _lost_peer(exc):  # the model's own collectives met the lost rank first
            self._mark_failed(f"lost the distributed group ({self.size} ranks): {exc}. {RESTART}")
        else:
            logger.exception("distributed step failed; the group must be restarted")
        self._mark_failed(self.failed or f"a distributed step failed: {exc}")
        return GroupLost(self.failed)

    def _take_journal(self) -> tuple[Op, ...]:
        ops, self._journal = tuple(self._journal), []
        return ops

    # ------------------------------------------------------------------ status
    def memory(self) -> dict[str, int]:
        """Status breakdown entries: group size and each rank's weight bytes."""
        out = {"group_size": self.size}
        out.update({f"weights_rank_{r}": b for r, b in enumerate(self.weights)})
        return out

    def info(self) -> dict:
        """Facts for GetMetrics: rank, size, split mode, weights per rank, failure."""
        return {
            "rank": self.rank,
            "group_size": self.size,
            "mode": self.model_mode or self.mode,
            "weights_per_rank": list(self.weights),
            "timeout_s": self.timeout,
            "failed": self.failed,
        }

    # ------------------------------------------------------------------ every rank
    def receive(self) -> Plan:
        """A follower: wait for rank 0's next plan. Raises GroupLost when a rank is lost."""
        return self.net.broadcast_plan(None)

    def load(
        self,
        host: ModelHost,
        params: LoadParams,
        cache: Callable[[LoadParams, str], PromptCache] | None = None,
    ) -> None:
        """Every rank: load this rank's part of the model ``params`` names into ``host``
        (``sharding.load``: the one loader, with the split step) and serve it.

        ``cache(params, mode)``: the prompt cache of this rank (None: the usual one).
        Raises ``ModelLoadError`` naming the reason (and the ranks, when they differ).
        """
        mode = params.distributed_mode or self.mode
        # Every rank must prefill the same chunk in each step, or their collectives part
        # ways: the step time budget (engine/step_budget.py) measures rank 0 alone and the
        # followers' steps do not read it, so a group prefills whole chunks.
        params = dataclasses.replace(params, step_budget_ms=0)
        try:
            loaded, self.weights = sharding.load(
                self.net, params, mode, lambda: host.unload(Unavailable(_REPLACED))
            )
        except ModelLoadError:
            if host.loaded is None:
                self.weights = [0] * self.size
            raise
        self.model_mode = mode
        host.serve(loaded, cache(params, mode) if cache is not None else None)
        logger.info(
            "rank %d of %d holds its %s shard: %.1f MB of weights (ranks: %s MB)",
            self.rank,
            self.size,
            mode,
            self.weights[self.rank] / 1e6,
            ", ".join(f"{w / 1e6:.1f}" for w in self.weights),
        )

    # ------------------------------------------------------------------ plumbing
    def _arm(self, allowance: float) -> None:
        self._deadline = (time.monotonic() + allowance, allowance)

    def _mark_failed(self, reason: str) -> None:
        self.net.mark_failed(reason)

    def _watch(self, engine: Engine) -> None:
        """Rank 0's watchdog: a step or collective past its deadline fails the group."""
        period = max(0.05, min(1.0, self.timeout / 4))
        while True:
            time.sleep(period)
            try:
                self._check_deadline(engine)
            except Exception:  # the watchdog must outlive anything it meets
                logger.exception("distributed watchdog")

    def _check_deadline(self, engine: Engine) -> None:
        if self.failed:
            engine.drain_inbox(GroupLost(self.failed))  # requests that raced with the failure
            return
        deadline = self._deadline
        if deadline is None or time.monotonic() <= deadline[0]:
            return
        self._mark_failed(
            f"rank 0 waited more than {deadline[1]:g}s for the other ranks (a rank hung "
            "or the network stalled); restart the group"
        )
        # The engine thread is stuck in a collective: end its jobs from here.
        engine.fail_from_outside(GroupLost(self.failed))
