"""Per-row reject for mlx-lm's ``BatchKVCache``: ``HoleyBatchKVCache``, whose rows can each
drop their last entries (a speculative step's rejected drafts).

mlx-lm's ``BatchKVCache`` shares one write index for all rows, so rows that kept different
numbers of draft tokens cannot each be trimmed; rolling the rows into line (its
``dynamic_roll``) copies the whole KV (180 ms at 8 rows x 400 tokens on this project's
CPU, more than a step). Instead the rejected entries stay where they are and are masked
out: RoPE positions come from the per-row ``offset`` (logical), not from the column, and
attention does not depend on the order of stored keys. The holes are compacted away when
they grow past a quarter of the cache (one copy), and never leave the batch: ``extract``
returns only a row's live entries. Kept small and separate so that it can go upstream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache

from seam.arrays import ints, scalar

#: mlx-lm private members used here (tests/fast/test_seam_contract.py checks them).
PRIVATE = (
    (
        "mlx_lm.models.cache",
        "BatchKVCache",
        "_idx",
        "the batch's shared write column; no public accessor",
    ),
)

#: Holes (rejected draft entries) a row may carry before the batch is compacted: at
#: least MIN_HOLES, and up to 1/HOLE_FRACTION of the cache's columns.
MIN_HOLES = 64
HOLE_FRACTION = 4


class HoleyBatchKVCache(BatchKVCache):
    """mlx-lm's `BatchKVCache` whose rows can each drop their last entries (`reject`).

    Keys/values: (B, heads, capacity, head_dim), left-padded as in `BatchKVCache`.
    ``dead``: None, or (B, capacity) bool marking entries inside ``[0, _idx)`` that
    attention must skip. ``offset`` (B,) stays each row's logical length (its RoPE
    position), which with holes is less than ``_idx - left_padding``.
    """

    keys: Any
    values: Any
    dead: Any = None  # mx.array (B, capacity) bool, or None
    holes: Any = None  # list[int] per row, or None

    @classmethod
    def adopt(cls, cache: BatchKVCache) -> HoleyBatchKVCache:
        """The same cache (its arrays shared) as a `HoleyBatchKVCache`."""
        if isinstance(cache, cls):
            return cache
        new = cls.__new__(cls)
        new.__dict__.update(cache.__dict__)
        return new

    def _rows(self) -> int:
        return int(self.left_padding.shape[0])

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        prev = self._idx
        out: tuple[mx.array, mx.array] = super().update_and_fetch(keys, values)
        if self.dead is not None:
            cap = self.keys.shape[2]
            if self.dead.shape[1] != cap:  # the keys were regrown from column ``prev``
                grow = mx.zeros((self._rows(), cap - prev), dtype=mx.bool_)
                self.dead = mx.concatenate([self.dead[:, :prev], grow], axis=1)
            else:
                self.dead[:, prev : self._idx] = False
        return out

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> mx.array:
        mask: mx.array = super().make_mask(N, return_array=return_array, **kwargs)
        if self.dead is None:
            return mask
        alive = mx.concatenate(
            [~self.dead[:, : self._idx], mx.ones((self._rows(), N), dtype=mx.bool_)], axis=1
        )
        return mask & alive[:, None, None, :]

    def reject(self, counts: Sequence[int]) -> None:
        """Drop the last ``counts[b]`` entries of each row b (its rejected draft tokens)."""
        common = min(counts)
        if common:
            self.trim(common)
        extra = [c - common for c in counts]
        if not any(extra):
            return
        if self.dead is None:
            self.dead = mx.zeros((self._rows(), self.keys.shape[2]), dtype=mx.bool_)
            self.holes = [0] * self._rows()
        ex = mx.array(extra)
        cols = mx.arange(self.dead.shape[1])[None]
        self.dead = self.dead | ((cols >= self._idx - ex[:, None]) & (cols < self._idx))
        self.offset = self.offset - ex
        self.holes = [h + e for h, e in zip(self.holes, extra, strict=True)]
        if max(self.holes) > max(MIN_HOLES, self._idx // HOLE_FRACTION):
            self.compact()

    def _live(self, row: int) -> list[int]:
        """Columns of ``row``'s live entries, in order (host lists; syncs)."""
        pad = scalar(self.left_padding[row])
        dead: list = self.dead[row, pad : self._idx].tolist() if self.dead is not None else []
        return [pad + j for j, d in enumerate(dead) if not d] if dead else []

    def compact(self) -> None:
        """Move every row's live entries together, right-aligned (one copy of the KV)."""
        if self.dead is None:
            return
        live = [self._live(b) for b in range(self._rows())]
        width = max(len(cols) for cols in live)
        pads = [width - len(cols) for cols in live]
        index = mx.array(
            [[cols[0] if cols else 0] * p + cols for p, cols in zip(pads, live, strict=True)]
        )
        gather = index[:, None, :, None]
        self.keys = mx.take_along_axis(self.keys[..., : self._idx, :], gather, axis=2)
        self.values = mx.take_along_axis(self.values[..., : self._idx, :], gather, axis=2)
        self.left_padding = mx.array(pads)
        self._idx = width
        self.dead = None
        self.holes = None

    def filter(self, batch_indices: list[int]) -> None:
        dead = (
            self.dead[mx.array(batch_indices)] if self.dead is not None and batch_indices else None
        )
        holes = [self.holes[i] for i in batch_indices] if self.holes is not None else None
        pads = ints(self.left_padding[mx.array(batch_indices)]) if batch_indices else []
        shift = min(pads, default=0)
        super().filter(batch_indices)
        if dead is not None and holes and any(holes):
            self.dead, self.holes = dead[:, shift:], holes
        else:
            self.dead = self.holes = None

    def extend(self, other: BatchKVCache) -> None:
        parts = [(c, getattr(c, "dead", None), c._idx) for c in (self, other)]
        had_holes = any(d is not None for _, d, _ in parts)
        rows = [int(c.left_padding.shape[0]) for c, _, _ in parts]
        holes = [
            h
            for (c, _, _), n in zip(parts, rows, strict=True)
            for h in (getattr(c, "holes", None) or [0] * n)
        ]
        top = max(self._idx, other._idx)
        super().extend(other)
        if not had_holes or self.keys is None:
            self.dead = self.holes = None
            return
        width = self.keys.shape[2]
        blocks = []
        for (_, dead, idx), n in zip(parts, rows, strict=True):
            d = dead if dead is not None else mx.zeros((n, idx), dtype=mx.bool_)
            d = mx.concatenate([mx.zeros((n, top - idx), dtype=mx.bool_), d[:, :idx]], axis=1)
            d = d[:, :width]
            if d.shape[1] < width:
                d = mx.concatenate([d, mx.zeros((n, width - d.shape[1]), dtype=mx.bool_)], axis=1)
            blocks.append(d)
        self.dead = mx.concatenate(blocks, axis=0)
        self.holes = holes

    def extract(self, idx: int) -> KVCache:
        if self.dead is None or not self.holes or not self.holes[idx]:
            return cast(KVCache, super().extract(idx))
        cols = mx.array(self._live(idx))
        cache = KVCache()
        cache.keys = mx.contiguous(mx.take(self.keys[idx : idx + 1], cols, axis=2))
        cache.values = mx.contiguous(mx.take(self.values[idx : idx + 1], cols, axis=2))
        cache.offset = cache.keys.shape[2]
        return cache


def speculable(layers: Sequence[Any]) -> bool:
    """Whether draft entries can be dropped per row from every layer of a batch cache
    (plain attention layers; rotating, recurrent and quantized layers cannot)."""
    return bool(layers) and all(type(c) in (BatchKVCache, HoleyBatchKVCache) for c in layers)
