"""Process-level operation: bearer-token auth, the parent-death watcher, durations, log level.

Owns what LocalAI's environment asks of every backend process, independent of the model:

- ``LOCALAI_GRPC_AUTH_TOKEN``: when set (non-blank), every call must carry metadata
  ``authorization: Bearer <token>`` (compared in constant time), else UNAUTHENTICATED.
  One exemption: ``/grpc.health.v1.Health/Check``, so Kubernetes' native gRPC probes and
  load balancers, which cannot send credentials, still see liveness; it answers only
  SERVING / NOT_SERVING and reveals nothing else. ``Health/Watch``, LocalAI's own
  ``backend.Backend/Health`` and server reflection all need the token.
- ``LOCALAI_BACKEND_PARENT_WATCH`` (default on; "false"/"0"/"no"/"off" disable) and
  ``LOCALAI_BACKEND_PARENT_WATCH_INTERVAL`` (``parse_duration``; default 2 s): when the
  spawning parent dies (this process is re-parented), send ourselves SIGTERM, so the
  exit takes exactly the graceful path of a SIGTERM from LocalAI.
- ``LOCALAI_LOG_LEVEL``: Python level names plus LocalAI's own (``trace``, ``warn``).

Also: ``DecodeErrorInterceptor`` (a request that does not parse, e.g. invalid UTF-8 in a
string field, gets INVALID_ARGUMENT rather than UNKNOWN and a logged traceback),
``parse_duration`` and ``os_threads_gone`` (a clean exit after the engine thread ends).
Never imports MLX or the engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import logging
import math
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError

logger = logging.getLogger("localai.mlx.ops")

AUTH_TOKEN_ENV = "LOCALAI_GRPC_AUTH_TOKEN"
PARENT_WATCH_ENV = "LOCALAI_BACKEND_PARENT_WATCH"
PARENT_WATCH_INTERVAL_ENV = "LOCALAI_BACKEND_PARENT_WATCH_INTERVAL"
LOG_LEVEL_ENV = "LOCALAI_LOG_LEVEL"
DEFAULT_PARENT_WATCH_INTERVAL = 2.0  # seconds, as LocalAI's own backends
# Methods open without a token: the standard health check only (see the module docstring).
AUTH_EXEMPT_METHODS = frozenset({"/grpc.health.v1.Health/Check"})
_FALSE_WORDS = frozenset({"false", "0", "no", "off"})


# --------------------------------------------------------------------------- durations
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """Seconds in ``text``: "500ms", "2s", "1.5m", "1h", or a plain number of seconds.

    Raises ValueError for anything else (negative, empty, unknown unit, inf/nan).
    """
    match = _DURATION_RE.match(text)
    if not match:
        raise ValueError(
            f'invalid duration {text!r}: use e.g. "500ms", "2s", "1m" or plain seconds'
        )
    number, unit = match.groups()
    seconds = float(number) * _UNIT_SECONDS[unit.lower() if unit else None]
    if not math.isfinite(seconds):
        raise ValueError(f"invalid duration {text!r}: not a finite number of seconds")
    return seconds


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


# --------------------------------------------------------------------------- auth
class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires metadata ``authorization: Bearer <token>`` on every call but ``exempt``.

    The comparison hashes both sides first, so its time depends neither on where the
    supplied value differs from the token nor on the token's length. The scheme name
    is case-insensitive (RFC 6750); the token is compared exactly. A denied call gets
    UNAUTHENTICATED before any handler runs, whatever the method, even an unknown one
    (which would otherwise reveal UNIMPLEMENTED).
    """

    def __init__(self, token: str, exempt: frozenset[str] = AUTH_EXEMPT_METHODS) -> None:
        if not token:
            raise ValueError("the bearer token must not be empty")
        self._expected = _digest(token.encode("utf-8"))
        self._exempt = exempt
        self._deny = grpc.stream_stream_rpc_method_handler(_deny)

    def authorized(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
        """Whether ``metadata`` (invocation metadata pairs) carries the token; the first
        ``authorization`` entry counts."""
        header = next((v for k, v in (metadata or ()) if k == "authorization"), None)
        if header is None:
            return False
        if isinstance(header, bytes):
            header = header.decode("utf-8", "replace")
        scheme, _, supplied = header.partition(" ")
        ok_scheme = scheme.lower() == "bearer"
        ok_token = hmac.compare_digest(_digest(supplied.encode("utf-8")), self._expected)
        return ok_scheme and ok_token

    async def intercept_service(self, continuation, details):
        if details.method in self._exempt or self.authorized(details.invocation_metadata):
            return await continuation(details)
        logger.debug("denied %s: missing or wrong bearer token", details.method)
        # Raw bytes in, raw bytes out, request never read: fits any call shape.
        return self._deny


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


async def _deny(request_iterator, context):
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
    yield b""  # pragma: no cover  (unreachable; makes this an async generator)


# --------------------------------------------------------------------------- decoding
class DecodeErrorInterceptor(grpc.aio.ServerInterceptor):
    """Answers INVALID_ARGUMENT to a request message that does not parse.

    A proto3 string field holding invalid UTF-8, or truncated bytes, otherwise get
    UNKNOWN and a traceback in the log for every such call. Wraps handlers that take one
    request message: they receive raw bytes, parse them here, then run as before.
    """

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        parse = handler.request_deserializer
        if handler.response_streaming:
            inner = handler.unary_stream
            if inspect.isasyncgenfunction(inner):

                async def stream_gen(raw: bytes, context):
                    async for reply in inner(await _parse(parse, raw, context), context):
                        yield reply

                behavior = stream_gen
            else:  # a coroutine that writes with context.write (health Watch)

                async def stream_coro(raw: bytes, context):
                    return await inner(await _parse(parse, raw, context), context)

                behavior = stream_coro
            return grpc.unary_stream_rpc_method_handler(behavior, None, handler.response_serializer)
        inner_unary = handler.unary_unary

        async def unary(raw: bytes, context):
            return await inner_unary(await _parse(parse, raw, context), context)

        return grpc.unary_unary_rpc_method_handler(unary, None, handler.response_serializer)


async def _parse(parse: Callable[[bytes], object], raw: bytes, context) -> object:
    try:
        return parse(raw)
    except DecodeError as exc:  # its message names the type and the fault
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid request: {exc}")


def server_interceptors(environ: Mapping[str, str] = os.environ) -> list:
    """The server's interceptors, outermost first: ``AuthInterceptor`` when
    ``LOCALAI_GRPC_AUTH_TOKEN`` is set and not blank (surrounding whitespace, e.g. a
    newline from a secrets file, is stripped), then ``DecodeErrorInterceptor``."""
    interceptors: list = [DecodeErrorInterceptor()]
    token = environ.get(AUTH_TOKEN_ENV, "").strip()
    if token:
        logger.info(
            "bearer-token auth on (all RPCs but %s)", ", ".join(sorted(AUTH_EXEMPT_METHODS))
        )
        interceptors.insert(0, AuthInterceptor(token))
    return interceptors


# --------------------------------------------------------------------------- parent watch
def parent_watch_interval(environ: Mapping[str, str] = os.environ) -> float | None:
    """Seconds between parent checks from ``environ``, or None when the watch is off.

    ``LOCALAI_BACKEND_PARENT_WATCH`` "false"/"0"/"no"/"off" (any case) turns it off;
    anything else, or unset, leaves it on. An invalid or non-positive
    ``LOCALAI_BACKEND_PARENT_WATCH_INTERVAL`` logs a warning and uses 2 s: a typo must
    not stop the backend from starting.
    """
    if environ.get(PARENT_WATCH_ENV, "").strip().lower() in _FALSE_WORDS:
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
