"""The two-tier prompt cache: the memory tier (``PromptCache``) backed by disk tiers
(``prompt_disk.DiskCache``, one per directory), behind the interface the scheduler uses.

Owns: choosing the tier that saves the most prefill (memory first; the disk only when it
serves more tokens), copying a disk hit into memory, writing retired KV caches to the
request's directory, one ``DiskCache`` per directory (opened when first named, closed at
unload), the load's fingerprint (``load_fingerprint``) and the figures Status and
GetMetrics report. Never imports grpc.

Threads: every method that takes KV (``fetch``, ``insert``) runs on the engine thread,
which owns MLX; the disk tier's files are written by its own writer thread and read by its
reader thread (``prompt_disk``). A directory is opened (created, its entries' headers
scanned) on a thread of its own: the engine waits for that at most ``_OPEN_WAIT_S``, and
until it is done the directory is not used (requests are served from memory), so a slow or
stuck file system never freezes the running streams.

Which directory: ``GenerationParams.prompt_cache_dir``, already resolved by
``params.generation_params`` (load option ``prompt_cache_dir`` wins over the request's
``PromptCachePath``). ``PromptCacheRO`` requests (``cache_write`` False) read both tiers
and write neither. Without a fingerprint (a model built in memory, distributed mode)
the disk tier is off and only memory is used.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Protocol, cast

import mlx.core as mx

from caches.prompt_disk import DiskCache, model_fingerprint, run_into
from parsing.options import DEFAULT_MAX_CACHE_ENTRIES
from prompt_cache import CacheLookup, CacheStats, Nearest, PromptCache, trim_exactly

__all__ = ["MAX_DISK_DIRS", "PromptTiers", "TieredLookup", "TieredPromptCache", "load_fingerprint"]

logger = logging.getLogger("localai.mlx." + __name__)

MAX_DISK_DIRS = 4  # directories open at once; each has a writer thread and an index
_CLOSE_TIMEOUT = 4.0  # seconds to finish queued writes at unload (Engine.stop joins for 5)
# The engine waits this long for a directory to open (its headers scanned): a healthy
# directory of a few hundred entries opens in milliseconds; a slower one is used once open.
_OPEN_WAIT_S = 0.5


TieredLookup = CacheLookup  # its ``disk_hit`` says whether the disk tier served it


class PromptTiers(Protocol):
    """A prompt cache as the engine uses it (scheduler, checkpoints, Status): the memory
    tier alone (``prompt_cache.PromptCache``) or with disk tiers (``TieredPromptCache``).
    ``disk_dir``: the request's disk-tier directory ("" = memory only; ignored without
    disk tiers)."""

    def fetch(self, model_key: str, tokens: Sequence[int], disk_dir: str = "") -> CacheLookup:
        """The cached KV that saves the most prefill for ``tokens``."""
        ...

    def insert(
        self,
        model_key: str,
        tokens: Sequence[int],
        kv: list,
        disk_dir: str = "",
        *,
        checkpoint: bool = False,
    ) -> None:
        """Store ``kv``, which holds exactly ``tokens``."""
        ...

    def longest_common_prefix(self, model_key: str, tokens: Sequence[int]) -> int: ...

    def nearest(self, model_key: str, tokens: Sequence[int]) -> Nearest:
        """The nearest stored (and evicted) prompt of the memory tier."""
        ...

    def trim_to(self, *, max_entries: int | None = None, max_bytes: int | None = None) -> int:
        """Evict from memory until within the bounds; returns the entries evicted."""
        ...

    def clear(self) -> None:
        """Empty the memory tier."""
        ...

    def close(self) -> None:
        """Flush and stop the disk tiers (the model is being unloaded)."""
        ...

    def stats(self) -> CacheStats: ...
    def disk_memory(self) -> dict[str, int]:
        """Status entries of the disk tiers (zeros without)."""
        ...

    def disk_stats(self) -> dict[str, dict]:
        """GetMetrics' per-directory disk stats ({} without)."""
        ...

    @property
    def nbytes(self) -> int: ...
    @property
    def checkpoint_nbytes(self) -> int: ...
    def __len__(self) -> int: ...


def load_fingerprint(params: Any, cpu_mode: str = "", distributed: str = "") -> str:
    """The ``model_fingerprint`` of a model loaded from files with ``params`` (LoadParams).

    Hashes the directory mlx-lm loaded (for a GGUF: its converted directory in
    ``gguf_convert.default_cache_dir()``, else the GGUF file itself), and in ``extra``
    everything else that changes the KV: KV quantization (bits, group size, start),
    ``max_kv_size`` (with the prefill step, which decides what a rotating cache
    keeps), the LoRA adapter's files and scale, the draft model's fingerprint (its
    layers share the entry), the distributed layout, the CPU weight mode and the device.
    Resolves paths only (no download). Raises ``ValueError`` or ``ModelLoadError`` when
    a file is missing.
    """
    from loading import model_loader

    def weights_of(model: str, model_file: str) -> Any:
        resolved = model_loader.resolve_model(model, model_file, params.model_path)
        if resolved.kind == "gguf":
            from loading import gguf_convert

            converted = gguf_convert.default_cache_dir() / gguf_convert.cache_key(resolved.path)
            if (converted / "config.json").is_file():
                return converted
        return resolved.path

    extra: dict[str, Any] = {
        "kv_bits": params.kv_bits,
        "kv_group_size": params.kv_group_size,
        "quantized_kv_start": params.quantized_kv_start,
        "max_kv_size": params.max_kv_size,
        "prefill_step_size": params.prefill_step_size if params.max_kv_size else None,
        "distributed": distributed,
        "cpu_mode": cpu_mode,
        "device": str(mx.default_device().type),
    }
    if params.lora_adapter:
        adapter = model_loader.resolve_adapter(params.lora_adapter, params.model_path)
        files = sorted(p for p in adapter.iterdir() if p.is_file())
        extra["lora"] = model_fingerprint(files, {"scale": params.lora_scale})
    if params.draft_model:
        extra["draft"] = model_fingerprint(weights_of(params.draft_model, ""), {})
    return model_fingerprint(weights_of(params.model, params.model_file), extra)


class TieredPromptCache:
    """A :class:`PromptCache` (memory) with disk tiers, one ``DiskCache`` per directory.

    Same interface as ``PromptCache`` (``fetch``, ``insert``, ``trim_to``, ``clear``, ``stats``,
    ``nbytes``, ``len``; ``stats``/``nbytes``/``len`` describe the memory tier), plus
    a ``disk_dir`` keyword on ``fetch``/``insert`` naming the request's directory
    ("" = memory only) and ``close`` (flush and stop the writers).

    Args:
        memory: the memory tier.
        fingerprint: :func:`load_fingerprint` of the loaded model; None turns the disk
            tier off.
        disk_bytes: the byte budget of each directory (>= 0).
        default_dir: a directory opened now (load option ``prompt_cache_dir``), so its
            entries show in Status before the first request; "" for none.
    """

    def __init__(
        self,
        memory: PromptCache,
        fingerprint: str | None = None,
        disk_bytes: int = 0,
        default_dir: str = "",
    ) -> None:
        self.memory = memory
        self.fingerprint = fingerprint
        self.disk_bytes = disk_bytes
        self._disks: dict[str, DiskCache] = {}
        self._opening: dict[str, Future] = {}  # directories whose DiskCache is being built
        self._refused: set[str] = set()
        self._closed = False
        if default_dir:
            self.disk(default_dir)

    # ------------------------------------------------------------------ disk tiers
    def disk(self, directory: str) -> DiskCache | None:
        """The ``DiskCache`` of ``directory``, opened (and created) on first use on a
        thread of its own, waited for at most ``_OPEN_WAIT_S``; None while it is still
        opening, when the disk tier is off or closed, the directory is "" or
        ``MAX_DISK_DIRS`` are open. Call on the engine thread."""
        if not directory or self.fingerprint is None or self._closed:
            return None
        key = os.path.abspath(directory)
        cache = self._disks.get(key)
        if cache is not None:
            return cache
        opening = self._opening.get(key)
        if opening is None:
            if len(self._disks) + len(self._opening) >= MAX_DISK_DIRS:
                if key not in self._refused:
                    self._refused.add(key)
                    logger.warning(
                        "prompt disk cache: %d directories already open; not using %s",
                        MAX_DISK_DIRS,
                        key,
                    )
                return None
            opening = self._opening[key] = self._open(key)
        try:
            cache = cast("DiskCache | None", opening.result(timeout=_OPEN_WAIT_S))
        except TimeoutError:
            return None  # still scanning: this request is served from memory
        except Exception as exc:  # DiskCache logs I/O failures itself; this is unexpected
            logger.warning("prompt disk cache: cannot open %s: %r", key, exc)
            cache = None
        del self._opening[key]
        if cache is None:
            self._refused.add(key)
            return None
        self._disks[key] = cache
        return cache

    def _open(self, key: str) -> Future:
        """Build ``key``'s ``DiskCache`` (no MLX: mkdir, header scan) on a daemon thread."""
        future: Future = Future()
        args = (future, DiskCache, key, self.disk_bytes, self.fingerprint or "")
        threading.Thread(target=run_into, args=args, name="prompt-disk-open", daemon=True).start()
        return future

    def fetch(self, model_key: str, tokens: Sequence[int], disk_dir: str = "") -> CacheLookup:
        """``PromptCache.fetch``, then, unless memory already serves all but the last
        token, the disk tier of ``disk_dir`` for a longer match: a disk hit is copied
        into memory and returned trimmed to the tokens it serves (``disk_hit`` True).
        Raises ValueError for empty ``tokens``."""
        hit = self.memory.fetch(model_key, tokens)
        lookup = CacheLookup(hit.kv, hit.cached_tokens, hit.rest)
        disk = self.disk(disk_dir)
        if disk is None or hit.cached_tokens >= len(tokens) - 1:
            return lookup
        found = disk.lookup(tokens, min_tokens=hit.cached_tokens + 1)
        if found is None:
            return lookup
        # Memory keeps its own materialised copy; ``found.kv`` stays ours to trim.
        self.memory.insert(model_key, found.tokens, found.kv)
        if not trim_exactly(found.kv, len(found.tokens) - found.cached_len):
            logger.debug("prompt disk cache: a hit failed to trim; using the memory tier")
            return lookup
        toks = list(map(int, tokens))
        return CacheLookup(found.kv, found.cached_len, toks[found.cached_len :], disk_hit=True)

    def insert(
        self,
        model_key: str,
        tokens: Sequence[int],
        kv: list,
        disk_dir: str = "",
        *,
        checkpoint: bool = False,
    ) -> None:
        """``PromptCache.insert`` (``checkpoint``: a prefill snapshot), then queue the
        entry for ``disk_dir``'s disk tier (serialised here, written by its writer
        thread). Raises ValueError as ``PromptCache.insert`` does."""
        self.memory.insert(model_key, tokens, kv, checkpoint=checkpoint)
        disk = self.disk(disk_dir)
        if disk is not None:
            disk.put(tokens, kv)

    def longest_common_prefix(self, model_key: str, tokens: Sequence[int]) -> int:
        """``PromptCache.longest_common_prefix`` of the memory tier."""
        return self.memory.longest_common_prefix(model_key, tokens)

    def nearest(self, model_key: str, tokens: Sequence[int]) -> Nearest:
        """``PromptCache.nearest`` of the memory tier."""
        return self.memory.nearest(model_key, tokens)

    @property
    def checkpoint_nbytes(self) -> int:
        """Bytes of the memory tier's prefill snapshots."""
        return self.memory.checkpoint_nbytes

    def clear(self) -> None:
        """Empty the memory tier (the disk keeps its entries)."""
        self.memory.clear()

    def close(self) -> None:
        """Write what is queued (at most a few seconds per directory) and stop every
        disk tier's writer; the disk tier stays off afterwards. Idempotent."""
        self._closed = True
        disks, self._disks = self._disks, {}
        opening, self._opening = self._opening, {}
        for cache in disks.values():
            cache.close(_CLOSE_TIMEOUT)
        for future in opening.values():  # close them once open (their threads are ours)
            future.add_done_callback(_close_opened)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued disk write is done (seconds); False on timeout."""
        return all(cache.flush(timeout) for cache in list(self._disks.values()))

    def stats(self) -> CacheStats:
        """The memory tier's :class:`CacheStats`."""
        return self.memory.stats()

    def disk_stats(self) -> dict[str, dict]:
        """Per open directory, its ``DiskCacheStats`` as a dict."""
        return {d: dataclasses.asdict(c.stats()) for d, c in list(self._disks.items())}

    def disk_memory(self) -> dict[str, int]:
        """Status entries: ``prompt_cache_disk`` (bytes on disk) and
        ``prompt_cache_disk_entries``, summed over the open directories."""
        stats = [c.stats() for c in list(self._disks.values())]
        return {
            "prompt_cache_disk": sum(s.nbytes for s in stats),
            "prompt_cache_disk_entries": sum(s.entries for s in stats),
        }

    def trim_to(self, *, max_entries: int | None = None, max_bytes: int | None = None) -> int:
        """Evict from the memory tier (`PromptCache.trim_to`); the disk tier keeps its
        files (they take no MLX memory)."""
        return self.memory.trim_to(max_entries=max_entries, max_bytes=max_bytes)

    @property
    def nbytes(self) -> int:
        """Bytes held by the memory tier."""
        return self.memory.nbytes

    def __len__(self) -> int:
        """Entries in the memory tier."""
        return len(self.memory)


def _close_opened(future: Future) -> None:
    """Close the ``DiskCache`` a future opened after its tiers were closed."""
    if future.exception() is None:
        future.result().close(_CLOSE_TIMEOUT)


# ---------------------------------------------------------------------- engine seams
def fingerprint_of(loaded: Any, distributed: str = "") -> str | None:
    """:func:`load_fingerprint` of a ``LoadedModel`` loaded from files, or None (disk
    tier off, with a warning) when it cannot be computed."""
    try:
        return load_fingerprint(loaded.params, loaded.cpu_mode, distributed)
    except Exception as exc:  # the model is loaded and serves; only the disk tier is lost
        logger.warning("prompt disk cache off: cannot fingerprint %s: %s", loaded.name, exc)
        return None


def entry_bound(params: Any, budgeted: bool) -> int | None:
    """The memory tier's entry bound for load ``params``: option ``max_cache_entries``;
    without it none where a memory budget bounds the tier's bytes (``budgeted``: the
    budget is on and this process decides alone, engine/preemption.py evicting least
    recently used entries when running sequences need the room), else the original
    backend's 10 (no budget; a distributed group, whose ranks must evict alike and whose
    followers count entries only: distributed/follower.py). Agents' sessions each keep
    an entry per turn: a count of 10 evicted on nearly every insert with a 19 GB budget
    0.2% used (issue 38)."""
    if params.max_cache_entries is not None:
        return int(params.max_cache_entries)
    return None if budgeted else DEFAULT_MAX_CACHE_ENTRIES


def for_model(loaded: Any, fingerprint: str | None, budgeted: bool = False) -> TieredPromptCache:
    """The prompt cache of ``loaded`` (a ``LoadedModel``): its memory tier bounded by
    the load's `entry_bound` / ``max_cache_bytes`` (``budgeted``: a memory budget bounds
    it), disk tiers of ``prompt_cache_disk_bytes`` each; the load option
    ``prompt_cache_dir`` is opened now. Call on the engine thread, after the previous
    model's cache was closed."""
    p = loaded.params
    memory = PromptCache(entry_bound(p, budgeted), p.max_cache_bytes)
    return TieredPromptCache(memory, fingerprint, p.prompt_cache_disk_bytes, p.prompt_cache_dir)


def disk_memory(cache: PromptTiers | None) -> dict[str, int]:
    """Status entries of ``cache``'s disk tiers (zeros without a cache)."""
    if cache is None:
        return {"prompt_cache_disk": 0, "prompt_cache_disk_entries": 0}
    return cache.disk_memory()


def disk_info(cache: PromptTiers) -> dict[str, dict]:
    """GetMetrics' per-directory disk stats of ``cache`` ({} when it has none)."""
    return cache.disk_stats()
