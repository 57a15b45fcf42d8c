"""Batched quantized KV (``kv_bits``): ``BatchQuantizedKVCache``, the batch form of mlx-lm's
``QuantizedKVCache``, so quantized sequences decode inside the continuous batch.

mlx-lm batches ``KVCache`` (``BatchKVCache``) only; this is the piece it lacks, kept small
and separate so that it can go upstream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import mlx.core as mx
from mlx.utils import tree_map, tree_reduce
from mlx_lm.models.cache import BatchKVCache, QuantizedKVCache, dynamic_roll

from seam.arrays import ints

#: mlx-lm private members used here (tests/fast/test_seam_contract.py checks them).
PRIVATE = (
    (
        "mlx_lm.models.cache",
        "BatchKVCache",
        "_idx",
        "the batch's shared write column; no public accessor",
    ),
    (
        "mlx_lm.models.cache",
        "BatchKVCache",
        "_right_padding",
        "a ragged prefill's padding, set by prepare, rolled by finalize",
    ),
)

KV_BITS = (2, 3, 4, 5, 6, 8)
GROUP_SIZES = (32, 64, 128)  # what mx.quantize accepts


class BatchQuantizedKVCache(BatchKVCache):
    """The batched ``QuantizedKVCache``: ``BatchKVCache``'s layout (rows left-padded,
    shared write index ``_idx``, per-row ``offset`` and ``left_padding`` (B,) int arrays,
    ``prepare(lengths=, right_padding=)`` / ``finalize`` rolling a ragged prefill's right
    padding to the left) with keys and values stored as ``mx.quantize`` triples, each
    element of shape (B, kv_heads, capacity, packed or grouped head dim).

    Every token is quantized along the head dimension by itself, as ``QuantizedKVCache``
    does, so a row's stored values do not depend on the rows beside it. The batch
    quantizes each row from its first token, as a ``QuantizedKVCache`` prompt cache given
    to ``generate_step`` does: even the first prefill chunk attends to quantized keys.
    (``generate_step(kv_bits=..., quantized_kv_start=0)`` instead runs the first chunk on
    a float ``KVCache`` and quantizes it afterwards, so its greedy tokens can differ.)
    There is no ``quantized_kv_start``. ``bits`` and ``group_size`` send
    ``mlx_lm.models.base.scaled_dot_product_attention`` down its quantized path.

    Args:
        bits: 2, 3, 4, 5, 6 or 8.
        group_size: 32, 64 or 128; must divide the model's head dimensions (else
            ``mx.quantize`` raises ValueError at the first update).
        left_padding: per row, padding tokens its first prefill starts with.
    """

    keys: Any  # tuples of mx.quantize's arrays, or None
    values: Any

    def __init__(self, bits: int, group_size: int, left_padding: list[int]) -> None:
        super().__init__(left_padding)
        self.bits = bits
        self.group_size = group_size

    def _quantize(self, x: mx.array) -> tuple:
        return tuple(mx.quantize(x, group_size=self.group_size, bits=self.bits))

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple:
        """Store (B, kv_heads, S, head_dim) keys and values; return all stored triples."""
        qk, qv = self._quantize(keys), self._quantize(values)
        S = keys.shape[2]
        prev = self._idx
        if self.keys is None or prev + S > self.keys[0].shape[2]:
            n = (self.step + S - 1) // self.step * self.step

            def grow(old: mx.array | None, new: mx.array) -> mx.array:
                # Buffers sized from mx.quantize's own output (packing differs by bits).
                blank = mx.zeros((*new.shape[:2], n, new.shape[3]), new.dtype)
                if old is None:
                    return blank
                if prev % self.step != 0:
                    old = old[..., :prev, :]
                return mx.concatenate([old, blank], axis=2)

            old_k = self.keys if self.keys is not None else (None,) * len(qk)
            old_v = self.values if self.values is not None else (None,) * len(qv)
            self.keys = tuple(grow(o, q) for o, q in zip(old_k, qk, strict=True))
            self.values = tuple(grow(o, q) for o, q in zip(old_v, qv, strict=True))
        self.offset = self.offset + S
        self._idx += S
        for a, q in zip(self.keys, qk, strict=True):
            a[..., prev : self._idx, :] = q
        for a, q in zip(self.values, qv, strict=True):
            a[..., prev : self._idx, :] = q
        return self.keys_and_values()

    def keys_and_values(self) -> tuple:
        return cast(tuple, tree_map(lambda x: x[..., : self._idx, :], (self.keys, self.values)))

    def finalize(self) -> None:
        if self._right_padding is not None:
            shift = self._right_padding[:, None]
            self.keys, self.values = tree_map(
                lambda x: dynamic_roll(x, shift, axis=2), (self.keys, self.values)
            )
            self.offset = self.offset - self._right_padding
            self.left_padding += self._right_padding
            self._right_padding = None

    @property
    def state(self) -> tuple:
        return (
            self.keys,
            self.values,
            self.offset,
            self.left_padding,
            self._idx,
            self.group_size,
            self.bits,
        )

    @state.setter
    def state(self, v: tuple) -> None:
        (
            self.keys,
            self.values,
            self.offset,
            self.left_padding,
            self._idx,
            self.group_size,
            self.bits,
        ) = v

    def filter(self, batch_indices: list[int]) -> None:
        """Keep only the rows ``batch_indices`` (in that order), in place."""
        if self.keys is not None:
            self.keys, self.values = tree_map(lambda x: x[batch_indices], (self.keys, self.values))
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        pads = ints(self.left_padding)
        min_left_pad = min(pads)
        if min_left_pad > 0:
            if self.keys is not None:
                self.keys, self.values = tree_map(
                    lambda x: x[..., min_left_pad:, :], (self.keys, self.values)
                )
            self._idx -= min_left_pad
            self.left_padding -= min_left_pad

    def extend(self, other: BatchQuantizedKVCache) -> None:
        """Append ``other``'s rows, in place (both right-justified at the larger ``_idx``).

        Raises:
            ValueError: if ``other`` is not a ``BatchQuantizedKVCache`` of the same bits
                and group size.
        """
        if not isinstance(other, BatchQuantizedKVCache) or (other.bits, other.group_size) != (
            self.bits,
            self.group_size,
        ):
            raise ValueError(
                f"cannot extend a {self.bits}-bit BatchQuantizedKVCache (group size "
                f"{self.group_size}) with {type(other).__name__}"
            )
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        max_idx = max(self._idx, other._idx)
        ref_k = self.keys if self.keys is not None else other.keys
        ref_v = self.values if self.values is not None else other.values
        width = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)

        def pad(c: BatchQuantizedKVCache) -> tuple:
            rows = c.offset.shape[0]
            if c.keys is None:
                ks = tuple(mx.zeros((rows, x.shape[1], 0, x.shape[3]), x.dtype) for x in ref_k)
                vs = tuple(mx.zeros((rows, x.shape[1], 0, x.shape[3]), x.dtype) for x in ref_v)
            else:
                ks, vs = c.keys, c.values
            left = max_idx - c._idx
            right = width - ks[0].shape[2] - left
            if right < 0:
                ks, vs = tree_map(lambda x: x[..., :right, :], (ks, vs))
                right = 0
            if left or right:
                widths = [(0, 0), (0, 0), (left, right), (0, 0)]
                ks, vs = tree_map(lambda x: mx.pad(x, widths), (ks, vs))
            return ks, vs, c.offset, c.left_padding + left

        (k1, v1, o1, l1), (k2, v2, o2, l2) = pad(self), pad(other)
        self.keys = tuple(mx.concatenate([a, b]) for a, b in zip(k1, k2, strict=True))
        self.values = tuple(mx.concatenate([a, b]) for a, b in zip(v1, v2, strict=True))
        self.offset = mx.concatenate([o1, o2])
        self.left_padding = mx.concatenate([l1, l2])
        self._idx = max_idx

    def extract(self, idx: int) -> QuantizedKVCache:
        """Row ``idx`` as mlx-lm's ``QuantizedKVCache`` holding exactly its tokens."""
        row = QuantizedKVCache(group_size=self.group_size, bits=self.bits)
        if self.keys is None:
            return row
        mx.eval(self.left_padding)
        padding = ints(self.left_padding)[idx]
        if padding >= self._idx:
            return row
        row.keys, row.values = tree_map(
            lambda x: mx.contiguous(x[idx : idx + 1, :, padding : self._idx]),
            (self.keys, self.values),
        )
        row.offset = self._idx - padding
        return row

    @classmethod
    def merge(cls, caches: Sequence[Any]) -> BatchQuantizedKVCache:
        """One batch of the per-row quantized caches ``caches`` (any ``QuantizedKVCache``,
        empty ones included), each left-padded to the longest.

        Raises:
            ValueError: if a layer is not a ``QuantizedKVCache`` or the rows differ in
                bits or group size.
        """
        first = caches[0]
        for c in caches:
            if not isinstance(c, QuantizedKVCache):
                raise ValueError(
                    f"BatchQuantizedKVCache merges QuantizedKVCache rows, got {type(c).__name__}"
                )
            if (c.bits, c.group_size) != (first.bits, first.group_size):
                raise ValueError(
                    "BatchQuantizedKVCache merges rows of one bits/group size, got "
                    f"{first.bits}/{first.group_size} and {c.bits}/{c.group_size}"
                )
        lengths = [c.offset if c.keys is not None else 0 for c in caches]
        longest = max(lengths)
        if longest == 0:
            return cls(first.bits, first.group_size, [0] * len(caches))
        padding = [longest - n for n in lengths]
        ref = next(c for c, n in zip(caches, lengths, strict=True) if n > 0)
        B = len(caches)

        def blank(x: mx.array) -> mx.array:
            return mx.zeros((B, x.shape[1], longest, x.shape[3]), x.dtype)

        keys = tuple(blank(x) for x in ref.keys)
        values = tuple(blank(x) for x in ref.values)
        for i, (p, n, c) in enumerate(zip(padding, lengths, caches, strict=True)):
            if n == 0:
                continue
            for a, x in zip(keys, c.keys, strict=True):
                a[i : i + 1, :, p : p + n] = x[..., :n, :]
            for a, x in zip(values, c.values, strict=True):
                a[i : i + 1, :, p : p + n] = x[..., :n, :]
        cache = cls(first.bits, first.group_size, padding)
        cache.keys, cache.values = keys, values
        cache.offset = cache.offset + longest
        cache._idx = longest
        return cache

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return int(tree_reduce(lambda a, x: a + x.nbytes, (self.keys, self.values), 0))
