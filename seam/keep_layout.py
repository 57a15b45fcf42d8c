"""The storage and attention of `seam.rotating_kv.BatchKeepRotatingKVCache`: a batch of
rotating rows with keep laid out in one buffer (`KeepRotatingLayout`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import dynamic_roll

#: mlx-lm private members used here: none.
PRIVATE: tuple = ()


class KeepRotatingLayout:
    """The buffer of a batch of rotating rows with keep: where each token sits and what
    each query sees (`BatchKeepRotatingKVCache`'s storage and attention; rows joining
    and leaving are that class's job).

    Layout (one buffer, own code because rows are left-padded differently, so the kept
    tokens are not one column range): ``keys``/``values`` (B, kv_heads, sink + capacity,
    head_dim) whose first ``sink`` = max(keep) columns hold each row's first tokens
    (column j: token j) and whose other columns (the tail) hold the rows' latest tokens,
    right-justified, in temporal order, or as a ring (``_idx`` the next slot) while
    decoding; ``pos`` (B, 1, columns, 1) int32 is each column's token position (-1: none),
    from which ``make_mask`` builds the (B, 1, N, columns) boolean mask. Attention does
    not depend on the order of the stored keys (RoPE is already applied), only on the
    mask. ``offset`` (B,) int32: tokens per row (negative while left padding is fed).

    Memory per layer: sink + max_size - min(keep) columns (+ the chunk while prefilling).

    Args:
        max_size: tokens a row keeps (mlx-lm's ``max_size``, the load option max_kv_size).
        keep: tokens kept from each row's start: one int for all rows, or one per row.
        left_padding: per row, padding tokens its first prefill starts with.

    Raises:
        ValueError: unless ``0 <= keep < max_size`` for every row.
    """

    step = 256
    keys: Any  # mx.array, or None before the first tokens
    values: Any
    pos: Any

    def __init__(self, max_size: int, keep: int | Sequence[int], left_padding: list[int]) -> None:
        keeps = [keep] * len(left_padding) if isinstance(keep, int) else list(keep)
        if len(keeps) != len(left_padding):
            raise ValueError(f"{len(keeps)} keep values for {len(left_padding)} rows")
        if any(not 0 <= k < max_size for k in keeps):
            raise ValueError(f"keep must be in [0, max_size={max_size}), got {keeps}")
        self.max_size = max_size
        self.keep = keeps
        self.keys = self.values = self.pos = None
        self._sink = max(keeps, default=0)
        self._offs = [-p for p in left_padding]
        self._ends: list[int] | None = None  # a ragged prefill's end position per row
        self._aligned = True  # every row's tail ends at its last stored column
        self._w = 0  # tail columns in use
        self._cap = 0  # tail columns allocated
        self._ring = False
        self._idx = 0  # ring mode: the tail slot the next token overwrites
        self._offset_arr: mx.array | None = None

    # ---- host-side bookkeeping (offsets are known on the host: no device sync per step)

    @property
    def offset(self) -> mx.array:
        if self._offset_arr is None:
            self._offset_arr = mx.array(self._offs, dtype=mx.int32)
        return self._offset_arr

    def _set_offs(self, offs: list[int]) -> None:
        self._offs = offs
        self._offset_arr = None

    @property
    def _capacity(self) -> int:
        """Tail columns a decoding row needs: its last max_size - keep tokens."""
        return self.max_size - min(self.keep)

    # ---- the one layout transform, shared by update_and_fetch and make_mask

    def _new_pos(self, S: int) -> mx.array:
        """(B, 1, S, 1) int32 positions of the next S tokens (-1 for padding)."""
        base = mx.array(self._offs, dtype=mx.int32)[:, None] + mx.arange(S, dtype=mx.int32)
        valid = base >= 0
        if self._ends is not None:
            valid = valid & (base < mx.array(self._ends, dtype=mx.int32)[:, None])
        return mx.where(valid, base, -1)[:, None, :, None]

    def _sink_needs_write(self, S: int) -> bool:
        return self._sink > 0 and any(
            o < k and o + S > 0 for o, k in zip(self._offs, self.keep, strict=True)
        )

    def _sink_written(self, sinks: list, news: list, S: int) -> list:
        """The sink columns after the S new tokens ``news`` whose positions are < keep."""
        j = mx.arange(self._sink, dtype=mx.int32)[None]
        i = j - mx.array(self._offs, dtype=mx.int32)[:, None]
        cond = (i >= 0) & (i < S) & (j < mx.array(self.keep, dtype=mx.int32)[:, None])
        if self._ends is not None:
            cond = cond & (j < mx.array(self._ends, dtype=mx.int32)[:, None])
        take = mx.clip(i, 0, S - 1)[:, None, :, None]
        cond = cond[:, None, :, None]
        return [
            mx.where(cond, mx.take_along_axis(n, take, axis=2), s)
            for s, n in zip(sinks, news, strict=True)
        ]

    @staticmethod
    def _blank(like: mx.array, rows: int, n: int, fill: int) -> mx.array:
        return mx.full((rows, like.shape[1], n, like.shape[3]), fill, like.dtype)

    @staticmethod
    def _put(buf: mx.array, col: int, x: mx.array, inplace: bool) -> mx.array:
        if inplace:
            buf[..., col : col + x.shape[2], :] = x
            return buf
        return mx.concatenate([buf[..., :col, :], x, buf[..., col + x.shape[2] :, :]], axis=2)

    def _apply(self, bufs: list, news: list, fills: list, commit: bool) -> tuple[list, list]:
        """The buffers after storing the S new columns ``news`` (parallel to ``bufs``:
        keys, values, pos; or pos alone) and the slices of them attention reads.
        With ``commit`` the host state moves on and in-place writes are allowed; without,
        nothing of ``self`` changes (``make_mask`` predicts the layout)."""
        S = news[0].shape[2]
        Ks, C, B = self._sink, self._capacity, len(self._offs)
        w, cap, ring, idx = self._w, self._cap, self._ring, self._idx
        aligned = self._aligned
        write_sink = self._sink_needs_write(S)
        if bufs[0] is None:  # first tokens
            sinks = [self._blank(n, B, Ks, f) for n, f in zip(news, fills, strict=True)]
            if write_sink:
                sinks = self._sink_written(sinks, news, S)
            out = [mx.concatenate([s, n], axis=2) for s, n in zip(sinks, news, strict=True)]
            w = cap = S
            aligned = self._ends is None
        elif S == 1 and self._ends is None and (ring or w < C):
            # Decode: write the token into the ring, or into the growing tail.
            out = list(bufs)
            if write_sink:
                sinks = self._sink_written([b[..., :Ks, :] for b in out], news, S)
                out = [self._put(b, 0, s, commit) for b, s in zip(out, sinks, strict=True)]
            if ring:
                out = [self._put(b, Ks + idx, n, commit) for b, n in zip(out, news, strict=True)]
                idx = (idx + 1) % cap
            else:
                if w == cap:
                    grow = min(self.step, C - cap)
                    out = [
                        mx.concatenate([b, self._blank(b, B, grow, f)], axis=2)
                        for b, f in zip(out, fills, strict=True)
                    ]
                    cap += grow
                out = [self._put(b, Ks + w, n, commit) for b, n in zip(out, news, strict=True)]
                w += 1
                if w == C:
                    out = [b[..., : Ks + C, :] for b in out]
                    cap, ring, idx = C, True, 0
        else:
            # A chunk (or the first decode step after one): forget what no row needs any
            # more, then append the new columns.
            sinks = [b[..., :Ks, :] for b in bufs]
            if write_sink:
                sinks = self._sink_written(sinks, news, S)
            if ring:
                tails = [mx.roll(b[..., Ks:, :], -idx, 2) for b in bufs]
            else:
                tails = [b[..., Ks : Ks + w, :] for b in bufs]
            if aligned:
                # Right-justified rows: the last C - (S == 1) columns hold every token any
                # row may still see (max_size - 1 - keep) and what extract returns
                # (max_size - keep).
                kept = min(w, C - 1 if S == 1 and self._ends is None else C)
                tails = [t[..., w - kept :, :] for t in tails]
                w = kept
            out = [
                mx.concatenate(list(parts), axis=2)
                for parts in zip(sinks, tails, news, strict=True)
            ]
            w = cap = w + S
            ring, idx = False, 0
            if S == 1 and self._ends is None and w == C:
                ring = True
            aligned = aligned and self._ends is None
        if commit:
            self._w, self._cap, self._ring, self._idx = w, cap, ring, idx
            self._aligned = aligned
        visible = out if w == cap else [b[..., : Ks + w, :] for b in out]
        return out, visible

    # ---- the cache interface

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Store (B, kv_heads, S, head_dim) keys and values; return the stored ones,
        (B, kv_heads, columns, head_dim), to be read with ``make_mask``'s mask."""
        S = keys.shape[2]
        news = [keys, values, self._new_pos(S)]
        bufs = [self.keys, self.values, self.pos]
        out, visible = self._apply(bufs, news, [0, 0, -1], commit=True)
        self.keys, self.values, self.pos = out
        self._set_offs([o + S for o in self._offs])
        return visible[0], visible[1]

    def make_mask(
        self, N: int, window_size: int | None = None, return_array: bool = False, **kwargs: Any
    ) -> mx.array:
        """The (B, 1, N, columns) boolean mask of the next update of N tokens.

        Raises:
            ValueError: for a ``window_size`` other than ``max_size`` (sliding-window
                layers have their own cache).
        """
        if window_size is not None and window_size != self.max_size:
            raise ValueError(
                f"BatchKeepRotatingKVCache masks a window of max_size={self.max_size}, "
                f"not {window_size}"
            )
        _, (pos,) = self._apply([self.pos], [self._new_pos(N)], [-1], commit=False)
        M = self.max_size
        offs = mx.array(self._offs, dtype=mx.int32)
        before = mx.maximum(offs, 0)  # tokens held before this update
        if self._ends is not None:
            before = mx.minimum(before, mx.array(self._ends, dtype=mx.int32))
        # Tokens the solo cache forgot before the update (between keep and the tail).
        dropped = mx.maximum(before - M + 1, 0)[:, None, None, None]
        keep = mx.array(self.keep, dtype=mx.int32)[:, None, None, None]
        q = (offs[:, None] + mx.arange(N, dtype=mx.int32))[:, None, :, None]
        r = pos[:, :, :, 0][:, :, None, :]
        held = r >= 0
        tail = held & (r >= keep + dropped) & (r <= q) & (r > q - M)
        sink = held & (r <= q - dropped) & (r > q - dropped - M)
        is_sink = mx.arange(r.shape[-1]) < self._sink
        return mx.where(is_sink, sink, tail)

    def prepare(
        self,
        *,
        left_padding: list[int] | None = None,
        lengths: list[int] | None = None,
        right_padding: list[int] | None = None,
    ) -> None:
        """Before a prefill: ``left_padding`` (empty cache only) or a ragged chunk's
        ``lengths`` and ``right_padding`` (tokens past a row's length are padding).

        Raises:
            ValueError: ``left_padding`` on a cache that holds tokens.
        """
        if left_padding is not None:
            if self.keys is not None:
                raise ValueError("left padding can only be added to an empty cache")
            self._set_offs([o - p for o, p in zip(self._offs, left_padding, strict=True)])
        if right_padding is not None and lengths is not None and max(right_padding) > 0:
            self._ends = [o + n for o, n in zip(self._offs, lengths, strict=True)]

    def finalize(self) -> None:
        """After a ragged prefill: roll each row's padding columns to the tail's left."""
        if self._ends is None:
            return
        shift = [max(0, o - e) for o, e in zip(self._offs, self._ends, strict=True)]
        if self.keys is not None and max(shift) > 0:
            Ks, w = self._sink, self._w
            roll = mx.array(shift, dtype=mx.int32)[:, None]
            self.keys, self.values, self.pos = (
                mx.concatenate(
                    [b[..., :Ks, :], dynamic_roll(b[..., Ks : Ks + w, :], roll, axis=2)], axis=2
                )
                for b in (self.keys, self.values, self.pos)
            )
            self._cap = w
        self._set_offs([min(o, e) for o, e in zip(self._offs, self._ends, strict=True)])
        self._ends = None
        self._aligned = True

    def _linearize(self) -> None:
        """Tail in temporal order, right-justified, no spare columns."""
        if self.keys is None or not (self._ring or self._w < self._cap):
            return
        Ks, w, ring, idx = self._sink, self._w, self._ring, self._idx

        def fix(b: mx.array) -> mx.array:
            if ring:
                return mx.concatenate([b[..., :Ks, :], mx.roll(b[..., Ks:, :], -idx, 2)], axis=2)
            return b[..., : Ks + w, :]

        self.keys, self.values, self.pos = (fix(b) for b in (self.keys, self.values, self.pos))
        self._cap, self._ring, self._idx = w, False, 0

    @property
    def state(self) -> tuple:
        return self.keys, self.values, self.pos

    def size(self) -> int:
        return max((min(max(o, 0), self.max_size) for o in self._offs), default=0)

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return int(self.keys.nbytes + self.values.nbytes + self.pos.nbytes)
