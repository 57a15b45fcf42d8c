"""Disk tier of the prompt cache: KV caches kept in files that survive restarts.

Owns: one directory of prompt-cache files, each holding the per-layer KV cache
(``mlx_lm.models.cache`` objects) of one token sequence in mlx-lm's own prompt-cache
file format (``save_prompt_cache`` / ``load_prompt_cache``: safetensors with metadata);
an in-memory index of them rebuilt from their headers at start-up; finding the entry
that saves the most prefill for a prompt; a byte budget with LRU eviction whose order
(file modification times, refreshed on every hit) survives restarts; atomic, checksummed
writes on a background thread; and counters. Never imports grpc or runs a model.

Threads: :meth:`DiskCache.put` and :meth:`DiskCache.lookup` run on the caller's thread
(the engine thread, which owns MLX): ``put`` materialises the KV and serialises it into
an in-memory buffer there (the only MLX work), then queues it; a private writer thread
hashes the buffer and writes it (temporary file, fsync, rename, directory fsync), with
no MLX call. ``lookup`` reads, checks and loads a file on the caller's thread.

File names are ``<key>-<sha256>.safetensors``: ``key`` is a hash of the fingerprint and
the token ids, ``sha256`` the checksum of the whole file, checked on every load (a torn,
truncated or altered file is skipped with one warning and deleted). The header metadata
holds the format version, fingerprint and token ids, so the index needs no separate
file that could disagree with the directory after a crash.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import hashlib
import io
import json
import logging
import os
import queue
import re
import secrets
import struct
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "FORMAT_VERSION",
    "DiskCache",
    "DiskCacheStats",
    "DiskHit",
    "model_fingerprint",
    "safe_cache_dir",
]

logger = logging.getLogger("localai.mlx.prompt_disk")

FORMAT_VERSION = 1
_SUFFIX = ".safetensors"
_NAME_RE = re.compile(r"^([0-9a-f]{32})-([0-9a-f]{64})\.safetensors$")
_TMP_RE = re.compile(r"^\.tmp-(\d+)-[0-9a-f]{16}\.part$")
_MAX_HEADER = 64 << 20  # bytes; a larger safetensors header is treated as corrupt
_STALE_TMP_S = 3600.0  # a temporary file this old is a dead writer's, whoever wrote it
# Errors after which writing stops for good (the directory will not take files).
_FATAL_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}
# Tokenizer files hashed by model_fingerprint when present.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)
_EDGE = 1 << 20  # bytes hashed at each end of a weight file


# --------------------------------------------------------------------------- helpers
def safe_cache_dir(prompt_cache_path: str, model_dir: str) -> Path:
    """The disk-cache directory for LocalAI's ``PromptCachePath``, confined to ``model_dir``.

    LocalAI sends ``PromptCachePath`` as its models directory (``ModelOptions.ModelPath``)
    joined with the model YAML's ``prompt_cache_path``; it creates only the parent. A
    relative ``prompt_cache_path`` is taken under ``model_dir``. Symlinks are resolved
    before the check, so a link cannot lead outside either.

    Args:
        prompt_cache_path: ``PredictOptions.PromptCachePath`` (or load option
            ``prompt_cache_dir``).
        model_dir: the models directory LocalAI names (``ModelOptions.ModelPath``).

    Returns:
        The resolved absolute directory (it may not exist yet; ``DiskCache`` creates it).

    Raises:
        ValueError: if either is empty or holds a NUL byte, or the path resolves to
            ``model_dir`` itself or anywhere outside it.
    """
    for name, value in (("PromptCachePath", prompt_cache_path), ("model directory", model_dir)):
        if not value or not value.strip():
            raise ValueError(f"{name} is empty; the prompt cache directory needs both")
        if "\0" in value:
            raise ValueError(f"{name} contains a NUL byte")
    root = Path(os.path.realpath(model_dir))
    path = Path(prompt_cache_path)
    if not path.is_absolute():
        path = root / path
    real = Path(os.path.realpath(path))
    if real == root or root not in real.parents:
        raise ValueError(
            f"PromptCachePath {prompt_cache_path!r} resolves to {real}, which is not inside "
            f"the models directory {root}; set prompt_cache_path in the model's YAML to a "
            "relative path such as 'cache/<model name>'"
        )
    return real


def _file_identity(path: Path, *, content: bool) -> dict[str, Any]:
    st = path.stat()
    ident: dict[str, Any] = {"name": path.name, "size": st.st_size}
    h = hashlib.sha256()
    with path.open("rb") as f:
        if content or st.st_size <= 2 * _EDGE:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        else:
            ident["mtime_ns"] = st.st_mtime_ns
            h.update(f.read(_EDGE))
            f.seek(st.st_size - _EDGE)
            h.update(f.read(_EDGE))
    ident["sha256"] = h.hexdigest()
    return ident


def model_fingerprint(model_dir_or_files: str | os.PathLike | Iterable, extra: dict) -> str:
    """A string naming everything that changes the KV a model computes for given tokens.

    Hashed, per file found: ``config.json``, the tokenizer files (``tokenizer.json``,
    ``tokenizer_config.json``, ... ) and small files by their whole content; weight files
    (``*.safetensors``, ``*.gguf``, ``*.npz``, and any file given explicitly that is
    larger than 2 MiB) by name, size, modification time and a SHA-256 of their first and
    last MiB. Whole-content hashes of multi-GB weights would add seconds to every load;
    size + mtime catch a replaced or re-downloaded file, and the first MiB holds the
    safetensors / GGUF header (tensor names, shapes, dtypes, quantization), so a
    re-quantized or re-converted model changes it. A copied model directory (new mtimes)
    just starts a fresh cache. Also hashed: ``extra`` (JSON, sorted keys) and the
    installed ``mlx`` / ``mlx-lm`` versions (an upgrade may change a model's maths).

    Pass in ``extra`` every load setting that changes the KV: KV quantization (bits,
    group size, start), ``max_kv_size`` (rotating cache), LoRA (e.g.
    ``model_fingerprint(adapter_dir, {"scale": s})``), a draft model's fingerprint (its
    layers share the entry), the distributed layout (kind, world size, rank), dtype.

    Args:
        model_dir_or_files: the directory ``mlx_lm.load`` loaded (the converted directory
            for a GGUF) or an iterable of file paths.
        extra: JSON-serialisable settings.

    Returns:
        ``"<lineage>:<content>"``, 16 + 32 hex digits. ``lineage`` hashes the resolved
        paths and ``extra``; ``content`` hashes everything. :class:`DiskCache` treats
        entries with the same lineage but another content as certainly stale (the files
        at that path changed) and deletes them.

    Raises:
        ValueError: if a path does not exist, the directory has no ``config.json`` or no
            file is given, or ``extra`` is not JSON-serialisable.
    """
    import mlx.core as mx
    import mlx_lm

    if isinstance(model_dir_or_files, (str, os.PathLike)):
        root = Path(model_dir_or_files)
        if not root.exists():
            raise ValueError(f"model path {root} does not exist")
        if root.is_dir():
            if not (root / "config.json").is_file():
                raise ValueError(f"model directory {root} has no config.json")
            small = [root / "config.json"] + [
                root / n for n in _TOKENIZER_FILES if (root / n).is_file()
            ]
            big = sorted(
                p
                for p in root.iterdir()
                if p.is_file() and p.suffix in (".safetensors", ".gguf", ".npz")
            )
            index = root / "model.safetensors.index.json"
            files = [(p, True) for p in small + ([index] if index.is_file() else [])]
            files += [(p, False) for p in big]
        else:
            files = [(root, False)]
    else:
        files = []
        for item in model_dir_or_files:
            p = Path(item)
            if not p.is_file():
                raise ValueError(f"model file {p} does not exist")
            files.append((p, p.stat().st_size <= 2 * _EDGE))
    if not files:
        raise ValueError("model_fingerprint needs at least one file")
    try:
        extra_json = json.dumps(extra, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"model_fingerprint extra is not JSON-serialisable: {exc}") from exc
    paths = sorted(str(p.resolve()) for p, _ in files)
    lineage = hashlib.sha256(json.dumps([paths, extra_json]).encode()).hexdigest()[:16]
    idents = [_file_identity(p, content=c) for p, c in sorted(files, key=lambda x: str(x[0]))]
    blob = json.dumps(
        [FORMAT_VERSION, idents, extra_json, mx.__version__, mlx_lm.__version__],
        sort_keys=True,
    )
    return f"{lineage}:{hashlib.sha256(blob.encode()).hexdigest()[:32]}"


def _entry_key(fingerprint: str, tokens: tuple[int, ...]) -> str:
    h = hashlib.sha256(fingerprint.encode())
    h.update(b"\0")
    h.update(",".join(map(str, tokens)).encode())
    return h.hexdigest()[:32]


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length (tokens) of the longest common prefix of ``a`` and ``b``."""
    m = min(len(a), len(b))
    if a[:m] == b[:m]:
        return m
    lo, hi = 0, m  # a[:lo] == b[:lo], a[:hi] != b[:hi]; bisect on C-speed slices
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _compact(layer: Any) -> Any:
    """``layer`` itself, or for a ``KVCache`` / ``QuantizedKVCache`` a shallow copy
    whose arrays hold only its ``offset`` tokens: their ``state`` is the whole
    step-padded buffer, including tokens trimmed away, which the file need not hold."""
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    if type(layer) not in (KVCache, QuantizedKVCache) or layer.keys is None:
        return layer
    out = copy.copy(layer)
    out.keys, out.values = layer.keys_and_values()
    return out


def _write_all(fd: int, data: memoryview) -> None:
    """Write all of ``data`` to ``fd`` (os.write may write less than asked)."""
    while data:
        n = os.write(fd, data)
        data = data[n:]


def _read_header(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file's header (no tensor data is read).

    Raises ValueError for a malformed header, OSError when unreadable.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if not 2 <= n <= _MAX_HEADER:
            raise ValueError(f"header length {n} out of range")
        raw = f.read(n)
    if len(raw) != n:
        raise ValueError("truncated header")
    header = json.loads(raw)
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict):
        raise ValueError("no metadata")
    return meta


def _parse_tokens(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in text.split(",")) if text else ()


# --------------------------------------------------------------------------- types
@dataclass(frozen=True)
class DiskCacheStats:
    """A snapshot of a :class:`DiskCache`'s state and counters.

    ``entries`` / ``nbytes`` (bytes on disk) count every file of the cache in the
    directory, including other fingerprints' (they share the budget); ``usable`` counts
    this fingerprint's. ``hits`` / ``misses`` count :meth:`DiskCache.lookup` calls;
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


# --------------------------------------------------------------------------- the cache
class DiskCache:
    """A directory of prompt KV caches for one model fingerprint, LRU within ``max_bytes``.

    Construction scans the directory (headers only): leftover temporary files of dead
    writers and unreadable files are deleted, older format versions and entries
    certainly stale for this model (same fingerprint lineage, other content, see
    :func:`model_fingerprint`) too. Entries of other fingerprints or newer format
    versions are never used but stay, counted in the budget, until LRU evicts them.

    Only files named by this module inside ``directory`` are ever created, opened or
    deleted; symlinks are not followed. I/O failures never raise: they are logged and
    counted, and a full disk or unwritable directory stops writing (logged once) while
    lookups go on.

    Args:
        directory: the cache directory (created unless ``read_only``); use
            :func:`safe_cache_dir` for a path that comes from a request.
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
        self._lineage, _, self._content = fingerprint.partition(":")
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}  # by file name
        self._by_key: dict[str, str] = {}  # entry key -> file name (this fingerprint)
        self._nbytes = 0
        self._writable = not read_only
        self._closing = False
        self._warned_write = False
        self._c = dict.fromkeys(
            ("hits", "misses", "evictions", "loads", "writes", "dropped", "write_errors"), 0
        )
        self._c["corrupt"] = 0
        self._load_ms = 0.0
        self._write_ms = 0.0
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=queue_size)
        self._writer: threading.Thread | None = None
        if not read_only:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                self._disable_writes(exc, "cannot create the directory")
        self._scan()
        if self._writable:
            self._writer = threading.Thread(
                target=self._write_loop, name="prompt-disk-writer", daemon=True
            )
            self._writer.start()

    # ----------------------------------------------------------------- start-up scan
    def _scan(self) -> None:
        try:
            names = os.listdir(self.directory)
        except OSError as exc:
            logger.warning("prompt disk cache: cannot list %s: %s", self.directory, exc)
            return
        now = time.time()
        for name in names:
            path = self.directory / name
            if _TMP_RE.match(name):
                self._maybe_remove_tmp(path, int(_TMP_RE.match(name).group(1)), now)
                continue
            m = _NAME_RE.match(name)
            if not m:
                continue
            try:
                st = path.lstat()
                meta = _read_header(path)
                version = int(meta["0.format"])
                fp = meta["0.fingerprint"]
                tokens = _parse_tokens(meta["0.tokens"])
                trimmable = meta["0.trimmable"] == "1"
            except OSError as exc:
                logger.warning("prompt disk cache: cannot read %s: %s", path, exc)
                continue
            except (ValueError, KeyError, TypeError) as exc:
                self._drop_corrupt(path, f"unreadable header ({exc})")
                continue
            if version < FORMAT_VERSION or (
                version == FORMAT_VERSION and self._certainly_stale(fp)
            ):
                logger.info("prompt disk cache: removing stale entry %s", name)
                self._unlink(path)
                continue
            entry = _Entry(name, fp, version, tokens, trimmable, st.st_size, st.st_mtime_ns)
            if fp == self.fingerprint and version == FORMAT_VERSION:
                if m.group(1) != _entry_key(fp, tokens):
                    self._drop_corrupt(path, "name does not match its tokens")
                    continue
                old = self._by_key.get(m.group(1))
                if old is not None:  # two files for one key: keep the newer
                    if self._entries[old].last_use >= entry.last_use:
                        self._unlink(path)
                        continue
                    self._remove_locked(old, delete=True)
                self._by_key[m.group(1)] = name
            self._entries[name] = entry
            self._nbytes += entry.nbytes
        if self._writable:
            with self._lock:
                self._evict_locked(self.max_bytes)
        logger.info(
            "prompt disk cache %s: %d entries (%d usable), %d bytes, budget %d bytes%s",
            self.directory,
            len(self._entries),
            len(self._by_key),
            self._nbytes,
            self.max_bytes,
            "" if self._writable else ", read-only",
        )

    def _certainly_stale(self, fp: str) -> bool:
        """Same lineage (model path + settings), other content: the files changed."""
        lineage, sep, content = fp.partition(":")
        return bool(sep and self._content) and lineage == self._lineage and content != self._content

    def _maybe_remove_tmp(self, path: Path, pid: int, now: float) -> None:
        if self.read_only:
            return
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
            return
        if not alive or old:
            logger.info("prompt disk cache: removing an unfinished write %s", path.name)
            self._unlink(path)

    # ----------------------------------------------------------------- lookup
    def lookup(self, tokens: Sequence[int], min_tokens: int = 1) -> DiskHit | None:
        """Load the stored entry that serves the most leading tokens of ``tokens``.

        Call on the engine thread (it creates MLX arrays). Candidates are this
        fingerprint's entries whose tokens are a strict prefix of ``tokens`` (served
        whole) or, if trimmable, that share a common prefix with it (served trimmed),
        capped at ``len(tokens) - 1`` so a token is left to feed; ties prefer an
        untrimmed entry, then the most recently used. A candidate whose file fails its
        checksum or does not load is deleted with one warning and the next is tried.
        A hit marks the entry most recently used (file mtime, unless read-only).

        Args:
            tokens: the whole prompt's token ids.
            min_tokens: ignore candidates serving fewer tokens (e.g. the memory tier's
                ``cached_tokens + 1``, so the disk is read only when it saves more).

        Returns:
            A :class:`DiskHit`, or None (a miss).
        """
        toks = tuple(map(int, tokens))
        n = len(toks)
        need = max(1, int(min_tokens))
        with self._lock:
            candidates = []
            for name in self._by_key.values():
                e = self._entries[name]
                if len(e.tokens) < n and toks[: len(e.tokens)] == e.tokens:
                    cached = len(e.tokens)
                elif e.trimmable:
                    cached = min(_common_prefix(e.tokens, toks), n - 1)
                else:
                    continue
                if cached >= need:
                    candidates.append((cached, cached == len(e.tokens), e.last_use, e))
        candidates.sort(key=lambda c: c[:3], reverse=True)
        for cached, _, _, entry in candidates:
            start = time.perf_counter()
            kv = self._load(entry)
            if kv is None:
                continue
            ms = (time.perf_counter() - start) * 1000
            self._touch(entry)
            with self._lock:
                self._c["hits"] += 1
                self._c["loads"] += 1
                self._load_ms += ms
            logger.debug(
                "prompt disk cache: hit %d/%d tokens from %s in %.1f ms",
                cached,
                n,
                entry.name,
                ms,
            )
            return DiskHit(kv, cached, entry.tokens)
        with self._lock:
            self._c["misses"] += 1
        return None

    def _load(self, entry: _Entry) -> list | None:
        from mlx_lm.models.cache import load_prompt_cache

        path = self.directory / entry.name
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as f:
                data = f.read()
        except FileNotFoundError:  # evicted meanwhile, or removed by hand
            self._forget(entry.name)
            return None
        except OSError as exc:
            logger.warning("prompt disk cache: cannot read %s: %s", path, exc)
            return None
        if hashlib.sha256(data).hexdigest() != _NAME_RE.match(entry.name).group(2):
            self._drop_corrupt(path, "checksum mismatch (torn, truncated or altered)")
            return None
        try:
            buf = io.BytesIO(data)
            buf.name = entry.name  # mx.load picks the format from the name
            kv, meta = load_prompt_cache(buf, return_metadata=True)
            ok = (
                meta.get("fingerprint") == self.fingerprint
                and meta.get("format") == str(FORMAT_VERSION)
                and _parse_tokens(meta.get("tokens", "")) == entry.tokens
                and all(
                    getattr(c, "offset", len(entry.tokens)) == len(entry.tokens)
                    for c in kv
                    if isinstance(getattr(c, "offset", None), int)
                )
            )
        except Exception as exc:  # any failure to parse means the entry is unusable
            self._drop_corrupt(path, f"does not load ({type(exc).__name__}: {exc})")
            return None
        if not ok:
            self._drop_corrupt(path, "metadata does not match the index")
            return None
        return kv

    def _touch(self, entry: _Entry) -> None:
        now = time.time_ns()
        if not self.read_only:
            with contextlib.suppress(OSError):  # else the order is kept in memory only
                os.utime(self.directory / entry.name, ns=(now, now), follow_symlinks=False)
        with self._lock:
            entry.last_use = now

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
        import mlx.core as mx
        from mlx_lm.models.cache import can_trim_prompt_cache, save_prompt_cache

        toks = tuple(map(int, tokens))
        if not kv:
            raise ValueError("kv must have at least one layer")
        for i, layer in enumerate(kv):
            offset = getattr(layer, "offset", None)
            if isinstance(offset, int) and offset != len(toks):
                raise ValueError(
                    f"kv layer {i} holds {offset} tokens but {len(toks)} tokens were given"
                )
        if not toks or not self._writable or self._closing:
            return False
        key = _entry_key(self.fingerprint, toks)
        with self._lock:
            name = self._by_key.get(key)
            existing = self._entries.get(name) if name else None
        if existing is not None:
            self._touch(existing)
            return False
        kv = [_compact(c) for c in kv]
        size = sum(int(layer.nbytes) for layer in kv)
        if size > self.max_bytes:
            logger.debug("prompt disk cache: entry of %d bytes exceeds the budget", size)
            return False
        if self._queue.full():
            self._drop(len(toks))
            return False
        mx.eval([c.state for c in kv])
        buf = io.BytesIO()
        meta = {
            "format": str(FORMAT_VERSION),
            "fingerprint": self.fingerprint,
            "tokens": ",".join(map(str, toks)),
            "trimmable": "1" if can_trim_prompt_cache(kv) else "0",
        }
        save_prompt_cache(buf, kv, meta)
        # getbuffer: no second copy of the bytes on the engine thread.
        job = _Job(key, toks, meta["trimmable"] == "1", buf.getbuffer())
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self._drop(len(toks))
            return False
        return True

    def _drop(self, n_tokens: int) -> None:
        with self._lock:
            self._c["dropped"] += 1
        logger.warning(
            "prompt disk cache: write queue full, not saving an entry of %d tokens", n_tokens
        )

    # ----------------------------------------------------------------- writer thread
    def _write_loop(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                if self._writable:
                    start = time.perf_counter()
                    self._write(job)
                    with self._lock:
                        self._write_ms += (time.perf_counter() - start) * 1000
            except Exception:  # the writer must outlive any one bad entry
                logger.exception("prompt disk cache: writing an entry failed")
                with self._lock:
                    self._c["write_errors"] += 1
            finally:
                self._queue.task_done()

    def _write(self, job: _Job) -> None:
        size = len(job.payload)
        if size > self.max_bytes:
            return
        name = f"{job.key}-{hashlib.sha256(job.payload).hexdigest()}{_SUFFIX}"
        with self._lock:
            self._evict_locked(self.max_bytes - size)
        tmp = self.directory / f".tmp-{os.getpid()}-{secrets.token_hex(8)}.part"
        final = self.directory / name
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            fd = os.open(tmp, flags, 0o644)
            try:
                _write_all(fd, job.payload)
                os.fsync(fd)
            finally:
                os.close(fd)
            # Creation counts as a use; a fine clock keeps LRU order exact (file
            # times come from a coarse kernel clock).
            now = time.time_ns()
            os.utime(tmp, ns=(now, now))
            os.replace(tmp, final)
            dfd = os.open(self.directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            self._unlink(tmp)
            with self._lock:
                self._c["write_errors"] += 1
            if exc.errno in _FATAL_WRITE_ERRNOS:
                self._disable_writes(exc, "cannot write")
            else:
                logger.warning("prompt disk cache: writing %s failed: %s", final, exc)
            return
        entry = _Entry(name, self.fingerprint, FORMAT_VERSION, job.tokens, job.trimmable, size, now)
        with self._lock:
            old = self._by_key.get(job.key)
            if old is not None and old != name:
                self._remove_locked(old, delete=True)
            if job.trimmable:
                for e in [
                    e
                    for e in self._entries.values()
                    if e.fingerprint == self.fingerprint
                    and len(e.tokens) < len(job.tokens)
                    and job.tokens[: len(e.tokens)] == e.tokens
                ]:
                    self._remove_locked(e.name, delete=True)
            if name not in self._entries:
                self._nbytes += size
            self._entries[name] = entry
            self._by_key[job.key] = name
            self._c["writes"] += 1
            self._evict_locked(self.max_bytes)

    def _disable_writes(self, exc: OSError, what: str) -> None:
        self._writable = False
        if not self._warned_write:
            self._warned_write = True
            logger.error(
                "prompt disk cache: %s in %s (%s); no more entries will be written, "
                "serving goes on",
                what,
                self.directory,
                exc.strerror or exc,
            )

    # ----------------------------------------------------------------- bookkeeping
    def _evict_locked(self, budget: int) -> None:
        if self._nbytes <= budget:
            return
        for e in sorted(self._entries.values(), key=lambda e: e.last_use):
            if self._nbytes <= budget:
                break
            self._remove_locked(e.name, delete=True)
            self._c["evictions"] += 1

    def _remove_locked(self, name: str, *, delete: bool) -> None:
        entry = self._entries.pop(name, None)
        if entry is None:
            return
        self._nbytes -= entry.nbytes
        key = _NAME_RE.match(name).group(1)
        if self._by_key.get(key) == name:
            del self._by_key[key]
        if delete:
            self._unlink(self.directory / name)

    def _forget(self, name: str) -> None:
        with self._lock:
            self._remove_locked(name, delete=False)

    def _drop_corrupt(self, path: Path, why: str) -> None:
        logger.warning(
            "prompt disk cache: skipping %s: %s%s",
            path,
            why,
            "" if self.read_only else "; deleted",
        )
        with self._lock:
            self._c["corrupt"] += 1
            self._remove_locked(path.name, delete=False)
        if not self.read_only:
            self._unlink(path)

    def _unlink(self, path: Path) -> None:
        if self.read_only or path.parent != self.directory:
            return
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("prompt disk cache: cannot delete %s: %s", path, exc)

    # ----------------------------------------------------------------- public state
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued entry is written (or dropped). Returns False on
        timeout (seconds). Call from any thread but the writer."""
        if self._writer is None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self, timeout: float | None = 10.0) -> None:
        """Write what is queued (waiting at most ``timeout`` seconds), then stop the
        writer thread. Later puts are ignored. Idempotent."""
        writer, self._writer = self._writer, None
        self._closing = True
        if writer is None:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                self._queue.put(None, timeout=0.05)
                break
            except queue.Full:
                if deadline is not None and time.monotonic() > deadline:
                    logger.warning("prompt disk cache: closing with writes still queued")
                    return
        writer.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def stats(self) -> DiskCacheStats:
        """A consistent snapshot of the counters and sizes (see :class:`DiskCacheStats`)."""
        with self._lock:
            return DiskCacheStats(
                entries=len(self._entries),
                usable=len(self._by_key),
                nbytes=self._nbytes,
                max_bytes=self.max_bytes,
                load_ms=round(self._load_ms, 3),
                write_ms=round(self._write_ms, 3),
                writable=self._writable,
                **self._c,
            )

    def __len__(self) -> int:
        """Number of this fingerprint's entries (the ones lookups can use)."""
        with self._lock:
            return len(self._by_key)
