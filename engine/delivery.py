"""Hand-offs from the engine thread to event loops: one per engine step, not one per token.

A job whose reader has something new to take asks for a wake-up (`notify`) on its event
loop. Inside an engine step (`in_steps` wraps the step) the wake-ups are collected and,
when the step ends, each event loop gets them in one ``call_soon_threadsafe`` callback: at
32 streams the loop thread wakes once per step instead of 32 times. Outside a step (a
watchdog failing a job from its own thread, a request refused before any step) a wake-up
is handed over at once, so failures arrive promptly when no step runs.

Own code, not a library: it is the few lines between our engine thread and asyncio's
``call_soon_threadsafe`` (mlx-lm's server hands each token to a per-request queue).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

Wake = Callable[[], None]
F = TypeVar("F", bound=Callable[..., Any])


class Loop(Protocol):
    """The part of an asyncio event loop a hand-off uses."""

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any) -> Any: ...


_local = threading.local()  # .batch: {loop: [wake, ...]} while a step runs on this thread


def in_steps(step: F) -> F:
    """Decorate the engine's step: the wake-ups asked for while it runs on this thread are
    handed to each event loop in one callback when it returns or raises (a nested step
    hands over at the outermost one's end)."""

    @functools.wraps(step)
    def stepped(*args: Any, **kwargs: Any) -> Any:
        if getattr(_local, "batch", None) is not None:
            return step(*args, **kwargs)
        batch: dict[Loop, list[Wake]] = {}
        _local.batch = batch
        try:
            return step(*args, **kwargs)
        finally:
            _local.batch = None
            for loop, wakes in batch.items():
                _hand_over(loop, wakes)

    return stepped  # type: ignore[return-value]


def notify(loop: Loop, wake: Wake) -> None:
    """Have ``wake`` called on ``loop``'s thread: at the end of the step running on this
    thread, or at once outside a step. A closed loop (nobody listens) is ignored."""
    batch: dict[Loop, list[Wake]] | None = getattr(_local, "batch", None)
    if batch is None:
        _hand_over(loop, [wake])
    else:
        batch.setdefault(loop, []).append(wake)


def _hand_over(loop: Loop, wakes: list[Wake]) -> None:
    with contextlib.suppress(RuntimeError):  # a closed event loop: nobody is listening
        loop.call_soon_threadsafe(_wake_all, wakes)


def _wake_all(wakes: list[Wake]) -> None:
    for wake in wakes:
        wake()
