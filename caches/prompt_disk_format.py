"""The files of the prompt cache's disk tier, as functions without state.

Owns: what identifies a model's KV (:func:`model_fingerprint`); the names of the files in a
cache directory (entry files ``<key>-<sha256>.safetensors``, temporary files
``.tmp-<pid>-<random>.part``); and the file format: mlx-lm's own prompt-cache files
(``save_prompt_cache`` / ``load_prompt_cache``: safetensors with metadata) whose metadata
holds the format version, the fingerprint and the token ids, checked by a SHA-256 of the
whole file that the file's name carries. ``prompt_disk.DiskCache`` does the I/O policy,
the index and the threads. Never imports grpc or runs a model.

Functions that write or check the format version take it as ``version``: the caller
(``prompt_disk``) decides which version it writes and accepts.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import io
import json
import os
import re
import stat
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

__all__ = [
    "FORMAT_VERSION",
    "CorruptFile",
    "Header",
    "NotRegularFile",
    "check_checksum",
    "compact",
    "entry_key",
    "file_name",
    "model_fingerprint",
    "name_checksum",
    "name_key",
    "parse_entry",
    "read_file",
    "read_header",
    "serialise",
    "tmp_name",
    "tmp_pid",
]

FORMAT_VERSION = 1
_SUFFIX = ".safetensors"
_NAME_RE = re.compile(r"^([0-9a-f]{32})-([0-9a-f]{64})\.safetensors$")
_TMP_RE = re.compile(r"^\.tmp-(\d+)-[0-9a-f]{16}\.part$")
_MAX_HEADER = 64 << 20  # bytes; a larger safetensors header is treated as corrupt
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
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# Opening a FIFO for reading without O_NONBLOCK waits for a writer: forever, on the
# engine thread. With it, open returns at once and fstat tells what the file is.
_READ_FLAGS = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class CorruptFile(ValueError):
    """An entry file that cannot be used: torn, truncated, altered or mislabelled.

    ``str(exc)`` says why, in words fit for a log line."""


class NotRegularFile(OSError):
    """A path named like an entry that is not a regular file (a FIFO, a directory, a
    device, a socket): never read. This cache only ever creates regular files."""


@dataclass(frozen=True)
class Header:
    """What an entry file's header says about it (read without its tensor data)."""

    version: int
    fingerprint: str
    tokens: tuple[int, ...]
    trimmable: bool


# --------------------------------------------------------------------------- model identity
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
    just starts a fresh cache. Also hashed: ``extra`` (JSON, sorted keys), the file
    format version and the installed ``mlx`` / ``mlx-lm`` versions (an upgrade may
    change a model's maths).

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
        paths and ``extra``; ``content`` hashes everything. ``DiskCache`` treats
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
    mlx_version = mx.__version__  # type: ignore[attr-defined]  # not in mlx's stubs
    blob = json.dumps(
        [FORMAT_VERSION, idents, extra_json, mlx_version, mlx_lm.__version__], sort_keys=True
    )
    return f"{lineage}:{hashlib.sha256(blob.encode()).hexdigest()[:32]}"


# --------------------------------------------------------------------------- file names
def entry_key(fingerprint: str, tokens: tuple[int, ...]) -> str:
    """The 32-hex-digit key of the entry of ``tokens`` under ``fingerprint``."""
    h = hashlib.sha256(fingerprint.encode())
    h.update(b"\0")
    h.update(",".join(map(str, tokens)).encode())
    return h.hexdigest()[:32]


def file_name(key: str, payload: bytes | memoryview) -> str:
    """The file name of an entry: its key and the SHA-256 of its bytes ``payload``."""
    return f"{key}-{hashlib.sha256(payload).hexdigest()}{_SUFFIX}"


def name_key(name: str) -> str | None:
    """The entry key in a file name, or None when ``name`` is not an entry file's."""
    m = _NAME_RE.match(name)
    return m.group(1) if m else None


def name_checksum(name: str) -> str:
    """The SHA-256 (hex) an entry file's name carries. ``name`` must be an entry's."""
    m = _NAME_RE.match(name)
    if m is None:
        raise ValueError(f"{name!r} is not a prompt cache entry's name")
    return m.group(2)


def tmp_name(pid: int, token: str) -> str:
    """The name of a temporary file written by process ``pid``; ``token``: 16 hex digits."""
    return f".tmp-{pid}-{token}.part"


def tmp_pid(name: str) -> int | None:
    """The writer's pid in a temporary file's name, or None when ``name`` is not one."""
    m = _TMP_RE.match(name)
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------- the format
def compact(layer: Any) -> Any:
    """``layer`` itself, or for a ``KVCache`` / ``QuantizedKVCache`` (subclasses included)
    a shallow copy whose arrays hold only its ``offset`` tokens: their ``state`` is the
    whole step-padded buffer, including tokens trimmed away, which the file need not
    hold."""
    from mlx.utils import tree_map
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    if not isinstance(layer, (KVCache, QuantizedKVCache)) or layer.keys is None:
        return layer
    out = copy.copy(layer)
    # (Not keys_and_values(): mlx-lm's main branch has none. Quantized: tuples of arrays.)
    n = layer.offset
    out.keys, out.values = tree_map(lambda x: x[..., :n, :], (layer.keys, layer.values))
    return out


def serialise(
    kv: list, fingerprint: str, tokens: Sequence[int], version: int
) -> tuple[memoryview, bool]:
    """Materialise ``kv`` (``mx.eval``; call on the thread that owns MLX) and write it
    with its metadata into memory, in mlx-lm's prompt-cache format.

    Returns:
        ``(payload, trimmable)``: the file's bytes (a view of the one buffer holding
        them) and whether every layer can be trimmed.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import can_trim_prompt_cache, save_prompt_cache

    mx.eval([c.state for c in kv])
    buf = io.BytesIO()
    trimmable = can_trim_prompt_cache(kv)
    meta = {
        "format": str(version),
        "fingerprint": fingerprint,
        "tokens": ",".join(map(str, tokens)),
        "trimmable": "1" if trimmable else "0",
    }
    # mlx-lm annotates a file name; mx.save_safetensors takes a file object too.
    save_prompt_cache(buf, kv, meta)  # type: ignore[arg-type]
    # getbuffer: no second copy of the bytes on the caller's thread.
    return buf.getbuffer(), trimmable


def _parse_tokens(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in text.split(",")) if text else ()


def read_header(path: Path) -> Header:
    """The :class:`Header` of the entry file at ``path`` (no tensor data is read;
    a symlink is not followed; only a regular file is read, see :func:`read_file`).

    Raises:
        ValueError: for a malformed header or metadata.
        NotRegularFile: for a FIFO, directory, device or socket.
        OSError: when the file cannot be read.
    """
    with _open_regular(path) as f:
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
    # save_prompt_cache flattens a list holding our metadata dict: at index 0 in mlx-lm
    # 0.32.2 ("0.format"...), at 1 on mlx-lm's main branch (after the layers' meta_state).
    ours = next((k[: -len("fingerprint")] for k in meta if k.endswith(".fingerprint")), "0.")
    try:
        return Header(
            version=int(meta[ours + "format"]),
            fingerprint=meta[ours + "fingerprint"],
            tokens=_parse_tokens(meta[ours + "tokens"]),
            trimmable=meta[ours + "trimmable"] == "1",
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(str(exc)) from exc


def _open_regular(path: Path) -> io.BufferedReader:
    """``path`` opened for reading without blocking and without following a symlink,
    checked to be a regular file on the open descriptor (no race with a swap).

    Raises:
        NotRegularFile: for a FIFO, directory, device or socket.
        OSError: when it cannot be opened (a symlink: ELOOP).
    """
    fd = os.open(path, _READ_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", str(path))
        # A regular file's reads never wait on O_NONBLOCK; clear it all the same.
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_file(path: Path) -> bytes:
    """All bytes of the regular file at ``path``, opened without blocking and not
    following a symlink. Raises NotRegularFile (an OSError) or OSError."""
    with _open_regular(path) as f:
        return f.read()


def check_checksum(data: bytes, name: str) -> None:
    """Raise :class:`CorruptFile` unless ``data`` hashes to the checksum in entry file
    name ``name``. No MLX: callable on any thread."""
    if hashlib.sha256(data).hexdigest() != name_checksum(name):
        raise CorruptFile("checksum mismatch (torn, truncated or altered)")


def parse_entry(
    data: bytes,
    name: str,
    fingerprint: str,
    tokens: tuple[int, ...],
    version: int,
    *,
    checked: bool = False,
) -> list:
    """The per-layer KV cache objects in ``data``, the bytes of entry file ``name``,
    after checking them against the checksum in ``name`` (skipped when ``checked``:
    :func:`check_checksum` already ran, e.g. on the reader thread) and the expected
    ``fingerprint``, ``tokens`` and format ``version``. Creates MLX arrays: call on the
    thread that owns MLX.

    Raises:
        CorruptFile: saying why the bytes are unusable.
    """
    from mlx_lm.models.cache import load_prompt_cache

    if not checked:
        check_checksum(data, name)
    try:
        buf = io.BytesIO(data)
        buf.name = name  # mx.load picks the format from the name
        kv, meta = load_prompt_cache(buf, return_metadata=True)
        ok = (
            meta.get("fingerprint") == fingerprint
            and meta.get("format") == str(version)
            and _parse_tokens(meta.get("tokens", "")) == tokens
            and all(
                getattr(c, "offset", len(tokens)) == len(tokens)
                for c in kv
                if isinstance(getattr(c, "offset", None), int)
            )
        )
    except Exception as exc:  # any failure to parse means the entry is unusable
        raise CorruptFile(f"does not load ({type(exc).__name__}: {exc})") from exc
    if not ok:
        raise CorruptFile("metadata does not match the index")
    return cast("list[Any]", kv)
