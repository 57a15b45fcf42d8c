"""What reaches the engine thread: the mailbox's item types.

The event loop (and watchdogs) put these on the engine's inbox; only the engine thread
takes them off. Small frozen values, so what crosses threads is explicit.
"""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass
from typing import Any

from engine.jobs import Job


@dataclass(frozen=True)
class Call:
    """Run engine operation ``op`` with ``args``; its result or error goes to ``future``.
    ``stop`` is set when the caller leaves (client gone, deadline passed)."""

    op: str
    args: tuple[Any, ...]
    future: concurrent.futures.Future
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
