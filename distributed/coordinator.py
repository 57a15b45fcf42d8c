"""Distributed mode: one model served by several processes or machines with MLX's engine.

Started with MLX's launcher, e.g. three processes on this machine over the ring backend::

    mlx.launch -n 3 --backend ring ./run.sh --addr 127.0.0.1:50051 --distributed tensor

Every process gets a rank. Rank 0 serves gRPC on ``--addr`` and runs the usual ``Engine``
with a ``Coordinator`` attached; the other ranks serve nothing and run ``follow()``: the
same ``Engine`` (its model shard, ``BatchGenerator`` and prompt cache) driven by rank 0.

What this module owns:

* the group (``init_group``) and sharded loading (``Coordinator.load``): each rank
  loads the model lazily, keeps only its part (tensor parallel through the model's
  ``shard(group)`` plus, for a few architectures, the vocabulary rows (``shard_vocab``);
  or pipeline through ``model.model.pipeline(group)``), prepares it for the CPU in the
  weight mode rank 0 chose, and all ranks agree on success before anyone serves; a model
  that cannot be split fails the load on every rank with the reason;
* the step plan: once per iteration of rank 0's engine loop, ``Coordinator.sync``
  sends the operations since the last sync -- which jobs joined (prompt ids, sampling
  parameters with a concrete seed, max tokens, cached-token count), which left (in rank
  0's order), whether to step -- and the followers apply them with the same ``Engine``
  methods (``_start``, ``_retire``) before stepping their ``BatchGenerator``. Every rank
  thus runs the same batch, and the collectives inside the sharded model line up. Calls
  that run the model (load, free, score, embed) are sent the same way and run on every
  rank. A message is an ``all_sum`` of a header (payload length, flags) and then of the
  pickled payload as uint8, as ``mlx_lm.server`` shares requests;
* failure: a collective that raises (the ring backend raises when a peer's socket
  closes) or a step that outlives the watchdog's timeout (a hung rank) marks the group
  failed. Rank 0 then fails every in-flight and queued request with UNAVAILABLE, Status
  says ERROR and health NOT_SERVING; followers exit non-zero. A broken group cannot be
  repaired in-process: restart it. (Followers wait on rank 0, so a follower whose
  neighbour died may only leave when rank 0 does.)

While rank 0 is idle it still syncs every ``HEARTBEAT`` seconds, and the followers nap in
between instead of waiting inside a collective, where the ring backend busy-polls.

Collectives are issued on mlx-lm's ``generation_stream``, the stream the model's own
collectives run on: ``BatchGenerator`` starts the next step asynchronously, and ops on one
stream run in order, so a plan never overtakes (or interleaves with) a step's collectives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
import os
import pickle
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.nn.layers import distributed as dist_layers
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.generate import generation_stream

from decoding.output import Delta
from engine.core import LOAD, LOCAL_OPS, REPLICATED_OPS, Engine
from engine.jobs import Job
from engine.scheduler import GroupHooks
from errors import BackendError, FailedPrecondition, ModelLoadError, Unavailable
from loading import cpu_fast_path, model_loader
from loading.loaded_model import LoadedModel, validate
from params import GenerationParams, GenerationRequest, LoadParams, PromptSpec
from prompt_cache import CacheLookup, PromptCache

logger = logging.getLogger("localai.mlx.distributed")

MODES = ("tensor", "pipeline")
DEFAULT_TIMEOUT = 60.0  # seconds one step (or heartbeat) may take before rank 0 gives up
LOAD_TIMEOUT = 3600.0  # seconds a replicated load (GGUF conversion included) may take
# While rank 0 is idle it syncs every HEARTBEAT seconds (so a lost rank shows) and the
# followers nap between syncs: the ring backend busy-polls while a rank waits in a
# collective, so an idle follower would otherwise burn a core. New work waits for the
# followers' nap to end: at most HEARTBEAT seconds more time to first token.
HEARTBEAT = 0.1
_NAP = 0.8  # followers nap this fraction of HEARTBEAT, to be waiting when rank 0 syncs
SHUTDOWN_TIMEOUT = 5.0  # seconds rank 0 waits to tell the others to exit
# Architectures whose code only calls embed_tokens(ids), embed_tokens.as_linear(h) and
# lm_head(h), so their vocabulary can be split too (see shard_vocab).
VOCAB_SPLIT_ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3"})

_STEP = 1  # header flag: the followers step after applying the plan
_IDLE = 2  # header flag: rank 0 has nothing to do; followers nap before the next sync
_STATUS_BYTES = 1024  # per-rank record of a load agreement: weights (int64), error text

SHUTDOWN = "shutdown"  # the plan call that stops the followers


class GroupLost(Unavailable):
    """A rank is gone or hung: the group cannot serve until it is restarted."""


class Desync(RuntimeError):
    """A follower's state no longer matches rank 0's (a bug, or diverging files)."""


@dataclass
class Plan:
    """What rank 0 sends each iteration: ops to apply in order, then a call or a step.

    ``ops``: ``("join", uid, ids, params, max_tokens, cached_tokens, initial_state)``,
    ``("leave", uid)``. ``call``: ``(engine method name, args)`` or None. ``idle``: rank
    0 has nothing to do, so the followers may nap before the next sync.
    """

    ops: list = field(default_factory=list)
    step: bool = False
    call: tuple | None = None
    idle: bool = False


def init_group(backend: str = "any") -> Any:
    """Join the group MLX's launcher set up (``MLX_RANK``/``MLX_HOSTFILE`` for ring).

    Raises RuntimeError naming ``mlx.launch`` when this process was not launched as
    part of a group.
    """
    try:
        return mx.distributed.init(strict=True, backend=backend)
    except RuntimeError as exc:
        raise RuntimeError(
            f"--distributed needs a process group ({exc}); start every rank with MLX's "
            "launcher, e.g. `mlx.launch -n 3 --backend ring ./run.sh --addr HOST:PORT "
            "--distributed tensor`, or `mlx.launch --hostfile hosts.json ...` for machines"
        ) from exc


class Coordinator(GroupHooks):
    """One rank's view of the group: the ``GroupHooks`` of the ``Engine`` on every rank.

    On rank 0 (``leader``) the engine calls ``sync`` once per loop iteration,
    ``joined``/``left`` as jobs start and retire, ``run`` for each engine operation
    (replicated ones go to every rank), ``close`` at shutdown; ``load`` runs on every
    rank. ``timeout`` (seconds) bounds
    each step and heartbeat; ``heartbeat`` (seconds) is rank 0's idle sync interval.
    """

    def __init__(
        self,
        group: Any,
        mode: str = "tensor",
        timeout: float = DEFAULT_TIMEOUT,
        heartbeat: float = HEARTBEAT,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"distributed mode must be one of {', '.join(MODES)}, got {mode!r}")
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"the distributed timeout must be a positive number, got {timeout}")
        self.group = group
        self.rank, self.size = group.rank(), group.size()
        self.leader = self.rank == 0
        self.mode = mode
        self.timeout = timeout
        self.heartbeat = min(heartbeat, timeout / 2)
        self.failed: str | None = None  # why the group broke; None while healthy
        self.weights: list[int] = [0] * self.size  # bytes of weights per rank (last load)
        self.model_mode = ""  # how the loaded model is split: "tensor" or "pipeline"
        self._journal: list[tuple] = []
        self._deadline: tuple[float, float] | None = None  # (monotonic deadline, allowance)
        self._engine: Engine | None = None

    # ------------------------------------------------------------------ rank 0 wiring
    def attach(self, engine: Engine) -> None:
        """Serve ``engine`` (built with this coordinator) as rank 0; start the watchdog."""
        self._engine = engine
        threading.Thread(target=self._watch, name="mlx-dist-watchdog", daemon=True).start()

    def check(self) -> None:
        """Raise GroupLost (UNAVAILABLE) once the group has failed."""
        if self.failed:
            raise GroupLost(self.failed)

    def pin_seed(self, params: GenerationParams) -> GenerationParams:
        """``params`` with a concrete seed, so every rank's sampler draws the same tokens."""
        if params.seed is not None:
            return params
        return dataclasses.replace(params, seed=secrets.randbits(63))

    def joined(self, job: Job, ids: list[int]) -> None:
        """Rank 0 started ``job``: the followers start it at the next sync."""
        if self.leader:
            self._journal.append(
                (
                    "join",
                    job.uid,
                    list(ids),
                    job.params,
                    job.max_tokens,
                    job.cached_tokens,
                    job.initial_state,  # logits processors (reasoning budget) start from it
                )
            )

    def left(self, job: Job) -> None:
        """Rank 0 retired ``job`` (any reason): the followers retire it at the next sync."""
        if self.leader:
            self._journal.append(("leave", job.uid))

    def sync(self, step: bool, idle: bool) -> None:
        """Rank 0, once per engine iteration: send the ops since the last sync, and
        whether a step follows (``idle``: nothing runs or waits). Raises GroupLost when
        a rank is lost."""
        self.check()
        ops, self._journal = self._journal, []
        self._arm(self.timeout)
        self._collective(self._exchange, Plan(ops, step, idle=idle and not step and not ops))
        self._arm(self.timeout)  # the step that follows gets the same allowance

    def run(self, op: str, args: tuple, local: Any) -> Any:
        """Rank 0's engine thread runs operation ``op``: on every rank when it runs or
        changes the model, here alone when it only reads the tokenizer; refused otherwise."""
        if op in REPLICATED_OPS:
            return self._replicate(op, args, local)
        if op in LOCAL_OPS:
            return local(*args)
        raise FailedPrecondition(
            f"{op} is not supported in distributed mode (it would run the model on rank 0 alone)"
        )

    def _replicate(self, op: str, args: tuple, local: Any) -> Any:
        self.check()
        ops, self._journal = self._journal, []
        self._arm(LOAD_TIMEOUT if op == LOAD else self.timeout)
        try:
            self._collective(self._exchange, Plan(ops, False, (op, args)))
            if op == LOAD:
                return self.load(self._engine, *args)
            result = local(*args)
            if op == "free":
                self.weights = [0] * self.size
            return result
        finally:
            self._arm(self.timeout)

    def close(self) -> None:
        """Rank 0 at shutdown: tell the other ranks to exit (best effort, bounded)."""
        if not self.leader or self.failed:
            return
        self._arm(SHUTDOWN_TIMEOUT)
        try:
            self._exchange(Plan([], False, (SHUTDOWN, ())))
        except Exception as exc:  # a rank already gone: nothing left to tell
            logger.warning("could not tell the other ranks to stop: %s", exc)
        self._deadline = None

    def abort(self, exc: BaseException) -> BackendError:
        """Rank 0's engine thread after a failed step: the group is failed for good;
        returns the error that ends every request (the engine thread then stops)."""
        if isinstance(exc, GroupLost):
            logger.error("%s", exc)
        else:
            logger.exception("distributed step failed; the group must be restarted")
        self._mark_failed(self.failed or f"a distributed step failed: {exc}")
        return GroupLost(self.failed)

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

    # ------------------------------------------------------------------ followers
    def receive(self) -> Plan:
        """A follower: wait for rank 0's next plan. Raises GroupLost when a rank is lost."""
        return self._collective(self._exchange, None)

    # ------------------------------------------------------------------ loading
    def load(self, engine: Engine, params: LoadParams, file_bytes: int = 0) -> None:
        """Every rank: load this rank's part of the model into ``engine``.

        Two agreements. First every rank validates the request and builds the model
        lazily (no weights read) to check that it can be split: a refusal anywhere keeps
        the current model everywhere, as in a single process. Then every rank drops the
        current model, keeps its part of the new one and prepares it; if any rank failed,
        all drop it. Raises ``ModelLoadError`` naming the reason (and the ranks, when
        they differ).
        """
        mode = params.distributed_mode or self.mode
        model = tokenizer = None
        error = ""
        try:
            if params.draft_model:
                raise ValueError("DraftModel (speculative decoding) is not supported distributed")
            if params.lora_adapter:
                raise ValueError("LoraAdapter is not supported in distributed mode")
            validate(params)
            model, tokenizer = model_loader.load_model(
                params.model,
                params.model_file,
                params.model_path,
                trust_remote_code=params.trust_remote_code,
                tokenizer_config=params.tokenizer_config,
                lazy=True,
            )
            check_split(model, mode, self.size)
        except Exception as exc:
            error = _describe(exc)
        self._agree(error, 0)
        engine.host.unload(FailedPrecondition("the model is being replaced; retry the request"))
        cpu_mode, weights = "", 0
        try:
            if mode == "tensor":
                model.shard(self.group)
                if params.distributed_vocab:
                    shard_vocab(model, self.group)
            else:
                model.model.pipeline(self.group)
            if self.leader:
                cpu_mode = self._prepare(model, params.cpu_dequantize, params.cpu_dequantize_budget)
        except Exception as exc:
            error = _describe(exc)
        # Rank 0 chose dense or quantized weights; every rank must compute the same way.
        # (Each rank measuring its own BLAS would disagree on a busy machine.)
        cpu_mode = self._share_cpu_mode(cpu_mode if not error else "")
        if not self.leader and not error and cpu_mode:
            try:
                self._prepare(model, cpu_mode == "dense", None)
            except Exception as exc:
                error = _describe(exc)
        if error or not cpu_mode:
            model = tokenizer = None  # when rank 0 failed, its error is the one reported
            gc.collect()
            mx.clear_cache()
        else:
            weights = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
        results = self._agree(error, weights)  # on failure every rank drops its part here
        self.weights = [w for _, w in results]
        self.model_mode = mode
        cache = None
        if not self.leader:
            # Pipeline ranks hold different layers, so their KV sizes differ from rank 0's:
            # bound followers by entries only and let them match rank 0's reuse exactly.
            max_bytes = params.max_cache_bytes if mode == "tensor" else None
            cache = FollowerPromptCache(params.max_cache_entries, max_bytes)
        engine.host.serve(LoadedModel.build(model, tokenizer, params, cpu_mode=cpu_mode), cache)
        logger.info(
            "rank %d of %d holds its %s shard: %.1f MB of weights (ranks: %s MB)",
            self.rank,
            self.size,
            mode,
            weights / 1e6,
            ", ".join(f"{w / 1e6:.1f}" for w in self.weights),
        )

    @staticmethod
    def _prepare(model: Any, dequantize: bool | None, budget: int | None) -> str:
        """Prepare a split model for the CPU as a single process does; evaluate it.

        Returns the CPU weight mode ("dense" or "quantized"; see cpu_fast_path).
        """
        cpu_mode = cpu_fast_path.prepare_for_cpu(model, dequantize, budget)
        if cpu_mode == "dense":
            # mlx-lm's dequantize_model skips the sharded quantized layers: do those here.
            _dequantize_sharded(model)
        mx.eval(model.parameters())
        return cpu_mode

    def _share_cpu_mode(self, cpu_mode: str) -> str:
        """Rank 0's CPU weight mode on every rank ("" when rank 0 failed)."""
        codes = ("", "dense", "quantized")
        mine = codes.index(cpu_mode) if self.leader else 0

        def share() -> int:
            summed = mx.distributed.all_sum(
                mx.array([mine], dtype=mx.int32), group=self.group, stream=generation_stream
            )
            return int(summed.item())

        return codes[self._collective(share)]

    def _agree(self, error: str, weights: int) -> list[tuple[str, int]]:
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

        rows = self._collective(gather)
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

    # ------------------------------------------------------------------ plumbing
    def _exchange(self, plan: Plan | None) -> Plan:
        """Broadcast ``plan`` from rank 0 (followers pass None and get it back)."""
        if self.leader:
            payload = b""
            if plan.ops or plan.call:
                payload = pickle.dumps((plan.ops, plan.call), protocol=pickle.HIGHEST_PROTOCOL)
            header = [len(payload), (_STEP if plan.step else 0) | (_IDLE if plan.idle else 0)]
        else:
            payload, header = b"", [0, 0]
        summed = mx.distributed.all_sum(
            mx.array(header, dtype=mx.int32), group=self.group, stream=generation_stream
        )
        size, flags = summed.tolist()
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
            return plan
        ops, call = pickle.loads(payload) if size else ([], None)  # from our own ranks
        return Plan(ops, bool(flags & _STEP), call, bool(flags & _IDLE))

    def _collective(self, fn: Any, *args: Any) -> Any:
        """Run a collective; a failure (a lost peer) marks the group failed."""
        try:
            return fn(*args)
        except Exception as exc:
            self._mark_failed(f"lost the distributed group ({self.size} ranks): {exc}")
            raise GroupLost(self.failed) from exc

    def _arm(self, allowance: float) -> None:
        self._deadline = (time.monotonic() + allowance, allowance)

    def _mark_failed(self, reason: str) -> None:
        if not self.failed:
            self.failed = reason
            logger.error("rank %d: %s", self.rank, reason)

    def _watch(self) -> None:
        """Rank 0's watchdog: a step or collective past its deadline fails the group."""
        period = max(0.05, min(1.0, self.timeout / 4))
        while True:
            time.sleep(period)
            try:
                self._check_deadline(self._engine)
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


class FollowerPromptCache(PromptCache):
    """A follower's prompt cache: reuses exactly as many tokens as rank 0 did.

    Before each ``Scheduler.start`` the follower sets ``expect`` to rank 0's cached-token
    count; a longer match is trimmed to it. A shorter one means the caches diverged:
    ``Desync`` (the follower exits, and rank 0 reports the lost rank).
    """

    def __init__(self, max_entries: int, max_bytes: int | None) -> None:
        super().__init__(max_entries, max_bytes)
        self.expect: int | None = None

    def fetch(self, model_key: str, tokens: Any) -> CacheLookup:
        want, self.expect = self.expect, None
        lookup = super().fetch(model_key, tokens)
        if want is None or lookup.cached_tokens == want:
            return lookup
        toks = [int(t) for t in tokens]
        if want == 0:
            return CacheLookup(kv=None, cached_tokens=0, rest=toks)
        extra = lookup.cached_tokens - want
        trimmable = extra > 0 and all(layer.is_trimmable() for layer in lookup.kv)
        if trimmable and all(layer.trim(extra) == extra for layer in lookup.kv):
            return CacheLookup(kv=lookup.kv, cached_tokens=want, rest=toks[want:])
        raise Desync(
            f"rank 0 reused {want} cached prompt tokens but this rank has {lookup.cached_tokens}"
        )


class _NullPipeline:
    """A follower's stand-in for the output pipeline: rank 0 alone decides stops."""

    finish_reason = None
    stopped = False

    def finish(self, reason: str) -> Delta:
        return Delta()


def _shadow_job(params: GenerationParams, max_tokens: int, initial_state: str) -> Job:
    """A follower's copy of one of rank 0's jobs: same parameters, no listener."""
    job = Job(GenerationRequest(params, PromptSpec()), initial_state=initial_state)
    job.max_tokens = max_tokens
    job.pipeline = _NullPipeline()
    return job


def follow(coordinator: Coordinator, engine: Engine | None = None) -> int:
    """Ranks other than 0: apply rank 0's plans until it stops; returns the exit code.

    0 when rank 0 shut down; 1 when the group broke (a rank was lost) or this rank
    could not keep up with rank 0 (its state diverged); the launcher then stops the rest.
    """
    engine = engine or Engine(coordinator)
    finished: dict[int, tuple] = {}  # uid -> (kv, tokens) of sequences the batch ended
    logger.info(
        "rank %d of %d (pid %d): following rank 0", coordinator.rank, coordinator.size, os.getpid()
    )
    while True:
        try:
            plan = coordinator.receive()
            for op in plan.ops:
                _apply(engine, op, finished)
            if plan.call is not None:
                name, args = plan.call
                if name == SHUTDOWN:
                    engine.shutdown()
                    logger.info("rank 0 stopped; rank %d exits", coordinator.rank)
                    return 0
                if name in (LOAD, "free"):
                    finished.clear()  # they end every sequence
                try:
                    if name == LOAD:
                        coordinator.load(engine, *args)
                    elif name in REPLICATED_OPS:
                        engine.local_op(name)(*args)
                    else:
                        raise Desync(f"rank 0 sent operation {name!r}, which is not replicated")
                except (GroupLost, Desync):
                    raise
                except Exception as exc:  # rank 0 meets the same error and reports it
                    logger.info("%s failed on rank %d too: %s", name, coordinator.rank, exc)
            if plan.step:
                finished.update(engine.scheduler.mirror_step())
            elif plan.idle:
                time.sleep(coordinator.heartbeat * _NAP)
        except GroupLost as exc:
            logger.error("rank %d exits: %s", coordinator.rank, exc)
            return 1
        except Exception:
            logger.exception("rank %d cannot follow rank 0 any more; exiting", coordinator.rank)
            return 1


def _apply(engine: Engine, op: tuple, finished: dict[int, tuple]) -> None:
    """Apply one of rank 0's ops to a follower's engine."""
    sched = engine.scheduler
    if sched is None:
        raise Desync(f"rank 0 sent {op[0]!r} but this rank has no model loaded")
    if op[0] == "join":
        _, uid, ids, params, max_tokens, cached, initial_state = op
        job = _shadow_job(params, max_tokens, initial_state)
        if isinstance(sched.cache, FollowerPromptCache):
            sched.cache.expect = cached
        sched.start(job, ids)
        if job.uid != uid:
            raise Desync(f"rank 0 started sequence {uid}, this rank {job.uid}")
    elif op[0] == "leave":
        job = sched.active.get(op[1])
        if job is None:
            raise Desync(f"rank 0 retired sequence {op[1]}, which this rank does not run")
        sched.retire(job, "stop", kv=finished.pop(op[1], None))
    else:
        raise Desync(f"unknown plan op {op[0]!r}")


# ---------------------------------------------------------------------- model splitting
def check_split(model: Any, mode: str, size: int) -> None:
    """Raise ValueError naming the reason when ``model`` cannot be split over ``size``
    ranks in ``mode`` ("tensor": the model's ``shard()`` with head counts divisible by
    ``size``; "pipeline": ``model.model.pipeline()`` with at least ``size`` layers)."""
    arch = _architecture(model)
    if mode == "tensor":
        if not hasattr(model, "shard"):
            hint = " (it supports --distributed pipeline)" if _can_pipeline(model) else ""
            raise ValueError(
                f"the {arch} architecture has no tensor-parallel split in mlx-lm (no shard()){hint}"
            )
        heads = _head_counts(model)
        if any(count % size for _, count in heads):
            common = math.gcd(*(count for _, count in heads))
            sizes = [d for d in range(2, common + 1) if common % d == 0]
            raise ValueError(
                f"the {arch} model's {' and '.join(f'{v} {k}' for k, v in heads)} cannot "
                f"be split evenly over {size} ranks; group sizes that work: "
                f"{', '.join(map(str, sizes)) or 'none'} (or --distributed pipeline, where "
                "the architecture supports it)"
            )
    elif mode == "pipeline":
        if not _can_pipeline(model):
            raise ValueError(
                f"the {arch} architecture has no pipeline split in mlx-lm (no "
                "model.pipeline()); use --distributed tensor"
            )
        layers = len(model.model.layers)
        if layers < size:
            raise ValueError(f"the {arch} model has {layers} layers, fewer than {size} ranks")
    else:
        raise ValueError(f"distributed mode must be one of {', '.join(MODES)}, got {mode!r}")


def _architecture(model: Any) -> str:
    args = getattr(model, "args", None)
    return getattr(args, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1]


def _can_pipeline(model: Any) -> bool:
    return hasattr(getattr(model, "model", None), "pipeline")


def _head_counts(model: Any) -> list[tuple[str, int]]:
    """(name, count) of the attention and KV head counts in the model's config."""
    args = getattr(model, "args", None)
    names = {
        "attention heads": ("num_attention_heads", "n_heads"),
        "KV heads": ("num_key_value_heads", "n_kv_heads"),
    }
    out = []
    for label, keys in names.items():
        for key in keys:
            value = getattr(args, key, None)
            if isinstance(value, int) and value > 0:
                out.append((label, value))
                break
    return out


class VocabParallelEmbedding(nn.Module):
    """One rank's rows of a token embedding (and of a tied or separate output head).

    Each rank holds ``ceil(vocab / size)`` rows (the last padded with zeros).
    ``__call__`` looks up the ids this rank holds and sums the group's results (every
    id lives on exactly one rank, so the sum is exact); ``as_linear`` (or calling it as
    a head) scores this rank's slice of the vocabulary and gathers the slices.
    """

    def __init__(self, inner: nn.Module, vocab: int, group: Any, head: bool = False) -> None:
        super().__init__()
        self.inner = inner  # an Embedding/QuantizedEmbedding or Linear/QuantizedLinear
        self.vocab = vocab
        self.rows = -(-vocab // group.size())
        self.start = group.rank() * self.rows
        self.group = group
        self.head = head

    def __call__(self, x: mx.array) -> mx.array:
        if self.head:
            return self.as_linear(x)
        local = x - self.start
        inside = (local >= 0) & (local < self.rows)
        h = self.inner(mx.where(inside, local, 0))
        h = mx.where(inside[..., None], h, mx.zeros_like(h))
        return mx.distributed.all_sum(h, group=self.group)

    def as_linear(self, x: mx.array) -> mx.array:
        part = self.inner(x) if self.head else self.inner.as_linear(x)
        # all_gather stacks along the first axis: bring the vocabulary axis there.
        full = mx.distributed.all_gather(mx.moveaxis(part, -1, 0), group=self.group)
        return mx.moveaxis(full, 0, -1)[..., : self.vocab]


def shard_vocab(model: Any, group: Any) -> bool:
    """Split the token embedding (and an untied output head) of ``model`` by vocabulary
    rows over ``group``, in place; returns False (and leaves the model alone) for
    architectures not in ``VOCAB_SPLIT_ARCHITECTURES`` or of another shape.

    Tensor parallelism (``shard()``) splits the layers but keeps the embedding whole on
    every rank; for small models with large vocabularies that is a large share.
    """
    body = getattr(model, "model", None)
    embed = getattr(body, "embed_tokens", None)
    if _architecture(model) not in VOCAB_SPLIT_ARCHITECTURES or embed is None:
        return False
    vocab = int(embed.weight.shape[0])
    body.embed_tokens = VocabParallelEmbedding(_rows(embed, vocab, group), vocab, group)
    head = getattr(model, "lm_head", None) if "lm_head" in model else None
    if head is not None:
        model.lm_head = VocabParallelEmbedding(_rows(head, vocab, group), vocab, group, head=True)
    return True


def _rows(module: nn.Module, vocab: int, group: Any) -> nn.Module:
    """``module`` (embedding or linear, maybe quantized) keeping this rank's vocab rows."""
    rows = -(-vocab // group.size())
    start = group.rank() * rows
    stop = min(start + rows, vocab)

    def take(a: mx.array) -> mx.array:
        part = a[start:stop]
        if stop - start < rows:  # the last rank: pad to the common row count
            pad = mx.zeros((rows - (stop - start), *a.shape[1:]), dtype=a.dtype)
            part = mx.concatenate([part, pad])
        return mx.contiguous(part)

    for key in ("weight", "scales", "biases", "bias"):
        if key in module and isinstance(module[key], mx.array):
            module[key] = take(module[key])
    if hasattr(module, "num_embeddings"):  # QuantizedEmbedding keeps its row count
        module.num_embeddings = rows
    return module


def _dequantize_sharded(model: Any) -> int:
    """Replace sharded quantized linears by dense float32 ones; returns how many."""
    replaced = []
    for name, m in model.named_modules():
        if not isinstance(
            m, (dist_layers.QuantizedAllToShardedLinear, dist_layers.QuantizedShardedToAllLinear)
        ):
            continue
        weight = mx.dequantize(
            m.weight, m.scales, m.biases, m.group_size, m.bits, mode=m.mode
        ).astype(mx.float32)
        out_dims, in_dims = weight.shape  # this rank's shard
        n = m.group.size()
        if isinstance(m, dist_layers.QuantizedAllToShardedLinear):  # outputs are split
            layer = dist_layers.AllToShardedLinear(in_dims, out_dims * n, "bias" in m, m.group)
        else:  # inputs are split
            layer = dist_layers.ShardedToAllLinear(in_dims * n, out_dims, "bias" in m, m.group)
        layer.weight = weight
        if "bias" in m:
            layer.bias = m.bias.astype(mx.float32)
        replaced.append((name, layer))
    if replaced:
        model.update_modules(tree_unflatten(replaced))
    return len(replaced)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return text if text and not isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------- LocalAI's worker protocol
# LocalAI's own way to form a group (``local-ai worker mlx-distributed``): each worker is
# started alone with ``--worker --hostfile FILE --rank N [--backend ring|jaccl]
# [--coordinator IP:PORT]``; rank 0 is the backend LocalAI starts like any other and joins
# at LoadModel (option ``hostfile:FILE``, ``distributed_backend:ring|jaccl``, or the env
# below). No launcher: every process sets the environment MLX's backend reads itself.

BACKENDS = ("ring", "jaccl")
HOSTFILE_ENV = "MLX_DISTRIBUTED_HOSTFILE"  # LocalAI's names (core/cli/worker)
RANK_ENV = "MLX_RANK"
BACKEND_ENV = "MLX_DISTRIBUTED_BACKEND"
COORDINATOR_ENV = "MLX_JACCL_COORDINATOR"
JOIN_TIMEOUT_ENV = "LOCALAI_MLX_JOIN_TIMEOUT"  # ours: seconds a rank waits for the others
JOIN_TIMEOUT = 600.0  # default of JOIN_TIMEOUT_ENV / --join-timeout
_RETRY_PAUSE = 1.0  # seconds between connection attempts while peers are not up


class JoinTimeout(TimeoutError):
    """The other ranks of the hostfile did not connect in time."""


@dataclass(frozen=True)
class GroupSpec:
    """Which group a process joins: hostfile path (absolute), MLX backend, this rank,
    the JACCL coordinator ``ip:port`` ("" for ring), and the group size the file gives."""

    hostfile: str
    backend: str
    rank: int
    size: int
    coordinator: str = ""
    rendezvous: str = ""  # rank 0's "ip:port" where the ranks meet before MLX's init

    def describe(self) -> str:
        return f"the {self.size}-rank {self.backend} group of {self.hostfile}"


def group_spec(hostfile: str, backend: str, rank: int, coordinator: str = "") -> GroupSpec:
    """Check a worker-protocol group description and read the hostfile's size.

    ``hostfile``: ring, a JSON array whose entry i is rank i's ``"ip:port"`` (MLX's
    list-of-lists form is accepted too); JACCL, a square JSON matrix of RDMA device names
    (``null`` on the diagonal). Raises ValueError naming what to change.
    """
    import json

    backend = (backend or "ring").strip().lower()
    if backend not in BACKENDS:
        raise ValueError(
            f"distributed backend must be one of {', '.join(BACKENDS)}, got {backend!r}"
        )
    if not hostfile:
        raise ValueError(
            "a distributed group needs a hostfile (--hostfile or option hostfile:PATH)"
        )
    path = os.path.abspath(os.path.expanduser(hostfile))
    try:
        with open(path, encoding="utf-8") as f:
            entries = json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read hostfile {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"hostfile {path} is not valid JSON: {exc}") from None
    example = '["192.168.1.10:5555", "192.168.1.11:5555"]'
    if backend == "ring":
        ok = isinstance(entries, list) and all(
            _is_address(e) or (isinstance(e, list) and e and all(_is_address(a) for a in e))
            for e in entries
        )
        if not ok:
            raise ValueError(
                f'ring hostfile {path} must be a JSON array of "ip:port" strings, entry i '
                f"being rank i's listen address, e.g. {example}"
            )
    else:
        ok = isinstance(entries, list) and all(
            isinstance(row, list)
            and len(row) == len(entries)
            and all(d is None or isinstance(d, str) for d in row)
            for row in entries
        )
        if not ok:
            raise ValueError(
                f"JACCL hostfile {path} must be a square JSON matrix of RDMA device names "
                'with null on the diagonal, e.g. [[null, "rdma_en2"], ["rdma_en2", null]]'
            )
    size = len(entries)
    if size < 2:
        raise ValueError(f"hostfile {path} lists {size} rank(s); a group needs at least 2")
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside hostfile {path}, which has ranks 0..{size - 1}")
    coordinator = (coordinator or "").strip() if backend == "jaccl" else ""
    if coordinator and not _is_address(coordinator):
        raise ValueError(f"the JACCL coordinator must be ip:port, got {coordinator!r}")
    if backend == "ring":
        meet = entries[0] if isinstance(entries[0], str) else entries[0][0]
    else:
        meet = coordinator
    return GroupSpec(path, backend, rank, size, coordinator, meet)


def _is_address(text: Any) -> bool:
    if not isinstance(text, str) or ":" not in text:
        return False
    host, port = text.rsplit(":", 1)
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def _init_spec(spec: GroupSpec, deadline: float) -> Any:
    """Set the environment MLX's backend reads and join; retry while peers refuse
    connections, until ``deadline`` (monotonic). Raises RuntimeError from MLX."""
    os.environ[RANK_ENV] = str(spec.rank)
    if spec.backend == "ring":
        os.environ["MLX_HOSTFILE"] = spec.hostfile
    else:
        os.environ["MLX_IBV_DEVICES"] = spec.hostfile
        if spec.coordinator:
            os.environ[COORDINATOR_ENV] = spec.coordinator
    if spec.rendezvous:
        _rendezvous(spec, deadline)
    else:
        logger.warning("JACCL without --coordinator: the wait for the other ranks is unbounded")
    while True:
        try:
            return mx.distributed.init(strict=True, backend=spec.backend)
        except RuntimeError as exc:
            # The ring backend's connecting side gives up after ~30 s ("Couldn't
            # connect"); a peer that is not up yet is normal here, so try again.
            if "connect" not in str(exc).lower() or time.monotonic() > deadline:
                raise
            logger.info("rank %d: the other ranks are not up yet (%s); retrying", spec.rank, exc)
            time.sleep(_RETRY_PAUSE)


def _rendezvous(spec: GroupSpec, deadline: float) -> None:
    """Meet every rank on rank 0's address before MLX's ``init``; JoinTimeout at
    ``deadline``.

    Why our own: MLX's ``init`` holds the GIL while its listening side waits for peers,
    with no timeout, which would freeze rank 0's gRPC server; these plain sockets wait
    without it. Rank 0 listens on its own hostfile address (MLX binds it right after),
    workers connect and send ``rank size``; once all ranks are in, rank 0 answers
    ``go`` and everyone calls ``init`` (whose connecting side retries for ~30 s).
    """
    import socket

    host, port = spec.rendezvous.rsplit(":", 1)
    host = host.strip("[]")
    hello = f"{spec.rank} {spec.size}\n".encode()
    if spec.rank == 0:
        _gather(spec, host, int(port), deadline)
        return
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise JoinTimeout(f"rank {spec.rank} waited for rank 0 at {spec.rendezvous}")
        try:
            with socket.create_connection((host, int(port)), timeout=min(left, 5.0)) as conn:
                conn.sendall(hello)
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                reply = conn.makefile("rb").readline().decode(errors="replace").strip()
        except (ConnectionError, OSError):  # rank 0 not up yet, or it dropped us
            time.sleep(_RETRY_PAUSE)
            continue
        if reply == "go":
            return
        if reply:
            raise RuntimeError(f"rank 0 at {spec.rendezvous} refused this rank: {reply}")
        time.sleep(_RETRY_PAUSE)


def _gather(spec: GroupSpec, host: str, port: int, deadline: float) -> None:
    """Rank 0's side of ``_rendezvous``: wait for ranks 1..size-1, then answer go."""
    import socket

    peers: dict[int, Any] = {}
    with socket.create_server((host, port), reuse_port=False) as server:
        server.settimeout(0.5)
        try:
            while len(peers) < spec.size - 1:
                if time.monotonic() > deadline:
                    raise JoinTimeout("rank 0 waited for the other ranks")
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                conn.settimeout(5.0)
                try:
                    rank, size = (int(x) for x in conn.makefile("rb").readline().split())
                except (OSError, ValueError):
                    conn.close()
                    continue
                if size != spec.size or not 0 < rank < spec.size:
                    conn.sendall(f"rank {rank} of {size} does not fit {spec.describe()}\n".encode())
                    conn.close()
                    continue
                if rank in peers:
                    peers.pop(rank).close()  # a restarted worker replaces its old link
                peers[rank] = conn
        except BaseException:
            for conn in peers.values():
                conn.close()
            raise
    for conn in peers.values():
        with contextlib.suppress(OSError):
            conn.sendall(b"go\n")
        conn.close()


class Joiner:
    """Joins one group for the life of the process, in a background thread.

    MLX's ``init`` has no timeout (the ring backend's listening side waits for its peers
    for ever), so it runs in a daemon thread and callers wait a bounded time. A wait
    that times out leaves the attempt running: the next ``join`` of the same spec waits
    for that same attempt; a different spec is refused (MLX joins one group per process).
    """

    def __init__(self) -> None:
        self.spec: GroupSpec | None = None
        self._future: Any = None
        self._lock = threading.Lock()

    def join(self, spec: GroupSpec, timeout: float) -> Any:
        """The group of ``spec`` (waiting up to ``timeout`` seconds).

        Raises JoinTimeout when the other ranks did not all connect in time, ValueError
        when this process already joins another group, RuntimeError from MLX otherwise.
        """
        import concurrent.futures

        with self._lock:
            if self.spec is not None and self.spec != spec:
                raise ValueError(
                    f"this process already joins {self.spec.describe()} as rank "
                    f"{self.spec.rank}; a process belongs to one group for its lifetime: "
                    "restart it to use another hostfile or backend"
                )
            if self._future is None or (self._future.done() and self._future.exception()):
                self.spec = spec
                self._future = concurrent.futures.Future()
                threading.Thread(
                    target=self._attempt,
                    args=(spec, self._future, time.monotonic() + timeout),
                    name="mlx-dist-join",
                    daemon=True,
                ).start()
            future = self._future
        try:
            return future.result(timeout=timeout)
        except (concurrent.futures.TimeoutError, JoinTimeout):
            raise JoinTimeout(
                f"rank {spec.rank} waited {timeout:g}s for the other ranks of {spec.describe()}"
            ) from None

    @staticmethod
    def _attempt(spec: GroupSpec, future: Any, deadline: float) -> None:
        try:
            future.set_result(_init_spec(spec, deadline))
        except BaseException as exc:  # handed to the waiting caller
            future.set_exception(exc)


def env_defaults() -> dict[str, str]:
    """The worker-protocol settings LocalAI passes through the environment."""
    return {
        "hostfile": os.environ.get(HOSTFILE_ENV, ""),
        "backend": os.environ.get(BACKEND_ENV, ""),
        "coordinator": os.environ.get(COORDINATOR_ENV, ""),
    }


def join_timeout_default() -> float:
    """``LOCALAI_MLX_JOIN_TIMEOUT`` (seconds, or "10m") or JOIN_TIMEOUT; ValueError names it."""
    from edge import lifecycle

    text = os.environ.get(JOIN_TIMEOUT_ENV, "").strip()
    if not text:
        return JOIN_TIMEOUT
    try:
        return lifecycle.parse_duration(text)
    except ValueError as exc:
        raise ValueError(f"{JOIN_TIMEOUT_ENV}: {exc}") from None


class JoinOnLoad(Engine):
    """Rank 0 of LocalAI's worker protocol: an ``Engine`` that joins its group at LoadModel.

    A LoadModel whose options (or ``defaults``: ``--hostfile``/``--backend``/
    ``--coordinator`` at start, else LocalAI's env) name a hostfile joins that group as
    rank 0 once, waiting up to ``join_timeout`` seconds for the workers, attaches a
    ``Coordinator`` (step timeout ``timeout`` seconds) and loads replicated; every later
    load stays in that group. Without a hostfile it is a plain single-process Engine.
    ``load`` raises ModelLoadError for a bad or different hostfile and for workers that
    did not connect in time (a later LoadModel keeps waiting for them).
    """

    def __init__(
        self,
        defaults: dict[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        join_timeout: float = JOIN_TIMEOUT,
    ) -> None:
        super().__init__()
        self.defaults = defaults if defaults is not None else env_defaults()
        self.step_timeout = timeout
        self.join_timeout = join_timeout
        self.joiner = Joiner()
        self.coordinator: Coordinator | None = None
        self._join_lock: Any = None  # an asyncio.Lock, made on the event loop

    async def load(self, params: LoadParams) -> None:
        import asyncio

        spec = self._wanted(params)
        if spec is not None and self.coordinator is None:
            if self._join_lock is None:
                self._join_lock = asyncio.Lock()
            async with self._join_lock:
                if self.coordinator is None:
                    await self._join(spec)
        if self.coordinator is not None:
            # Rank 0 decides the split; the workers apply the params it sends them.
            mode = params.distributed_mode or self.coordinator.mode
            params = dataclasses.replace(params, distributed_mode=mode)
        await super().load(params)

    def _wanted(self, params: LoadParams) -> GroupSpec | None:
        hostfile = params.hostfile or self.defaults.get("hostfile", "")
        if not hostfile:
            return None
        backend = params.distributed_backend or self.defaults.get("backend", "") or "ring"
        try:
            spec = group_spec(hostfile, backend, 0, self.defaults.get("coordinator", ""))
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
        joined = self.joiner.spec
        if joined is not None and joined != spec:
            raise ModelLoadError(
                f"this backend already serves {joined.describe()} as rank 0; a process "
                f"stays in one group: restart the backend to use {spec.describe()}"
            )
        return spec

    async def _join(self, spec: GroupSpec) -> None:
        import asyncio

        logger.info(
            "joining %s as rank 0; waiting up to %gs for the workers",
            spec.describe(),
            self.join_timeout,
        )
        loop = asyncio.get_running_loop()
        try:
            group = await loop.run_in_executor(None, self.joiner.join, spec, self.join_timeout)
        except JoinTimeout as exc:
            workers = ", ".join(str(r) for r in range(1, spec.size))
            raise ModelLoadError(
                f"{exc}: start ranks {workers} first (`local-ai worker mlx-distributed "
                f"--hostfile {spec.hostfile} --rank N`, or `run.sh --worker --hostfile "
                f"{spec.hostfile} --rank N`); the next LoadModel keeps waiting for them"
            ) from None
        except (RuntimeError, ValueError) as exc:
            raise ModelLoadError(f"cannot join {spec.describe()}: {exc}") from None
        coordinator = Coordinator(group, "tensor", self.step_timeout)
        coordinator.attach(self)  # before the first sync: the watchdog needs the engine
        await self.attach_group(coordinator)
        self.coordinator = coordinator
        logger.info("rank 0 of %d: joined %s", coordinator.size, spec.describe())


def run_worker(spec: GroupSpec, timeout: float, join_timeout: float) -> int:
    """A worker of LocalAI's protocol: join as ``spec.rank`` (waiting up to
    ``join_timeout`` seconds for rank 0 and the others), then follow rank 0 across every
    LoadModel and Free until it stops. Returns the exit code: 0 when rank 0 stopped the
    group, 1 when joining failed or the group broke."""
    logger.info(
        "rank %d: joining %s; waiting up to %gs for rank 0 (it joins at its first "
        "LoadModel with option hostfile:%s)",
        spec.rank,
        spec.describe(),
        join_timeout,
        spec.hostfile,
    )
    try:
        group = Joiner().join(spec, join_timeout)
    except JoinTimeout as exc:
        logger.error(
            "%s; giving up. Load a model on rank 0 with option hostfile:%s (or start it "
            "with --hostfile), or allow longer with --join-timeout / %s",
            exc,
            spec.hostfile,
            JOIN_TIMEOUT_ENV,
        )
        return 1
    except RuntimeError as exc:
        logger.error("rank %d cannot join %s: %s", spec.rank, spec.describe(), exc)
        return 1
    return follow(Coordinator(group, "tensor", timeout))
