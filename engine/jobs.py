"""One generation request in flight: the `Job` handle and the `Event`s it produces.

A `Job` is created on the event loop by `Engine.submit`, run on the engine thread by the
`Scheduler`, and read back on the event loop through `events()`. Events cross threads as
values, errors included, in one hand-off per engine step (`engine.delivery`). The reader
takes every event waiting for it at once, joined into one (`merged`): a client that lags
gets several tokens in one reply, with the same text, tool calls and logprobs. The
backlog is bounded: a streaming client that stops reading while its generation goes on
has its job ended (RESOURCE_EXHAUSTED) once `max_pending` events wait untaken, and its KV
is released, instead of the server buffering every remaining token.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from decoding.finish import FinishReason
from decoding.output import Delta
from engine import delivery
from errors import BackendError
from params import GenerationRequest

if TYPE_CHECKING:
    from engine.prepare import PreparedRequest
    from engine.vision_prompt import VisionPrompt

# A sequence's KV cache: one mlx-lm cache object per layer (the draft model's after the
# target's); with the tokens it holds, what a runner hands to the prompt cache.
KV = list[Any]
Handover = tuple[KV, Sequence[int]]

# Untaken events one job may accumulate (about one per generated token) before the
# scheduler ends it: a client that has not read for this many tokens is not reading.
DEFAULT_MAX_PENDING_EVENTS = 4096


@dataclass(frozen=True)
class Event:
    """One step of a request's result, as the servicer sees it.

    ``delta`` is the new output since the previous event (possibly empty). Counters are
    running totals: ``tokens`` generated so far, ``prompt_tokens`` the whole prompt
    (cached or not). Timings are milliseconds: ``prompt_ms`` from admission to the first
    generated token (TTFT minus queueing), ``generation_ms`` since the first token.
    The last event has ``finish_reason`` (a `FinishReason`) or ``error``.
    """

    delta: Delta
    prompt_tokens: int
    tokens: int
    prompt_ms: float
    generation_ms: float
    cached_tokens: int = 0
    finish_reason: FinishReason | None = None
    error: BackendError | None = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None


class Job:
    """One generation request's handle: created on the event loop, read back there.

    Holds the prepared request (``request``; ``prompt_ids`` its token ids, tokenized off
    the engine thread; ``initial_state`` the output pipeline's starting state;
    ``model_serial`` the loaded model the ids were made for; ``checkpoints`` token
    positions (ascending) where the prefill may be snapshot for later prompts sharing that
    prefix, see `prompt.chat_boundary`; ``max_tokens`` what it may generate, the prepare
    step's cap, `prompting.fit.max_tokens`, default the request's Tokens; ``vision`` the
    image part of an image prompt), its events and its cancel flag; no engine-thread
    state: the engine's record of it is an `engine.sequence.Sequence`. Iterate
    ``events()`` on the event loop; call ``cancel()`` from anywhere (idempotent): the
    scheduler drops the sequence at its next step and keeps its KV in the prompt cache.
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
        max_tokens: int | None = None,
        vision: VisionPrompt | None = None,
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
        # Emitted, not yet taken by the reader (engine thread appends, the reader swaps it
        # out, both under the lock); the reader's future while it waits for more.
        self._untaken: list[Event] = []
        self._untaken_lock = threading.Lock()
        self._waiter: asyncio.Future[None] | None = None
        self._cancelled = threading.Event()
        self.submitted = time.perf_counter()
        self.max_tokens = self.params.max_tokens if max_tokens is None else max_tokens
        self.vision = vision
        self.done = False  # the final event was sent; set once, under _done_lock
        self._done_lock = threading.Lock()

    @classmethod
    def prepared(
        cls,
        prepared: PreparedRequest,
        *,
        loop: asyncio.AbstractEventLoop,
        wake: Callable[[], None],
        max_pending: int = DEFAULT_MAX_PENDING_EVENTS,
    ) -> Job:
        """The job of a request the prepare step made ready (`engine.prepare`)."""
        prompt = prepared.prompt
        return cls(
            prepared.request,
            prompt.token_ids,
            prompt.initial_state,
            loop=loop,
            wake=wake,
            model_serial=prepared.model_serial,
            max_pending=max_pending,
            checkpoints=prompt.checkpoints,
            max_tokens=prepared.max_tokens,
            vision=prepared.vision,
        )

    # -- event-loop side ---------------------------------------------------------------
    def cancel(self) -> None:
        if not self._cancelled.is_set():
            self._cancelled.set()
            self._wake()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    async def events(self) -> AsyncIterator[Event]:
        """Yield events until the final one (which carries finish_reason or error).

        Each yielded event joins all that were emitted since the previous one was taken
        (`joined`): a reader that pauses gets fewer, larger events with the same
        concatenation; one that keeps up gets one per engine step.
        """
        while True:
            with self._untaken_lock:
                taken, self._untaken = self._untaken, []
            if not taken:
                # Nothing runs on this loop between the check above and the await: the
                # engine's wake-up for the next event finds the waiter.
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
                continue
            for event in taken if len(taken) == 1 else joined(taken):
                yield event
                if event.final:
                    return

    def _ready(self) -> None:
        """On the event loop: there are events to take."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- engine-thread side ------------------------------------------------------------
    @property
    def backlog(self) -> int:
        """Events emitted but not yet taken by the reader."""
        return len(self._untaken)

    def emit(self, event: Event) -> None:
        """Hand ``event`` to the reader (any thread): it is taken with any others still
        waiting; the reader is woken at the end of the running engine step, or at once
        outside a step (`engine.delivery`)."""
        if self._loop is None:  # a distributed follower's shadow: nobody listens
            return
        with self._untaken_lock:
            self._untaken.append(event)
            first = len(self._untaken) == 1  # later ones ride on the same wake-up
        if first:
            delivery.notify(self._loop, self._ready)

    def mark_done(self) -> bool:
        """Mark the job ended; True for the one caller that ended it (any thread: the
        engine thread retires jobs while a watchdog may fail them)."""
        with self._done_lock:
            if self.done:
                return False
            self.done = True
            return True

    def fail(self, error: BackendError) -> None:
        """End the job with ``error`` unless it has ended (any thread; idempotent). Before
        the engine made its record (`engine.sequence.Sequence.fail` after)."""
        if self.mark_done():
            self.emit(
                Event(
                    Delta(),
                    prompt_tokens=0,
                    tokens=0,
                    prompt_ms=0.0,
                    generation_ms=0.0,
                    error=error,
                )
            )


def joined(events: Sequence[Event]) -> list[Event]:
    """What a reader gets for ``events`` (emitted, in order, not yet taken): as few
    `merged` events as keep the order of the output kinds.

    A reply says reasoning, then content, then tool calls (the order LocalAI sends a
    ChatDelta's parts on, `core/http/endpoints/openai/chat_stream_workers.go`), so an
    event starts a new merged one when it has a kind earlier than one already joined
    (content after a tool call, say). An error starts one too, so that a stream failing
    mid-way still delivers what preceded the failure. Events after the first final one
    are dropped (a job ends once; the reader stops there).
    """
    end = next((i for i, e in enumerate(events) if e.final), len(events) - 1)
    groups: list[list[Event]] = []
    latest = -1  # the latest kind joined into groups[-1]; -1: no output yet
    for event in events[: end + 1]:
        kinds = _kinds(event.delta)
        if not groups:
            fits = False
        elif event.error is not None:
            fits = not any(e.delta for e in groups[-1])
        else:
            fits = not kinds or kinds[0] >= latest
        if fits:
            groups[-1].append(event)
        else:
            groups.append([event])
            latest = -1
        if kinds:
            latest = max(latest, kinds[-1])
    return [merged(group) for group in groups]


def _kinds(delta: Delta) -> list[int]:
    """The output kinds ``delta`` has, in reply order: 0 reasoning, 1 content, 2 tool calls."""
    return [k for k, part in enumerate((delta.reasoning, delta.content, delta.tool_calls)) if part]


def merged(events: Sequence[Event]) -> Event:
    """One event saying what ``events`` (in emission order, non-empty) say together.

    Text is concatenated, tool-call pieces and logprobs entries kept in order; counters,
    timings and the end (finish_reason, error) are the latest event's.
    """
    if len(events) == 1:
        return events[0]
    last = events[-1]
    delta = Delta(
        content="".join(e.delta.content for e in events),
        reasoning="".join(e.delta.reasoning for e in events),
        tool_calls=tuple(t for e in events for t in e.delta.tool_calls),
        logprobs=tuple(entry for e in events for entry in e.delta.logprobs),
    )
    return Event(
        delta=delta,
        prompt_tokens=last.prompt_tokens,
        tokens=last.tokens,
        prompt_ms=last.prompt_ms,
        generation_ms=last.generation_ms,
        cached_tokens=last.cached_tokens,
        finish_reason=last.finish_reason,
        error=last.error,
    )
