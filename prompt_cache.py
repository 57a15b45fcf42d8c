"""Thread-safe LRU prefix cache of mlx-lm KV caches, keyed by (model key, token ids).

Owns: storing the per-layer KV cache objects (``mlx_lm.models.cache``) of finished or
cancelled sequences, finding the stored entry that saves the most prefill for a new
prompt (exact, shorter-prefix or longer-and-trimmed match), handing out private deep
copies, bounding memory by entry count and bytes with true-LRU eviction, and counting
hits, misses, reused tokens and evictions, and telling how near a prompt comes to what is
stored and to what was evicted last (``nearest``: engine/divergence.py's miss reasons).
Never imports grpc or runs a model.

Every stored entry is a :func:`materialize` copy: a KV cut from a BatchGenerator batch
(``BatchKVCache.extract``) is a lazy ``mx.contiguous`` of a slice whose graph keeps the
whole batch buffer alive (measured: 94 MB held for an entry reporting 0.7 MB), so the
byte bound only bounds memory once each entry owns buffers holding exactly its tokens.

Modelled on mlx-lm's ``LRUPromptCache`` / ``PromptTrie`` (mlx_lm/models/cache.py), which
we do not reuse because: an exact hit returns the whole KV with nothing left to feed;
fetch hits do not refresh recency (and eviction is tiered by message role); the trie
ignores a one-token shorter prefix and only tries the single shortest longer entry;
partial trims (``trim_prompt_cache`` reports layer 0 only) go unnoticed; an entry
larger than the byte bound first evicts everything else; and it has no lock or stats.
"""

from __future__ import annotations

import copy
import logging
import threading
from array import array
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models.cache import (
    CacheList,
    ChunkedKVCache,
    ConcatenateKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    can_trim_prompt_cache,
)

from parsing.tokens import common_prefix
from seam import kv as seam_kv

__all__ = [
    "CacheLookup",
    "CacheStats",
    "Nearest",
    "PromptCache",
    "kv_nbytes",
    "materialize",
    "needs_checkpoints",
]

logger = logging.getLogger(__name__)

_Key = tuple[str, tuple[int, ...]]


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of a :class:`PromptCache`'s counters and bounds.

    ``hits``/``misses`` count :meth:`PromptCache.fetch` calls; ``tokens_reused`` is
    the sum of ``cached_tokens`` over hits (tokens); ``entries`` and ``nbytes``
    (bytes) describe what is stored now; ``evictions`` counts entries dropped to
    honour the bounds (not replacements, redundant prefixes or
    :meth:`PromptCache.clear`). ``checkpoints`` / ``checkpoint_bytes``: how many of the
    stored entries are prefill snapshots (``insert(..., checkpoint=True)``) and their
    bytes. Hits by kind (they sum to ``hits``): ``hits_exact`` (the prompt is a stored
    entry's tokens: trimmed by one), ``hits_shorter`` (a stored final entry is a strict
    prefix), ``hits_checkpoint`` (a stored snapshot is a strict prefix),
    ``hits_trimmed`` (a longer or diverging entry trimmed back).
    """

    hits: int
    misses: int
    tokens_reused: int
    entries: int
    nbytes: int
    max_entries: int | None  # None: no entry bound
    max_bytes: int | None
    evictions: int
    # Breakdowns, left out of equality: two snapshots with the same totals compare equal.
    checkpoints: int = field(default=0, compare=False)
    checkpoint_bytes: int = field(default=0, compare=False)
    hits_exact: int = field(default=0, compare=False)
    hits_shorter: int = field(default=0, compare=False)
    hits_checkpoint: int = field(default=0, compare=False)
    hits_trimmed: int = field(default=0, compare=False)


@dataclass
class CacheLookup:
    """The result of :meth:`PromptCache.fetch`.

    ``kv`` is a private deep copy of a stored per-layer KV cache, already trimmed to
    ``cached_tokens`` tokens and safe to mutate (hand it to ``BatchGenerator.insert``),
    or ``None`` on a miss. ``cached_tokens`` is how many leading prompt tokens ``kv``
    holds (0 on a miss). ``rest`` is ``tokens[cached_tokens:]``, the tokens still to
    prefill; never empty, so the model always has a token to produce logits from.
    ``kind``: "exact", "shorter", "checkpoint" or "trimmed" on a hit (see
    :class:`CacheStats`), "" on a miss. ``disk_hit``: a disk tier served it
    (``caches.prompt_tiers``).
    """

    kv: list | None
    cached_tokens: int
    rest: list[int]
    kind: str = field(default="", compare=False)
    disk_hit: bool = False


@dataclass(frozen=True)
class Nearest:
    """What :meth:`PromptCache.nearest` finds for a prompt: ``common`` tokens shared with
    the nearest stored entry of its model, whose tokens are ``stored`` (``()`` when none
    shares a token); ``entries`` stored for the model; ``evicted`` tokens shared with the
    nearest of the entries evicted last (to honour the bounds)."""

    common: int
    stored: tuple[int, ...]
    entries: int
    evicted: int = 0


GHOSTS = 16  # evicted entries whose tokens are remembered (Nearest.evicted)
GHOST_TOKENS = 1 << 20  # and at most this many of their tokens (8 bytes each)


def _packed(tokens: Sequence[int]) -> array | None:
    """``tokens`` as 8-byte integers; None when some do not fit (image key ids)."""
    try:
        return array("q", tokens)
    except OverflowError:
        return None


@dataclass
class _Entry:
    kv: list
    nbytes: int
    trimmable: bool
    checkpoint: bool = False  # a prefill snapshot (insert(..., checkpoint=True))
    ids: np.ndarray | None = None  # its tokens as int64 (`_ids`), for `_Prefixes`


def _ids(tokens: Sequence[int]) -> np.ndarray | None:
    """``tokens`` as an int64 array; None when some do not fit (image key ids)."""
    packed = _packed(tokens)
    return None if packed is None else np.frombuffer(packed, dtype=np.int64)


class _Prefixes:
    """The common prefix of one prompt with each stored entry, one vectorised comparison
    per entry: agents' prompts share thousands of tokens with hundreds of entries (a
    system prompt and tool list, a session's history), where `common_prefix`'s sliced
    tuple comparisons cost about a millisecond per entry on the engine thread."""

    def __init__(self, toks: tuple[int, ...]) -> None:
        self.toks = toks
        self.ids = _ids(toks)

    def common(self, etoks: tuple[int, ...], entry: _Entry) -> int:
        a, b = entry.ids, self.ids
        if a is None or b is None:
            return common_prefix(etoks, self.toks)
        m = min(len(a), len(b))
        differ = np.flatnonzero(a[:m] != b[:m])
        return int(differ[0]) if differ.size else m


def needs_checkpoints(layers: Sequence[Any]) -> bool:
    """Whether a model whose fresh cache is ``layers`` (``make_prompt_cache(model, ...)``)
    needs prefill snapshots for prefix reuse: True when some layer is not a plain
    ``KVCache`` (a ``RotatingKVCache`` cannot be trimmed once past its window;
    ``ArraysCache``/``MambaCache`` state and ``CacheList`` cannot be trimmed at all)."""
    return any(type(layer) is not KVCache for layer in layers)


def _held_tokens(layer: Any) -> int | None:
    """How many leading positions of ``layer.keys``/``values`` (axis 2) hold tokens, when
    the buffer may be longer (mlx-lm grows KV buffers 256 tokens at a time); ``None`` to
    keep the whole buffer (unknown types; a rotating cache once it wrapped around)."""
    if isinstance(layer, (KVCache, QuantizedKVCache, ConcatenateKVCache)):
        return layer.offset
    if isinstance(layer, ChunkedKVCache):
        return layer.offset - layer.start_position
    if isinstance(layer, RotatingKVCache):
        # Until it wraps around, a rotating cache writes at ``offset``: position i is token i.
        return layer.offset if seam_kv.rotating_write_position(layer) == layer.offset else None
    return None


def _copy_layer(layer: Any) -> Any:
    """A shallow copy of ``layer`` whose every ``mx.array`` is replaced by a lazy copy
    (KV buffers cut to the tokens they hold); nested caches are copied the same way."""
    if isinstance(layer, CacheList):
        new = copy.copy(layer)
        new.caches = tuple(_copy_layer(c) for c in layer.caches)
        return new
    if not hasattr(layer, "__dict__"):
        return layer
    new = copy.copy(layer)
    attrs = dict(vars(layer))
    n = _held_tokens(layer)
    if n is not None and getattr(layer, "keys", None) is not None:
        for name in ("keys", "values"):
            attrs[name] = tree_map(lambda x, n=n: x[..., :n, :], attrs[name])
    # mx.array(x) copies into a buffer of exactly x's size, unless x is donatable (nothing
    # else references it), when MLX may hand it x's whole parent buffer instead: the
    # caller keeps the source layer referenced until materialize's mx.eval, so it cannot.
    # (mx.contiguous is no substitute: it shares a row-contiguous view's parent buffer
    # when that is at most 16 KB larger.)
    vars(new).update(
        tree_map(
            lambda x: (
                mx.array(x)
                if isinstance(x, mx.array)
                else _copy_layer(x)
                if hasattr(x, "state") and hasattr(x, "nbytes")
                else x
            ),
            attrs,
        )
    )
    return new


def _arrays(layer: Any) -> Iterator[mx.array]:
    """Every ``mx.array`` a layer object holds, nested caches included."""
    if isinstance(layer, CacheList):
        for c in layer.caches:
            yield from _arrays(c)
        return
    # tree_flatten returns a dict only when asked to (``destination``).
    flat = cast(
        "list[tuple[str, Any]]",
        tree_flatten(dict(vars(layer)) if hasattr(layer, "__dict__") else {}),
    )
    for _, x in flat:
        if isinstance(x, mx.array):
            yield x
        elif hasattr(x, "state") and hasattr(x, "nbytes"):
            yield from _arrays(x)


def materialize(kv: list) -> list:
    """Evaluated private copies of a per-layer KV cache, each owning exactly its tokens.

    For every layer (``KVCache``, ``QuantizedKVCache``, ``RotatingKVCache``,
    ``ChunkedKVCache``, ``ArraysCache``/``MambaCache``, ``CacheList`` and any other
    ``mlx_lm.models.cache`` object) returns a shallow copy whose arrays are all fresh,
    evaluated, row-contiguous buffers: KV buffers are cut to the tokens held (no
    256-token growth tail, no batch rows or left padding), and nothing references the
    source's buffers or lazy graph, so dropping the copy frees exactly its
    :func:`kv_nbytes`. Non-array attributes (offsets, sizes) are shared with the source.
    Layers without ``__dict__`` are returned as they are. ``kv`` itself is not changed.

    Costs one copy (memory and time) of what the entry holds; evaluates on the default
    stream, so call it from the thread that runs the model.

    Args:
        kv: per-layer cache objects, e.g. a ``BatchGenerator`` response's
            ``prompt_cache`` or ``BatchGenerator.remove(..., return_prompt_caches=True)``.

    Returns:
        A new list with one copied layer per layer of ``kv``.
    """
    out = [_copy_layer(layer) for layer in kv]
    mx.eval([x for layer in out for x in _arrays(layer)])  # while ``kv`` is still alive
    return out


def kv_nbytes(kv: list) -> int:
    """Bytes (int) a per-layer KV cache holds: the sum of ``nbytes`` over every array
    of every layer (each counted once); a layer without arrays counts its own
    ``nbytes``. After :func:`materialize` this is what freeing the copy releases, up to
    the allocator's per-buffer rounding (16 bytes per array measured on CPU)."""
    total = 0
    for layer in kv:
        arrays = {id(x): x for x in _arrays(layer)}
        total += sum(x.nbytes for x in arrays.values()) if arrays else int(layer.nbytes)
    return total


def trim_exactly(kv: list, num_tokens: int) -> bool:
    """Trim every layer of ``kv`` in place by ``num_tokens`` tokens (0: nothing to do).

    Returns False if any layer trimmed fewer (the copy must then be discarded). Checks
    each layer because ``trim_prompt_cache`` reports layer 0's count only, and e.g.
    ``ChunkedKVCache`` can trim fewer tokens than asked.
    """
    if num_tokens == 0:
        return True
    if not can_trim_prompt_cache(kv):
        return False
    return all(layer.trim(num_tokens) == num_tokens for layer in kv)


def check_kv_holds(kv: list, tokens: Sequence[int]) -> None:
    """Raise ValueError unless ``kv`` has layers and every layer with an integer
    ``offset`` holds exactly ``len(tokens)`` tokens (an entry is stored only under the
    tokens its KV really holds)."""
    if not kv:
        raise ValueError("kv must have at least one layer")
    for i, layer in enumerate(kv):
        offset = getattr(layer, "offset", None)
        if isinstance(offset, int) and offset != len(tokens):
            raise ValueError(
                f"kv layer {i} holds {offset} tokens but {len(tokens)} tokens were given"
            )


class PromptCache:
    """Thread-safe LRU cache of prompt KV caches, bounded by entries and bytes.

    Entries are keyed by ``(model_key, token ids)``; different model keys never match.
    One ``threading.RLock`` guards all state, and deep copies are made under it.

    Matching (see :meth:`fetch`) picks the stored entry of the same model that lets the
    most prompt tokens be reused, capped at ``len(tokens) - 1`` so at least one token is
    always fed:

    * a *shorter prefix* entry (its tokens are a strict prefix of the prompt) is copied
      as is;
    * any other entry sharing a common prefix (an exact match, or a *longer* entry, or
      one that diverges) is copied and trimmed to that prefix (an exact hit loses its
      last token). This needs every layer to trim completely; entries whose caches are
      not trimmable (e.g. a ``RotatingKVCache`` past its window) only serve as shorter
      prefixes, and a partially trimmed copy is discarded, never returned.

    Ties prefer an untrimmed copy, then the most recently used entry. A fetch scans
    every stored entry (one vectorised comparison each: `_Prefixes`), a few
    milliseconds for hundreds of entries of thousands of tokens.

    On :meth:`insert` of a trimmable cache, stored entries of the same model whose
    tokens are a strict prefix of the new tokens are dropped (as mlx-lm does): the new
    entry serves every prompt they could, at least as well, by trimming.

    Args:
        max_entries: most entries kept (>= 1); ``None`` for no entry bound (a memory
            budget bounds the bytes instead: `entry_bound`).
        max_bytes: most bytes kept, summing :func:`kv_nbytes` of every entry (what
            MLX holds for them, up to the allocator's per-buffer rounding);
            ``None`` for no byte bound; ``0`` disables caching (insert stores nothing).

    Raises:
        ValueError: if ``max_entries < 1`` or ``max_bytes < 0``.
    """

    def __init__(self, max_entries: int | None = 10, max_bytes: int | None = None) -> None:
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 or None, got {max_bytes}")
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._lock = threading.RLock()
        # Least recently used first; move_to_end marks use.
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()
        self._nbytes = 0
        self._hits = 0
        self._misses = 0
        self._tokens_reused = 0
        self._evictions = 0
        self._hits_by_kind = dict.fromkeys(("exact", "shorter", "checkpoint", "trimmed"), 0)
        # The tokens of the entries evicted last (:meth:`nearest`: "evicted" misses).
        self._ghosts: deque[tuple[str, array]] = deque()
        self._ghost_tokens = 0

    def longest_common_prefix(self, model_key: str, tokens: Sequence[int]) -> int:
        """Tokens (int) the longest common prefix of ``tokens`` with any stored entry of
        ``model_key`` spans (0 when none): where a new prompt diverges from one seen
        before, a position worth a prefill snapshot. Changes no recency or counter."""
        prefixes = _Prefixes(tuple(map(int, tokens)))
        with self._lock:
            return max(
                (prefixes.common(k[1], e) for k, e in self._entries.items() if k[0] == model_key),
                default=0,
            )

    def nearest(self, model_key: str, tokens: Sequence[int]) -> Nearest:
        """The :class:`Nearest` stored entry of ``model_key`` to ``tokens`` (the shortest
        of equals), and the longest common prefix with the entries evicted last
        (``GHOSTS`` of them). Changes no recency or counter."""
        toks = tuple(map(int, tokens))
        prefixes = _Prefixes(toks)
        best: tuple[int, tuple[int, ...]] = (0, ())
        entries = 0
        with self._lock:
            for key, entry in self._entries.items():
                if key[0] != model_key:
                    continue
                entries += 1
                n = prefixes.common(key[1], entry)
                if n > best[0] or (n == best[0] and n and len(key[1]) < len(best[1])):
                    best = (n, key[1])
            ghosts = list(self._ghosts)
        evicted = 0
        packed = _packed(toks) if ghosts else None
        for ghost_key, ghost in ghosts:
            if ghost_key == model_key and packed is not None and type(ghost) is type(packed):
                evicted = max(evicted, common_prefix(ghost, packed))
        return Nearest(best[0], best[1], entries, evicted)

    def fetch(self, model_key: str, tokens: Sequence[int], disk_dir: str = "") -> CacheLookup:
        """Find the cached KV that saves the most prefill for ``tokens``.

        Args:
            model_key: identifies the model (and anything else that changes the KV).
            tokens: the whole prompt's token ids.
            disk_dir: a disk tier's directory; none here (memory only): ignored.

        Returns:
            A :class:`CacheLookup`: on a hit, a trimmed private deep copy holding
            ``cached_tokens`` (1 .. ``len(tokens) - 1``) tokens and ``rest`` the tokens
            after them; on a miss, ``kv=None``, ``cached_tokens=0``, ``rest=tokens``.
            A hit marks the entry most recently used.

        Raises:
            ValueError: if ``tokens`` is empty (there would be nothing to feed).
        """
        toks = tuple(map(int, tokens))
        n = len(toks)
        if n == 0:
            raise ValueError("fetch needs at least one token")
        prefixes = _Prefixes(toks)
        with self._lock:
            # (cached tokens, untrimmed, recency rank, tokens to trim, key)
            candidates: list[tuple[int, bool, int, int, _Key]] = []
            for rank, (key, entry) in enumerate(self._entries.items()):
                if key[0] != model_key:
                    continue
                etoks = key[1]
                common = prefixes.common(etoks, entry)
                if len(etoks) < n and common == len(etoks):
                    cached, trim = len(etoks), 0
                elif entry.trimmable:
                    cached = min(common, n - 1)
                    trim = len(etoks) - cached
                else:
                    continue
                if cached > 0:
                    candidates.append((cached, trim == 0, rank, trim, key))
            candidates.sort(reverse=True)
            for cached, _, _, trim, key in candidates:
                entry = self._entries[key]
                kv = copy.deepcopy(entry.kv)
                if trim and not trim_exactly(kv, trim):
                    logger.debug("prompt cache: entry failed to trim %d tokens", trim)
                    continue
                if trim == 0:
                    kind = "checkpoint" if entry.checkpoint else "shorter"
                else:
                    kind = "exact" if key[1] == toks else "trimmed"
                self._entries.move_to_end(key)
                self._hits += 1
                self._hits_by_kind[kind] += 1
                self._tokens_reused += cached
                return CacheLookup(kv=kv, cached_tokens=cached, rest=list(toks[cached:]), kind=kind)
            self._misses += 1
            return CacheLookup(kv=None, cached_tokens=0, rest=list(toks))

    def insert(
        self,
        model_key: str,
        tokens: Sequence[int],
        kv: list,
        disk_dir: str = "",
        *,
        checkpoint: bool = False,
    ) -> None:
        """Store ``kv`` as the KV cache of ``tokens`` under ``model_key`` (``disk_dir``:
        a disk tier's directory; memory only here, ignored).

        ``checkpoint``: ``kv`` is a snapshot taken while prefilling (counted apart in
        :meth:`stats`; a later hit on it counts as a "checkpoint" hit). Entries that
        cannot be trimmed, snapshots included, are never dropped as redundant prefixes.

        ``kv`` must hold exactly ``tokens`` (BatchGenerator's ``Response.all_tokens``
        and ``prompt_cache``). The cache stores a :func:`materialize` copy, so the entry
        owns buffers holding exactly its tokens (never a view that keeps a batch buffer
        alive) and its counted size (:func:`kv_nbytes`) is what evicting it frees;
        ``kv`` is left unchanged and the caller may drop or reuse it. Call this on the
        thread that made ``kv``'s arrays unless they are evaluated (MLX evaluates lazy
        arrays on their own thread's stream only).

        The entry becomes the most recently used; an entry under the same key is
        replaced; redundant shorter prefixes are dropped (see the class doc); then least
        recently used entries are evicted until both bounds hold. Not stored: an empty
        ``tokens``, anything while ``max_bytes == 0``, and an entry whose own size
        (bytes, after materialising) exceeds ``max_bytes`` (existing entries are then
        left untouched).

        Args:
            model_key: identifies the model, as passed to :meth:`fetch`.
            tokens: the token ids whose KV ``kv`` holds.
            kv: per-layer cache objects from ``mlx_lm.models.cache``.

        Raises:
            ValueError: if ``kv`` has no layers, or a layer's integer ``offset`` (tokens
                it holds) differs from ``len(tokens)``.
        """
        toks = tuple(map(int, tokens))
        check_kv_holds(kv, toks)
        if not toks or self._max_bytes == 0:
            return
        with self._lock:  # one MLX evaluation at a time from this cache's callers
            kv = materialize(kv)
        nbytes = kv_nbytes(kv)
        if self._max_bytes is not None and nbytes > self._max_bytes:
            logger.debug(
                "prompt cache: entry of %d bytes exceeds max_bytes=%d; not stored",
                nbytes,
                self._max_bytes,
            )
            return
        entry = _Entry(
            kv=kv,
            nbytes=nbytes,
            trimmable=can_trim_prompt_cache(kv),
            checkpoint=checkpoint,
            ids=_ids(toks),
        )
        key = (model_key, toks)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._nbytes -= old.nbytes
            if entry.trimmable:
                # Only trimmable prefixes: a snapshot of a cache that cannot be trimmed
                # is the one way a prompt sharing just that prefix reuses anything.
                prefixes = _Prefixes(toks)
                redundant = [
                    k
                    for k, e in self._entries.items()
                    if k[0] == model_key
                    and e.trimmable
                    and len(k[1]) < len(toks)
                    and prefixes.common(k[1], e) == len(k[1])
                ]
                for k in redundant:
                    self._nbytes -= self._entries.pop(k).nbytes
            self._entries[key] = entry
            self._nbytes += nbytes
            self._evict_locked(self._max_entries, self._max_bytes)

    def trim_to(self, *, max_entries: int | None = None, max_bytes: int | None = None) -> int:
        """Evict least recently used entries until at most ``max_entries`` entries and
        ``max_bytes`` bytes remain (``None``: that bound is not tightened), e.g. to make
        room for active sequences as mlx-lm's server does. Returns the number evicted.
        The configured bounds are unchanged.
        """
        with self._lock:
            return self._evict_locked(
                self._max_entries if max_entries is None else max(0, max_entries),
                max_bytes if max_bytes is not None else self._max_bytes,
            )

    def _evict_locked(self, max_entries: int | None, max_bytes: int | None) -> int:
        evicted = 0
        while self._entries and (
            (max_entries is not None and len(self._entries) > max_entries)
            or (max_bytes is not None and self._nbytes > max_bytes)
        ):
            key, entry = self._entries.popitem(last=False)
            self._nbytes -= entry.nbytes
            evicted += 1
            self._remember_evicted(key)
        self._evictions += evicted
        return evicted

    def _remember_evicted(self, key: _Key) -> None:
        """Keep the tokens of an evicted entry (packed, 8 bytes each) among the last
        ``GHOSTS``, at most ``GHOST_TOKENS`` tokens in all, for :meth:`nearest`."""
        packed = _packed(key[1])
        if packed is None:
            return
        self._ghosts.append((key[0], packed))
        self._ghost_tokens += len(packed)
        while len(self._ghosts) > GHOSTS or (
            self._ghost_tokens > GHOST_TOKENS and len(self._ghosts) > 1
        ):
            self._ghost_tokens -= len(self._ghosts.popleft()[1])

    def clear(self) -> None:
        """Drop every entry; counters (hits, misses, tokens reused, evictions) stay."""
        with self._lock:
            self._entries.clear()
            self._nbytes = 0

    def stats(self) -> CacheStats:
        """Return a consistent snapshot of the counters, sizes (bytes) and bounds."""
        with self._lock:
            snaps = [e for e in self._entries.values() if e.checkpoint]
            return CacheStats(
                checkpoints=len(snaps),
                checkpoint_bytes=sum(e.nbytes for e in snaps),
                hits_exact=self._hits_by_kind["exact"],
                hits_shorter=self._hits_by_kind["shorter"],
                hits_checkpoint=self._hits_by_kind["checkpoint"],
                hits_trimmed=self._hits_by_kind["trimmed"],
                hits=self._hits,
                misses=self._misses,
                tokens_reused=self._tokens_reused,
                entries=len(self._entries),
                nbytes=self._nbytes,
                max_entries=self._max_entries,
                max_bytes=self._max_bytes,
                evictions=self._evictions,
            )

    @property
    def nbytes(self) -> int:
        """Bytes held by all stored entries (sum of their :func:`kv_nbytes`)."""
        with self._lock:
            return self._nbytes

    @property
    def checkpoint_nbytes(self) -> int:
        """Bytes held by the stored prefill snapshots (``insert(..., checkpoint=True)``)."""
        with self._lock:
            return sum(e.nbytes for e in self._entries.values() if e.checkpoint)

    def __len__(self) -> int:
        """Number of stored entries."""
        with self._lock:
            return len(self._entries)

    # Memory only: no disk tier to close or report (``caches.prompt_tiers.PromptTiers``).
    def close(self) -> None:
        """Nothing to flush."""

    def disk_memory(self) -> dict[str, int]:
        """Status entries of the disk tiers: none."""
        return {"prompt_cache_disk": 0, "prompt_cache_disk_entries": 0}

    def disk_stats(self) -> dict[str, dict]:
        """GetMetrics' per-directory disk stats: none."""
        return {}

    def _snapshot(self) -> list[tuple[str, tuple[int, ...], Any]]:
        """For tests: (model key, tokens, stored kv) per entry, least recently used
        first. The kv objects are the stored ones; do not mutate them."""
        with self._lock:
            return [(k[0], k[1], e.kv) for k, e in self._entries.items()]
