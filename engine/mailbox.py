"""What reaches the engine thread: the mailbox and its item types.

The event loop (and watchdogs) put items on the engine's `Mailbox`; only the engine thread
takes them off. Small frozen values, so what crosses threads is explicit.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.jobs import Job
from errors import BackendError


@dataclass(frozen=True)
class Call:
    """Run engine operation ``op`` with ``args``; its result or error goes to ``future``.
    ``stop`` is set when the caller leaves (client gone, deadline passed)."""

    op: str
    args: tuple[Any, ...]
    future: concurrent.futures.Future[Any]
    stop: threading.Event


@dataclass(frozen=True)
class Submit:
    """A generation request, prompt ready, for the scheduler."""

    job: Job


@dataclass(frozen=True)
class Wake:
    """Nothing to do but look again (a job was cancelled or its reader caught up)."""


@dataclass(frozen=True)
class Stop:
    """End every job and the engine thread."""


Item = Call | Submit | Wake | Stop
WAKE = Wake()
STOP = Stop()


class Mailbox:
    """The engine's inbox: any thread puts, the engine thread takes. Items set aside while
    a call ran (`defer`) come out first, in order."""

    def __init__(self) -> None:
        self._inbox: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self._deferred: deque[Item] = deque()

    def put(self, item: Item) -> None:
        self._inbox.put(item)

    @property
    def has_deferred(self) -> bool:
        return bool(self._deferred)

    def next(self, block: bool, timeout: float | None = None) -> Item:
        """The next item, deferred ones first; raises queue.Empty when there is none (in
        ``timeout`` seconds when ``block``)."""
        if self._deferred:
            return self._deferred.popleft()
        if block:
            return self._inbox.get(timeout=timeout)
        return self._inbox.get_nowait()

    def arrived(self) -> list[Item]:
        """Every item put since the last take, not the deferred ones (engine thread)."""
        items = []
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                return items

    def defer(self, item: Item) -> None:
        self._deferred.append(item)

    def drain(self, error: BackendError, on_submit: Callable[[Submit], None]) -> None:
        """Fail queued jobs (``on_submit`` first, for the engine's counts) and calls with
        ``error``; a stop request stays."""
        keep = []
        while True:
            try:
                item = self.next(block=False)
            except queue.Empty:
                break
            if isinstance(item, Submit):
                on_submit(item)
                item.job.fail(error)
            elif isinstance(item, Call):
                if item.future.set_running_or_notify_cancel():
                    item.future.set_exception(error)
            elif isinstance(item, Stop):
                keep.append(item)
        for item in keep:
            self._inbox.put(item)
