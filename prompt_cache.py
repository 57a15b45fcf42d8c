"""Thread-safe LRU prefix cache of mlx-lm KV caches, keyed by (model key, token ids).

Owns: storing the per-layer KV cache objects (``mlx_lm.models.cache``) of finished or
cancelled sequences, finding what saves the most prefill for a new prompt (exact,
shorter-prefix or longer-and-trimmed match), handing out private copies, bounding memory
by entry count and bytes with least-recently-used eviction, and counting hits, misses,
reused tokens and evictions, and telling how near a prompt comes to what is stored and to
what was evicted last (``nearest``: engine/divergence.py's miss reasons). Never imports
grpc or runs a model.

Shared prefixes are stored once (issue 38): agents' sessions on one system prompt and
tool list each extend the same prefix. An entry whose layers can be cut at a token
position (``KVCache``, ``QuantizedKVCache``) is kept as segments of a token trie
(`_Trie`, a radix tree as SGLang's RadixAttention keeps KV blocks): a new entry stores
only the tokens past what is stored, a fetch joins the segments along its path, and
eviction takes the least recently used leaf, so one session's turns go while the prefix
other sessions extend stays. Layers that cannot be cut (a rotating window, recurrent
state) keep whole entries, as before.

Everything stored owns buffers holding exactly its tokens: a KV cut from a
BatchGenerator batch (``BatchKVCache.extract``) is a lazy ``mx.contiguous`` of a slice
whose graph keeps the whole batch buffer alive (measured: 94 MB held for an entry
reporting 0.7 MB), so the byte bound only bounds memory once each segment or entry is a
copy (:func:`materialize`, `_owned`).

Modelled on mlx-lm's ``LRUPromptCache`` / ``PromptTrie`` (mlx_lm/models/cache.py), which
we do not reuse because: it keeps every entry's whole KV at its trie node (a prefix shared
by many entries is held once per entry); an exact hit returns the whole KV with nothing
left to feed; fetch hits do not refresh recency (and eviction is tiered by message role);
the trie ignores a one-token shorter prefix and only tries the single shortest longer
entry; partial trims (``trim_prompt_cache`` reports layer 0 only) go unnoticed; an entry
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
    used: int = 0  # the cache's clock at its last use (insert, fetch)


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


# ------------------------------------------------------------------ shared prefix segments
# Layer types whose KV can be cut at any token position and put back together by
# concatenation: keys/values (a tuple of packed data, scales and biases when quantized,
# each token quantized on its own) run along axis 2 and ``trim`` only moves ``offset``
# (mlx_lm/models/cache.py). A rotating cache (its window wraps around), a chunked one (it
# drops its front), recurrent state (``ArraysCache``/``MambaCache``) and ``CacheList``
# cannot, and are stored whole (`_Entry`).
_Layout = tuple[tuple[Any, ...], ...]


def _layout(kv: list) -> _Layout | None:
    """The layer layout of ``kv`` when every layer can be cut at a token position (a
    plain ``KVCache`` or ``QuantizedKVCache`` holding tokens), else None. Entries of one
    model with the same layout share prefix segments; a quantized layer shares only with
    quantized layers of the same bits and group size (its values differ from a plain one's)."""
    out = []
    for layer in kv:
        keys: Any = getattr(layer, "keys", None)
        values: Any = getattr(layer, "values", None)
        if type(layer) is KVCache and keys is not None:
            out.append(("kv", keys.dtype, keys.shape[-1], values.shape[-1]))
        elif type(layer) is QuantizedKVCache and keys is not None:
            out.append(("q", layer.bits, layer.group_size, keys[0].dtype))
        else:
            return None
    return tuple(out)


def _cut(x: Any, start: int, stop: int) -> Any:
    """Positions ``start:stop`` (axis 2) of a layer's keys or values (an array, or the
    tuple of a quantized layer), as views."""
    return tree_map(lambda a: a[..., start:stop, :], x)


def _owned(x: Any) -> Any:
    """Copies of a tree of (sliced) arrays into buffers of exactly their size (see
    `_copy_layer`: the caller keeps the source referenced until they are evaluated)."""
    return tree_map(mx.array, x)


def _join(parts: list[Any]) -> Any:
    """The segments ``parts`` of a layer's keys or values concatenated along axis 2."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], tuple):
        return tuple(mx.concatenate([p[i] for p in parts], axis=2) for i in range(len(parts[0])))
    return mx.concatenate(parts, axis=2)


def _tree_nbytes(x: Any) -> int:
    return sum(a.nbytes for _, a in cast("list[tuple[str, Any]]", tree_flatten(x)))


class _Node:
    """A segment of the token trie: ``tokens`` after its parent's, and their KV
    (``arrays``: per layer, (keys, values) holding exactly those tokens). ``used``: the
    clock of its last use (insert or fetch through it); ``mark``: a stored sequence ends
    here (an entry: every leaf is one); ``checkpoint``: that entry is a prefill snapshot."""

    __slots__ = (
        "arrays",
        "checkpoint",
        "children",
        "depth",
        "mark",
        "nbytes",
        "parent",
        "tokens",
        "used",
    )

    def __init__(self, parent: _Node | None, tokens: tuple[int, ...], arrays: list) -> None:
        self.parent = parent
        self.tokens = tokens
        self.arrays = arrays
        self.children: dict[int, _Node] = {}
        self.depth: int = (parent.depth if parent is not None else 0) + len(tokens)
        self.nbytes = _tree_nbytes(arrays)
        self.used = 0
        self.mark = False
        self.checkpoint = False

    def path(self) -> list[_Node]:
        """The nodes from the root's first child down to this one."""
        out: list[_Node] = []
        node: _Node | None = self
        while node is not None and node.parent is not None:
            out.append(node)
            node = node.parent
        return out[::-1]

    def sequence(self) -> tuple[int, ...]:
        """The tokens from the root to the end of this segment."""
        return tuple(t for node in self.path() for t in node.tokens)


class _Trie:
    """The stored sequences of one model and layer layout as a radix tree of KV segments:
    a prefix shared by many sequences (a system prompt and tool list) is one segment that
    their own segments extend, held once. Cut on insert (a new sequence stores only the
    tokens past what is stored; a segment it parts inside is split in two), joined on
    fetch. Not locked: `PromptCache` holds its lock around every call."""

    def __init__(self, model_key: str, layout: _Layout, kv: list) -> None:
        self.model_key = model_key
        self.layout = layout
        # Per layer, an empty copy of its object (type, bits, group size) to fill on fetch.
        self.templates = []
        for layer in kv:
            template = copy.copy(layer)
            template.keys = template.values = None
            template.offset = 0
            self.templates.append(template)
        self.root = _Node(None, (), [])
        self.marks = 0  # its marked segments (entries)

    def walk(self, toks: tuple[int, ...]) -> tuple[list[_Node], int]:
        """(the segments ``toks`` runs through, the last possibly in part; how many
        leading tokens of ``toks`` are stored)."""
        node, i, path = self.root, 0, []
        while i < len(toks):
            child = node.children.get(toks[i])
            if child is None:
                break
            c = common_prefix(child.tokens, toks[i : i + len(child.tokens)])
            path.append(child)
            i += c
            if c < len(child.tokens):
                break
            node = child
        return path, i

    def kv(self, path: list[_Node], n: int) -> list:
        """Fresh per-layer caches holding the first ``n`` tokens along ``path``: new
        array objects (slices and concatenations of the segments), so writing into them
        never touches what is stored."""
        parts: list[list[tuple[Any, Any]]] = [[] for _ in self.templates]
        left = n
        for node in path:
            take = min(left, len(node.tokens))
            if take <= 0:
                break
            for i, (k, v) in enumerate(node.arrays):
                parts[i].append((_cut(k, 0, take), _cut(v, 0, take)))
            left -= take
        out = []
        for template, layer_parts in zip(self.templates, parts, strict=True):
            layer = copy.copy(template)
            layer.keys = _join([k for k, _ in layer_parts])
            layer.values = _join([v for _, v in layer_parts])
            layer.offset = n
            out.append(layer)
        return out

    def split(self, node: _Node, at: int) -> _Node:
        """Cut ``node`` after its first ``at`` tokens into a new parent segment (returned)
        and the rest; each part is copied into its own buffer, so dropping one frees it."""
        assert node.parent is not None and 0 < at < len(node.tokens)
        old = node.arrays
        head = _Node(node.parent, node.tokens[:at], [_owned(_cut(a, 0, at)) for a in old])
        node.arrays = [_owned(_cut(a, at, None)) for a in old]  # type: ignore[arg-type]
        mx.eval(head.arrays, node.arrays)
        del old
        node.parent.children[head.tokens[0]] = head
        node.tokens = node.tokens[at:]
        node.parent = head
        node.nbytes = _tree_nbytes(node.arrays)
        head.children[node.tokens[0]] = node
        head.used = node.used
        return head

    def extend(self, parent: _Node, toks: tuple[int, ...], kv: list, start: int) -> _Node:
        """A new segment under ``parent`` holding ``toks[start:]``, copied out of ``kv``."""
        arrays = [
            (_owned(_cut(c.keys, start, len(toks))), _owned(_cut(c.values, start, len(toks))))
            for c in kv
        ]
        mx.eval(arrays)  # while ``kv`` is still referenced (`_copy_layer`)
        node = _Node(parent, toks[start:], arrays)
        parent.children[node.tokens[0]] = node
        return node

    def nearest(self, path: list[_Node], common: int) -> tuple[int, ...]:
        """The shortest stored sequence that shares ``common`` tokens along ``path``."""
        if not path:
            return ()
        last = path[-1]
        best: _Node | None = None
        todo = [last]
        while todo:
            node = todo.pop()
            if node.mark and (best is None or node.depth < best.depth):
                best = node
            todo.extend(node.children.values())
        return best.sequence() if best is not None else ()


def _path_bytes(kv: list, start: int, stop: int) -> int:
    """Bytes positions ``start:stop`` of the cut-able ``kv`` hold once copied."""
    total = 0
    for layer in kv:
        for _, a in cast("list[tuple[str, Any]]", tree_flatten((layer.keys, layer.values))):
            total += a.nbytes // a.shape[2] * (stop - start)
    return total


class _Segments:
    """Every model's tries (`_Trie`, one per model and layer layout), their leaves and
    entries, and the bytes their segments hold, each counted once. Not locked: the
    `PromptCache` holding it locks around every call."""

    def __init__(self) -> None:
        self.tries: dict[tuple[str, _Layout], _Trie] = {}
        self.leaves: dict[_Node, _Trie] = {}  # eviction candidates
        self.marks = 0  # entries (marked segments)
        self.nbytes = 0

    def of(self, model_key: str) -> list[_Trie]:
        return [t for (m, _), t in self.tries.items() if m == model_key]

    def find(self, model_key: str, toks: tuple[int, ...]) -> tuple[int, _Trie, list[_Node]] | None:
        """(tokens reusable, capped at ``len(toks) - 1``; the trie; the segments walked)
        of the trie that reuses the most of ``toks``; None when none reuses a token."""
        found = None
        for trie in self.of(model_key):
            path, common = trie.walk(toks)
            cached = min(common, len(toks) - 1)
            if cached > 0 and (found is None or cached > found[0]):
                found = (cached, trie, path)
        return found

    def insert(
        self,
        model_key: str,
        toks: tuple[int, ...],
        kv: list,
        layout: _Layout,
        now: int,
        max_bytes: int | None,
    ) -> _Node | None:
        """Store ``toks`` (``kv`` holds them) as an entry of its layout's trie, copying
        only the tokens past what is stored; the entry's segment, or None when the
        entry, its stored prefix included, is over ``max_bytes``."""
        trie = self.tries.get((model_key, layout)) or _Trie(model_key, layout, kv)
        path, common = trie.walk(toks)
        stored = sum(node.nbytes for node in path[:-1])
        if path:  # the last segment's part before the cut (bytes scale with tokens)
            last = path[-1]
            stored += last.nbytes * (common - (last.depth - len(last.tokens))) // len(last.tokens)
        if max_bytes is not None and stored + _path_bytes(kv, common, len(toks)) > max_bytes:
            return None
        self.tries[(model_key, layout)] = trie
        self.drop_key(model_key, toks, keep=trie)
        if path and common < path[-1].depth:  # parts inside a segment: cut it there
            before = path[-1].nbytes
            head = trie.split(path[-1], common - (path[-1].depth - len(path[-1].tokens)))
            self.nbytes += head.nbytes + path[-1].nbytes - before
            path[-1] = head
        end = path[-1] if path else trie.root
        if common < len(toks):
            self.leaves.pop(end, None)
            end = trie.extend(end, toks, kv, common)
            self.nbytes += end.nbytes
            self.leaves[end] = trie
            path.append(end)
        for node in path:
            if node is not end:
                self.mark(trie, node, False)  # served as well by the longer entry
            node.used = now
        self.mark(trie, end, True)
        return end

    def drop_key(self, model_key: str, toks: tuple[int, ...], keep: _Trie | None = None) -> None:
        """Forget the entry ``toks`` in every trie of ``model_key`` but ``keep`` (it is
        being replaced)."""
        for trie in self.of(model_key):
            if trie is keep:
                continue
            path, common = trie.walk(toks)
            if path and common == len(toks) == path[-1].depth and path[-1].mark:
                if path[-1].children:
                    self.mark(trie, path[-1], False)
                else:
                    self.drop_leaf(path[-1])

    def drop_leaf(self, node: _Node) -> _Key | None:
        """Remove the leaf segment ``node``; a parent left without children becomes a
        leaf and an entry (it still serves its prefix). Returns the key of the entry
        that ended there, if one did."""
        trie = self.leaves.pop(node)
        parent = node.parent
        assert parent is not None
        del parent.children[node.tokens[0]]
        self.nbytes -= node.nbytes
        key = (trie.model_key, node.sequence()) if node.mark else None
        self.mark(trie, node, False)
        if parent is trie.root:
            if not parent.children:
                del self.tries[(trie.model_key, trie.layout)]
        elif not parent.children:
            self.leaves[parent] = trie
            self.mark(trie, parent, True)
        return key

    def mark(self, trie: _Trie, node: _Node, on: bool) -> None:
        """Make ``node`` an entry of ``trie`` (``on``) or not, keeping the counts."""
        if node.mark != on:
            node.mark = on
            delta = 1 if on else -1
            trie.marks += delta
            self.marks += delta
        if not on:
            node.checkpoint = False

    def oldest_leaf(self) -> _Node | None:
        return min(self.leaves, key=lambda node: node.used, default=None)

    def marked(self) -> list[tuple[_Trie, _Node]]:
        """Every entry (marked segment) of every trie."""
        out = []
        for trie in self.tries.values():
            todo = list(trie.root.children.values())
            while todo:
                node = todo.pop()
                if node.mark:
                    out.append((trie, node))
                todo.extend(node.children.values())
        return out


class PromptCache:
    """Thread-safe LRU cache of prompt KV caches, bounded by entries and bytes.

    Entries are keyed by ``(model_key, token ids)``; different model keys never match.
    One ``threading.RLock`` guards all state, and copies are made under it.

    Storage: an entry whose every layer can be cut at a token position (``KVCache``,
    ``QuantizedKVCache``: `_layout`) goes into its model's token trie (`_Trie`) as
    segments: the tokens it shares with what is stored are not stored again (agents'
    sessions on one system prompt and tool list hold that prefix once, each session its
    own turns after it), and :attr:`nbytes` counts every segment once. Other entries
    (a rotating cache, recurrent state, prefill snapshots of such models) are kept whole.

    Matching (see :meth:`fetch`) picks what lets the most prompt tokens be reused,
    capped at ``len(tokens) - 1`` so at least one token is always fed:

    * in a trie every stored position can be reused: the longest common prefix with any
      stored sequence (an exact entry loses its last token);
    * a whole *shorter prefix* entry (its tokens are a strict prefix of the prompt) is
      copied as is; any other whole entry sharing a prefix is copied and trimmed to it,
      which needs every layer to trim completely (a ``RotatingKVCache`` past its window
      cannot: it only serves as a shorter prefix; a partial trim is discarded).

    Ties prefer the trie, then an untrimmed copy, then the most recently used entry.

    Eviction is least recently used first, over the trie's leaves (a session's last
    turns; a prefix stays while another sequence extends it, and becomes a leaf, and
    an entry, once none does) and whole entries. A fetch or insert marks every segment
    it goes through used. Inserting a sequence that extends a stored entry takes that
    entry's place (its tokens stay stored, as part of the longer one; mlx-lm's
    ``LRUPromptCache`` likewise drops trimmable prefixes, but stores every entry's whole
    KV at its node of a per-token trie: mlx_lm/models/cache.py ``PromptTrie``).

    Args:
        max_entries: most entries kept (>= 1); ``None`` for no entry bound (a memory
            budget bounds the bytes instead: `entry_bound`).
        max_bytes: most bytes kept (every segment and whole entry counted once: what
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
        # Whole entries, least recently used first; move_to_end marks use.
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()
        self._segments = _Segments()  # entries whose KV is stored as shared segments
        self._clock = 0  # ticks on every use: `_Node.used`, `_Entry.used`
        self._nbytes = 0  # the whole entries' (the segments count theirs)
        self._hits = 0
        self._misses = 0
        self._tokens_reused = 0
        self._evictions = 0
        self._hits_by_kind = dict.fromkeys(("exact", "shorter", "checkpoint", "trimmed"), 0)
        # The tokens of the entries evicted last (:meth:`nearest`: "evicted" misses).
        self._ghosts: deque[tuple[str, array]] = deque()
        self._ghost_tokens = 0

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def longest_common_prefix(self, model_key: str, tokens: Sequence[int]) -> int:
        """Tokens (int) the longest common prefix of ``tokens`` with any stored entry of
        ``model_key`` spans (0 when none): where a new prompt diverges from one seen
        before, a position worth a prefill snapshot. Changes no recency or counter."""
        return self.nearest(model_key, tokens, ghosts=False).common

    def nearest(self, model_key: str, tokens: Sequence[int], *, ghosts: bool = True) -> Nearest:
        """The :class:`Nearest` stored entry of ``model_key`` to ``tokens`` (the shortest
        of equals), and the longest common prefix with the entries evicted last
        (``GHOSTS`` of them; ``ghosts`` False: not looked at). Changes no recency or
        counter."""
        toks = tuple(map(int, tokens))
        prefixes = _Prefixes(toks)
        best: tuple[int, tuple[int, ...]] = (0, ())
        with self._lock:
            entries = sum(1 for k in self._entries if k[0] == model_key)
            for key, entry in self._entries.items():
                if key[0] != model_key:
                    continue
                n = prefixes.common(key[1], entry)
                if n > best[0] or (n == best[0] and n and len(key[1]) < len(best[1])):
                    best = (n, key[1])
            for trie in self._segments.of(model_key):
                entries += trie.marks
                path, n = trie.walk(toks)
                if n > best[0] or (n == best[0] and n):
                    stored = trie.nearest(path, n)
                    if n > best[0] or len(stored) < len(best[1]):
                        best = (n, stored)
            remembered = list(self._ghosts) if ghosts else []
        evicted = 0
        packed = _packed(toks) if remembered else None
        for ghost_key, ghost in remembered:
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
            A :class:`CacheLookup`: on a hit, a private copy holding ``cached_tokens``
            (1 .. ``len(tokens) - 1``) tokens and ``rest`` the tokens after them; on a
            miss, ``kv=None``, ``cached_tokens=0``, ``rest=tokens``. A hit marks what
            it used most recently used.

        Raises:
            ValueError: if ``tokens`` is empty (there would be nothing to feed).
        """
        toks = tuple(map(int, tokens))
        n = len(toks)
        if n == 0:
            raise ValueError("fetch needs at least one token")
        with self._lock:
            found = self._segments.find(model_key, toks)
            whole = self._fetch_whole(model_key, toks, found[0] if found else 0)
            if whole is not None:
                return whole
            if found is None:
                self._misses += 1
                return CacheLookup(kv=None, cached_tokens=0, rest=list(toks))
            cached, trie, path = found
            last = path[-1]
            at_end = cached == last.depth and last.mark  # a stored entry, untrimmed
            if cached == n - 1 and last.depth == n and last.mark:
                kind = "exact"
            elif at_end:
                kind = "checkpoint" if last.checkpoint else "shorter"
            else:
                kind = "trimmed"
            now = self._tick()
            for node in path:
                node.used = now
            self._count_hit(kind, cached)
            return CacheLookup(trie.kv(path, cached), cached, list(toks[cached:]), kind=kind)

    def _count_hit(self, kind: str, cached: int) -> None:
        self._hits += 1
        self._hits_by_kind[kind] += 1
        self._tokens_reused += cached

    def _fetch_whole(self, model_key: str, toks: tuple[int, ...], beat: int) -> CacheLookup | None:
        """The hit from a whole entry reusing more than ``beat`` tokens, else None."""
        n = len(toks)
        prefixes = _Prefixes(toks)
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
            if cached > beat:
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
            entry.used = self._tick()
            self._count_hit(kind, cached)
            return CacheLookup(kv=kv, cached_tokens=cached, rest=list(toks[cached:]), kind=kind)
        return None

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
        :meth:`stats`; a later hit on it counts as a "checkpoint" hit). Whole entries
        that cannot be trimmed, snapshots included, are never dropped as redundant
        prefixes.

        ``kv`` must hold exactly ``tokens`` (BatchGenerator's ``Response.all_tokens``
        and ``prompt_cache``). The cache stores copies owning buffers that hold exactly
        their tokens (never a view that keeps a batch buffer alive: `materialize`), so
        its counted bytes are what evicting frees; in a trie only the tokens past what
        is stored are copied. ``kv`` is left unchanged and the caller may drop or reuse
        it. Call this on the thread that made ``kv``'s arrays unless they are evaluated
        (MLX evaluates lazy arrays on their own thread's stream only).

        The entry becomes the most recently used; an entry under the same key is
        replaced; stored entries it extends stop being entries (see the class doc);
        then least recently used leaves and entries are evicted until both bounds hold.
        Not stored: an empty ``tokens``, anything while ``max_bytes == 0``, and an entry
        whose own size (bytes, its shared prefix included) exceeds ``max_bytes``
        (existing entries are then left untouched).

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
        layout = _layout(kv)
        with self._lock:
            if layout is not None:
                end = self._segments.insert(
                    model_key, toks, kv, layout, self._tick(), self._max_bytes
                )
                if end is not None:
                    end.checkpoint = checkpoint
                    self._drop_whole((model_key, toks))
            else:
                self._insert_whole(model_key, toks, kv, checkpoint)
            self._evict_locked(self._max_entries, self._max_bytes)

    def _drop_whole(self, key: _Key) -> None:
        """Forget the whole entry under ``key`` (being replaced), if there is one."""
        old = self._entries.pop(key, None)
        if old is not None:
            self._nbytes -= old.nbytes

    def _insert_whole(
        self, model_key: str, toks: tuple[int, ...], kv: list, checkpoint: bool
    ) -> None:
        kv = materialize(kv)
        nbytes = kv_nbytes(kv)
        if self._max_bytes is not None and nbytes > self._max_bytes:
            return  # larger than the whole cache may hold: not stored
        trimmable = can_trim_prompt_cache(kv)
        entry = _Entry(kv, nbytes, trimmable, checkpoint, _ids(toks), self._tick())
        self._drop_whole((model_key, toks))
        self._segments.drop_key(model_key, toks)
        if trimmable:
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
        self._entries[(model_key, toks)] = entry
        self._nbytes += nbytes

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
        before = self._evictions
        while (self._entries or self._segments.leaves) and (
            (max_entries is not None and len(self) > max_entries)
            or (max_bytes is not None and self.nbytes > max_bytes)
        ):
            leaf = self._segments.oldest_leaf()
            whole = next(iter(self._entries.items()), None)
            if whole is not None and (leaf is None or whole[1].used <= leaf.used):
                key: _Key | None = whole[0]
                self._nbytes -= self._entries.pop(whole[0]).nbytes
            else:
                assert leaf is not None
                key = self._segments.drop_leaf(leaf)
            if key is not None:
                self._evictions += 1
                self._remember_evicted(key)
        return self._evictions - before

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
            self._segments = _Segments()
            self._nbytes = 0

    def stats(self) -> CacheStats:
        """Return a consistent snapshot of the counters, sizes (bytes) and bounds."""
        with self._lock:
            snaps = [e.nbytes for e in self._entries.values() if e.checkpoint]
            snaps += [node.nbytes for _, node in self._segments.marked() if node.checkpoint]
            return CacheStats(
                checkpoints=len(snaps),
                checkpoint_bytes=sum(snaps),
                hits_exact=self._hits_by_kind["exact"],
                hits_shorter=self._hits_by_kind["shorter"],
                hits_checkpoint=self._hits_by_kind["checkpoint"],
                hits_trimmed=self._hits_by_kind["trimmed"],
                hits=self._hits,
                misses=self._misses,
                tokens_reused=self._tokens_reused,
                entries=len(self),
                nbytes=self.nbytes,
                max_entries=self._max_entries,
                max_bytes=self._max_bytes,
                evictions=self._evictions,
            )

    @property
    def nbytes(self) -> int:
        """Bytes held by all stored entries (every shared segment counted once)."""
        with self._lock:
            return self._nbytes + self._segments.nbytes

    @property
    def checkpoint_nbytes(self) -> int:
        """Bytes held by the stored prefill snapshots (``insert(..., checkpoint=True)``;
        in a trie, the snapshot's own last segment)."""
        return self.stats().checkpoint_bytes

    def __len__(self) -> int:
        """Number of stored entries."""
        with self._lock:
            return self._segments.marks + len(self._entries)

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
        """For tests: (model key, tokens, kv) per entry, least recently used first. Whole
        entries' kv objects are the stored ones (do not mutate them); a trie entry's kv
        is put together from its segments."""
        with self._lock:
            rows: list[tuple[int, str, tuple[int, ...], Any]] = [
                (e.used, k[0], k[1], e.kv) for k, e in self._entries.items()
            ]
            for trie, node in self._segments.marked():
                path = node.path()
                rows.append((node.used, trie.model_key, node.sequence(), trie.kv(path, node.depth)))
            rows.sort(key=lambda r: r[0])
            return [(m, t, kv) for _, m, t, kv in rows]
