"""The process's life: log levels from the environment, the parent-death
watcher, and waiting for native threads at exit.

- ``LOCALAI_BACKEND_PARENT_WATCH`` (default on; "false"/"0"/"no"/"off" disable) and
  ``LOCALAI_BACKEND_PARENT_WATCH_INTERVAL`` (``parse_duration``; default 2 s): when the
  spawning parent dies (this process is re-parented), send ourselves SIGTERM, so the
  exit takes exactly the graceful path of a SIGTERM from LocalAI.
- ``LOCALAI_LOG_LEVEL``: Python level names plus LocalAI's own (``trace``, ``warn``).
- ``os_threads_gone``: a clean exit after the engine thread ends.

Never imports MLX or the engine.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from parsing.durations import parse_duration
from parsing.options import env_on

logger = logging.getLogger("localai.mlx." + __name__)

PARENT_WATCH_ENV = "LOCALAI_BACKEND_PARENT_WATCH"
PARENT_WATCH_INTERVAL_ENV = "LOCALAI_BACKEND_PARENT_WATCH_INTERVAL"
LOG_LEVEL_ENV = "LOCALAI_LOG_LEVEL"
DEFAULT_PARENT_WATCH_INTERVAL = 2.0  # seconds, as LocalAI's own backends


# --------------------------------------------------------------------------- log level
_LOCALAI_LEVELS = {"trace": logging.DEBUG, "warn": logging.WARNING, "fatal": logging.CRITICAL}


def log_level(name: str) -> int:
    """The ``logging`` level for ``name`` (any case): Python's names, LocalAI's ``trace``
    (= DEBUG), ``warn`` and ``fatal``, or a number. Raises ValueError for anything else."""
    key = name.strip().lower()
    if key in _LOCALAI_LEVELS:
        return _LOCALAI_LEVELS[key]
    if key.isdigit():
        return int(key)
    level = logging.getLevelName(key.upper())
    if not isinstance(level, int):
        raise ValueError(
            f"unknown log level {name!r}: use debug, info, warning, error, critical "
            "(or trace, warn)"
        )
    return level


# --------------------------------------------------------------------------- parent watch
def parent_watch_interval(environ: Mapping[str, str] = os.environ) -> float | None:
    """Seconds between parent checks from ``environ``, or None when the watch is off.

    ``LOCALAI_BACKEND_PARENT_WATCH`` "false"/"0"/"no"/"off" (any case) turns it off;
    anything else, or unset, leaves it on. An invalid or non-positive
    ``LOCALAI_BACKEND_PARENT_WATCH_INTERVAL`` logs a warning and uses 2 s: a typo must
    not stop the backend from starting.
    """
    if not env_on(environ, PARENT_WATCH_ENV):
        return None
    raw = environ.get(PARENT_WATCH_INTERVAL_ENV, "").strip()
    if not raw:
        return DEFAULT_PARENT_WATCH_INTERVAL
    try:
        interval = parse_duration(raw)
    except ValueError as exc:
        interval = 0.0
        logger.warning("%s: %s", PARENT_WATCH_INTERVAL_ENV, exc)
    if interval <= 0:
        logger.warning(
            "%s=%r is not a positive duration; using %gs",
            PARENT_WATCH_INTERVAL_ENV,
            raw,
            DEFAULT_PARENT_WATCH_INTERVAL,
        )
        return DEFAULT_PARENT_WATCH_INTERVAL
    return interval


# --------------------------------------------------------------------------- exit
async def os_threads_gone(native_ids: Iterable[int], timeout: float) -> bool:
    """Wait up to ``timeout`` seconds until the OS threads ``native_ids`` have exited.

    A Python thread counts as ended (``join`` returns) before its native thread-local
    destructors run; MLX's compile cache is one and calls back into Python, so
    finalizing the interpreter meanwhile aborts the process ("terminate called without
    an active exception"). Linux: watches ``/proc/self/task``; elsewhere waits 0.2 s.
    Returns False when some thread is still there at the timeout.
    """
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        await asyncio.sleep(0.2)
        return True
    pending = {tasks / str(i) for i in native_ids}
    deadline = time.monotonic() + timeout
    while True:
        pending = {p for p in pending if p.exists()}
        if not pending or time.monotonic() >= deadline:
            return not pending
        await asyncio.sleep(0.01)


def _sigterm_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


class ParentWatcher:
    """Calls ``on_gone`` once when this process's parent is gone.

    "Gone" means re-parented: ``getppid()`` differs from ``initial_ppid`` (the parent at
    start, by default read now) or is 1. Checks every ``interval`` seconds on a daemon
    thread, so it works even while the event loop is busy. The default ``on_gone``
    sends this process SIGTERM: the same graceful path as LocalAI's own SIGTERM.
    """

    def __init__(
        self,
        interval: float,
        on_gone: Callable[[], None] = _sigterm_self,
        initial_ppid: int | None = None,
        getppid: Callable[[], int] = os.getppid,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        self.interval = interval
        self.initial_ppid = getppid() if initial_ppid is None else initial_ppid
        self._on_gone = on_gone
        self._getppid = getppid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="parent-watch", daemon=True)

    def start(self) -> bool:
        """Start watching; False (nothing started) when already orphaned at start
        (initial parent 1 or less: there is no spawning parent left to watch)."""
        if self.initial_ppid <= 1:
            logger.info("parent watch off: already re-parented to pid %d", self.initial_ppid)
            return False
        self._thread.start()
        logger.debug(
            "parent watch: pid %d every %gs (%s=off disables)",
            self.initial_ppid,
            self.interval,
            PARENT_WATCH_ENV,
        )
        return True

    def stop(self) -> None:
        """Stop watching and wait for the thread (idempotent); no ``on_gone`` afterwards."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def parent_gone(self) -> bool:
        ppid = self._getppid()
        return ppid != self.initial_ppid or ppid <= 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.parent_gone():
                logger.warning(
                    "parent process %d is gone (now pid %d): shutting down",
                    self.initial_ppid,
                    self._getppid(),
                )
                self._on_gone()
                return
