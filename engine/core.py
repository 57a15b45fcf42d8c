"""The engine: the one thread that does all MLX work, its mailbox, and the async API.

Everything that touches MLX (load, prefill, decode, score, embed, free) runs on a single
engine thread, so the asyncio event loop that serves gRPC never blocks. Work reaches the
thread through one inbox queue: operations (load, free, score, ...) carry a
``concurrent.futures.Future``; generation requests arrive as ``Job`` objects and go to
the ``Scheduler``, which decodes them together (continuous batching). Results travel
back as values (``jobs.Event``; a future's result or exception), never as exceptions
across threads. The engine receives parsed values only (``params.GenerationRequest``,
``params.LoadParams``), never protobuf messages.

The pattern follows mlx-lm's ``server.py`` (one generation thread, a request queue,
per-request response queues, a stop flag checked every step).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from caches import prompt_tiers
from engine import model_calls, model_host
from engine import prompt as prompt_mod
from engine.jobs import DEFAULT_MAX_PENDING_EVENTS, Job
from engine.scheduler import NO_GROUP, GroupHooks, RequestMetrics, Scheduler
from errors import (
    BackendError,
    Cancelled,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from loading import loaded_model
from loading.loaded_model import LoadedModel
from params import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_QUEUE, GenerationRequest, LoadParams
from tasks import scoring

logger = logging.getLogger("localai.mlx." + __name__)

# Engine operations, by name. Distributed mode (GroupHooks.run) runs REPLICATED ones on
# every rank and LOCAL ones on rank 0 alone; anything else is refused there.
LOAD, FREE, SCORE, EMBED, INSTALL = "load", "free", "score", "embed", "install"
ATTACH = "attach"  # join a distributed group after start (LocalAI's worker protocol)
TOKENIZE, DETOKENIZE, METADATA = "tokenize", "detokenize", "metadata"
REPLICATED_OPS = frozenset({LOAD, FREE, SCORE, EMBED})
LOCAL_OPS = frozenset({TOKENIZE, DETOKENIZE, METADATA})
MEMORY_SNAPSHOT_INTERVAL = 0.05  # seconds between MLX memory readings while busy

# Tokenizing and rendering prompts runs here: off the event loop and off the engine thread.
_PROMPT_WORKERS = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="prompt")


@dataclass(frozen=True)
class StatusSnapshot:
    """What Status reports: state name, request counts, memory in bytes."""

    state: str  # UNINITIALIZED | BUSY | READY | ERROR
    running: int
    waiting: int
    memory: dict[str, int] = field(default_factory=dict)


class Engine:
    """Owns the loaded model and the single MLX thread.

    Public methods are called from the asyncio event loop; none of them blocks it.
    Errors raised: ``FailedPrecondition`` (no model), ``ResourceExhausted`` (queue full),
    ``NotFound`` (model identity mismatch), ``InvalidArgument`` (a prompt the model
    cannot take), ``Unavailable`` (a lost distributed rank); ``load`` raises
    ``ModelLoadError``.
    """

    def __init__(self, group: GroupHooks = NO_GROUP) -> None:
        self.group = group
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="mlx-engine", daemon=True)
        # Memory is read when the last request ends, so Status after a reply is current.
        self.host = model_host.ModelHost(self._record_metrics, group, self._snapshot_memory)
        self._queued = 0  # submitted but not yet seen by the engine thread
        self._count_lock = threading.Lock()
        self._stopped = False
        self._memory: dict[str, int] = _mlx_memory()
        self._memory_at = 0.0
        self.last_metrics = RequestMetrics()
        self._call_stop: threading.Event | None = None  # the running call's cancel flag
        self._deferred: deque[tuple] = deque()  # mailbox items set aside while a call ran

    # ------------------------------------------------------------------ event-loop API
    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        if self.group.failed:
            return False  # a lost rank: nothing can run until the group is restarted
        return self._thread.is_alive() and not self._stopped

    @property
    def loaded(self) -> LoadedModel | None:
        """The model being served (None before LoadModel); read from any thread."""
        return self.host.loaded

    @property
    def scheduler(self) -> Scheduler | None:
        return self.host.scheduler

    @property
    def load_params(self) -> LoadParams | None:
        """The loaded model's parameters (request defaults); None before LoadModel."""
        loaded = self.loaded
        return loaded.params if loaded is not None else None

    @property
    def model_identity(self) -> str:
        loaded = self.loaded
        return loaded.identity if loaded is not None else ""

    async def call(self, op: str, *args: Any) -> Any:
        """Run engine operation ``op`` with ``args`` on the engine thread; await its result."""
        self.group.check()  # Unavailable once a rank is lost
        if not self.alive:
            raise FailedPrecondition("the engine is stopped; restart the backend")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        stop = threading.Event()  # set when the caller leaves (client gone, deadline passed)
        self._inbox.put(("call", op, args, fut, stop))
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            stop.set()
            raise

    async def load(self, params: LoadParams) -> None:
        """Load (or replace) the model; raises ModelLoadError on failure.

        Resolving the files (a Hugging Face download, minutes maybe) happens on a worker
        thread first, so running streams and Health go on meanwhile; a model that cannot
        be found leaves the current one serving.
        """
        loop = asyncio.get_running_loop()
        file_bytes = await loop.run_in_executor(None, loaded_model.validate, params)
        await self.call(LOAD, params, file_bytes)

    async def attach_group(self, group: GroupHooks) -> None:
        """Serve as rank 0 of ``group`` from now on (LocalAI's worker protocol joins at
        LoadModel, after the engine started). Runs on the engine thread: the current
        model is released (its requests fail FAILED_PRECONDITION) so that every rank
        starts from the same state; the next replicated LOAD fills it. Only once, from
        the single-process state; FailedPrecondition otherwise."""
        await self.call(ATTACH, group)

    def _attach(self, group: GroupHooks) -> None:
        if self.group is not NO_GROUP:
            raise FailedPrecondition("this backend already belongs to a distributed group")
        self.host.unload(FailedPrecondition("the backend is joining a distributed group; retry"))
        self.group = self.host.group = group

    async def install(self, model: Any, tokenizer: Any, params: LoadParams) -> None:
        """Serve an already-built model and tokenizer (tests, embedding applications)."""
        await self.call(INSTALL, model, tokenizer, params)

    async def free(self) -> None:
        """Drop model, tokenizer, prompt cache and batch; release MLX memory."""
        await self.call(FREE)

    async def metadata(self) -> model_calls.ModelMetadata:
        """Capabilities of the loaded model's tokenizer (thinking, tool-call markers)."""
        return await self.call(METADATA)

    async def score(
        self,
        prompt: str,
        candidates: list[str],
        include_token_logprobs: bool,
        identity: str = "",
        stable_prefix_len: int = 0,
    ) -> list:
        """Joint log-probability of each candidate continuation (scoring.score).

        ``stable_prefix_len``: ScoreRequest's hint, characters of ``prompt`` that later
        requests share (a prefill checkpoint there on caches that cannot be trimmed).
        Raises InvalidArgument for too many or empty candidates before anything runs;
        a caller that leaves stops the scoring between candidates.
        """
        self.check_identity(identity)
        try:
            scoring.check_candidates(candidates)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        return await self.call(
            SCORE, prompt, candidates, include_token_logprobs, max(0, stable_prefix_len)
        )

    async def embed(self, text: str, token_ids: list[int], identity: str = ""):
        """Pooled final hidden states of ``text`` or ``token_ids`` (scoring.embed)."""
        self.check_identity(identity)
        return await self.call(EMBED, text, token_ids)

    async def tokenize(self, text: str, identity: str = "") -> list[int]:
        self.check_identity(identity)
        return await self.call(TOKENIZE, text)

    async def detokenize(self, ids: list[int]) -> str:
        return await self.call(DETOKENIZE, ids)

    async def submit(self, request: GenerationRequest) -> Job:
        """Prepare ``request``'s prompt off the event loop and queue it; returns its Job.

        Raises FailedPrecondition before LoadModel, NotFound on a model identity
        mismatch, InvalidArgument for a prompt the template refuses or the context
        cannot hold, ResourceExhausted when ``max_batch_size + max_queue`` requests are
        already in flight; Unavailable when a distributed rank is lost. Every error
        comes before the job is queued.
        """
        loaded = self._admissible(request)
        self._reserve(loaded)
        sched = self.scheduler
        # Prefill snapshots: models whose cache cannot be trimmed (scheduler.checkpointing).
        checkpoints = sched is not None and sched.wants_boundaries
        try:
            loop = asyncio.get_running_loop()
            prepared = await loop.run_in_executor(
                _PROMPT_WORKERS,
                prompt_mod.prepare_prompt,
                request.prompt,
                loaded.tokenizer,
                None if loaded.params.max_kv_size else loaded.context_len,
                loaded.max_token_chars,
                checkpoints,
            )
            job = Job(
                request,
                prepared.token_ids,
                prepared.initial_state,
                loop=loop,
                wake=self._wake,
                model_serial=loaded.serial,
                max_pending=loaded.params.max_pending_events or DEFAULT_MAX_PENDING_EVENTS,
                checkpoints=prepared.checkpoints,
            )
        except BaseException as exc:
            with self._count_lock:
                self._queued -= 1
            if isinstance(exc, ValueError):
                raise InvalidArgument(str(exc)) from None
            raise
        self._inbox.put(("job", job))
        return job

    def _admissible(self, request: GenerationRequest) -> LoadedModel:
        self.group.check()
        if not self.alive:
            raise FailedPrecondition("the server is shutting down; retry on another backend")
        loaded = self.loaded
        if loaded is None:
            raise FailedPrecondition("no model loaded: call LoadModel first")
        self.check_identity(request.params.model_identity)
        return loaded

    def _reserve(self, loaded: LoadedModel) -> None:
        p = loaded.params
        sched = self.scheduler
        with self._count_lock:
            running = (len(sched.active) + len(sched.waiting)) if sched is not None else 0
            in_flight = running + self._queued
            if in_flight >= p.max_batch_size + p.max_queue:
                raise ResourceExhausted(
                    f"server busy: {in_flight} requests in flight (max_batch_size="
                    f"{p.max_batch_size}, max_queue={p.max_queue}); retry later"
                )
            self._queued += 1

    def check_identity(self, identity: str) -> None:
        """NotFound when both the request's and the loaded ModelOptions.Model are non-empty
        and differ (LocalAI's router matches the text "model identity mismatch")."""
        serving = self.model_identity
        if identity and serving and identity != serving:
            raise NotFound(
                f"model identity mismatch: request is for '{identity}' but this "
                f"backend serves '{serving}'"
            )

    def status(self) -> StatusSnapshot:
        """A snapshot safe to take from any thread, without waiting for the engine.

        MLX memory figures come from the engine thread's last reading (taken after every
        operation and, while busy, every ``MEMORY_SNAPSHOT_INTERVAL`` seconds).
        """
        sched = self.scheduler
        with self._count_lock:
            running = len(sched.active) if sched is not None else 0
            waiting = (len(sched.waiting) if sched is not None else 0) + self._queued
        if self.group.failed:
            state = "ERROR"
        elif self.loaded is None:
            state = "UNINITIALIZED"
        elif not self.alive:
            state = "ERROR"
        else:
            state = "BUSY" if running or waiting else "READY"
        loaded = self.loaded
        memory = {
            "weights": loaded.weights_bytes if loaded is not None else 0,
            "kv_active": sched.kv_bytes if sched is not None else 0,
            "prompt_cache": sched.cache.nbytes if sched is not None else 0,
            **prompt_tiers.disk_memory(sched.cache if sched is not None else None),
            # the part of prompt_cache held by prefill snapshots (checkpoints)
            "prompt_cache_checkpoints": sched.cache.checkpoint_nbytes if sched is not None else 0,
            **self._memory,
            **self.group.memory(),  # distributed: group_size, weights_rank_<i>
        }
        return StatusSnapshot(state, running, waiting, memory)

    def cache_stats(self):
        sched = self.scheduler
        return sched.cache.stats() if sched is not None else None

    def info(self) -> dict:
        """Engine facts for operators (GetMetrics): model, CPU weight mode, BLAS, batch, cache."""
        snap = self.status()
        stats = self.cache_stats()
        loaded = self.loaded
        p = loaded.params if loaded is not None else None
        return {
            "model": loaded.name if loaded is not None else "",
            "state": snap.state,
            "requests_running": snap.running,
            "requests_waiting": snap.waiting,
            "max_batch_size": p.max_batch_size if p else DEFAULT_MAX_BATCH_SIZE,
            "max_queue": p.max_queue if p else DEFAULT_MAX_QUEUE,
            "cpu_mode": loaded.cpu_mode if loaded is not None else "",
            "kv_bits": p.kv_bits if p else None,
            "draft_model": bool(loaded is not None and loaded.draft is not None),
            "speculative": (p.speculative or ("draft" if p.draft_model else "")) if p else "",
            "last_request_draft_tokens_accepted": self.last_metrics.draft_tokens_accepted,
            "blas": loaded.blas if loaded is not None else None,
            "prompt_cache": (
                dict(dataclasses.asdict(stats), disk=prompt_tiers.disk_info(self.scheduler.cache))
                if stats is not None
                else None
            ),
            "distributed": self.group.info(),
        }

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel all work, free the model and end the engine thread."""
        if self._thread.is_alive():
            self._inbox.put(("stop",))
            self._thread.join(timeout)
        self._stopped = True

    def _wake(self) -> None:
        self._inbox.put(("wake",))

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        while True:
            # Distributed: even an idle rank 0 syncs every heartbeat, so a lost rank shows.
            idle_wait = self.group.heartbeat  # read each time: attach_group may change it
            sched = self.scheduler
            busy = (sched is not None and sched.busy) or bool(self._deferred)
            try:
                item = self._next_item(block=not busy, timeout=idle_wait)
            except queue.Empty:
                item = None
            while item is not None:
                if item[0] == "stop":
                    self.group.close()  # the other ranks exit too
                    self.shutdown()
                    return
                self._handle(item)
                try:
                    item = self._next_item(block=False)
                except queue.Empty:
                    item = None
            sched = self.scheduler
            try:
                if sched is not None:
                    sched.tick()
                active = sched is not None and bool(sched.active)
                idle = sched is None or not sched.busy
                # Distributed: the other ranks apply this iteration's joins and leaves,
                # then step with us; raises once a rank is lost.
                self.group.sync(active, idle)
                if active:
                    sched.step()
                self._snapshot_memory(throttle=sched is not None and sched.busy)
            except Exception as exc:  # keep serving: fail the batch, not the process
                fatal = self.group.abort(exc)
                if fatal is not None:
                    # Ranks cannot be resynchronized after a failed step: fail everything
                    # and stop this thread (status ERROR).
                    self.fail_everything(fatal)
                    return
                logger.exception("engine step failed")
                if sched is not None:
                    sched.fail_all(BackendError(f"generation failed: {exc}"))
                    sched.reset_batch()

    def _next_item(self, block: bool, timeout: float | None = None) -> tuple:
        """The next mailbox item: first those set aside while a call ran (in order)."""
        if self._deferred:
            return self._deferred.popleft()
        if block:
            return self._inbox.get(timeout=timeout)
        return self._inbox.get_nowait()

    def _handle(self, item: tuple) -> None:
        kind = item[0]
        if kind == "call":
            _, op, args, fut, stop = item
            if not fut.set_running_or_notify_cancel():
                return
            # Only a single process may stop a call midway: ranks must run the same steps.
            self._call_stop = stop if self.group is NO_GROUP else None
            try:
                fut.set_result(self.group.run(op, args, self.local_op(op)))
            except BaseException as exc:  # handed to the awaiting coroutine
                fut.set_exception(exc)
            finally:
                self._call_stop = None
            self._snapshot_memory()
        elif kind == "job":
            job = item[1]
            with self._count_lock:
                self._queued -= 1
                if self.scheduler is not None:
                    self.scheduler.enqueue(job)
                    return
            job.fail(FailedPrecondition("the model was freed while the request waited"))

    def local_op(self, op: str) -> Callable[..., Any]:
        """The function that performs engine operation ``op`` on this process.

        Distributed followers call it directly for the operations rank 0 replicates.
        """
        host = self.host
        return {
            LOAD: host.load,
            FREE: host.free,
            SCORE: lambda *args: host.score(*args, should_stop=self._should_stop()),
            EMBED: lambda *args: host.embed(*args, should_stop=self._should_stop()),
            INSTALL: host.install_built,
            ATTACH: self._attach,
            TOKENIZE: host.tokenize,
            DETOKENIZE: host.detokenize,
            METADATA: host.metadata,
        }[op]

    def _snapshot_memory(self, throttle: bool = False) -> None:
        now = time.monotonic()
        if throttle and now - self._memory_at < MEMORY_SNAPSHOT_INTERVAL:
            return
        self._memory_at = now
        self._memory = _mlx_memory()

    # -- model lifecycle (engine thread): the ModelHost does the work
    def _record_metrics(self, metrics: RequestMetrics) -> None:
        self.last_metrics = metrics

    def shutdown(self) -> None:
        """End every job (CANCELLED), free the model; the engine stops serving."""
        self.host.unload(Cancelled("the server is shutting down"))
        self._stopped = True

    def fail_everything(self, error: BackendError) -> None:
        """End every job, queued ones and pending calls included, with ``error``."""
        if self.scheduler is not None:
            self.scheduler.fail_all(error)
        self.drain_inbox(error)

    def fail_from_outside(self, error: BackendError) -> None:
        """Another thread (a watchdog) found the engine thread stuck: end every job.

        Jobs are only marked done and told; the stuck thread's own state is left alone.
        """
        sched = self.scheduler
        if sched is not None:
            for job in sched.jobs():
                job.fail(error)
        self.drain_inbox(error)

    def drain_inbox(self, error: BackendError) -> None:
        """Fail queued jobs and calls with ``error``; keep a stop request."""
        keep = []
        while True:
            try:
                item = self._next_item(block=False)
            except queue.Empty:
                break
            if item[0] == "job":
                with self._count_lock:
                    self._queued -= 1
                item[1].fail(error)
            elif item[0] == "call":
                fut = item[3]
                if fut.set_running_or_notify_cancel():
                    fut.set_exception(error)
            elif item[0] == "stop":
                keep.append(item)
        for item in keep:
            self._inbox.put(item)

    def _should_stop(self) -> Callable[[], bool] | None:
        """For Score and Embedding: called between candidates and forward chunks, it lets
        the running streams decode one step, then says whether the caller has left.

        None in distributed mode: every rank must run the same steps in the same order.
        """
        stop = self._call_stop
        if stop is None:
            return None

        def check() -> bool:
            self._step_between()
            return stop.is_set()

        return check

    def _step_between(self) -> None:
        # A long Score must not stall generation: one batch step per check point.
        sched = self.scheduler
        if sched is None:
            return
        # New requests join now; other calls wait (in order) until this one has ended.
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if item[0] == "job":
                self._handle(item)
            elif item[0] != "wake":
                self._deferred.append(item)
        try:
            sched.tick()
            if sched.active:
                sched.step()
            self._snapshot_memory(throttle=True)
        except Exception as exc:  # as in the main loop: fail the batch, not the call
            logger.exception("engine step failed")
            sched.fail_all(BackendError(f"generation failed: {exc}"))
            sched.reset_batch()


def _mlx_memory() -> dict[str, int]:
    return {
        "mlx_active": mx.get_active_memory(),
        "mlx_peak": mx.get_peak_memory(),
        "mlx_cache": mx.get_cache_memory(),
    }
