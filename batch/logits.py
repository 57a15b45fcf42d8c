"""Logits processors applied to all rows of a batch step at once (`batch.decode.DecodeBatch`).

A row's processors, one by one, cost a few array operations each per row and step (a
slice, a scatter, a concatenation: on Metal each a kernel dispatch; the grammar a host
sync per row). Here the kinds this project builds (`decoding.sampling.make_logits_processors`)
are applied for the whole batch: every row's `LogitBias` (and the IgnoreEOS ban, one too)
as one scatter-add over the concatenated (row, id) pairs; each `Penalty` kind as one
gather/scatter over the rows' last tokens, kept on the device as a (B, W) window that
shifts by the step's input tokens; every `ConstraintProcessor`'s next mask filled by
llguidance's thread pool into one (B, words) bitmask (`grammar.fill_masks`), applied with
one ``mx.where``. The values are those of the per-row calls (mlx-lm's penalty formulas,
`tests/model/test_batch_processors.py`).

A row's processors are taken batch-wide as far as they come in the order bias, repetition,
presence, frequency, grammar (the order `make_logits_processors` gives them); the rest
(any other callable, e.g. the reasoning budget; a penalty over the whole history, window
0) run per row on that row's logits, after the batch-wide ones, with its token history.

The state (stacked ids and values, windows, the bitmask buffer) is built for a list of
rows and kept while the same rows come one token further each step (`matches`); a row
joining or leaving, or a speculative step (several tokens at once), rebuilds it from the
rows' host token lists.

Runs on the engine's MLX thread, like every MLX call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from decoding import grammar
from decoding.grammar import ConstraintProcessor
from decoding.sampling import LogitBias, Penalty
from seam.arrays import ints

#: mlx-lm private members used here: none.
PRIVATE: tuple = ()

_PENALTY_RANK = {"repetition": 1, "presence": 2, "frequency": 3}
_NEUTRAL = {"repetition": 1.0, "presence": 0.0, "frequency": 0.0}  # x*1, x/1, x-0: x


def _rank(processor: Any) -> int | None:
    """Its place in the batch-wide order (None: applied per row)."""
    kind = type(processor)
    if kind is LogitBias:
        return 0
    if kind is Penalty and processor.window > 0:  # window 0: mlx-lm reads all tokens
        return _PENALTY_RANK[processor.kind]
    if kind is ConstraintProcessor:
        return 4
    return None


def split(processors: Sequence[Any]) -> tuple[tuple, tuple]:
    """(the leading processors applied batch-wide, the rest applied per row)."""
    last = -1
    for n, p in enumerate(processors):
        rank = _rank(p)
        if rank is None or rank < last or (rank == last and rank != 0):
            return tuple(processors[:n]), tuple(processors[n:])
        last = rank
    return tuple(processors), ()


class BatchLogits:
    """The batch-wide processor state of one list of decoding rows.

    ``rows``: objects with ``processors`` (a sequence of logits processors), ``tokens``
    (the token ids their KV holds, before this step's input) and ``history(new)`` (their
    token context followed by ``new``, an (n,) array: for per-row processors).
    """

    def __init__(self, rows: Sequence[Any]) -> None:
        self._rows = list(rows)
        self._lengths = [len(r.tokens) for r in rows]
        self._arange = mx.arange(len(rows))[:, None]
        biases: list[list[tuple[int, LogitBias]]] = []
        penalties: dict[str, dict[int, Penalty]] = {}
        self._grammar: list[tuple[int, ConstraintProcessor]] = []
        self._suffix: list[tuple[int, tuple]] = []
        for e, r in enumerate(rows):
            batched, rest = split(r.processors)
            layer = 0
            for p in batched:
                if isinstance(p, LogitBias):
                    if layer == len(biases):
                        biases.append([])
                    biases[layer].append((e, p))
                    layer += 1
                elif isinstance(p, Penalty):
                    penalties.setdefault(p.kind, {})[e] = p
                else:
                    self._grammar.append((e, p))
            if rest:
                self._suffix.append((e, rest))
        # One scatter-add per layer (a row's first bias, its second, ...): at most one
        # value per (row, id) in each, added in the row's own order.
        self._bias = [
            (
                mx.array(np.concatenate([np.full(p.ids.size, e, np.int32) for e, p in pairs])),
                mx.concatenate([p.ids for _, p in pairs]),
                mx.concatenate([p.values for _, p in pairs]),
            )
            for pairs in biases
        ]
        self._penalties: list[tuple[str, mx.array, np.ndarray]] = []
        self._window: mx.array | None = None
        if penalties:
            width = max(p.window for kind in penalties.values() for p in kind.values())
            window = np.zeros((len(rows), width), np.int32)
            for e, r in enumerate(rows):
                last = r.tokens[-width:]
                if last:
                    window[e, width - len(last) :] = last
            self._window = mx.array(window)
            self._seen = np.array(self._lengths, np.int64)  # context tokens before the step
            for kind in sorted(penalties, key=_PENALTY_RANK.__getitem__):
                factor = [_NEUTRAL[kind]] * len(rows)
                size = np.full(len(rows), width, np.int64)
                for e, p in penalties[kind].items():
                    factor[e], size[e] = p.penalty, p.window
                self._penalties.append((kind, mx.array(factor, mx.float32), size))
        self._bits: np.ndarray | None = None
        self._tail: tuple[mx.array, tuple[int, ...]] | None = None
        if self._grammar:
            words = max(p.words for _, p in self._grammar)
            self._bits = np.full((len(rows), words), -1, np.int32)
            self._grammar_rows = np.array([e for e, _ in self._grammar])
        self._suffix_rows = mx.array([e for e, _ in self._suffix], mx.int32)

    def matches(self, rows: Sequence[Any]) -> bool:
        """Whether ``rows`` are this state's rows, each one token further than at the
        last `apply` (else the state must be rebuilt)."""
        if len(rows) != len(self._rows):
            return False
        return all(
            a is b and len(a.tokens) == n
            for a, b, n in zip(rows, self._rows, self._lengths, strict=True)
        )

    def apply(self, logits: mx.array, inputs: mx.array) -> tuple[mx.array, list]:
        """Every row's processors on ``logits`` (B, V) of the step that fed ``inputs``
        (B,): (processed logits (B, V), the per-row histories read, to evaluate)."""
        rows = self._rows
        self._lengths = [n + 1 for n in self._lengths]
        for at, ids, values in self._bias:
            logits = logits.at[at, ids].add(values.astype(logits.dtype))
        if self._window is not None:
            logits = self._penalize(logits, inputs)
        if self._grammar:
            logits = self._mask(logits, inputs)
        contexts = []
        if self._suffix:
            pieces = []
            for e, processors in self._suffix:
                row = logits[e : e + 1]
                context = rows[e].history(inputs[e : e + 1])
                contexts.append(context)
                for processor in processors:
                    row = processor(context, row)
                pieces.append(row)
            logits[self._suffix_rows] = mx.concatenate(pieces, axis=0)
        return logits, contexts

    def _penalize(self, logits: mx.array, inputs: mx.array) -> mx.array:
        """mlx-lm's penalties (`sample_utils.make_*_penalty`) on each row's last tokens:
        repetition scales and presence shifts each distinct token once, frequency shifts
        once per occurrence. Window slots before a row's history (or beyond its own
        window) point at its newest token (a repeat: no effect) or weigh 0."""
        assert self._window is not None
        window = mx.concatenate([self._window[:, 1:], inputs[:, None].astype(mx.int32)], axis=1)
        self._window = window
        self._seen += 1
        width = window.shape[1]
        rows = self._arange
        for kind, factor, size in self._penalties:
            have = np.minimum(self._seen, size)
            valid = None
            index = window
            if (have < width).any():
                valid = mx.array(np.arange(width)[None, :] >= (width - have)[:, None])
                index = mx.where(valid, window, window[:, -1:])
            f = factor.astype(logits.dtype)[:, None]
            if kind == "frequency":
                weight = f if valid is None else mx.where(valid, f, mx.zeros_like(f))
                logits = logits.at[rows, index].subtract(mx.broadcast_to(weight, index.shape))
                continue
            picked = logits[rows, index]
            if kind == "repetition":
                picked = mx.where(picked < 0, picked * f, picked / f)
            else:
                picked = picked - f
            logits[rows, index] = picked
        return logits

    def _mask(self, logits: mx.array, inputs: mx.array) -> mx.array:
        """The grammar rows' masks, filled in one llguidance call, applied in one
        ``mx.where``; a finished or failed grammar's row keeps only EOS
        (`ConstraintProcessor.only_eos`); a dormant one (its constraint not started yet:
        after the reasoning, lazy trigger) is left unchanged."""
        assert self._bits is not None
        rows, bits = self._rows, self._bits
        host: list[int] = []
        for e, p in self._grammar:
            tokens = rows[e].tokens

            def fetch(start: int, e: int = e, tokens: list[int] = tokens) -> list[int]:
                if not host:  # one sync for all rows: the grammar needs the tokens now
                    host.extend(ints(inputs))
                return [*tokens[start:], host[e]]

            p.advance(len(tokens) + 1, fetch)
        dormant = tuple(e for e, p in self._grammar if p.dormant)
        if len(dormant) == len(self._grammar):
            return logits  # no row's constraint has started
        active = [(p, e) for e, p in self._grammar if p.masking]
        mx.async_eval(logits)  # the forward pass runs while llguidance fills the masks
        bits[self._grammar_rows] = -1
        grammar.fill_masks(active, bits)
        for p, e in active:
            p.allow_extra(bits[e])
        ended = [(e, p) for e, p in self._grammar if not p.masking and not p.dormant]
        for e, _ in ended:
            bits[e] = -1
        vocab = logits.shape[-1]
        if len(ended) + len(dormant) < len(self._grammar):
            packed = mx.array(bits.view(np.uint8))
            unpacked = (packed[:, :, None] >> mx.arange(8, dtype=mx.uint8)) & 1
            allowed = unpacked.reshape(len(rows), -1)[:, :vocab] != 0
            if allowed.shape[1] < vocab:  # ids past the grammar's vocabulary: banned
                tail = self._beyond(vocab - allowed.shape[1], dormant)
                allowed = mx.concatenate([allowed, tail], 1)
            logits = mx.where(allowed, logits, -mx.inf)
        for e, p in ended:
            logits[e : e + 1] = p.only_eos(logits[e : e + 1])
        return logits

    def _beyond(self, n: int, dormant: tuple[int, ...]) -> mx.array:
        """(B, n) bools: False on started grammar rows, True on the others."""
        if self._tail is None or self._tail[0].shape[1] != n or self._tail[1] != dormant:
            tail = np.ones((len(self._rows), n), np.bool_)
            tail[self._grammar_rows] = False
            tail[list(dormant)] = True
            self._tail = (mx.array(tail), dormant)
        return self._tail[0]
