"""One sequence's empty batch-row caches (``row_cache``) and the per-row classes for layers
of mlx-lm's own classes (``as_rows``)."""

from __future__ import annotations

import copy
from typing import Any

import mlx_lm.models.cache as _mlx_cache
from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache, make_prompt_cache

from seam.quantized_kv import GROUP_SIZES, KV_BITS, RowQuantizedKVCache
from seam.rotating_kv import RowRotatingKVCache


def row_cache(
    model: Any,
    *,
    kv_bits: int | None = None,
    kv_group_size: int = 64,
    max_kv_size: int | None = None,
    keep: int = 0,
) -> list:
    """One new sequence's empty per-layer cache for ``BatchGenerator.insert(caches=[...])``.

    - ``kv_bits`` set: a :class:`RowQuantizedKVCache` per layer (merging into
      :class:`BatchQuantizedKVCache`).
    - ``max_kv_size`` and ``keep`` > 0: a :class:`RowRotatingKVCache(max_kv_size, keep)`
      per layer (merging into :class:`BatchKeepRotatingKVCache`).
    - otherwise what ``BatchGenerator`` makes itself: ``make_prompt_cache(model,
      max_kv_size)`` (mlx-lm's ``KVCache`` / ``RotatingKVCache`` / the model's
      ``make_cache``, merging into mlx-lm's batch classes). Note that such rows and the
      rows above merge into different batch classes: one ``BatchGenerator`` batch must
      not mix them (``extend`` of one batch class by another fails).

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
    elif keep >= max_kv_size:
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
        return [RowQuantizedKVCache(group_size=kv_group_size, bits=kv_bits) for _ in layers]
    return [RowRotatingKVCache(max_kv_size, keep) for _ in layers]


def as_rows(kv: list) -> list:
    """``kv`` with each layer of mlx-lm's own ``QuantizedKVCache``, or ``RotatingKVCache``
    with keep > 0, replaced by a shallow copy of the per-row class (same state), so a
    cache made outside the batch (``generate_step``, an older prompt-cache entry) merges
    into this module's batch classes; other layers are kept as they are."""
    out = []
    for layer in kv:
        cls = None
        if type(layer) is QuantizedKVCache:
            cls = RowQuantizedKVCache
        elif type(layer) is RotatingKVCache and layer.keep > 0:
            cls = RowRotatingKVCache
        if cls is not None:
            layer = copy.copy(layer)
            layer.__class__ = cls
        out.append(layer)
    return out


# mlx-lm's load_prompt_cache (the disk tier's reader) finds each layer's class by name in
# mlx_lm.models.cache: adding the per-row classes there (new names only) lets a saved row
# load back as itself, so it still merges.
for _cls in (RowQuantizedKVCache, RowRotatingKVCache):
    vars(_mlx_cache).setdefault(_cls.__name__, _cls)
