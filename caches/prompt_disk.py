"""Disk tier of the prompt cache: KV caches kept in files that survive restarts.

Owns: one directory of prompt-cache files, each holding the per-layer KV cache
(``mlx_lm.models.cache`` objects) of one token sequence; an in-memory index of them
rebuilt from their headers at start-up; finding the entry that saves the most prefill
for a prompt; a byte budget with LRU eviction whose order (file modification times,
refreshed on every hit) survives restarts; atomic, checksummed writes on a background
thread; and counters. Never imports grpc or runs a model.

Three parts, one job each, behind the :class:`DiskCache` façade:

- ``_Index``: the entries of the directory (start-up scan, LRU order, byte total,
  eviction, deleting files) and the counters, behind one lock;
- ``_Writer``: the write queue and its thread (temporary file, fsync, rename, directory
  fsync; a full disk or unwritable directory stops writing);
- ``_Reader``: the thread that reads entry files (and refreshes their mtimes), whose
  reads the engine waits for at most a bound (:func:`read_wait`);
- ``prompt_disk_format``: file names, the file format and its checks, as functions.

Threads: :meth:`DiskCache.put` and :meth:`DiskCache.lookup` run on the caller's thread
(the engine thread, which owns MLX) and never touch the file system there: ``put``
materialises the KV and serialises it into an in-memory buffer (the only MLX work), then
queues it without waiting (a full queue drops the entry, counted); the writer thread
hashes the buffer and writes it, with no MLX call. ``lookup`` picks the entry from the
in-memory index, has the reader thread read and checksum its file, waits at most
:func:`read_wait` seconds, then builds the MLX arrays from the bytes on the caller's
thread. A read that comes later is a miss (counted in ``late``; its bytes are dropped
when they arrive), and while it still runs further lookups miss at once instead of
waiting again: a slow or stuck file system costs the engine one bounded wait.

File names are ``<key>-<sha256>.safetensors``: ``key`` is a hash of the fingerprint and
the token ids, ``sha256`` the checksum of the whole file, checked on every load (a torn,
truncated or altered file is skipped with one warning and deleted). The header metadata
holds the format version, fingerprint and token ids, so the index needs no separate
file that could disagree with the directory after a crash.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from caches import prompt_disk_format as fmt
from caches.prompt_disk_format import FORMAT_VERSION, model_fingerprint
from parsing.tokens import common_prefix
from prompt_cache import check_kv_holds

__all__ = [
    "FORMAT_VERSION",
    "DiskCache",
    "DiskCacheStats",
    "DiskHit",
    "model_fingerprint",
]

# FORMAT_VERSION is the version this cache writes and accepts; the code below reads this
# module's name at call time, so a test can pin another one here.

logger = logging.getLogger("localai.mlx.prompt_disk")

_LATE = object()  # DiskCache._load: the read outlasted its bound

_STALE_TMP_S = 3600.0  # a temporary file this old is a dead writer's, whoever wrote it
# Errors after which writing stops for good (the directory will not take files).
_FATAL_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}
_COUNTERS = (
    "hits",
    "misses",
    "late",
    "evictions",
    "loads",
    "writes",
    "dropped",
    "write_errors",
    "corrupt",
)
# The engine thread (every stream) waits for a disk read at most _READ_WAIT_S plus the
# file at _READ_BYTES_PER_S: a healthy SSD or page cache reads several times faster, and
# past that recomputing the prefill beats a frozen batch.
_READ_WAIT_S = 0.5
_READ_BYTES_PER_S = 256 << 20


def read_wait(nbytes: int) -> float:
    """Seconds a lookup waits for the read of an entry file of ``nbytes`` bytes."""
    return _READ_WAIT_S + nbytes / _READ_BYTES_PER_S


def _write_all(fd: int, data: memoryview) -> None:
    """Write all of ``data`` to ``fd`` (os.write may write less than asked)."""
    while data:
        n = os.write(fd, data)
        data = data[n:]


def _abandoned(path: Path, pid: int, now: float) -> bool:
    """Whether the temporary file at ``path``, written by process ``pid``, is a dead
    writer's: that process is gone or is this one, or the file is older than
    ``_STALE_TMP_S`` (``now``: epoch seconds). False when it cannot be stat'ed."""
    alive = pid != os.getpid()
    if alive:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            alive = False
        except OSError:
            pass  # exists but not ours to signal
    try:
        old = now - path.lstat().st_mtime > _STALE_TMP_S
    except OSError:
        return False
    return not alive or old


# --------------------------------------------------------------------------- types
@dataclass(frozen=True)
class DiskCacheStats:
    """A snapshot of a :class:`DiskCache`'s state and counters.

    ``entries`` / ``nbytes`` (bytes on disk) count every file of the cache in the
    directory, including other fingerprints' (they share the budget); ``usable`` counts
    this fingerprint's. ``hits`` / ``misses`` count :meth:`DiskCache.lookup` calls;
    ``late`` the misses whose file read outlasted :func:`read_wait` (or found the reader
    still busy with such a read);
    ``evictions`` files deleted for the budget; ``load_ms`` the total milliseconds
    spent loading hits (``loads`` of them; mean = load_ms / loads); ``writes`` files
    written, ``write_ms`` the writer thread's total milliseconds; ``dropped`` puts
    dropped because the write queue was full; ``write_errors`` failed writes;
    ``corrupt`` files found torn, truncated or altered (and deleted); ``writable`` is
    False when read-only or after a fatal write error (full disk, read-only or
    forbidden directory).
    """

    entries: int
    usable: int
    nbytes: int
    max_bytes: int
    hits: int
    misses: int
    late: int
    evictions: int
    loads: int
    load_ms: float
    writes: int
    write_ms: float
    dropped: int
    write_errors: int
    corrupt: int
    writable: bool


class DiskHit(NamedTuple):
    """A :meth:`DiskCache.lookup` hit.

    ``kv``: freshly loaded per-layer cache objects holding exactly ``tokens`` (the
    entry's token ids), owned by the caller. ``cached_len``: how many leading tokens of
    the prompt it serves (1 .. len(prompt) - 1); when ``cached_len < len(tokens)`` the
    caller trims ``len(tokens) - cached_len`` tokens off every layer first (or inserts
    ``(tokens, kv)`` into the memory tier and fetches from there, which trims).
    """

    kv: list
    cached_len: int
    tokens: tuple[int, ...]


@dataclass
class _Entry:
    name: str
    fingerprint: str
    version: int
    tokens: tuple[int, ...]
    trimmable: bool
    nbytes: int
    last_use: int  # ns; the file's mtime


@dataclass
class _Job:
    key: str
    tokens: tuple[int, ...]
    trimmable: bool
    payload: memoryview


# --------------------------------------------------------------------------- the index
class _Index:
    """The entry files of one cache directory and the cache's counters, behind one lock.

    Holds every entry file of the directory (any fingerprint, any format version) with
    its size and last use (LRU order), which of them are this ``fingerprint``'s (by
    entry key), their byte total, and the counters of :class:`DiskCacheStats`, so a
    :meth:`snapshot` is consistent. Deletes only files inside ``directory``, and
    nothing when ``read_only``. Every method but :meth:`scan` is thread-safe.
    """

    def __init__(self, directory: Path, fingerprint: str, read_only: bool) -> None:
        self.directory = directory
        self.fingerprint = fingerprint
        self.read_only = read_only
        self._lineage, _, self._content = fingerprint.partition(":")
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}  # by file name
        self._by_key: dict[str, str] = {}  # entry key -> file name (this fingerprint)
        self._nbytes = 0
        self._counts: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        self._ms = {"load_ms": 0.0, "write_ms": 0.0}

    # ----------------------------------------------------------------- start-up scan
    def scan(self, version: int) -> None:
        """Build the index from the headers of the directory's files. Call once, before
        any other thread uses the index.

        Deletes (unless read-only) leftover temporary files of dead writers, unreadable
        or mislabelled files, entries of format versions older than ``version`` and
        entries certainly stale for this model (same fingerprint lineage, other
        content, see :func:`model_fingerprint`); of two files for one key, the older.
        """
        try:
            names = os.listdir(self.directory)
        except OSError as exc:
            logger.warning("prompt disk cache: cannot list %s: %s", self.directory, exc)
            return
        now = time.time()
        for name in names:
            pid = fmt.tmp_pid(name)
            if pid is not None:
                if not self.read_only and _abandoned(self.directory / name, pid, now):
                    logger.info("prompt disk cache: removing an unfinished write %s", name)
                    self.unlink(self.directory / name)
            elif fmt.name_key(name) is not None:
                self._scan_entry(name, version)

    def _scan_entry(self, name: str, version: int) -> None:
        path = self.directory / name
        key = fmt.name_key(name)
        try:
            st = path.lstat()
            head = fmt.read_header(path)
        except fmt.NotRegularFile:
            # Not one of ours (we write regular files only): skipped, never deleted.
            logger.warning("prompt disk cache: skipping %s: not a regular file", path)
            return
        except OSError as exc:
            logger.warning("prompt disk cache: cannot read %s: %s", path, exc)
            return
        except ValueError as exc:
            self.drop_corrupt(path, f"unreadable header ({exc})")
            return
        fp = head.fingerprint
        if head.version < version or (head.version == version and self._certainly_stale(fp)):
            logger.info("prompt disk cache: removing stale entry %s", name)
            self.unlink(path)
            return
        entry = _Entry(
            name, fp, head.version, head.tokens, head.trimmable, st.st_size, st.st_mtime_ns
        )
        if fp == self.fingerprint and head.version == version:
            if key != fmt.entry_key(fp, head.tokens):
                self.drop_corrupt(path, "name does not match its tokens")
                return
            old = self._by_key.get(key)
            if old is not None:  # two files for one key: keep the newer
                if self._entries[old].last_use >= entry.last_use:
                    self.unlink(path)
                    return
                self._remove_locked(old, delete=True)
            self._by_key[key] = name
        self._entries[name] = entry
        self._nbytes += entry.nbytes

    def _certainly_stale(self, fp: str) -> bool:
        """Same lineage (model path + settings), other content: the files changed."""
        lineage, sep, content = fp.partition(":")
        return bool(sep and self._content) and lineage == self._lineage and content != self._content

    # ----------------------------------------------------------------- queries
    def candidates(self, tokens: tuple[int, ...], need: int) -> list[tuple[int, _Entry]]:
        """``(cached, entry)`` for this fingerprint's entries serving ``cached >= need``
        leading tokens of ``tokens``, best first.

        An entry whose tokens are a strict prefix of ``tokens`` serves them all; a
        trimmable one serves the common prefix, at most ``len(tokens) - 1``. Ties
        prefer an untrimmed entry, then the most recently used.
        """
        n = len(tokens)
        found = []
        with self._lock:
            for name in self._by_key.values():
                e = self._entries[name]
                if len(e.tokens) < n and tokens[: len(e.tokens)] == e.tokens:
                    cached = len(e.tokens)
                elif e.trimmable:
                    cached = min(common_prefix(e.tokens, tokens), n - 1)
                else:
                    continue
                if cached >= need:
                    found.append((cached, cached == len(e.tokens), e.last_use, e))
        found.sort(key=lambda c: c[:3], reverse=True)
        return [(cached, e) for cached, _, _, e in found]

    def get(self, key: str) -> _Entry | None:
        """This fingerprint's entry with entry key ``key``, if stored."""
        with self._lock:
            name = self._by_key.get(key)
            return self._entries.get(name) if name else None

    def snapshot(self) -> dict[str, Any]:
        """Entries, usable entries, bytes and every counter, taken at one instant."""
        with self._lock:
            return {
                "entries": len(self._entries),
                "usable": len(self._by_key),
                "nbytes": self._nbytes,
                **self._counts,
                **{k: round(v, 3) for k, v in self._ms.items()},
            }

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_key)

    # ----------------------------------------------------------------- changes
    def count(self, **deltas: float) -> None:
        """Add to counters by name (``hits=1``, ``load_ms=2.5``, ...), atomically."""
        with self._lock:
            for name, delta in deltas.items():
                if name in self._ms:
                    self._ms[name] += delta
                else:
                    self._counts[name] += int(delta)

    def touch(self, entry: _Entry) -> int:
        """Mark ``entry`` most recently used in memory; returns the time (ns) for
        :meth:`touch_file`."""
        now = time.time_ns()
        with self._lock:
            entry.last_use = now
        return now

    def touch_file(self, entry: _Entry, now: int) -> None:
        """Set ``entry``'s file mtime to ``now`` (ns; unless read-only), so the LRU
        order survives a restart. File I/O: call off the engine thread."""
        if not self.read_only:
            with contextlib.suppress(OSError):  # else the order is kept in memory only
                os.utime(self.directory / entry.name, ns=(now, now), follow_symlinks=False)

    def add(self, key: str, entry: _Entry, budget: int) -> None:
        """Record a newly written file of this fingerprint (counted in ``writes``), then
        evict down to ``budget`` bytes.

        Replaces (deleting their files) the entry stored under ``key`` and, when
        ``entry`` is trimmable, stored entries whose tokens are a strict prefix of its.
        """
        with self._lock:
            old = self._by_key.get(key)
            if old is not None and old != entry.name:
                self._remove_locked(old, delete=True)
            if entry.trimmable:
                for e in [
                    e
                    for e in self._entries.values()
                    if e.fingerprint == self.fingerprint
                    and len(e.tokens) < len(entry.tokens)
                    and entry.tokens[: len(e.tokens)] == e.tokens
                ]:
                    self._remove_locked(e.name, delete=True)
            if entry.name not in self._entries:
                self._nbytes += entry.nbytes
            self._entries[entry.name] = entry
            self._by_key[key] = entry.name
            self._counts["writes"] += 1
            self._evict_locked(budget)

    def evict(self, budget: int) -> None:
        """Delete least recently used files until at most ``budget`` bytes are held."""
        with self._lock:
            self._evict_locked(budget)

    def forget(self, name: str) -> None:
        """Drop file ``name`` from the index (it is gone already)."""
        with self._lock:
            self._remove_locked(name, delete=False)

    def drop_corrupt(self, path: Path, why: str) -> None:
        """Log once that the file at ``path`` is unusable (``why``), count it in
        ``corrupt``, forget it and (unless read-only) delete it."""
        logger.warning(
            "prompt disk cache: skipping %s: %s%s",
            path,
            why,
            "" if self.read_only else "; deleted",
        )
        with self._lock:
            self._counts["corrupt"] += 1
            self._remove_locked(path.name, delete=False)
        if not self.read_only:
            self.unlink(path)

    def unlink(self, path: Path) -> None:
        """Delete the file at ``path`` unless read-only or outside the directory; a
        failure is logged."""
        if self.read_only or path.parent != self.directory:
            return
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("prompt disk cache: cannot delete %s: %s", path, exc)

    def _evict_locked(self, budget: int) -> None:
        if self._nbytes <= budget:
            return
        for e in sorted(self._entries.values(), key=lambda e: e.last_use):
            if self._nbytes <= budget:
                break
            self._remove_locked(e.name, delete=True)
            self._counts["evictions"] += 1

    def _remove_locked(self, name: str, *, delete: bool) -> None:
        entry = self._entries.pop(name, None)
        if entry is None:
            return
        self._nbytes -= entry.nbytes
        key = fmt.name_key(name)
        if key is not None and self._by_key.get(key) == name:
            del self._by_key[key]
        if delete:
            self.unlink(self.directory / name)


# --------------------------------------------------------------------------- the writer
class _Writer:
    """The background writer of one cache: a bounded queue of serialised entries and
    the thread that writes each atomically, then records it in the index.

    A write evicts room for the entry first, then writes a temporary file, fsyncs it,
    renames it to its final name and fsyncs the directory, so a crash leaves either no
    entry or a whole one. A fatal error (full disk, read-only or forbidden directory)
    stops writing for good, logged once; other failures are logged and counted. The
    thread makes no MLX call.
    """

    def __init__(self, index: _Index, max_bytes: int, queue_size: int, writable: bool) -> None:
        self.index = index
        self.directory = index.directory
        self.max_bytes = max_bytes
        self.writable = writable  # False once read-only or after a fatal error
        self.closing = False
        self._warned = False
        self.queue: queue.Queue[_Job | None] = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread, when writing is possible."""
        if self.writable:
            self._thread = threading.Thread(
                target=self._loop, name="prompt-disk-writer", daemon=True
            )
            self._thread.start()

    def full(self) -> bool:
        """Whether a job queued now would be dropped."""
        return self.queue.full()

    def submit(self, job: _Job) -> bool:
        """Queue ``job`` without blocking; False (counted and logged) when full."""
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            self.drop(len(job.tokens))
            return False
        return True

    def drop(self, n_tokens: int) -> None:
        """Count and log an entry of ``n_tokens`` tokens not saved for a full queue."""
        self.index.count(dropped=1)
        logger.warning(
            "prompt disk cache: write queue full, not saving an entry of %d tokens", n_tokens
        )

    def disable(self, exc: OSError, what: str) -> None:
        """Stop writing for good after ``exc`` (``what`` failed); logged once."""
        self.writable = False
        if not self._warned:
            self._warned = True
            logger.error(
                "prompt disk cache: %s in %s (%s); no more entries will be written, "
                "serving goes on",
                what,
                self.directory,
                exc.strerror or exc,
            )

    def flush(self, timeout: float | None) -> bool:
        """Wait until every queued job is written (or dropped); False on timeout."""
        if self._thread is None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.queue.unfinished_tasks:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self, timeout: float | None) -> None:
        """Write what is queued (at most ``timeout`` seconds), then stop the thread.
        Later jobs are refused (``closing``). Idempotent."""
        thread, self._thread = self._thread, None
        self.closing = True
        if thread is None:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                self.queue.put(None, timeout=0.05)
                break
            except queue.Full:
                if deadline is not None and time.monotonic() > deadline:
                    logger.warning("prompt disk cache: closing with writes still queued")
                    return
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    # ----------------------------------------------------------------- the thread
    def _loop(self) -> None:
        while True:
            job = self.queue.get()
            try:
                if job is None:
                    return
                if self.writable:
                    start = time.perf_counter()
                    self._write(job)
                    self.index.count(write_ms=(time.perf_counter() - start) * 1000)
            except Exception:  # the writer must outlive any one bad entry
                logger.exception("prompt disk cache: writing an entry failed")
                self.index.count(write_errors=1)
            finally:
                self.queue.task_done()

    def _write(self, job: _Job) -> None:
        size = len(job.payload)
        if size > self.max_bytes:
            return
        name = fmt.file_name(job.key, job.payload)
        self.index.evict(self.max_bytes - size)
        tmp = self.directory / fmt.tmp_name(os.getpid(), secrets.token_hex(8))
        final = self.directory / name
        try:
            now = self._write_file(tmp, final, job.payload)
        except OSError as exc:
            self.index.unlink(tmp)
            self.index.count(write_errors=1)
            if exc.errno in _FATAL_WRITE_ERRNOS:
                self.disable(exc, "cannot write")
            else:
                logger.warning("prompt disk cache: writing %s failed: %s", final, exc)
            return
        fp = self.index.fingerprint
        entry = _Entry(name, fp, FORMAT_VERSION, job.tokens, job.trimmable, size, now)
        self.index.add(job.key, entry, self.max_bytes)

    def _write_file(self, tmp: Path, final: Path, payload: memoryview) -> int:
        """Write ``payload`` to ``tmp``, fsync, rename to ``final``, fsync the
        directory. Returns the file's mtime (ns). Raises OSError."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(tmp, flags, 0o644)
        try:
            _write_all(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        # Creation counts as a use; a fine clock keeps LRU order exact (file times come
        # from a coarse kernel clock).
        now = time.time_ns()
        os.utime(tmp, ns=(now, now))
        os.replace(tmp, final)
        dfd = os.open(self.directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return now


# --------------------------------------------------------------------------- the reader
def run_into(future: Future, fn: Callable, *args: Any) -> None:
    """Run ``fn(*args)`` and put its result or exception into ``future`` (unless it was
    cancelled): the body of a thread whose work someone waits for with a bound."""
    if future.set_running_or_notify_cancel():
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # handed to the waiter (or dropped if it left)
            future.set_exception(exc)


class _Reader:
    """One daemon thread that runs file reads for a cache, so the engine thread can wait
    for one at most a bound (``Future.result(timeout)``) and go on without it.

    ``submit`` queues ``fn(*args)`` and returns its Future. No MLX call is made here.
    A daemon thread: a read stuck in the kernel cannot keep the process from exiting.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future, Callable, tuple] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="prompt-disk-reader", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable, *args: Any) -> Future:
        """Run ``fn(*args)`` on the thread; its Future holds the result or exception."""
        fut: Future = Future()
        self._jobs.put((fut, fn, args))
        return fut

    def close(self, timeout: float) -> None:
        """Finish queued jobs (waiting at most ``timeout`` seconds), then stop."""
        self._jobs.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            fut, fn, args = job
            run_into(fut, fn, *args)


# --------------------------------------------------------------------------- the cache
class DiskCache:
    """A directory of prompt KV caches for one model fingerprint, LRU within ``max_bytes``.

    Construction scans the directory (headers only): leftover temporary files of dead
    writers and unreadable files are deleted, older format versions and entries
    certainly stale for this model (same fingerprint lineage, other content, see
    :func:`model_fingerprint`) too. Entries of other fingerprints or newer format
    versions are never used but stay, counted in the budget, until LRU evicts them.

    Only files named by this module inside ``directory`` are ever created, opened or
    deleted; symlinks are not followed; only regular files are read, opened without
    blocking (a FIFO, directory or device named like an entry is skipped with a warning,
    never read or deleted, so it cannot freeze the engine thread). I/O failures never
    raise: they are logged and counted, and a full disk or unwritable directory stops
    writing (logged once) while lookups go on.

    Args:
        directory: the cache directory (created unless ``read_only``); use
            `parsing.paths.safe_cache_dir` for a path that comes from a request.
        max_bytes: disk budget in bytes for all files of the cache (>= 0; 0 stores
            nothing).
        fingerprint: identifies the model and KV settings (:func:`model_fingerprint`);
            entries of any other fingerprint are never used.
        read_only: look up only; never write, touch or delete anything.
        queue_size: most serialised entries waiting for the writer (>= 1); a put beyond
            is dropped with a log line.

    Raises:
        ValueError: for a negative ``max_bytes``, an empty ``fingerprint`` or a
            ``queue_size`` < 1.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        max_bytes: int,
        fingerprint: str,
        read_only: bool = False,
        *,
        queue_size: int = 4,
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes (disk budget) must be >= 0, got {max_bytes}")
        if not fingerprint or "\0" in fingerprint:
            raise ValueError("fingerprint must be a non-empty string without NUL bytes")
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        self.directory = Path(os.path.abspath(directory))
        self.max_bytes = int(max_bytes)
        self.fingerprint = fingerprint
        self.read_only = read_only
        self._index = _Index(self.directory, fingerprint, read_only)
        self._writer = _Writer(self._index, self.max_bytes, queue_size, not read_only)
        if not read_only:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                self._writer.disable(exc, "cannot create the directory")
        self._index.scan(FORMAT_VERSION)
        if self._writer.writable:
            self._index.evict(self.max_bytes)
        st = self._index.snapshot()
        logger.info(
            "prompt disk cache %s: %d entries (%d usable), %d bytes, budget %d bytes%s",
            self.directory,
            st["entries"],
            st["usable"],
            st["nbytes"],
            self.max_bytes,
            "" if self._writer.writable else ", read-only",
        )
        self._writer.start()
        self._reader = _Reader()
        self._late: Future | None = None  # a read that outlasted its wait, while it runs

    @property
    def _queue(self) -> queue.Queue:
        # The writer's queue; bench/bench_disk_cache.py reads its unfinished_tasks.
        return self._writer.queue

    # ----------------------------------------------------------------- lookup
    def lookup(self, tokens: Sequence[int], min_tokens: int = 1) -> DiskHit | None:
        """Load the stored entry that serves the most leading tokens of ``tokens``.

        Call on the engine thread (it creates MLX arrays). Candidates are this
        fingerprint's entries whose tokens are a strict prefix of ``tokens`` (served
        whole) or, if trimmable, that share a common prefix with it (served trimmed),
        capped at ``len(tokens) - 1`` so a token is left to feed; ties prefer an
        untrimmed entry, then the most recently used. A candidate whose file fails its
        checksum or does not load is deleted with one warning and the next is tried.
        The file is read on the reader thread and waited for at most
        :func:`read_wait` seconds; a later read is a miss (``late``), and while it
        runs every lookup misses at once. A hit marks the entry most recently used
        (file mtime, set on the reader thread, unless read-only).

        Args:
            tokens: the whole prompt's token ids.
            min_tokens: ignore candidates serving fewer tokens (e.g. the memory tier's
                ``cached_tokens + 1``, so the disk is read only when it saves more).

        Returns:
            A :class:`DiskHit`, or None (a miss).
        """
        toks = tuple(map(int, tokens))
        for cached, entry in self._index.candidates(toks, max(1, int(min_tokens))):
            start = time.perf_counter()
            kv = self._load(entry)
            if kv is _LATE:
                break
            if kv is None:
                continue
            ms = (time.perf_counter() - start) * 1000
            now = self._index.touch(entry)
            self._touch_file(entry, now)
            self._index.count(hits=1, loads=1, load_ms=ms)
            logger.debug(
                "prompt disk cache: hit %d/%d tokens from %s in %.1f ms",
                cached,
                len(toks),
                entry.name,
                ms,
            )
            return DiskHit(kv, cached, entry.tokens)
        self._index.count(misses=1)
        return None

    def _load(self, entry: _Entry) -> Any:
        """``entry``'s KV (MLX arrays built here, on the caller's thread), None when its
        file is gone, unreadable or corrupt, or ``_LATE`` when the reader did not
        deliver its bytes within :func:`read_wait` (or is still busy with a late read)."""
        if self._stuck():
            self._index.count(late=1)
            return _LATE
        wait = read_wait(entry.nbytes)
        future = self._reader.submit(self._read, entry)
        try:
            data = future.result(timeout=wait)
        except TimeoutError:
            self._late = future  # its result is never read
            self._index.count(late=1)
            logger.warning(
                "prompt disk cache: reading %s took over %.1f s; served as a miss "
                "(is the file system slow or stuck?)",
                self.directory / entry.name,
                wait,
            )
            return _LATE
        if data is None:
            return None
        try:
            return fmt.parse_entry(
                data, entry.name, self.fingerprint, entry.tokens, FORMAT_VERSION, checked=True
            )
        except fmt.CorruptFile as exc:
            self._index.drop_corrupt(self.directory / entry.name, str(exc))
            return None

    def _stuck(self) -> bool:
        """Whether a read that outlasted its wait is still running."""
        if self._late is not None and self._late.done():
            self._late = None
        return self._late is not None

    def _touch_file(self, entry: _Entry, now: int) -> None:
        """Queue ``entry``'s mtime update for the reader thread (not while it is stuck)."""
        if not self.read_only and not self._stuck():
            self._reader.submit(self._index.touch_file, entry, now)

    def _read(self, entry: _Entry) -> bytes | None:
        """On the reader thread: ``entry``'s file bytes with their checksum checked, or
        None when the file is gone, not a regular file, unreadable or corrupt (handled
        here: forgotten, logged or deleted)."""
        path = self.directory / entry.name
        try:
            data = fmt.read_file(path)
        except FileNotFoundError:  # evicted meanwhile, or removed by hand
            self._index.forget(entry.name)
            return None
        except fmt.NotRegularFile:  # replaced by a FIFO, a directory...: never read
            logger.warning("prompt disk cache: skipping %s: not a regular file", path)
            self._index.forget(entry.name)
            return None
        except OSError as exc:
            logger.warning("prompt disk cache: cannot read %s: %s", path, exc)
            return None
        try:
            fmt.check_checksum(data, entry.name)
        except fmt.CorruptFile as exc:
            self._index.drop_corrupt(path, str(exc))
            return None
        return data

    # ----------------------------------------------------------------- put
    def put(self, tokens: Sequence[int], kv: list) -> bool:
        """Queue ``kv``, the KV cache of ``tokens``, to be written to disk.

        Call on the engine thread: materialises ``kv`` (``mx.eval``) and serialises it
        into memory with mlx-lm's ``save_prompt_cache`` (one copy of its bytes); the
        file is written later by the writer thread. ``kv`` is only read, so it may also
        be given to the memory tier. Never blocks on I/O: when the write queue is full
        the entry is dropped with a log line.

        Not queued: an empty ``tokens``; tokens already stored (the entry is marked
        used instead); a read-only or disabled cache; an entry larger than
        ``max_bytes``. A trimmable entry, once written, replaces stored entries whose
        tokens are a strict prefix of its own.

        Args:
            tokens: the token ids whose KV ``kv`` holds.
            kv: per-layer cache objects from ``mlx_lm.models.cache``.

        Returns:
            True when queued for writing.

        Raises:
            ValueError: if ``kv`` has no layers or a layer's integer ``offset`` differs
                from ``len(tokens)``.
        """
        toks = tuple(map(int, tokens))
        check_kv_holds(kv, toks)
        if not toks or not self._writer.writable or self._writer.closing:
            return False
        key = fmt.entry_key(self.fingerprint, toks)
        existing = self._index.get(key)
        if existing is not None:
            now = self._index.touch(existing)
            self._touch_file(existing, now)
            return False
        kv = [fmt.compact(c) for c in kv]
        size = sum(int(layer.nbytes) for layer in kv)
        if size > self.max_bytes:
            logger.debug("prompt disk cache: entry of %d bytes exceeds the budget", size)
            return False
        if self._writer.full():
            self._writer.drop(len(toks))
            return False
        payload, trimmable = fmt.serialise(kv, self.fingerprint, toks, FORMAT_VERSION)
        return self._writer.submit(_Job(key, toks, trimmable, payload))

    # ----------------------------------------------------------------- public state
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued entry is written (or dropped). Returns False on
        timeout (seconds). Call from any thread but the writer."""
        return self._writer.flush(timeout)

    def close(self, timeout: float | None = 10.0) -> None:
        """Write what is queued (waiting at most ``timeout`` seconds), then stop the
        writer thread, and the reader's (its queued mtime updates; a read stuck in the
        kernel is left to its daemon thread). Later puts are ignored. Idempotent."""
        start = time.monotonic()
        self._writer.close(timeout)
        left = 1.0 if timeout is None else max(0.0, timeout - (time.monotonic() - start))
        self._reader.close(min(left, 1.0))

    def stats(self) -> DiskCacheStats:
        """A consistent snapshot of the counters and sizes (see :class:`DiskCacheStats`)."""
        return DiskCacheStats(
            max_bytes=self.max_bytes, writable=self._writer.writable, **self._index.snapshot()
        )

    def __len__(self) -> int:
        """Number of this fingerprint's entries (the ones lookups can use)."""
        return len(self._index)
