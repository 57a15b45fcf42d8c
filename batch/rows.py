"""A batch row's layers: one new sequence's empty per-row cache (``row_cache``) and the
batch layers its rows merge into (``merge_rows``).

mlx-lm merges a batch's rows with each layer's own ``merge`` (its ``BatchKVCache``,
``BatchRotatingKVCache``...). Quantized rows (``kv_bits``) and rotating rows with keep
(NKeep) merge here into `seam.quantized_kv`'s and `seam.rotating_kv`'s batch classes
instead: mlx-lm's ``QuantizedKVCache`` has no batch form and its
``RotatingKVCache.merge`` drops keep. Rows stay mlx-lm's own classes (what the prompt
cache stores and the disk tier writes; what ``generate_step`` makes), so no class of
ours needs registering where mlx-lm's ``load_prompt_cache`` looks classes up by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache, make_prompt_cache

from seam.quantized_kv import GROUP_SIZES, KV_BITS, BatchQuantizedKVCache
from seam.rotating_kv import BatchKeepRotatingKVCache

#: mlx-lm private members used here: none.
PRIVATE: tuple = ()


def merge_layer(rows: Sequence[Any], own: bool = False) -> Any:
    """One batch layer of the rows' layers ``rows`` (one per row, of one class); ``own``:
    quantized and rotating rows merge into this package's batch classes.

    Raises:
        ValueError: a layer with no batch form (mlx-lm's message).
    """
    first = rows[0]
    if own and isinstance(first, QuantizedKVCache):
        return BatchQuantizedKVCache.merge(rows)
    if own and isinstance(first, RotatingKVCache):
        return BatchKeepRotatingKVCache.merge(rows)
    if not hasattr(first, "merge"):
        raise ValueError(f"{type(first)} does not yet support batching with history")
    return first.merge(list(rows))


def merge_rows(caches: Sequence[list], own: bool = False) -> list:
    """The batch layers of several rows' per-layer caches (`merge_layer` per layer)."""
    if not caches:
        return []
    return [merge_layer([c[i] for c in caches], own) for i in range(len(caches[0]))]


def row_cache(
    model: Any,
    *,
    kv_bits: int | None = None,
    kv_group_size: int = 64,
    max_kv_size: int | None = None,
    keep: int = 0,
) -> list:
    """One new sequence's empty per-layer cache for `batch.decode.DecodeBatch.insert`.

    - ``kv_bits`` set: a ``QuantizedKVCache(kv_group_size, kv_bits)`` per layer (merging,
      ``own``, into :class:`BatchQuantizedKVCache`).
    - ``max_kv_size`` and ``keep`` > 0: a ``RotatingKVCache(max_kv_size, keep)`` per layer
      (merging, ``own``, into :class:`BatchKeepRotatingKVCache`).
    - otherwise what the batch makes itself: ``make_prompt_cache(model, max_kv_size)``
      (mlx-lm's ``KVCache`` / ``RotatingKVCache`` / the model's ``make_cache``, merging
      into mlx-lm's batch classes). One batch must not mix such rows with the rows
      above (``extend`` of one batch class by another fails).

    Raises:
        ValueError: ``kv_bits`` not in (2, 3, 4, 5, 6, 8) or ``kv_group_size`` not in
            (32, 64, 128); ``kv_bits`` together with ``max_kv_size`` (mlx-lm has no
            quantized rotating cache); ``keep`` < 0 or ``keep`` >= ``max_kv_size``;
            ``max_kv_size`` < 1; or a model whose own cache (``make_cache``) has layers
            other than plain ``KVCache`` (sliding-window ``RotatingKVCache`` layers,
            e.g. Gemma 3 and gpt-oss; ``ArraysCache``/``MambaCache`` state, e.g. Mamba,
            Qwen3.5's linear attention, LFM2's convolutions; ``CacheList``;
            ``ChunkedKVCache``), which cannot be quantized or rotated that way.
    """
    if max_kv_size is not None and max_kv_size < 1:
        raise ValueError(f"max_kv_size must be >= 1, got {max_kv_size}")
    if keep < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    rotate = max_kv_size is not None and keep > 0
    if kv_bits is None and not rotate:
        return make_prompt_cache(model, max_kv_size)
    if kv_bits is not None:
        if kv_bits not in KV_BITS:
            raise ValueError(f"kv_bits must be one of {KV_BITS}, got {kv_bits}")
        if kv_group_size not in GROUP_SIZES:
            raise ValueError(f"kv_group_size must be one of {GROUP_SIZES}, got {kv_group_size}")
        if max_kv_size is not None:
            raise ValueError(
                "kv_bits and max_kv_size together: mlx-lm has no quantized rotating KV cache"
            )
    elif max_kv_size is not None and keep >= max_kv_size:
        raise ValueError(f"keep ({keep}) must be smaller than max_kv_size ({max_kv_size})")
    layers = make_prompt_cache(model)
    other = sorted({type(c).__name__ for c in layers if type(c) is not KVCache})
    if other:
        what = f"{kv_bits}-bit quantized" if kv_bits is not None else "rotated with keep"
        raise ValueError(
            f"this model's cache has {', '.join(other)} layers, which cannot be {what} "
            "in a batch (only plain KVCache layers can)"
        )
    if kv_bits is not None:
        return [QuantizedKVCache(group_size=kv_group_size, bits=kv_bits) for _ in layers]
    return [RotatingKVCache(max_kv_size, keep) for _ in layers]
