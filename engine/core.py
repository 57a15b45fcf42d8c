"""The engine: the one thread that does all MLX work, its mailbox, and the async API.

Everything that touches MLX (load, prefill, decode, score, embed, free) runs on a single
engine thread, so the asyncio event loop that serves gRPC never blocks. Work reaches the
thread through one inbox queue: operations (load, free, score, ...) carry a
``concurrent.futures.Future``; generation requests arrive as ``Job`` objects and go to
the ``Scheduler``, which decodes them together (continuous batching). Results travel
back as values (``jobs.Event``; a future's result or exception), never as exceptions
across threads. A request reaches the thread after one prepare step on a worker pool
(``engine.prepare``: parse, constraint compile, render, tokenize); the thread receives
parsed values only (``params.GenerationRequest``, ``params.LoadParams``), never protobuf
messages.

The pattern follows mlx-lm's ``server.py`` (one generation thread, a request queue,
per-request response queues, a stop flag checked every step).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from engine import delivery, memory, model_calls, model_host, prepare
from engine import status as status_mod
from engine.jobs import DEFAULT_MAX_PENDING_EVENTS, Job
from engine.mailbox import STOP, WAKE, Call, Item, Mailbox, Stop, Submit, Wake
from engine.metrics import NULL, Recorder
from engine.scheduler import NO_GROUP, GroupHooks, RequestMetrics, Scheduler
from engine.status import StatusSnapshot
from errors import (
    BackendError,
    Cancelled,
    FailedPrecondition,
    ResourceExhausted,
    Unavailable,
)
from loading import loaded_model
from loading.loaded_model import LoadedModel
from params import LoadParams
from prompting import fit
from tasks import embedding, rerank, scoring

logger = logging.getLogger("localai.mlx." + __name__)

# Engine operations, by name. Distributed mode (GroupHooks.run) runs REPLICATED ones on
# every rank and LOCAL ones on rank 0 alone; anything else is refused there.
LOAD, FREE, SCORE, EMBED, INSTALL = "load", "free", "score", "embed", "install"
RERANK = "rerank"
ATTACH = "attach"  # join a distributed group after start (LocalAI's worker protocol)
TOKENIZE, DETOKENIZE, METADATA = "tokenize", "detokenize", "metadata"
REPLICATED_OPS = frozenset({LOAD, FREE, SCORE, EMBED, RERANK})
LOCAL_OPS = frozenset({TOKENIZE, DETOKENIZE, METADATA})
MEMORY_SNAPSHOT_INTERVAL = 0.05  # seconds between MLX memory readings while busy


class Prepared(Protocol):
    """A task's request as its ``prepare_on`` made it: ready for the engine thread."""

    @property
    def model_key(self) -> str:
        """The model it was made for (`LoadedModel.cache_key`)."""
        ...

    @property
    def tokens(self) -> int:
        """Its longest sequence, in tokens (what its KV holds at most)."""
        ...


@dataclass(frozen=True)
class Task:
    """A task other than generation, as the engine runs it: ``prepare_on(loaded,
    *request)`` on the prepare pool (measure, tokenize, check: no MLX), then ``run_on(loaded,
    prompt cache, prepared, should_stop)`` on the engine thread; ``rpc`` names it in errors.
    A new one is a module in tasks/ with those two functions, an entry in `TASKS` and an
    Engine method that calls `Engine._task`."""

    rpc: str
    prepare_on: Callable[..., Prepared]
    run_on: Callable[..., Any]

    def prepare(self, loaded: LoadedModel, budget: fit.NeverFits | None, *request: Any) -> Prepared:
        """``prepare_on``, then the memory decision a generation request takes
        (`prompting.fit.check_memory`, a rotating cache counted at its window):
        ResourceExhausted when its longest sequence can never fit ``budget``. Any thread."""
        prepared = self.prepare_on(loaded, *request)
        if budget is not None:
            fit.check_memory(budget, loaded, prepared.tokens, 0)
        return prepared

    def check(self, loaded: LoadedModel, prepared: Prepared) -> None:
        """FailedPrecondition when the model was replaced since ``prepared`` was made for
        it (its token ids may mean other tokens now). Rank 0 alone checks, before the task
        is replicated: the other ranks run it on the model rank 0 had them load (their own
        ``cache_key``s count their own loads)."""
        if prepared.model_key != loaded.cache_key:
            raise FailedPrecondition(
                f"the model was replaced while the {self.rpc} request was prepared: retry"
            )

    def run(
        self,
        host: model_host.ModelHost,
        should_stop: Callable[[], Callable[[], bool] | None],
        prepared: Prepared,
    ) -> Any:
        """``run_on`` of ``prepared`` on the loaded model, sharing the prompt cache;
        ``should_stop()``, read as it starts, steps the batch between its forward calls
        (`_Interleave`). Engine thread."""
        sched = host.scheduler
        cache = sched.cache if sched is not None else None
        return self.run_on(host.require(), cache, prepared, should_stop())


TASKS: dict[str, Task] = {
    SCORE: Task("Score", scoring.prepare_on, scoring.run_on),
    RERANK: Task("Rerank", rerank.prepare_on, rerank.run_on),
    EMBED: Task("Embedding", embedding.prepare_on, embedding.run_on),
}


class Engine:
    """Owns the loaded model and the single MLX thread.

    Public methods are called from the asyncio event loop; none of them blocks it.
    Errors raised: ``FailedPrecondition`` (no model), ``ResourceExhausted`` (queue full),
    ``NotFound`` (model identity mismatch), ``InvalidArgument`` (a request the client
    must change), ``Unavailable`` (a lost distributed rank);
    ``load`` raises ``ModelLoadError``.
    """

    def __init__(self, group: GroupHooks = NO_GROUP, metrics: Recorder = NULL) -> None:
        self.group = group
        self.metrics = metrics  # Prometheus series (engine.metrics); NULL when off
        self._inbox = Mailbox()
        self._thread = threading.Thread(target=self._run, name="mlx-engine", daemon=True)
        # Memory is read when the last request ends, so Status after a reply is current.
        self.host = model_host.ModelHost(
            self._record_metrics, group, self._snapshot_memory, metrics
        )
        self.queued = 0  # submitted but not yet seen by the engine thread
        self.counts_lock = threading.Lock()
        self._stopped = False
        self.mlx_memory_reading: dict[str, int] = status_mod.mlx_memory()
        self._memory_at = 0.0
        self.last_metrics = RequestMetrics()
        self._call_stop: threading.Event | None = None  # the running call's cancel flag
        self._interleave = _Interleave(self)
        self._idle = memory.IdleRelease(self._snapshot_memory)  # MLX's cache back when idle

    # ------------------------------------------------------------------ event-loop API
    def start(self) -> None:
        self._thread.start()

    @property
    def fatal(self) -> str | None:
        """Why this engine can never serve again, or None: a broken distributed group, or
        an engine thread that ended without being stopped (read from any thread)."""
        if self.group.failed:
            return f"the distributed group is broken ({self.group.failed})"
        if self._thread.ident is not None and not self._thread.is_alive() and not self._stopped:
            return "the engine thread died"
        return None

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

    async def call(self, op: str, *args: Any) -> Any:
        """Run engine operation ``op`` with ``args`` on the engine thread; await its result."""
        self._check_serving()
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        stop = threading.Event()  # set when the caller leaves (client gone, deadline passed)
        self._inbox.put(Call(op, args, fut, stop))
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
        if not self.group.single_process:
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
        return cast("model_calls.ModelMetadata", await self.call(METADATA))

    async def score(
        self,
        prompt: str,
        candidates: list[str],
        include_token_logprobs: bool,
        identity: str = "",
        stable_prefix_len: int = 0,
    ) -> list[scoring.CandidateResult]:
        """Joint log-probability of each candidate continuation (`tasks.scoring`;
        ``stable_prefix_len``: ScoreRequest's hint, characters of ``prompt`` that later
        requests share). A caller that leaves stops it between candidates."""
        request = (prompt, candidates, include_token_logprobs, stable_prefix_len)
        return cast("list[scoring.CandidateResult]", await self._task(SCORE, identity, *request))

    async def rerank(
        self, query: str, documents: list[str], top_n: int, identity: str = ""
    ) -> rerank.RerankOutput:
        """``documents`` ranked by relevance to ``query`` (`tasks.rerank`)."""
        out = await self._task(RERANK, identity, query, documents, top_n)
        return cast("rerank.RerankOutput", out)

    async def embed(
        self, text: str, token_ids: list[int], identity: str = ""
    ) -> embedding.EmbeddingOutput:
        """Pooled final hidden states of ``text`` or ``token_ids`` (`tasks.embedding`)."""
        out = await self._task(EMBED, identity, text, token_ids)
        return cast("embedding.EmbeddingOutput", out)

    async def _task(self, op: str, identity: str, *request: Any) -> Any:
        """Task ``op`` (`TASKS`) of ``request``: prepared for the model serving now on the
        prepare pool, off the engine thread (`Task.prepare`), then run on it (`Task.run`)."""
        loaded = self.serving(identity)
        sched = self.host.scheduler_for(loaded)
        budget = sched.memory if sched is not None else None
        prepared = await prepare.off_engine(TASKS[op].prepare, loaded, budget, *request)
        return await self.call(op, prepared)

    async def tokenize(self, text: str, identity: str = "") -> list[int]:
        return await prepare.off_engine(model_calls.tokenize, self.serving(identity), text)

    async def detokenize(self, ids: list[int]) -> str:
        return cast("str", await self.call(DETOKENIZE, ids))

    def serving(self, identity: str = "") -> LoadedModel:
        """The model a new request will run on; the one check a request's model passes.

        Raises Unavailable when a distributed rank is lost, FailedPrecondition while
        stopping or before LoadModel, NotFound on a model identity mismatch (``identity``:
        the request's ``ModelIdentity``; empty skips the check).
        """
        self._check_serving()
        loaded = self.host.require()
        fit.check_identity(identity, loaded)
        return loaded

    def _check_serving(self) -> None:
        """Unavailable once a rank is lost; FailedPrecondition once this engine serves no more."""
        self.group.check()
        if not self.alive:
            fatal = self.fatal
            raise FailedPrecondition(
                f"{fatal}; retry once the backend has restarted"
                if fatal
                else "the server is shutting down; retry on another backend"
            )

    async def submit(self, message: Any, loaded: LoadedModel) -> Job:
        """Prepare the Predict request ``message`` for ``loaded`` (what ``serving``
        returned) in one hop off the event loop (`engine.prepare`: parse, constraint
        compile, render, tokenize, fit) and queue it; returns its Job.

        Raises InvalidArgument for anything the request must change, ResourceExhausted
        when ``max_batch_size + max_queue`` requests are already in flight or the memory
        budget can never hold it. Every error comes before the job is queued; a model
        replaced meanwhile fails the job when it is admitted. The engine thread receives
        the parsed request only.
        """
        self._reserve(loaded)
        try:
            sched = self.host.scheduler_for(loaded)  # None: admission refuses the job
            intake = prepare.Intake(
                loaded,
                memory=sched.memory if sched is not None else None,
                boundaries=sched is not None and sched.wants_boundaries,
            )
            prepared = await prepare.run(message, intake)
            job = Job.prepared(
                prepared,
                loop=asyncio.get_running_loop(),
                wake=self._wake,
                max_pending=loaded.params.max_pending_events or DEFAULT_MAX_PENDING_EVENTS,
            )
        except BaseException:
            with self.counts_lock:
                self.queued -= 1
            raise
        self._inbox.put(Submit(job))
        return job

    def _reserve(self, loaded: LoadedModel) -> None:
        p = loaded.params
        sched = self.scheduler
        with self.counts_lock:
            running = (sched.running + len(sched.waiting)) if sched is not None else 0
            in_flight = running + self.queued
            if in_flight >= p.max_batch_size + p.max_queue:
                raise ResourceExhausted(
                    f"server busy: {in_flight} requests in flight (max_batch_size="
                    f"{p.max_batch_size}, max_queue={p.max_queue}); retry later"
                )
            self.queued += 1

    def facts(self) -> status_mod.EngineFacts:
        """What `engine.status` reads, taken now from any thread (counts under the lock)."""
        sched = self.scheduler
        with self.counts_lock:
            running = sched.running if sched is not None else 0
            waiting = (len(sched.waiting) if sched is not None else 0) + self.queued
        return status_mod.EngineFacts(
            sched, self.loaded, self.group, self.alive, running, waiting,
            self.mlx_memory_reading, self.last_metrics.draft_tokens_accepted,
        )  # fmt: skip

    def status(self) -> StatusSnapshot:
        """A snapshot safe to take from any thread, without waiting for the engine
        (`engine.status.snapshot`)."""
        return status_mod.snapshot(self.facts())

    def info(self) -> dict[str, Any]:
        """Engine facts for operators (GetMetrics; `engine.status.info`)."""
        return status_mod.info(self.facts())

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel all work, free the model and end the engine thread."""
        if self._thread.is_alive():
            self._inbox.put(STOP)
            self._thread.join(timeout)
        self._stopped = True

    def _wake(self) -> None:
        self._inbox.put(WAKE)

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        try:
            self._serve_forever()
        except BaseException:  # a bug outside one job's handling: this thread is done
            logger.exception("the engine thread died")
            self.fail_everything(Unavailable("the engine thread died; the backend restarts"))

    def _serve_forever(self) -> None:
        while True:
            # Distributed: even an idle rank 0 syncs every heartbeat, so a lost rank shows.
            sched = self.scheduler
            busy = (sched is not None and sched.busy) or self._inbox.has_deferred
            idle_wait = self._idle.wait(busy, self.group.heartbeat)  # read each time
            try:
                item = self._inbox.next(block=not busy, timeout=idle_wait)
            except queue.Empty:
                item = None
            while item is not None:
                if isinstance(item, Stop):
                    self.group.close()  # the other ranks exit too
                    self.shutdown()
                    return
                self._handle(item)
                try:
                    item = self._inbox.next(block=False)
                except queue.Empty:
                    item = None
            if not self._step():
                return
            self._idle.tick(busy or (self.scheduler is not None and self.scheduler.busy))

    @delivery.in_steps  # one hand-off of its events to each event loop
    def _step(self) -> bool:
        """One step of the running set: reap and admit, then decode one token for every
        active sequence; False when this thread must end (a failed distributed step).

        The one step body: the main loop runs it, and so does a long call between its
        chunks (`_Interleave`). A failed step fails the batch, not the process.
        """
        sched = self.scheduler
        try:
            if sched is not None:
                sched.tick()
            active = sched is not None and bool(sched.active)
            idle = sched is None or not sched.busy
            # Distributed: the other ranks apply this iteration's joins and leaves,
            # then step with us; raises once a rank is lost.
            self.group.sync(active, idle)
            if active and sched is not None:
                sched.step()
            self._snapshot_memory(throttle=sched is not None and sched.busy)
        except Exception as exc:  # keep serving: fail the batch, not the process
            fatal = self.group.abort(exc)
            if fatal is not None:
                # Ranks cannot be resynchronized after a failed step: fail everything
                # and stop this thread (status ERROR).
                self.fail_everything(fatal)
                return False
            logger.exception("engine step failed")
            if sched is not None:
                sched.fail_all(BackendError(f"generation failed: {exc}"))
                sched.reset_batch()
        return True

    def _handle(self, item: Item) -> None:
        if isinstance(item, Call):
            fut = item.future
            if not fut.set_running_or_notify_cancel():
                return
            # Only a single process may stop a call midway: ranks must run the same steps.
            self._call_stop = item.stop if self.group.single_process else None
            try:
                if item.op in TASKS:  # rank 0 alone (`Task.check`)
                    TASKS[item.op].check(self.host.require(), item.args[0])
                fut.set_result(self.group.run(item.op, item.args, self.local_op(item.op)))
            except BaseException as exc:  # handed to the awaiting coroutine
                fut.set_exception(exc)
            finally:
                self._call_stop = None
            self._snapshot_memory()
        elif isinstance(item, Submit):
            job = item.job
            with self.counts_lock:
                self.queued -= 1
                if self.scheduler is not None:
                    self.scheduler.enqueue(job)
                    return
            job.fail(FailedPrecondition("the model was freed while the request waited"))

    def local_op(self, op: str) -> Callable[..., Any]:
        """The function that performs engine operation ``op`` on this process.

        Distributed followers call it directly for the operations rank 0 replicates.
        """
        if op in TASKS:
            return functools.partial(TASKS[op].run, self.host, self._interleave.should_stop)
        host = self.host
        ops: dict[str, Callable[..., Any]] = {
            LOAD: host.load,
            FREE: host.free,
            INSTALL: host.install_built,
            ATTACH: self._attach,
            TOKENIZE: lambda text: model_calls.tokenize(host.require(), text),
            DETOKENIZE: lambda ids: model_calls.detokenize(host.require(), ids),
            METADATA: lambda: model_calls.metadata(host.require()),
        }
        return ops[op]

    def _snapshot_memory(self, throttle: bool = False) -> None:
        now = time.monotonic()
        if throttle and now - self._memory_at < MEMORY_SNAPSHOT_INTERVAL:
            return
        self._memory_at = now
        self.mlx_memory_reading = status_mod.mlx_memory()
        if self.metrics.enabled:
            status_mod.push_gauges(self.facts(), self.metrics)

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
        self._inbox.drain(error, self._unqueue)

    def _unqueue(self, item: Submit) -> None:
        with self.counts_lock:
            self.queued -= 1


class _Interleave:
    """Lets a long call on the engine thread (Score, Embedding) share it with generation:
    between its candidates and forward chunks, new requests are admitted and the running
    batch decodes one step; the call stops when its caller has left."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def should_stop(self) -> Callable[[], bool] | None:
        """The check to call between chunks; None in distributed mode, where every rank
        must run the same steps in the same order."""
        stop = self.engine._call_stop
        if stop is None:
            return None

        def check() -> bool:
            self._step()
            return stop.is_set()

        return check

    def _step(self) -> None:
        engine = self.engine
        if engine.scheduler is None:
            return
        # New requests join now; other calls wait (in order) until this one has ended.
        for item in engine._inbox.arrived():
            if isinstance(item, Submit):
                engine._handle(item)
            elif not isinstance(item, Wake):
                engine._inbox.defer(item)
        engine._step()  # single process only (`should_stop`): a failed step fails the batch
