"""The continuous batch: our own small class over mlx-lm's public model and cache API.

`DecodeBatch` holds every sequence the engine decodes together. A sequence joins with
its prompt as segments (prefill stops exactly at each segment's end, so that the caller
can snapshot the KV there), an optional KV it starts from and the tokens that KV holds;
it waits, is prefilled in chunks of at most ``prefill_step_size`` tokens (one chunk per
`next`, interleaved with decoding; the caller may change the size between steps), then
decodes one token per `next` until EOS (when it stops at EOS) or ``max_tokens``. Rows join
and leave between steps.

The steps are mlx-lm's `BatchGenerator`'s (0.32) in the same order, so greedy tokens are
the same: decoding first, then waiting rows enter the prefill group; a row whose prompt
is down to its last token leaves the prefill group with one forward pass of that token
(its first token is queued, and returned by this step: `_first_tokens`), then joins the
decoding rows; then one chunk for each row still prefilling (a ragged chunk right-padded,
``prepare``/``finalize``). Decoding is pipelined as mlx-lm's: the next step is queued
before this one's tokens are read, so a sequence's KV always holds the token it just
returned (a first token returned as its prompt ended: from the next step).

Own code instead of mlx-lm's `BatchGenerator` + `GenerationBatch`: these are private in
all but name (subclassing them meant re-implementing their private ``_step`` and reading
their private counters, renamed on mlx-lm's main), and this project needs what they lack:
a log-softmax only when a row reads it, logits processors applied to all rows at once
(`batch.logits`), rows of the batched quantized and keep-rotating caches
(`batch.rows`), and a step that speculation replaces (`batch.speculation`).

Runs on the engine's MLX thread, like every MLX call.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import TokenBuffer, make_prompt_cache

from batch.logits import BatchLogits
from batch.release import release_cache
from batch.rows import merge_rows
from decoding.finish import FinishReason, finish_of
from decoding.sampling import GREEDY
from seam.arrays import ints

#: mlx-lm private members used here: none.
PRIVATE: tuple = ()

Sampler = Callable[[mx.array], mx.array]


@dataclass(frozen=True)
class Prefilled:
    """A prefill chunk of row ``uid`` ran (or its prompt ended): ``progress`` (prompt tokens
    fed so far, all of them); ``end_of_segment``: the chunk ended a segment;
    ``end_of_prompt``: the row now decodes."""

    uid: int
    progress: tuple[int, int]
    end_of_segment: bool
    end_of_prompt: bool


@dataclass(frozen=True)
class Generated:
    """One decoded token of row ``uid``; ``logprobs`` (V,), or None when its row does not
    read them. On the last one, ``finish_reason`` (STOP, LENGTH), ``prompt_cache`` the
    row's KV and ``all_tokens`` the tokens it holds. ``drafted``: an accepted draft."""

    uid: int
    token: int
    logprobs: mx.array | None
    finish_reason: FinishReason | None = None
    prompt_cache: list | None = None
    all_tokens: list[int] | None = None
    drafted: bool = False


@dataclass(eq=False)
class Row:
    """One sequence of the batch."""

    uid: int
    segments: list[list[int]]  # prompt left to feed; the last segment is the last token
    cache: list  # its own layers until it enters the prefill group (then [])
    tokens: list[int]  # the tokens its KV holds
    max_tokens: int
    sampler: Sampler
    processors: tuple
    stops: bool  # EOS ends it
    logprobs: bool  # its logprobs are read
    total: int  # prompt tokens to feed
    draft: tuple | None = None  # (most draft tokens per step, stats): `batch.speculation`
    done: int = 0  # prompt tokens fed
    emitted: int = 0  # tokens returned
    context: Any = None  # TokenBuffer of its history, for its per-row logits processors
    held: int = 0  # tokens in ``context``
    gate: Any = None  # its `DraftGate` while it drafts
    sent: bool = False  # its queued token was returned as it left prefill (`_first_tokens`)
    since: int = 0  # the batch's prompt tokens fed when it was inserted (`_pick`)
    # The caller wants its KV where only the last prompt token is left (a segment of its
    # own: a checkpoint or `cut` there): it then decodes from the next step, not this one.
    boundary: bool = False

    def history(self, new: mx.array, fresh: bool = True) -> mx.array:
        """Its token context for a per-row logits processor: the tokens its KV holds,
        then ``new`` (n,) (``fresh`` False: after the context of the last call, for
        tokens not yet in ``tokens``). Rebuilt from ``tokens`` when the last call's
        context is not theirs (the row's batch-wide steps do not keep it)."""
        if fresh and (self.context is None or self.held != len(self.tokens)):
            self.context, self.held = TokenBuffer(self.tokens), len(self.tokens)
        self.held += new.size
        return cast(mx.array, self.context.update_and_fetch(new))


def _nbytes(layer: Any) -> int:
    # An empty QuantizedKVCache's nbytes fails in mlx-lm 0.32.
    return 0 if getattr(layer, "keys", 0) is None else layer.nbytes


def _cut(segments: list[list[int]], offset: int) -> bool:
    """Split ``segments`` (a row's prompt left to feed) so that one ends ``offset`` tokens
    in; False when ``offset`` is not inside them (0 or less: already fed)."""
    at = 0
    for i, seg in enumerate(segments):
        if offset <= at:
            return False
        if offset <= at + len(seg):
            if offset < at + len(seg):
                segments[i : i + 1] = [seg[: offset - at], seg[offset - at :]]
            return True
        at += len(seg)
    return False


def _filter_layers(cache: list, keep: list[int]) -> None:
    """Keep only rows ``keep`` (indices, in order) of every batch layer of ``cache``."""
    if not keep:
        cache.clear()
    else:
        for c in cache:
            c.filter(keep)


def _take_chunk(row: Row, size: int) -> tuple[list[int], bool]:
    """The next prefill chunk of ``row`` (at most ``size`` tokens, never past the end of
    its first segment), taken off its prompt; whether it ends that segment."""
    seg = row.segments[0]
    chunk, row.segments[0] = seg[:size], seg[size:]
    end = not row.segments[0]
    if end:
        row.segments.pop(0)
    row.done += len(chunk)
    return chunk, end


def _take_chunks(rows: list[Row], chunk: int, budget: int | None) -> list[tuple[list[int], bool]]:
    """The next chunk of each prefilling row (`_take_chunk`): at most ``chunk`` tokens,
    within an equal share of the step's ``budget`` (None: no bound), as the forward pass
    pads every row to the longest chunk (`_pick`)."""
    if budget is not None and rows:
        chunk = max(1, min(chunk, budget // len(rows)))
    return [_take_chunk(r, chunk) for r in rows]


def _feed(model: Any, cache: list, chunks: list[list[int]], step: int) -> None:
    """Run ``chunks`` (one per row of the batch ``cache``, right-padded when they differ
    in length) through ``model``, at most ``step`` tokens a pass."""
    lengths = [len(c) for c in chunks]
    longest = max(lengths)
    padding = [longest - n for n in lengths]
    ragged = max(padding) > 0
    if ragged:
        inputs = mx.array([c + [0] * (longest - len(c)) for c in chunks])
        for c in cache:
            c.prepare(lengths=lengths, right_padding=padding)
    else:
        inputs = mx.array(chunks)
    while inputs.shape[1] > 0:
        n = min(step, inputs.shape[1])
        model(inputs[:, :n], cache=cache)
        mx.eval([c.state for c in cache])
        release_cache(generation_stream)
        inputs = inputs[:, n:]
    if ragged:
        for c in cache:
            c.finalize()
        mx.eval([c.state for c in cache])
        release_cache(generation_stream)


def _split(cache: list, ready: list[int], keep: list[int]) -> tuple[list, list]:
    """The batch ``cache``'s rows ``ready`` and rows ``keep`` (indices), each its own."""
    if not keep:
        _filter_layers(cache, ready)
        return cache, []
    out = copy.deepcopy(cache)
    _filter_layers(out, ready)
    _filter_layers(cache, keep)
    return out, cache


def _extend(a: list, b: list) -> list:
    if not a:
        return b
    if not b:
        return a
    for x, y in zip(a, b, strict=True):
        x.extend(y)
    return a


def _joining(n: int, limit: int | None, prefilling: list[Row]) -> int:
    """Of ``n`` waiting rows that may join the prefill group, how many do when it holds at
    most ``limit`` rows (None: all; engine/step_budget.py sets it between steps): the
    others wait, in order. Rows down to their last token leave it in this step."""
    if limit is None:
        return n
    return min(n, limit - len(prefilling) + sum(1 for r in prefilling if _leaving(r)))


def _leaving(row: Row) -> bool:
    """Whether ``row``'s prompt is down to its last token (it leaves the prefill group)."""
    return len(row.segments) == 1 == len(row.segments[0])


def _left(row: Row) -> int:
    """Prompt tokens ``row`` has left to prefill in chunks (its last one is the first
    decode step's)."""
    return sum(len(s) for s in row.segments) - 1


#: How fast waiting raises a row's turn (`_pick`): its tokens left count less by this
#: fraction of the prompt tokens the batch prefilled while it waited.
AGING = 0.5


def _pick(
    waiting: deque[Row], n: int, budget: int, chunk: int, group: list[Row], fed: int
) -> list[Row]:
    """Take from ``waiting`` the rows that join the prefill group this step (at most
    ``n``), within the step's ``budget`` of prompt tokens over all its rows (vLLM's
    ``max_num_batched_tokens``), counting every row's chunk (at most ``chunk`` tokens) as
    the longest one's, as the forward pass pads them. The rows with the fewest tokens left
    join first (a new turn of a running session does not wait behind a long prompt),
    less `AGING` times the tokens prefilled while they waited (``fed``: the batch's count;
    a long prompt is never starved); rows down to their last token always join (one
    decode token each). The first row joins whatever its chunk when the group is empty.

    Own code: mlx-lm's `BatchGenerator` takes waiting prompts in arrival order, each with a
    full chunk; vLLM's scheduler (vllm/v1/core/sched/scheduler.py, ``schedule``) shares a
    token budget per step, in arrival order."""

    def cost(r: Row) -> int:
        return 0 if _leaving(r) else min(chunk, len(r.segments[0]))

    # The forward pass right-pads every row to the longest chunk (`_feed`): the step runs
    # rows x longest positions, which the budget bounds.
    staying = [r for r in group if not _leaving(r)]
    rows, longest = len(staying), max(map(cost, staying), default=0)
    order = sorted(waiting, key=lambda r: _left(r) - AGING * (fed - r.since))
    taken: list[Row] = []
    for r in order:
        if len(taken) >= n:
            break
        c = cost(r)
        k, top = (rows + 1, max(longest, c)) if c else (rows, longest)
        if k * top > budget and (taken or staying):
            continue
        taken.append(r)
        rows, longest = k, top
    if taken:
        chosen = {id(r) for r in taken}
        kept = [r for r in waiting if id(r) not in chosen]
        waiting.clear()
        waiting.extend(kept)
    return taken


class DecodeBatch:
    """The continuous batch of one model (module doc).

    Args:
        model: called as ``model(tokens (B, L), cache=layers)`` -> logits (B, L, V).
        eos: token ids that end a row that stops at EOS.
        max_rows: most rows decoding, and most prefilling, at once.
        prefill_step_size: most prompt tokens per row per step (may change between steps),
            ``prefill_rows`` the most rows prefilling together (`_joining`; None: any),
            ``prefill_tokens`` the most prompt positions a step feeds, padding included
            (`_pick`, `_take_chunks`; None: no bound, rows join in arrival order).
        max_kv_size: passed to ``make_prompt_cache`` for rows inserted without a cache.
        own_layers: rows' quantized and rotating layers merge into `batch.rows`'s batch
            classes (``kv_bits``, NKeep), not mlx-lm's.
        settle: each `next` waits for the step it queued (no overlap with the caller's
            next collective). A distributed group needs it: a lost peer then fails the
            decode's own all_sum; a collective queued after an already-failed one waits
            forever on MLX's ring backend (the 60 s watchdog instead of a prompt error).
    """

    def __init__(
        self,
        model: Any,
        *,
        eos: Sequence[int] = (),
        max_rows: int = 32,
        prefill_step_size: int = 2048,
        max_kv_size: int | None = None,
        own_layers: bool = False,
        settle: bool = False,
    ) -> None:
        self.model = model
        self.settle = settle
        self.eos = frozenset(eos)
        self.max_rows = max_rows
        self.prefill_step_size = prefill_step_size
        self.prefill_rows: int | None = None
        self.prefill_tokens: int | None = None
        self._fed = 0  # prompt tokens fed by prefill chunks so far
        self.max_kv_size = max_kv_size
        self.own_layers = own_layers
        self._uid = 0
        self._waiting: deque[Row] = deque()
        self._prefilling: list[Row] = []
        self._pcache: list = []
        self._rows: list[Row] = []  # decoding, in the order of the cache's rows
        self._cache: list = []
        self._next_tokens: Any = None  # (B,) mx.array queued, not yet read; None: no row
        self._next_logprobs: list = []
        self._early: list[Generated] = []  # first tokens returned by this step (`_start`)
        self._steps = 0
        self._release_due = False
        self._logits: BatchLogits | None = None  # of the last processed step's rows
        self._old_wired: int | None = None
        limit = mx.device_info().get("max_recommended_working_set_size")
        if limit is not None:  # Metal: keep the weights wired (as mlx-lm's BatchGenerator)
            self._old_wired = mx.set_wired_limit(int(limit))

    def close(self) -> None:
        if self._old_wired is not None:
            mx.synchronize(generation_stream)
            mx.set_wired_limit(self._old_wired)
            self._old_wired = None

    # -- rows joining and leaving ------------------------------------------------------
    def insert(
        self,
        segments: Sequence[Sequence[int]],
        *,
        max_tokens: int,
        cache: list | None = None,
        tokens: Sequence[int] = (),
        sampler: Sampler | None = None,
        processors: Sequence[Any] | None = (),
        stops: bool = True,
        logprobs: bool = False,
        draft: tuple | None = None,
    ) -> int:
        """Add a sequence: its prompt ``segments`` (prefill stops at each one's end),
        ``cache`` holding ``tokens`` (None: an empty cache of the model's), up to
        ``max_tokens`` tokens sampled with ``sampler`` (None: greedy) after
        ``processors``; ``stops``: EOS ends it; ``logprobs``: its logprobs are read;
        ``draft``: (most draft tokens per step, `NgramStats`) for `batch.speculation`.
        Returns its uid.

        Raises:
            ValueError: an empty prompt, or ``max_tokens`` <= 0.
        """
        uid = self._uid
        segs = [list(s) for s in segments if len(s)]
        if not segs:
            raise ValueError(f"Sequence {uid} has an empty prompt.")
        if max_tokens <= 0:
            raise ValueError(f"Sequence {uid}'s max_tokens must be > 0.")
        boundary = len(segs) > 1 and len(segs[-1]) == 1
        if len(segs[-1]) != 1:  # the last token is fed by the first decode step
            segs.append(segs[-1][-1:])
            segs[-2] = segs[-2][:-1]
        if cache is None:
            cache = make_prompt_cache(self.model, self.max_kv_size)
        row = Row(
            uid,
            segs,
            cache,
            list(tokens),
            max_tokens,
            sampler or GREEDY,
            tuple(processors or ()),
            stops,
            logprobs,
            sum(len(s) for s in segs),
            draft,
            boundary=boundary,
            since=self._fed,
        )
        self._uid += 1
        self._waiting.append(row)
        return uid

    def cut(self, uid: int, position: int) -> bool:
        """Make row ``uid``'s prefill stop at ``position`` (tokens its KV holds then,
        counted from the start of its prompt), so that its KV can be copied there: True
        when it will (a new or existing segment end still ahead), False when the row is
        past it, decoding or absent."""
        for rows in (self._waiting, self._prefilling):
            for r in rows:
                if r.uid == uid:
                    offset = position - len(r.tokens)
                    if not _cut(r.segments, offset):
                        return False
                    r.boundary |= offset == _left(r)
                    return True
        return False

    def held(self, uid: int) -> tuple[int, int] | None:
        """(tokens row ``uid``'s KV holds now, its stage: 0 waiting, 1 prefilling, 2
        decoding); None: no such row."""
        for stage, rows in enumerate((self._waiting, self._prefilling, self._rows)):
            for r in rows:
                if r.uid == uid:
                    return len(r.tokens), stage
        return None

    def _find(self, uids: Sequence[int]) -> dict[int, tuple[int, int]]:
        """uid -> (stage, index): 0 waiting, 1 prefilling, 2 decoding."""
        want, out = set(uids), {}
        for stage, rows in enumerate((self._waiting, self._prefilling, self._rows)):
            for i, row in enumerate(rows):
                if row.uid in want:
                    out[row.uid] = (stage, i)
        return out

    def extract_cache(self, uids: Sequence[int]) -> dict[int, tuple[list, list[int]]]:
        """uid -> (a copy of its KV, the tokens it holds) for each of ``uids`` present."""
        out = {}
        for uid, (stage, i) in self._find(uids).items():
            if stage == 0:
                row = self._waiting[i]
                out[uid] = (row.cache, row.tokens)
            elif stage == 1:
                out[uid] = ([c.extract(i) for c in self._pcache], self._prefilling[i].tokens)
            else:
                out[uid] = (self.extract_row(i), self._rows[i].tokens)
        return out

    def extract_row(self, i: int) -> list:
        """Decoding row ``i``'s KV, its own copy."""
        return [c.extract(i) for c in self._cache]

    def remove(self, uids: Sequence[int], return_prompt_caches: bool = False) -> dict:
        """Take ``uids`` out; with ``return_prompt_caches`` {uid: (kv, tokens)}."""
        out = self.extract_cache(uids) if return_prompt_caches else {}
        found = self._find(uids)
        gone = [{i for s, i in found.values() if s == stage} for stage in range(3)]
        if gone[0]:
            self._waiting = deque(r for i, r in enumerate(self._waiting) if i not in gone[0])
        if gone[1]:
            keep = [i for i in range(len(self._prefilling)) if i not in gone[1]]
            self._prefilling = [self._prefilling[i] for i in keep]
            _filter_layers(self._pcache, keep)
        if gone[2]:
            self._filter([i for i in range(len(self._rows)) if i not in gone[2]])
        return out

    def _filter(self, keep: list[int]) -> None:
        """Keep only decoding rows ``keep`` (indices, in order)."""
        self._rows = [self._rows[i] for i in keep]
        _filter_layers(self._cache, keep)
        self._next_tokens = self._next_tokens[keep] if keep else None
        self._next_logprobs = [self._next_logprobs[i] for i in keep]

    def _joined(self, rows: list[Row]) -> None:
        """Hook: ``rows`` were just appended to the decoding rows (and the cache)."""

    @property
    def rows(self) -> int:
        return len(self._waiting) + len(self._prefilling) + len(self._rows)

    @property
    def prefills(self) -> bool:
        """Whether a row waits to prefill or is prefilling."""
        return bool(self._waiting or self._prefilling)

    def __len__(self) -> int:
        return self.rows

    @property
    def nbytes(self) -> int:
        """Bytes of every row's KV."""
        total = sum(_nbytes(c) for r in self._waiting for c in r.cache)
        return total + sum(_nbytes(c) for c in (*self._pcache, *self._cache))

    # -- stepping ----------------------------------------------------------------------
    def next(
        self, decode: bool = True, prefill: bool = True
    ) -> tuple[list[Prefilled], list[Generated]]:
        """One step: a token for every decoding row, then a prefill chunk for each row
        still prefilling (module doc); ``decode`` / ``prefill`` False: without that part
        (a caller that hands the tokens over before the prefill runs)."""
        with mx.stream(generation_stream):
            out = self._next(decode, prefill)
            if self.settle and self._next_tokens is not None:
                mx.eval(self._next_tokens, [x for x in self._next_logprobs if x is not None])
            return out

    def _next(self, decode: bool, prefill: bool) -> tuple[list[Prefilled], list[Generated]]:
        generated: list[Generated] = []
        if self._rows and decode:
            generated = self._decode()
            self._steps += 1
            # Every 512 steps, at the first step after that in which no sequence finished.
            self._release_due |= self._steps % 512 == 0
            if self._release_due and not any(g.finish_reason for g in generated):
                release_cache(generation_stream)
                self._release_due = False
        prefilled: list[Prefilled] = []
        if len(self._rows) >= self.max_rows or not prefill:
            return prefilled, generated
        n = min(
            self.max_rows - len(self._prefilling),
            self.max_rows - len(self._rows),
            len(self._waiting),
        )
        n = _joining(n, self.prefill_rows, self._prefilling)
        if n <= 0:
            rows = []
        elif self.prefill_tokens is None:
            rows = [self._waiting.popleft() for _ in range(n)]
        else:
            budget, chunk = self.prefill_tokens, self.prefill_step_size
            rows = _pick(self._waiting, n, budget, chunk, self._prefilling, self._fed)
        if rows:
            cache = merge_rows([r.cache for r in rows], self.own_layers)
            for r in rows:
                r.cache = []
            self._prefilling.extend(rows)
            self._pcache = _extend(self._pcache, cache)
        prefilled += self._start_ready(lambda r: True)
        chunks = _take_chunks(self._prefilling, self.prefill_step_size, self.prefill_tokens)
        prefilled += [
            Prefilled(r.uid, (r.done, r.total), e, False)
            for r, (_, e) in zip(self._prefilling, chunks, strict=True)
        ]
        self._prefill([c for c, _ in chunks])
        # Rows whose prompt this chunk ended decode from now: their first token comes with
        # this step (`_first_tokens`), not later (unless the caller wants their KV first).
        if len(self._rows) < self.max_rows:
            prefilled += self._start_ready(lambda r: not r.boundary)
        generated += self._early
        self._early = []
        return prefilled, generated

    def _start_ready(self, may: Callable[[Row], bool]) -> list[Prefilled]:
        """Start the prefilling rows down to their last token that ``may`` start (`_start`)."""
        ready = [i for i, r in enumerate(self._prefilling) if _leaving(r) and may(r)]
        if not ready:
            return []
        keep = [i for i in range(len(self._prefilling)) if i not in set(ready)]
        rows = [self._prefilling[i] for i in ready]
        self._prefilling = [self._prefilling[i] for i in keep]
        cache, self._pcache = _split(self._pcache, ready, keep)
        self._start(rows, cache)
        return [Prefilled(r.uid, (r.total, r.total), True, True) for r in rows]

    def _prefill(self, chunks: list[list[int]]) -> None:
        """Feed each prefilling row its chunk (`_feed`)."""
        if chunks:
            for r, chunk in zip(self._prefilling, chunks, strict=True):
                r.tokens += chunk
                self._fed += len(chunk)
            _feed(self.model, self._pcache, chunks, self.prefill_step_size)

    def _start(self, rows: list[Row], cache: list) -> None:
        """``rows`` (KV ``cache``) leave prefill: their last prompt token's forward pass is
        queued on its own, then they join the decoding rows."""
        last = [r.segments[0][0] for r in rows]
        for r in rows:
            r.segments = []
        inputs = mx.array(last)
        sampled, logprobs = self._forward(rows, cache, inputs)
        mx.eval(inputs)
        for r, t in zip(rows, last, strict=True):
            r.tokens.append(t)
        self._rows += rows
        self._cache = _extend(self._cache, cache)
        if self._next_tokens is None:
            self._next_tokens, self._next_logprobs = sampled, logprobs
        else:
            self._next_tokens = mx.concatenate([self._next_tokens, sampled])
            self._next_logprobs += logprobs
        if not self.settle:  # a distributed group's ranks keep the pipelined order
            self._early += _first_tokens(rows, sampled, logprobs, self.eos)
        self._joined(rows)

    def _forward(self, rows: list[Row], cache: list, inputs: mx.array) -> tuple[mx.array, list]:
        """Queue one decode pass of ``inputs`` (B,): (sampled (B,), logprobs (V,) of each
        row that reads them, else None), evaluation started.

        The rows' logits processors run batch-wide (`batch.logits`); greedy rows are
        one argmax; a seeded sampler draws from its own row (reproducible alone or in any
        batch)."""
        logits = self.model(inputs[:, None], cache=cache)[:, -1, :]
        if lean(rows):
            sampled = mx.argmax(logits, axis=-1)
            mx.async_eval(sampled)
            return sampled, [None] * len(rows)
        contexts: list = []
        if any(r.processors for r in rows):
            state = self._logits
            if state is None or not state.matches(rows):
                state = self._logits = BatchLogits(rows)
            logits, contexts = state.apply(logits, inputs)
        samplers = [r.sampler for r in rows]
        if all(s is GREEDY for s in samplers) and not any(r.logprobs for r in rows):
            # The argmax of the logits is the log-softmax's (a per-row constant apart).
            sampled = mx.argmax(logits, axis=-1)
            mx.async_eval(sampled, contexts)
            return sampled, [None] * len(rows)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        drawn = [e for e, s in enumerate(samplers) if s is not GREEDY]
        if all(s is samplers[0] for s in samplers):  # one batched call
            sampled = samplers[0](logprobs)
        elif len(drawn) == len(rows):
            sampled = mx.concatenate(
                [s(logprobs[e : e + 1]) for e, s in enumerate(samplers)], axis=0
            )
        else:  # greedy rows in one argmax, the others drawn each from its own row
            sampled = mx.argmax(logprobs, axis=-1)
            sampled[mx.array(drawn)] = mx.concatenate(
                [samplers[e](logprobs[e : e + 1]) for e in drawn], axis=0
            ).astype(sampled.dtype)
        per_row = [logprobs[e] if r.logprobs else None for e, r in enumerate(rows)]
        mx.async_eval(sampled, [x for x in per_row if x is not None], contexts)
        return sampled, per_row

    def _plain_step(self) -> tuple[list[int], list]:
        """Read the queued tokens of the decoding rows, after queuing the next step."""
        current, current_lp = self._next_tokens, self._next_logprobs
        self._next_tokens, self._next_logprobs = self._forward(self._rows, self._cache, current)
        mx.eval(current, [x for x in current_lp if x is not None])
        tokens = ints(current)
        for r, t in zip(self._rows, tokens, strict=True):
            r.tokens.append(t)
        return tokens, current_lp

    def _decode(self) -> list[Generated]:
        """One token for every decoding row (`batch.speculation` may return several); none
        for a row whose token was returned as it left prefill (`Row.sent`)."""
        tokens, logprobs = self._plain_step()
        emitted = [[(t, lp, False)] for t, lp in zip(tokens, logprobs, strict=True)]
        return self._respond(unsent(self._rows, emitted))

    def _respond(self, emitted: list[list[tuple[int, Any, bool]]]) -> list[Generated]:
        """Responses for each decoding row's ``emitted`` (token, logprobs, drafted), in
        order; a row that ends at ``max_tokens`` or EOS leaves, its KV trimmed to the token
        it ended on (its later emitted tokens, accepted drafts, are dropped)."""
        out, keep = [], []
        for i, toks in enumerate(emitted):
            row, finish = self._rows[i], None
            for n, (token, lp, drafted) in enumerate(toks):
                row.emitted += 1
                finish = finish_of(
                    token, row.emitted, row.max_tokens, stops=row.stops, eos=self.eos
                )
                if finish is None:
                    out.append(Generated(row.uid, token, lp, drafted=drafted))
                    continue
                extra = len(toks) - 1 - n
                cache, tokens = self.extract_row(i), row.tokens
                if extra:
                    for c in cache:
                        c.trim(extra)
                    tokens = tokens[:-extra]
                out.append(Generated(row.uid, token, lp, finish, cache, tokens, drafted))
                break
            if finish is None:
                keep.append(i)
        if len(keep) < len(self._rows):
            self._filter(keep)
        return out


def lean(rows: Sequence[Row]) -> bool:
    """Whether a step may skip the log-softmax over the vocabulary: every row greedy,
    without processors, its logprobs unread (then the token is the logits' argmax: the
    log-softmax only subtracts a per-row constant; ~1-2% of a step)."""
    return all(r.sampler is GREEDY and not r.processors and not r.logprobs for r in rows)


def _first_tokens(rows: list[Row], sampled: mx.array, logprobs: list, eos: frozenset[int]) -> list:
    """Generated for each of ``rows`` (just out of prefill) whose first token, ``sampled``
    by its last prompt token's forward pass, does not end it: returned by the step that
    ended its prompt instead of the next one (which, on the CPU, computes the following
    forward pass before it reads this one: MLX's ``async_eval`` waits once more than 10
    tasks are queued, mlx/transforms.cpp ``MAX_ACTIVE_TASKS``). The token stays queued as
    the row's next input, marked ``sent`` (`unsent`); a first token that ends its row is
    returned the usual way, with its finish, by the next step."""
    mx.eval(sampled, [x for x in logprobs if x is not None])
    out = []
    for r, t, lp in zip(rows, ints(sampled), logprobs, strict=True):
        if finish_of(t, r.emitted + 1, r.max_tokens, stops=r.stops, eos=eos) is None:
            r.emitted += 1
            r.sent = True
            out.append(Generated(r.uid, t, lp))
    return out


def unsent(rows: list[Row], emitted: list[list[tuple[int, Any, bool]]]) -> list[list]:
    """Each row's ``emitted`` tokens without the first one where `_first_tokens` returned
    it already (the row's ``sent`` mark is cleared: that token is read now)."""
    out = []
    for r, toks in zip(rows, emitted, strict=True):
        out.append(toks[1:] if r.sent else toks)
        r.sent = False
    return out


def pending(batch: DecodeBatch, uid: int) -> tuple[int, mx.array | None, bool] | None:
    """(token, logprobs (V,) or None, returned) that ``batch``'s decoding row ``uid`` has
    queued, sampled but not yet read (the pipelined step); ``returned``: it was returned
    as the row left prefill (`_first_tokens`). None when the row does not decode.
    Reading it waits for the queued step. The row's KV does not hold it yet; its sampler
    and processors have seen it: a row taken out now (`engine.preemption`) resumes by
    feeding it. A plain decode's queue (a `SpeculativeBatch` is never asked)."""
    for i, row in enumerate(batch._rows):
        if row.uid == uid and batch._next_tokens is not None:
            logprobs = batch._next_logprobs[i]
            mx.eval(batch._next_tokens, *([logprobs] if logprobs is not None else []))
            return int(batch._next_tokens[i].item()), logprobs, row.sent
    return None
