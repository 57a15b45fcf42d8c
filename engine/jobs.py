"""One generation request in flight: the `Job` handle and the `Event`s it produces.

A `Job` is created on the event loop by `Engine.submit`, run on the engine thread by the
`Scheduler`, and read back on the event loop through `events()`. Events cross threads as
values (`loop.call_soon_threadsafe`), errors included. The buffer between the two sides
is bounded: a streaming client that stops reading while its generation goes on has its
job ended (RESOURCE_EXHAUSTED) once `max_pending` events wait undelivered, and its KV is
released, instead of the server buffering every remaining token.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from decoding.output import Delta
from errors import BackendError
from params import GenerationRequest

# Undelivered events one job may accumulate (about one per generated token) before the
# scheduler ends it: a client that has not read for this many tokens is not reading.
DEFAULT_MAX_PENDING_EVENTS = 4096


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

    ``request`` is the parsed request; ``prompt_ids`` its token ids (the servicer side
    tokenizes, off the engine thread); ``initial_state`` the output pipeline's starting
    state; ``model_serial`` the loaded model the ids were made for; ``checkpoints`` token
    positions (ascending) where the scheduler may snapshot the prefill for later prompts
    sharing that prefix (see `prompt.chat_boundary`). Iterate ``events()``
    on the event loop; call ``cancel()`` from anywhere (idempotent): the scheduler drops
    the sequence at its next step and keeps its KV in the prompt cache.
    """

    def __init__(
        self,
        request: GenerationRequest,
        prompt_ids: tuple[int, ...] = (),
        initial_state: str = "normal",
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        wake: Callable[[], None] = lambda: None,
        model_serial: int = 0,
        max_pending: int = DEFAULT_MAX_PENDING_EVENTS,
        checkpoints: tuple[int, ...] = (),
    ) -> None:
        self.request = request
        self.params = request.params
        self.prompt_ids = prompt_ids
        self.initial_state = initial_state
        self.checkpoints = checkpoints
        self.model_serial = model_serial
        self.max_pending = max_pending
        self._loop = loop
        self._wake = wake
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._cancelled = threading.Event()
        self.submitted = time.perf_counter()
        # Engine-thread state (the scheduler's).
        self.uid: int | None = None
        self.pipeline: Any = None  # output.OutputPipeline once admitted
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.tokens = 0
        self.t_admit = 0.0
        self.t_first: float | None = None
        self.t_last = 0.0  # when the latest token was decoded (inter-token latency)
        self.max_tokens = self.params.max_tokens
        self.kv_tokens = 0  # tokens its KV may reach; what the memory budget reserved
        self.runner: Any = None  # the engine.sequences runner decoding it, once started
        self.drafted = 0  # tokens accepted from a draft
        self.spec_stats: Any = None  # ngram_spec.NgramStats of an n-gram speculative run
        self.snapshots: frozenset[int] = frozenset()  # positions the scheduler snapshots
        self.vision: Any = None  # engine.vision_prompt.VisionPrompt of an image request
        self.processors: list = []  # its logits processors (a grammar's reports a failure)
        self.done = False  # the final event was sent; set once, under _done_lock
        self._done_lock = threading.Lock()

    # -- event-loop side ---------------------------------------------------------------
    def cancel(self) -> None:
        if not self._cancelled.is_set():
            self._cancelled.set()
            self._wake()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    async def events(self) -> AsyncIterator[Event]:
        """Yield events until the final one (which carries finish_reason or error)."""
        while True:
            event = await self._queue.get()
            with self._pending_lock:
                self._pending -= 1
            yield event
            if event.final:
                return

    # -- engine-thread side ------------------------------------------------------------
    @property
    def backlog(self) -> int:
        """Events emitted but not yet taken by the reader."""
        return self._pending

    def emit(self, event: Event) -> None:
        if self._loop is None:  # a distributed follower's shadow: nobody listens
            return
        with self._pending_lock:
            self._pending += 1
        # A closed event loop (RuntimeError) means nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    def mark_done(self) -> bool:
        """Mark the job ended; True for the one caller that ended it (any thread: the
        engine thread retires jobs while a watchdog may fail them)."""
        with self._done_lock:
            if self.done:
                return False
            self.done = True
            return True

    def fail(self, error: BackendError) -> None:
        """End the job with ``error`` unless it has ended (any thread; idempotent)."""
        if self.mark_done():
            self.emit(self.event(Delta(), error=error))

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
