"""Batched rotating KV with keep (NKeep): ``BatchKeepRotatingKVCache``, a batch of mlx-lm's
``RotatingKVCache(max_size, keep)`` rows, keep per row (mlx-lm's own
``BatchRotatingKVCache`` drops keep). Kept small and separate so that it can go upstream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache, _BaseCache

from seam.keep_layout import KeepRotatingLayout

#: mlx-lm private members used here (tests/fast/test_seam_contract.py checks them).
PRIVATE = (
    (
        "mlx_lm.models.cache",
        "",
        "_BaseCache",
        "the cache base class: default meta_state, is_trimmable, make_mask",
    ),
    (
        "mlx_lm.models.cache",
        "RotatingKVCache",
        "_temporal_order",
        "a solo row's entries in token order, to merge it",
    ),
    (
        "mlx_lm.models.cache",
        "RotatingKVCache",
        "_idx",
        "a solo row's next write slot, set when a row is extracted",
    ),
)


class BatchKeepRotatingKVCache(KeepRotatingLayout, _BaseCache):
    """A batch of ``RotatingKVCache(max_size, keep)`` rows, ``keep`` per row (0 allowed).

    What each row attends to is what mlx-lm's solo ``RotatingKVCache(max_size, keep)``
    gives it for the same chunks: before each update of S tokens a row that holds T >=
    max_size tokens forgets all but its first ``keep`` and its last ``max_size - 1 - keep``
    tokens; query i of the update then sees, of [kept tokens, the new ones up to itself],
    the last ``max_size`` (a decode step sees everything kept; a long prefill chunk's
    later queries lose the first tokens too, as solo). The rule depends only on T, so a
    row gives the same tokens whatever was batched beside it.

    Storage and masks: `seam.keep_layout.KeepRotatingLayout`; here, rows joining
    (``merge``, ``extend``), leaving (``filter``, ``extract``) and ``trim``.

    Args:
        max_size: tokens a row keeps (mlx-lm's ``max_size``, the load option max_kv_size).
        keep: tokens kept from each row's start: one int for all rows, or one per row.
        left_padding: per row, padding tokens its first prefill starts with.

    Raises:
        ValueError: unless ``0 <= keep < max_size`` for every row.
    """

    def filter(self, batch_indices: list[int]) -> None:
        """Keep only the rows ``batch_indices`` (in that order), in place."""
        if self.keys is not None:
            self.keys, self.values, self.pos = (
                b[batch_indices] for b in (self.keys, self.values, self.pos)
            )
        self.keep = [self.keep[i] for i in batch_indices]
        self._set_offs([self._offs[i] for i in batch_indices])
        if self._ends is not None:
            self._ends = [self._ends[i] for i in batch_indices]

    def extend(self, other: BatchKeepRotatingKVCache) -> None:
        """Append ``other``'s rows, in place (``other`` is left in temporal order).

        Raises:
            ValueError: if ``other`` is not a ``BatchKeepRotatingKVCache`` of the same
                ``max_size``. RuntimeError: during a ragged prefill (before ``finalize``).
        """
        if not isinstance(other, BatchKeepRotatingKVCache) or other.max_size != self.max_size:
            raise ValueError(
                f"cannot extend a BatchKeepRotatingKVCache (max_size {self.max_size}) "
                f"with {type(other).__name__}"
            )
        if self._ends is not None or other._ends is not None:
            raise RuntimeError("extend during a ragged prefill (call finalize first)")
        Ks = max(self._sink, other._sink)
        if self.keys is not None or other.keys is not None:
            self._linearize()
            other._linearize()
            W = max(self._w, other._w)
            ref = self if self.keys is not None else other

            def padded(c: BatchKeepRotatingKVCache) -> list:
                rows = len(c.keep)
                out = []
                for b, r, f in zip(
                    (c.keys, c.values, c.pos),
                    (ref.keys, ref.values, ref.pos),
                    (0, 0, -1),
                    strict=True,
                ):
                    if b is None:
                        out.append(self._blank(r, rows, Ks + W, f))
                        continue
                    parts = [
                        b[..., : c._sink, :],
                        self._blank(r, rows, Ks - c._sink, f),
                        self._blank(r, rows, W - c._w, f),
                        b[..., c._sink :, :],
                    ]
                    out.append(mx.concatenate(parts, axis=2))
                return out

            self.keys, self.values, self.pos = (
                mx.concatenate([a, b]) for a, b in zip(padded(self), padded(other), strict=True)
            )
            self._w = self._cap = W
            self._ring, self._idx, self._aligned = False, 0, True
        self._sink = Ks
        self.keep = self.keep + other.keep
        self._set_offs(self._offs + other._offs)

    def extract(self, idx: int) -> RotatingKVCache:
        """Row ``idx`` as the ``RotatingKVCache`` mlx-lm's solo cache would hold
        after the same tokens: its first ``keep`` tokens then its latest ones, in temporal
        order (all T tokens while T < max_size; keep + (max_size - keep) = max_size once
        T >= max_size).

        Raises:
            RuntimeError: during a ragged prefill, or if a token the row needs is missing
                (a bug).
        """
        if self._ends is not None:
            raise RuntimeError("extract during a ragged prefill (call finalize first)")
        K, M, T = self.keep[idx], self.max_size, self._offs[idx]
        row = RotatingKVCache(M, K)
        if self.keys is None or T <= 0:
            return row
        Ks = self._sink
        pos = self.pos[idx, 0, :, 0].tolist()
        sink_cols = {p: c for c, p in enumerate(pos[:Ks]) if p >= 0}
        tail_cols = {p: Ks + c for c, p in enumerate(pos[Ks:]) if p >= 0}
        first = K if T < M else T - (M - K)
        try:
            cols = [sink_cols[j] for j in range(min(K, T))]
            cols += [tail_cols[p] for p in range(first, T)]
        except KeyError as exc:
            raise RuntimeError(f"row {idx} lost token {exc} it still needs") from exc
        take = mx.array(cols, dtype=mx.int32)
        row.keys = mx.take(self.keys[idx : idx + 1], take, axis=2)
        row.values = mx.take(self.values[idx : idx + 1], take, axis=2)
        row.offset = T
        row._idx = len(cols)
        return row

    @classmethod
    def merge(cls, caches: Sequence[Any]) -> BatchKeepRotatingKVCache:
        """One batch of per-row ``RotatingKVCache`` rows (any keep, empty ones included).

        Raises:
            ValueError: if a layer is not a ``RotatingKVCache``, ``max_size`` differs, or a
                row's keep is not in [0, max_size).
        """
        M = caches[0].max_size if isinstance(caches[0], RotatingKVCache) else None
        for c in caches:
            if not isinstance(c, RotatingKVCache) or c.max_size != M:
                raise ValueError(
                    "BatchKeepRotatingKVCache merges RotatingKVCache rows of one max_size, "
                    f"got {type(c).__name__} (max_size {getattr(c, 'max_size', None)})"
                )
        if M is None:
            raise ValueError("BatchKeepRotatingKVCache merges RotatingKVCache rows")
        cache = cls(M, [c.keep for c in caches], [0] * len(caches))
        rows: list[tuple | None] = []
        for c in caches:
            if c.keys is None or c.offset <= 0:
                rows.append(None)
                continue
            k, v = c._temporal_order(c.keys), c._temporal_order(c.values)
            n, T, K = k.shape[2], c.offset, c.keep
            n_sink = min(K, n)
            n_tail = min(n - n_sink, M - K)
            rows.append((k, v, n, T, n_sink, n_tail))
        cache._set_offs([max(c.offset, 0) if c.keys is not None else 0 for c in caches])
        if all(r is None for r in rows):
            return cache
        Ks = cache._sink
        W = max(r[5] for r in rows if r is not None)
        ref = next(r for r in rows if r is not None)
        B = len(caches)
        keys = mx.zeros((B, ref[0].shape[1], Ks + W, ref[0].shape[3]), ref[0].dtype)
        values = mx.zeros((B, ref[1].shape[1], Ks + W, ref[1].shape[3]), ref[1].dtype)
        pos = mx.full((B, 1, Ks + W, 1), -1, mx.int32)
        for i, r in enumerate(rows):
            if r is None:
                continue
            k, v, n, T, n_sink, n_tail = r
            keys[i : i + 1, :, :n_sink] = k[..., :n_sink, :]
            values[i : i + 1, :, :n_sink] = v[..., :n_sink, :]
            pos[i : i + 1, :, :n_sink] = mx.arange(n_sink, dtype=mx.int32)[None, None, :, None]
            if n_tail:
                at = Ks + W - n_tail
                keys[i : i + 1, :, at:] = k[..., n - n_tail :, :]
                values[i : i + 1, :, at:] = v[..., n - n_tail :, :]
                tail_pos = mx.arange(T - n_tail, T, dtype=mx.int32)
                pos[i : i + 1, :, at:] = tail_pos[None, None, :, None]
        cache.keys, cache.values, cache.pos = keys, values, pos
        cache._w = cache._cap = W
        return cache

    def is_trimmable(self) -> bool:
        return self._ends is None and all(o < self.max_size for o in self._offs)

    def trim(self, n: int) -> int:
        """Drop every row's last ``n`` tokens (at most the shortest row's count), while
        no row has forgotten any (``is_trimmable``). Returns the tokens trimmed."""
        n = min([n] + [max(o, 0) for o in self._offs])
        if n <= 0 or not self.is_trimmable():
            return 0
        if self.keys is not None:
            self._linearize()
            after = mx.array([o - n for o in self._offs], dtype=mx.int32)[:, None, None, None]
            self.pos = mx.where(self.pos >= after, -1, self.pos)
            cut = min(n, self._w)
            end = self.keys.shape[2] - cut
            self.keys, self.values, self.pos = (
                b[..., :end, :] for b in (self.keys, self.values, self.pos)
            )
            self._w = self._cap = self._w - cut
        self._set_offs([o - n for o in self._offs])
        return n
