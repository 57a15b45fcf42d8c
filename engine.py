"""The engine: owns the model, tokenizer, prompt cache and the one thread that does all MLX work.

Everything that touches MLX (load, tokenize, prefill, decode, free) runs on a single
engine thread, so the asyncio event loop that serves gRPC never blocks. Work reaches the
thread through one inbox queue: plain calls (load, free, tokenize) carry a
``concurrent.futures.Future``; generation requests arrive as ``Job`` objects. Concurrent
jobs are decoded together by mlx-lm's ``BatchGenerator`` (continuous batching): newcomers
join a running batch between steps, finished or cancelled sequences leave it, and each
sequence keeps its own sampler, logits processors, stop tokens and prompt-cache entry.

Results travel back as ``Event`` values on a per-job asyncio queue
(``loop.call_soon_threadsafe``); errors travel as values too, never as exceptions across
threads. The pattern follows mlx-lm's ``server.py`` (one generation thread, a request
queue, per-request response queues, a stop flag checked every step).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import gc
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map
from mlx_lm.generate import (
    BatchGenerator,
    StopSequences,
    generate_step,
    speculative_generate_step,
)
from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache, make_prompt_cache

import cpu_fast_path
import grammar
import model_loader
import prompt as prompt_mod
import sampling
import scoring
from errors import (
    BackendError,
    Cancelled,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from output import Delta, OutputPipeline, initial_state_for
from params import GenerationParams, LoadParams, parse_tools
from prompt_cache import PromptCache

logger = logging.getLogger("localai.mlx.engine")

DEFAULT_MAX_BATCH_SIZE = 8  # sequences decoded together (option ``max_batch_size``)
DEFAULT_MAX_QUEUE = 64  # requests waiting for a batch slot (option ``max_queue``)
DEFAULT_PREFILL_STEP = 512  # prompt tokens per prefill chunk (option ``prefill_step_size``)


@dataclass(frozen=True)
class Event:
    """One step of a request's result, as the servicer sees it.

    ``delta`` is the new output since the previous event (possibly empty). Counters are
    running totals: ``tokens`` generated so far, ``prompt_tokens`` the whole prompt
    (cached or not). Timings are milliseconds: ``prompt_ms`` from admission to the first
    generated token (TTFT minus queueing), ``generation_ms`` since the first token.
    The last event has ``finish_reason`` ("stop", "length", "cancelled") or ``error``.
    """

    delta: Delta
    prompt_tokens: int
    tokens: int
    prompt_ms: float
    generation_ms: float
    cached_tokens: int = 0
    finish_reason: str | None = None
    error: BackendError | None = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None


class Job:
    """One generation request: created on the event loop, run on the engine thread.

    Iterate ``events()`` on the event loop; call ``cancel()`` from anywhere (idempotent):
    the engine drops the sequence at its next step and keeps its KV in the prompt cache.
    """

    def __init__(
        self,
        request: Any,
        params: GenerationParams,
        loop: asyncio.AbstractEventLoop,
        engine: Engine,
    ) -> None:
        self.request = request
        self.params = params
        self._loop = loop
        self._engine = engine
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._cancelled = threading.Event()
        self.submitted = time.perf_counter()
        # Engine-thread state.
        self.uid: int | None = None
        self.pipeline: OutputPipeline | None = None
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.tokens = 0
        self.t_admit = 0.0
        self.t_first: float | None = None
        self.max_tokens = params.max_tokens
        self.solo: SoloRun | None = None  # set when decoded outside the batch
        self.drafted = 0  # tokens accepted from the draft model
        self.done = False

    # -- event-loop side ---------------------------------------------------------------
    def cancel(self) -> None:
        if not self._cancelled.is_set():
            self._cancelled.set()
            self._engine._wake()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    async def events(self) -> AsyncIterator[Event]:
        """Yield events until the final one (which carries finish_reason or error)."""
        while True:
            event = await self._queue.get()
            yield event
            if event.final:
                return

    # -- engine-thread side ------------------------------------------------------------
    def emit(self, event: Event) -> None:
        # A closed event loop (RuntimeError) means nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    def timings(self, now: float) -> tuple[float, float]:
        if self.t_first is None:
            return (now - self.t_admit) * 1000.0 if self.t_admit else 0.0, 0.0
        return (self.t_first - self.t_admit) * 1000.0, (now - self.t_first) * 1000.0

    def event(self, delta: Delta, **kw: Any) -> Event:
        prompt_ms, gen_ms = self.timings(time.perf_counter())
        return Event(
            delta=delta,
            prompt_tokens=self.prompt_tokens,
            tokens=self.tokens,
            prompt_ms=prompt_ms,
            generation_ms=gen_ms,
            cached_tokens=self.cached_tokens,
            **kw,
        )


class SoloRun:
    """A sequence decoded outside the batch: its step generator, KV cache and token ids."""

    def __init__(self, steps, kv: list, tokens: list[int], cache_key: str) -> None:
        self.steps = steps
        self.kv = kv
        self.tokens = tokens  # prompt + generated ids; the KV holds exactly these at the end
        self.cache_key = cache_key

    def finish(self) -> tuple[list, list[int]] | None:
        """Close the generator; return (kv, tokens) when the KV holds exactly ``tokens``.

        mlx-lm's step generators have fed every yielded token into the KV; the speculative
        one rewinds rejected draft tokens when closed. Any surplus is trimmed; a cache
        that cannot be made to match is not returned (and so never stored).
        """
        self.steps.close()
        n = len(self.tokens)
        for c in self.kv:
            offset = getattr(c, "offset", None)
            if not isinstance(offset, int):
                return None
            if offset > n and c.is_trimmable():
                c.trim(offset - n)
            if c.offset != n:
                return None
        for c in self.kv:
            _compact(c)
        return self.kv, self.tokens


def _compact(cache: Any) -> None:
    """Drop the unused tail of a (quantized) KV cache's step-grown buffers before it is kept.

    mlx-lm grows KV buffers 256 tokens at a time; a cache entry should cost what it holds.
    Rotating caches keep their circular layout and are left alone.
    """
    if type(cache) not in (KVCache, QuantizedKVCache) or cache.keys is None:
        return
    n = cache.offset
    cache.keys, cache.values = tree_map(
        lambda x: mx.contiguous(x[..., :n, :]), (cache.keys, cache.values)
    )
    mx.eval(cache.keys, cache.values)


@dataclass(frozen=True)
class StatusSnapshot:
    """What Status reports: state name, request counts, memory in bytes."""

    state: str  # UNINITIALIZED | BUSY | READY | ERROR
    running: int
    waiting: int
    memory: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelMetadata:
    """What the tokenizer says about thinking and tool calls (mlx-lm's TokenizerWrapper)."""

    supports_thinking: bool
    rendered_template: str  # a one-user-turn probe rendered with thinking enabled
    tool_format: str  # mlx-lm tool parser name, e.g. "json_tools"; "" when none
    tool_call_start: str
    tool_call_end: str
    think_start: str
    think_end: str


@dataclass(frozen=True)
class RequestMetrics:
    """Metrics of the last finished (or current) request, for GetMetrics."""

    tokens_per_second: float = 0.0
    tokens_generated: int = 0
    prompt_tokens_processed: int = 0
    draft_tokens_accepted: int = 0


class Engine:
    """Owns the loaded model and the single MLX thread.

    Public methods are called from the asyncio event loop; none of them blocks it.
    Errors raised: ``FailedPrecondition`` (no model), ``ResourceExhausted`` (queue full),
    ``NotFound`` (model identity mismatch); model-load failures raise
    ``model_loader.ModelLoadError`` or ``ValueError`` from ``load``.
    """

    def __init__(self) -> None:
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="mlx-engine", daemon=True)
        self._model = None
        self._tokenizer = None
        self._cache: PromptCache | None = None
        self._gen: BatchGenerator | None = None
        self._eos_stops: StopSequences | None = None
        self._context_len: int | None = None
        self._model_key = ""
        self.load_params: LoadParams | None = None
        self.model_name = ""
        self.model_identity = ""
        self.max_batch_size = DEFAULT_MAX_BATCH_SIZE
        self.max_queue = DEFAULT_MAX_QUEUE
        self._prefill_step = DEFAULT_PREFILL_STEP
        self._max_kv_size: int | None = None
        self._kv_bits: int | None = None
        self._kv_group_size = 64
        self._quantized_kv_start = 0
        self._draft = None  # speculative-decoding draft model
        self._num_draft_tokens = 3
        self._solo_uid = 0  # solo sequences get negative ids, apart from BatchGenerator's
        self._active: dict[int, Job] = {}
        self._waiting: deque[Job] = deque()
        self._queued = 0  # submitted but not yet seen by the engine thread
        self._count_lock = threading.Lock()
        self._weights_bytes = 0
        self._kv_bytes = 0
        self._stopped = False
        self.last_metrics = RequestMetrics()
        self.cpu_mode = ""
        self.blas: dict | None = None  # on CPU: which BLAS MLX's float32 matmuls run on
        # Distributed mode only (distributed.Coordinator, set before start() on every rank):
        # rank 0 shares each step's joins and leaves with the other ranks through it.
        self.coordinator: Any = None

    # ------------------------------------------------------------------ event-loop API
    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        if self.coordinator is not None and self.coordinator.failed:
            return False  # a lost rank: nothing can run until the group is restarted
        return self._thread.is_alive() and not self._stopped

    @property
    def loaded(self) -> bool:
        return self._model is not None

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the engine thread and await its result (or exception)."""
        if self.coordinator is not None:
            self.coordinator.check()  # Unavailable once a rank is lost
        if not self.alive:
            raise FailedPrecondition("the engine is stopped; restart the backend")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(("call", fn, args, fut))
        return await asyncio.wrap_future(fut)

    async def load(self, params: LoadParams) -> None:
        """Load (or replace) the model; raises ModelLoadError / ValueError on failure."""
        await self.call(self._load, params)

    async def free(self) -> None:
        """Drop model, tokenizer, prompt cache and batch; release MLX memory."""
        await self.call(self._free)

    async def metadata(self) -> ModelMetadata:
        """Capabilities of the loaded model's tokenizer (thinking, tool-call markers)."""
        return await self.call(self._metadata)

    async def score(
        self, prompt: str, candidates: list[str], include_token_logprobs: bool, identity: str = ""
    ) -> list:
        """Joint log-probability of each candidate continuation (scoring.score)."""
        self.check_identity(identity)
        return await self.call(self._score, prompt, candidates, include_token_logprobs)

    async def embed(self, text: str, token_ids: list[int], identity: str = ""):
        """Pooled final hidden states of ``text`` or ``token_ids`` (scoring.embed)."""
        self.check_identity(identity)
        return await self.call(self._embed, text, token_ids)

    async def tokenize(self, text: str, identity: str = "") -> list[int]:
        self.check_identity(identity)
        return await self.call(self._tokenize, text)

    async def detokenize(self, ids: list[int]) -> str:
        return await self.call(self._detokenize, ids)

    def submit(self, request: Any, params: GenerationParams) -> Job:
        """Queue a generation request; returns its Job at once (never blocks).

        Raises FailedPrecondition before LoadModel, NotFound on a model identity
        mismatch, ResourceExhausted when ``max_batch_size + max_queue`` requests are
        already in flight; Unavailable when a distributed rank is lost.
        """
        if self.coordinator is not None:
            self.coordinator.check()
        if not self.alive:
            raise FailedPrecondition("the server is shutting down; retry on another backend")
        if self._model is None:
            raise FailedPrecondition("no model loaded: call LoadModel first")
        self.check_identity(params.model_identity)
        with self._count_lock:
            in_flight = len(self._active) + len(self._waiting) + self._queued
            if in_flight >= self.max_batch_size + self.max_queue:
                raise ResourceExhausted(
                    f"server busy: {in_flight} requests in flight (max_batch_size="
                    f"{self.max_batch_size}, max_queue={self.max_queue}); retry later"
                )
            self._queued += 1
        job = Job(request, params, asyncio.get_running_loop(), self)
        self._inbox.put(("job", job))
        return job

    def check_identity(self, identity: str) -> None:
        """NotFound when both the request's and the loaded ModelOptions.Model are non-empty
        and differ (LocalAI's router matches the text "model identity mismatch")."""
        if identity and self.model_identity and identity != self.model_identity:
            raise NotFound(
                f"model identity mismatch: request is for '{identity}' but this "
                f"backend serves '{self.model_identity}'"
            )

    def status(self) -> StatusSnapshot:
        """A snapshot safe to take from any thread, without waiting for the engine."""
        with self._count_lock:
            running, waiting = len(self._active), len(self._waiting) + self._queued
        if self.coordinator is not None and self.coordinator.failed:
            state = "ERROR"
        elif self._model is None:
            state = "UNINITIALIZED"
        elif not self.alive:
            state = "ERROR"
        else:
            state = "BUSY" if running or waiting else "READY"
        memory = {
            "weights": self._weights_bytes,
            "kv_active": self._kv_bytes,
            "prompt_cache": self._cache.nbytes if self._cache is not None else 0,
            "mlx_active": mx.get_active_memory(),
            "mlx_peak": mx.get_peak_memory(),
            "mlx_cache": mx.get_cache_memory(),
        }
        if self.coordinator is not None:
            memory.update(self.coordinator.memory())  # group_size, weights_rank_<i>
        return StatusSnapshot(state, running, waiting, memory)

    def cache_stats(self):
        return self._cache.stats() if self._cache is not None else None

    def info(self) -> dict:
        """Engine facts for operators (GetMetrics): model, CPU weight mode, BLAS, batch, cache."""
        snap = self.status()
        stats = self.cache_stats()
        return {
            "model": self.model_name,
            "state": snap.state,
            "requests_running": snap.running,
            "requests_waiting": snap.waiting,
            "max_batch_size": self.max_batch_size,
            "max_queue": self.max_queue,
            "cpu_mode": self.cpu_mode,
            "kv_bits": self._kv_bits,
            "draft_model": bool(self._draft is not None),
            "last_request_draft_tokens_accepted": self.last_metrics.draft_tokens_accepted,
            "blas": self.blas,
            "prompt_cache": dataclasses.asdict(stats) if stats is not None else None,
            "distributed": self.coordinator.info() if self.coordinator is not None else None,
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
        coord = self.coordinator  # None in a single process
        # Distributed: even an idle rank 0 syncs every heartbeat, so a lost rank shows.
        idle_wait = coord.heartbeat if coord is not None else None
        while True:
            busy = bool(self._active or self._waiting)
            try:
                item = self._inbox.get(block=not busy, timeout=idle_wait)
            except queue.Empty:
                item = None
            while item is not None:
                if item[0] == "stop":
                    if coord is not None:
                        coord.close()  # the other ranks exit too
                    self._shutdown()
                    return
                self._handle(item)
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    item = None
            try:
                self._reap_cancelled()
                self._admit()
                if coord is not None:
                    # The other ranks apply this iteration's joins and leaves, then step
                    # with us (distributed.follow); raises once a rank is lost.
                    coord.sync(step=bool(self._active))
                if self._active:
                    self._step()
                self._kv_bytes = self._gen.prompt_cache_nbytes if self._active else 0
            except Exception as exc:  # keep serving: fail the batch, not the process
                if coord is not None:
                    # Ranks cannot be resynchronized after a failed step: fail everything
                    # with UNAVAILABLE and stop this thread (status ERROR).
                    coord.abort(self, exc)
                    return
                logger.exception("engine step failed")
                self._fail_all(BackendError(f"generation failed: {exc}"))
                self._reset_batch()

    def _handle(self, item: tuple) -> None:
        kind = item[0]
        if kind == "call":
            _, fn, args, fut = item
            if not fut.set_running_or_notify_cancel():
                return
            if self.coordinator is not None:
                # Distributed (rank 0): load, free, score and embed run on every rank;
                # other calls that would run the model here alone are refused.
                fn = self.coordinator.route(self, fn)
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # handed to the awaiting coroutine
                fut.set_exception(exc)
        elif kind == "job":
            job = item[1]
            with self._count_lock:
                self._queued -= 1
                self._waiting.append(job)

    # -- model lifecycle
    def _load(self, params: LoadParams) -> None:
        if self.coordinator is not None:
            # Distributed: every rank loads its own shard of the model (distributed.py).
            self.coordinator.load(self, params)
            return
        limits = self._check_load(params)
        self._fail_all(FailedPrecondition("the model is being replaced; retry the request"))
        self._unload()
        model, tokenizer = model_loader.load_model(
            params.model,
            params.model_file,
            params.model_path,
            trust_remote_code=params.trust_remote_code,
            tokenizer_config=params.tokenizer_config,
            adapter_path=params.lora_adapter,
            lora_scale=params.lora_scale,
        )
        opts = params.options
        # On CPU: float32 parameters, and dense weights on the fast BLAS when they fit.
        self.cpu_mode = cpu_fast_path.prepare_for_cpu(
            model, opts.get("cpu_dequantize"), opts.get("cpu_dequantize_budget")
        )
        # Dense weights: merge a LoRA adapter in (no per-token cost); quantized: keep it apart.
        model_loader.fuse_adapters(model)
        if mx.default_device().type == mx.DeviceType.cpu:
            report = cpu_fast_path.blas_report()
            self.blas = {"library": report.library, "gflops": report.gflops, "fast": report.fast}
        draft = self._load_draft(params, tokenizer) if params.draft_model else None
        self._install(model, tokenizer, params, limits, draft)
        # llguidance's view of the vocabulary takes ~2 s to build and needs no MLX: build
        # it off this thread, so the first constrained request does not stall the batch.
        threading.Thread(target=_warm_grammar, args=(tokenizer,), daemon=True).start()

    def _check_load(self, params: LoadParams) -> tuple[int, int, int]:
        """Validate a load before touching the current model; returns the engine limits.

        Resolve and validate first: a load that names a missing model or a bad option
        leaves the current model serving. Raises ModelLoadError / ValueError.
        """
        model_loader.resolve_model(params.model, params.model_file, params.model_path)
        if params.lora_adapter:
            model_loader.resolve_adapter(params.lora_adapter, params.model_path)
        limits = _engine_limits(params.options)
        scoring.embedding_settings(params.options)  # a bad option keeps the current model
        return limits

    def _load_draft(self, params: LoadParams, tokenizer: Any) -> Any:
        """The speculative-decoding draft model; its vocabulary must be the main model's."""
        draft, draft_tok = model_loader.load_model(
            params.draft_model,
            "",
            params.model_path,
            trust_remote_code=params.trust_remote_code,
            tokenizer_config=params.tokenizer_config,
        )
        if draft_tok.get_vocab() != tokenizer.get_vocab():
            raise ValueError(
                f"DraftModel {params.draft_model!r} has a different vocabulary from the main "
                "model; speculative decoding needs the same tokenizer"
            )
        cpu_fast_path.prepare_for_cpu(
            draft, params.options.get("cpu_dequantize"), params.options.get("cpu_dequantize_budget")
        )
        return draft

    async def install(
        self, model: Any, tokenizer: Any, params: LoadParams, draft: Any = None
    ) -> None:
        """Serve an already-built model and tokenizer (tests, embedding applications)."""
        limits = _engine_limits(params.options)
        await self.call(self._install, model, tokenizer, params, limits, draft)

    def _install(
        self, model: Any, tokenizer: Any, params: LoadParams, limits: tuple, draft: Any = None
    ) -> None:
        self._fail_all(FailedPrecondition("the model is being replaced; retry the request"))
        self.max_batch_size, self.max_queue, self._prefill_step = limits
        self._model, self._tokenizer = model, tokenizer
        self._cache = PromptCache(params.max_cache_entries, params.max_cache_bytes)
        self._eos_stops = StopSequences([(t,) for t in sorted(tokenizer.eos_token_ids)])
        self._max_kv_size = params.max_kv_size
        self._kv_bits = params.kv_bits
        self._kv_group_size = params.kv_group_size
        self._quantized_kv_start = params.quantized_kv_start
        self._num_draft_tokens = params.num_draft_tokens
        self._draft = draft
        self._reset_batch()
        self._weights_bytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
        self._context_len = params.context_size or _model_context(model)
        self.load_params = params
        self.model_name = params.model or params.model_file
        self.model_identity = params.model  # LocalAI records ModelOptions.Model alone
        self._model_key = f"{self.model_name}:{id(model)}"
        logger.info(
            "loaded %s: %.1f MB weights, context %s tokens, max_batch_size %d",
            self.model_name,
            self._weights_bytes / 1e6,
            self._context_len,
            self.max_batch_size,
        )

    def _reset_batch(self) -> None:
        if self._gen is not None:
            self._gen.close()
        self._gen = None
        if self._model is not None:
            self._gen = BatchGenerator(
                self._model,
                stop_tokens=[[t] for t in sorted(self._tokenizer.eos_token_ids)],
                completion_batch_size=self.max_batch_size,
                prefill_batch_size=self.max_batch_size,
                prefill_step_size=self._prefill_step,
                max_kv_size=self._max_kv_size,
            )
        self._kv_bytes = 0

    def _unload(self) -> None:
        if self._gen is not None:
            self._gen.close()
        self._gen = None
        self._model = self._tokenizer = self._draft = None
        if self._cache is not None:
            self._cache.clear()
        self._cache = None
        self._weights_bytes = self._kv_bytes = 0
        self.model_name = self.model_identity = ""
        self.load_params = None
        gc.collect()
        mx.clear_cache()

    def _free(self) -> None:
        self._fail_all(FailedPrecondition("the model was freed"))
        self._unload()

    def _shutdown(self) -> None:
        self._fail_all(Cancelled("the server is shutting down"))
        self._unload()
        self._stopped = True

    def _require_tokenizer(self):
        if self._tokenizer is None:
            raise FailedPrecondition("no model loaded: call LoadModel first")
        return self._tokenizer

    def _tokenize(self, text: str) -> list[int]:
        return prompt_mod.encode(self._require_tokenizer(), text)

    def _metadata(self) -> ModelMetadata:
        tok = self._require_tokenizer()
        rendered = ""
        if getattr(tok, "has_chat_template", False):
            try:
                rendered = tok.apply_chat_template(
                    [{"role": "user", "content": "Hello"}],
                    tokenize=False,
                    add_generation_prompt=True,
                    enable_thinking=True,
                )
            except Exception as exc:  # a template that needs other inputs: report none
                logger.warning("chat template did not render a probe conversation: %s", exc)
        parser = getattr(tok, "tool_parser", None)
        return ModelMetadata(
            supports_thinking=bool(getattr(tok, "has_thinking", False)),
            rendered_template=rendered,
            tool_format=getattr(parser, "__module__", "").rsplit(".", 1)[-1] if parser else "",
            tool_call_start=getattr(tok, "tool_call_start", None) or "",
            tool_call_end=getattr(tok, "tool_call_end", None) or "",
            think_start=getattr(tok, "think_start", None) or "",
            think_end=getattr(tok, "think_end", None) or "",
        )

    # Score and Embedding run inline between batch steps: they pause decoding meanwhile.
    def _score(self, prompt: str, candidates: list[str], include: bool) -> list:
        if self._model is None:
            raise FailedPrecondition("no model loaded: call LoadModel first")
        try:
            return scoring.score(
                self._model,
                self._tokenizer,
                prompt,
                candidates,
                include_token_logprobs=include,
                cache=self._cache,
                model_key=self._model_key,
                context_len=self._context_len,
                prefill_step=self._prefill_step,
                max_kv_size=self._max_kv_size,
            )
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None

    def _embed(self, text: str, token_ids: list[int]):
        if self._model is None:
            raise FailedPrecondition("no model loaded: call LoadModel first")
        pooling, normalize = scoring.embedding_settings(self.load_params.options)
        kw = dict(pooling=pooling, normalize=normalize, context_len=self._context_len)
        try:
            if token_ids:
                return scoring.embed_tokens(self._model, token_ids, step=self._prefill_step, **kw)
            return scoring.embed(self._model, self._tokenizer, text, step=self._prefill_step, **kw)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None

    def _detokenize(self, ids: list[int]) -> str:
        tokenizer = self._require_tokenizer()
        vocab = len(tokenizer)
        bad = [i for i in ids if i < 0 or i >= vocab]
        if bad:
            raise InvalidArgument(f"tokens {bad[:5]} are outside the vocabulary [0, {vocab})")
        return tokenizer.decode(ids)

    # -- scheduling
    def _admit(self) -> None:
        while self._waiting and len(self._active) < self.max_batch_size:
            with self._count_lock:
                job = self._waiting.popleft()
            if job.cancelled:
                self._end(job, error=Cancelled("cancelled before it started"))
                continue
            try:
                self._insert(job)
            except BackendError as exc:
                self._end(job, error=exc)
            except ValueError as exc:
                self._end(job, error=InvalidArgument(str(exc)))

    def _insert(self, job: Job) -> None:
        if self._model is None:
            raise FailedPrecondition("no model loaded: call LoadModel first")
        job.t_admit = time.perf_counter()
        tokenizer, params = self._tokenizer, job.params
        prepared = prompt_mod.prepare_prompt(job.request, tokenizer)
        ids = list(prepared.token_ids)
        if not ids:
            raise InvalidArgument(
                "the prompt is empty: set Prompt, or Messages with UseTokenizerTemplate"
            )
        max_tokens = params.max_tokens
        rotating = self._max_kv_size is not None
        if self._context_len and not rotating:
            if len(ids) >= self._context_len:
                raise InvalidArgument(
                    f"the prompt is {len(ids)} tokens but the context holds {self._context_len}: "
                    "shorten the prompt or raise ContextSize"
                )
            max_tokens = min(max_tokens, self._context_len - len(ids))
        job.max_tokens = max_tokens
        job.pipeline = OutputPipeline(
            tokenizer,
            stop=params.stop,
            top_logprobs=params.top_logprobs if params.logprobs else None,
            temperature=params.temperature,
            initial_state=initial_state_for(tokenizer, ids),
            tools=parse_tools(job.request.Tools),
        )
        if self.coordinator is not None:
            # Distributed: every rank samples this sequence, so pick its seed once, here.
            job.params = self.coordinator.pin_seed(job.params)
        self._start(job, ids)

    def _start(self, job: Job, ids: list[int]) -> None:
        """Put an admitted job's prompt ``ids`` into the batch (or a solo run).

        Fetches the prompt cache and builds the sampler from ``job.params``; uses
        ``job.max_tokens``. In distributed mode every rank runs this for every job.
        """
        tokenizer, params = self._tokenizer, job.params
        rotating = self._max_kv_size is not None
        solo = self._draft is not None or self._kv_bits is not None or (rotating and params.keep)
        cache_key = self._model_key + ("+draft" if self._draft is not None else "")
        # Sampler and processors first: a request they refuse (e.g. a bad grammar) must
        # not have touched the prompt cache, whose order every rank keeps the same.
        sampler = sampling.make_sampler(params, tokenizer)
        processors = sampling.make_logits_processors(params, tokenizer)
        lookup = self._cache.fetch(cache_key, ids)
        job.prompt_tokens, job.cached_tokens = len(ids), lookup.cached_tokens
        if solo:
            self._solo_uid -= 1
            job.uid = self._solo_uid
            job.solo = self._solo_run(job, ids, lookup, sampler, processors, cache_key)
        else:
            (job.uid,) = self._gen.insert(
                [lookup.rest],
                max_tokens=[job.max_tokens],
                caches=[lookup.kv] if lookup.kv is not None else None,
                all_tokens=[ids[: lookup.cached_tokens]],
                samplers=[sampler],
                logits_processors=[processors],
                stop_sequences=[
                    self._eos_stops if self._stops_at_eos(params) else StopSequences(None)
                ],
            )
        self._active[job.uid] = job
        if self.coordinator is not None:
            self.coordinator.joined(job, ids)  # rank 0: the other ranks start it too

    def _solo_run(self, job: Job, ids, lookup, sampler, processors, cache_key: str) -> SoloRun:
        """A sequence decoded on its own with mlx-lm's generate_step / speculative step.

        For what BatchGenerator cannot batch (a draft model, a quantized KV cache, a
        rotating cache with NKeep). mlx-lm's server runs such requests one at a time; here
        each is a generator stepped once per engine iteration, interleaved with the batch.
        """
        params = job.params
        kv = lookup.kv
        if kv is None:
            if self._max_kv_size is not None:
                keep = params.keep or 4  # mlx-lm's default
                kv = [
                    RotatingKVCache(max_size=self._max_kv_size, keep=keep)
                    for _ in range(len(self._model.layers))
                ]
            else:
                kv = make_prompt_cache(self._model)
            if self._draft is not None:
                kv = kv + make_prompt_cache(self._draft)
        prompt = mx.array(lookup.rest, dtype=mx.uint32)
        common = dict(
            max_tokens=job.max_tokens,
            sampler=sampler,
            logits_processors=processors or None,
            prompt_cache=kv,
            prefill_step_size=self._prefill_step,
            kv_bits=self._kv_bits,
            kv_group_size=self._kv_group_size,
            quantized_kv_start=self._quantized_kv_start,
        )
        if self._draft is not None:
            steps = speculative_generate_step(
                prompt,
                self._model,
                self._draft,
                num_draft_tokens=params.num_draft_tokens or self._num_draft_tokens,
                **common,
            )
        else:
            steps = generate_step(prompt, self._model, **common)
        return SoloRun(steps, kv, list(ids), cache_key)

    def _reap_cancelled(self) -> None:
        for job in [j for j in self._waiting if j.cancelled]:
            with self._count_lock:
                self._waiting.remove(job)
            self._end(job, error=Cancelled("cancelled before it started"))
        for job in [j for j in self._active.values() if j.cancelled]:
            self._retire(job, "cancelled")

    def _step(self) -> None:
        if any(job.solo is None for job in self._active.values()):
            _, responses = self._gen.next()
            for r in responses:
                job = self._active.get(r.uid)
                if job is not None:
                    kv = (r.prompt_cache, r.all_tokens) if r.finish_reason else None
                    self._on_token(job, r.token, r.logprobs, r.finish_reason, kv)
        for job in [j for j in self._active.values() if j.solo is not None]:
            self._solo_step(job)

    @staticmethod
    def _stops_at_eos(params: GenerationParams) -> bool:
        # A finished grammar allows only EOS, so a constrained request stops there even
        # with IgnoreEOS (else it would emit EOS until max_tokens).
        return not params.ignore_eos or params.constraint is not None

    def _solo_step(self, job: Job) -> None:
        try:
            token, logprobs, *drafted = next(job.solo.steps)
        except StopIteration:
            self._retire(job, "length")
            return
        token = int(token)
        job.solo.tokens.append(token)
        if drafted and drafted[0]:
            job.drafted += 1
        finish = None
        if token in self._tokenizer.eos_token_ids and self._stops_at_eos(job.params):
            finish = "stop"
        elif job.tokens + 1 >= job.max_tokens:
            finish = "length"
        self._on_token(job, token, logprobs, finish)

    def _on_token(self, job: Job, token: int, logprobs, finish: str | None, kv=None) -> None:
        """One generated token of an active job: output deltas, stop handling, retiring."""
        if job.t_first is None:
            job.t_first = time.perf_counter()
        job.tokens += 1
        delta = job.pipeline.feed(token, logprobs if job.params.logprobs else None)
        if finish is not None:
            self._retire(job, finish, delta, kv)
        elif job.pipeline.stopped:
            self._retire(job, "stop", delta)
        elif delta:
            job.emit(job.event(delta))

    def _retire(self, job: Job, reason: str, delta: Delta | None = None, kv=None) -> None:
        """End an active job: keep its KV in the prompt cache, flush its output."""
        if self.coordinator is not None:
            self.coordinator.left(job)  # rank 0: the other ranks retire it too
        key = self._model_key
        if job.solo is not None:
            key, kv = job.solo.cache_key, job.solo.finish()
        elif kv is None:
            kv = self._gen.remove([job.uid], return_prompt_caches=True).get(job.uid)
        if kv is not None and kv[0] and kv[1] and job.params.cache_write:
            try:
                self._cache.insert(key, list(kv[1]), kv[0])
            except ValueError:  # a KV/token mismatch must not leave the client hanging
                logger.exception("prompt cache refused the KV of request %s", job.uid)
        final = job.pipeline.finish(reason)
        if delta:
            job.emit(job.event(delta))
        # Flushing held text can complete a stop sequence: the pipeline has the last word.
        self._end(job, final=final, reason=job.pipeline.finish_reason or reason)

    def _end(
        self,
        job: Job,
        *,
        final: Delta | None = None,
        reason: str | None = None,
        error: BackendError | None = None,
    ) -> None:
        if job.done:
            return
        job.done = True
        if job.uid is not None:
            self._active.pop(job.uid, None)
        # Metrics first: a client may ask GetMetrics as soon as it has the final event.
        self._log(job, reason or (error.status if error else "?"))
        job.emit(job.event(final or Delta(), finish_reason=reason, error=error))

    def _log(self, job: Job, outcome: str) -> None:
        now = time.perf_counter()
        _, gen_ms = job.timings(now)
        tps = (job.tokens - 1) / (gen_ms / 1000.0) if gen_ms > 0 and job.tokens > 1 else 0.0
        ttft = ((job.t_first or now) - job.submitted) * 1000.0
        if job.tokens:
            self.last_metrics = RequestMetrics(
                tps, job.tokens, job.prompt_tokens - job.cached_tokens, job.drafted
            )
        logger.info(
            "request %s: prompt=%d cached=%d generated=%d ttft=%.1fms tok/s=%.1f finish=%s%s",
            job.params.correlation_id or "-",
            job.prompt_tokens,
            job.cached_tokens,
            job.tokens,
            ttft,
            tps,
            outcome,
            f" drafted={job.drafted}" if job.solo is not None and self._draft is not None else "",
        )

    def _fail_all(self, error: BackendError) -> None:
        for job in list(self._active.values()):
            if job.solo is not None:
                job.solo.steps.close()
            elif self._gen is not None and job.uid is not None:
                self._gen.remove([job.uid])
            self._end(job, error=error)
        while self._waiting:
            with self._count_lock:
                job = self._waiting.popleft()
            self._end(job, error=error)


def _warm_grammar(tokenizer: Any) -> None:
    try:
        grammar.warm_up(tokenizer)
    except ValueError as exc:  # a slow tokenizer: constrained requests will say so
        logger.warning("constrained decoding unavailable for this tokenizer: %s", exc)


def _engine_limits(opts: dict) -> tuple[int, int, int]:
    """(max_batch_size, max_queue, prefill_step_size) from load options; ValueError names one."""
    return (
        _positive_int(opts, "max_batch_size", DEFAULT_MAX_BATCH_SIZE),
        _positive_int(opts, "max_queue", DEFAULT_MAX_QUEUE, allow_zero=True),
        _positive_int(opts, "prefill_step_size", DEFAULT_PREFILL_STEP),
    )


def _positive_int(opts: dict, key: str, default: int, allow_zero: bool = False) -> int:
    value = opts.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < (0 if allow_zero else 1):
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"option {key} must be a {kind} integer, got {value!r}")
    return value


def _model_context(model) -> int | None:
    args = getattr(model, "args", None)
    for name in ("max_position_embeddings", "context_length", "max_seq_len"):
        value = getattr(args, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
