"""Speculative decoding inside the continuous batch (`batch.decode.DecodeBatch`).

`SpeculativeBatch` (a `DecodeBatch`) replaces it for a model loaded with
``speculative:ngram`` or a draft model (`DraftedModel`). At each step every row that
wants to speculate proposes up to k draft tokens (`decoding.ngram_spec.DraftGate`:
prompt lookup, with the solo path's back-off and width rules; or the draft model's
greedy tokens); if any row has a draft
and the step's cost model (`StepCosts`) says the wider pass pays, the target model runs
once on ``[pending token, d1..dK]`` for *all* rows (rows without a draft are padded and
accept nothing), each row keeps its longest agreeing prefix plus one token sampled by
the model, and its rejected entries are masked out of its KV (`HoleyBatchKVCache`).
Otherwise the step is `DecodeBatch`'s own pipelined single-token step.

**Exactness** (as `ngram_spec`'s solo path): every emitted token comes from the row's own
logits processors and sampler, called once per emitted token, in order, on the history
plain decoding gives them; a draft token is kept iff the sampler drew it. So greedy
output is plain decoding's, sampled output has plain decoding's distribution, and a
seeded sampler (`sampling.SeededSampler`, one key split per call) gives the same tokens
whether or not, and whenever, a step speculated — alone or in any batch. A stateful
processor (the grammar) never sees a token that is later taken back.

**Per-row rejection**: `seam.holes.HoleyBatchKVCache`.

Runs on the engine's MLX thread, like every MLX call.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

from batch.decode import DecodeBatch, Generated, Row, unsent
from decoding.ngram_spec import DraftGate
from decoding.sampling import GREEDY
from seam.arrays import ints, nested, scalar
from seam.holes import HoleyBatchKVCache, speculable

#: mlx-lm private members used here: none.
PRIVATE: tuple = ()

#: A verify pass with k draft tokens per row is first assumed to cost 1 + PRIOR_SLOPE * k
#: single-token steps, until measured (on the 2-core CPU host: ~1.1-1.3x for k=3, ~2-3x
#: for k=8, at 1-8 rows).
PRIOR_SLOPE = 0.2
#: Every this many plain steps chosen over an unmeasured verify width, that width is tried.
EXPLORE_EVERY = 32
_EMA = 0.3


def position_free(processor: Any) -> bool:
    """Whether a logits processor ignores the token history (so one call may process
    several positions' logits, (n, V)): it says so with ``position_free = True``."""
    return getattr(processor, "position_free", False) is True


class StepCosts:
    """Measured seconds of decode steps, per batch size (single token) and per (batch
    size, tokens per row) of verify passes, and the choice they imply.

    ``timed`` False (a distributed group, whose ranks must take the same steps): every
    step with a draft verifies (the drafting gates alone decide).
    """

    def __init__(self, timed: bool = True) -> None:
        self.timed = timed
        self.plain: dict[int, float] = {}
        self.verify: dict[tuple[int, int], float] = {}
        self._declined: dict[tuple[int, int], int] = {}

    @staticmethod
    def _mix(table: dict, key: Any, seconds: float) -> None:
        old = table.get(key)
        table[key] = seconds if old is None else old + _EMA * (seconds - old)

    def observe_plain(self, rows: int, seconds: float) -> None:
        self._mix(self.plain, rows, seconds)

    def observe_verify(self, rows: int, width: int, seconds: float) -> None:
        # Never cheaper than a single-token step (a timing net of the plain step it
        # waited for can read 0 or less on a noisy host).
        floor = max(self.plain.get(rows, 0.0), 1e-6)
        self._mix(self.verify, (rows, width), max(seconds, floor))

    def _ratio(self, rows: int, k: int) -> float:
        """Verify / single-token cost of k drafts at ``rows`` rows before it is measured:
        as measured at the nearest batch size with both figures, else the prior."""
        known = [
            (abs(r - rows), v / self.plain[r])
            for (r, w), v in self.verify.items()
            if w == k + 1 and r in self.plain
        ]
        return min(known)[1] if known else 1 + PRIOR_SLOPE * k

    def width(self, rows: int, lengths: Sequence[int], rates: Sequence[float]) -> int:
        """Draft tokens per row for this step (0: a plain step), given each row's draft
        length and expected kept fraction: the width whose verify pass is expected to
        yield the most tokens per second, if that beats a single-token step.

        Untimed: the longest draft. Before a single-token step at this batch size has
        been measured: 0. A width never measured at this batch size costs what it did
        relative to a single-token step at the nearest batch size, else the prior
        1 + PRIOR_SLOPE * k; a choice of a plain step over it is overruled every
        EXPLORE_EVERY times, to measure it.
        """
        longest = max(lengths, default=0)
        if not self.timed or longest == 0:
            return longest
        plain = self.plain.get(rows)
        if plain is None:
            return 0  # a plain step first, to compare with
        best, best_rate = 0, rows / plain
        unmeasured = None
        for k in sorted(set(lengths) - {0}):
            verify = self.verify.get((rows, k + 1))
            if verify is None:
                verify = plain * self._ratio(rows, k)
                unmeasured = k if unmeasured is None else unmeasured
            gain = sum(r * min(n, k) for n, r in zip(lengths, rates, strict=True))
            if (rows + gain) / verify > best_rate:
                best, best_rate = k, (rows + gain) / verify
        if best == 0 and unmeasured is not None:
            n = self._declined.get((rows, unmeasured), 0) + 1
            self._declined[(rows, unmeasured)] = n
            if n % EXPLORE_EVERY == 0:
                return unmeasured
        return best


class DraftedModel:
    """A target model and its draft model called as one by mlx-lm's batch code.

    ``model(tokens (B, L), cache)`` feeds the tokens to both (the cache list is the
    target's layers, then the draft's) and returns the target's logits (B, L, V); so
    prefill and plain decode steps keep the draft's KV in step with the target's.
    `make_cache` gives one sequence's layers in that order (the order solo sequences
    and the prompt cache use).
    """

    def __init__(self, target: Any, draft: Any, max_kv_size: int | None = None) -> None:
        self.target, self.draft, self.max_kv_size = target, draft, max_kv_size
        self.split = len(make_prompt_cache(target, max_kv_size))
        self.layers = list(target.layers) + list(draft.layers)

    def make_cache(self) -> list:
        return make_prompt_cache(self.target, self.max_kv_size) + make_prompt_cache(
            self.draft, self.max_kv_size
        )

    def __call__(self, inputs: mx.array, cache: list | None = None, **kwargs: Any) -> mx.array:
        cache = cache if cache is not None else self.make_cache()
        self.draft(inputs, cache=cache[self.split :])
        return cast(mx.array, self.target(inputs, cache=cache[: self.split], **kwargs))


class SpeculativeBatch(DecodeBatch):
    """The continuous batch with speculation per row (see the module doc).

    A row drafts when inserted with ``draft=(most draft tokens per step, NgramStats)``
    and its batch's layers can drop entries per row (`speculable`). Drafts come from
    n-gram lookup, or from the draft model when ``model`` is a `DraftedModel` (greedy
    drafts; ``ngram_max`` unused). `next` may return several tokens for one row (its
    accepted drafts, in order). ``timed`` False (distributed): `StepCosts` untimed.
    """

    def __init__(self, model: Any, *, ngram_max: int, timed: bool = True, **kw: Any) -> None:
        super().__init__(model, **kw)
        self.drafter = model if isinstance(model, DraftedModel) else None
        self.ngram_max = ngram_max
        self.costs = StepCosts(timed)
        self._after_plain = False

    # -- rows joining ------------------------------------------------------------------
    def _joined(self, rows: list[Row]) -> None:
        self._cache = [
            HoleyBatchKVCache.adopt(c) if type(c) is BatchKVCache else c for c in self._cache
        ]
        ok = speculable(self._cache)
        for row in rows:
            width, stats = row.draft or (0, None)
            row.gate = None
            if ok and width:
                lookup = self.drafter is None  # a draft model needs no n-gram index
                held = row.tokens if lookup else ()  # the whole prompt, fed by now
                row.gate = DraftGate(width, self.ngram_max, held, stats=stats)

    # -- stepping ----------------------------------------------------------------------
    def _decode(self) -> list[Generated]:
        drafts = self._drafts()
        if drafts is not None:
            return self._verify(drafts)
        rows = len(self._rows)
        start = time.perf_counter()
        out = super()._decode()
        if self._after_plain:  # after a verify step this one only read a known token
            self.costs.observe_plain(rows, time.perf_counter() - start)
        self._after_plain = True
        if self.drafter is not None:  # nothing else reads the draft's KV this step
            mx.async_eval([c.state for c in self._cache[self.drafter.split :]])
        for row in self._rows:
            if row.gate is not None:
                row.gate.known = None
        return out

    def _drafts(self) -> list[list[int]] | None:
        """Each row's draft for this step (cut to the width that pays best), or None for
        a plain step."""
        if not any(r.gate is not None for r in self._rows):
            return None
        if self.drafter is not None:
            return self._model_drafts()
        drafts, rates = [], []
        for row in self._rows:
            d: list[int] = []
            if row.gate is not None:
                row.gate.stats.steps += 1
                d = row.gate.propose(row.tokens, row.max_tokens - row.emitted)
            drafts.append(d)
            rates.append(row.gate.rate if row.gate is not None else 0.0)
        k = self.costs.width(len(self._rows), [len(d) for d in drafts], rates)
        if k == 0:
            return None
        return [d[:k] for d in drafts]

    def _model_drafts(self) -> list[list[int]] | None:
        """Drafts from the draft model: k greedy tokens for every row (k chosen by the
        cost model from each row's allowed width), cut to each row's own width."""
        widths, rates = [], []
        for row in self._rows:
            w = 0
            if row.gate is not None:
                row.gate.stats.steps += 1
                w = max(min(row.gate.width, row.max_tokens - row.emitted - 1), 0)
            widths.append(w)
            rates.append(row.gate.rate if row.gate is not None else 0.0)
        k = self.costs.width(len(self._rows), widths, rates)
        if k == 0:
            return None
        # k + 1 draft steps: the last feeds d_k, so the draft's KV holds what the
        # target's will (pending, d1..dk) and both drop the same rejected entries.
        drafter, x, steps = self.drafter, self._next_tokens, []
        if drafter is None:
            return None
        draft_cache = self._cache[drafter.split :]
        for j in range(k + 1):
            logits = drafter.draft(x[:, None], cache=draft_cache)[:, -1, :]
            x = mx.argmax(logits, axis=-1).astype(self._next_tokens.dtype)
            if j < k:
                steps.append(x)
        tokens = nested(mx.stack(steps, axis=1))
        return [row[:w] for row, w in zip(tokens, widths, strict=True)]

    def _verify(self, drafts: list[list[int]]) -> list[Generated]:
        start = time.perf_counter()
        after_plain = self._after_plain
        rows, k = len(self._rows), max(len(d) for d in drafts)
        pending = self._next_tokens
        padded = mx.array([d + [0] * (k - len(d)) for d in drafts], dtype=pending.dtype)
        inputs = mx.concatenate([pending[:, None], padded], axis=1)
        if self.drafter is not None:  # the draft's KV already holds these tokens
            split = self.drafter.split
            logits = self.drafter.target(inputs, cache=self._cache[:split])
        else:
            logits = self.model(inputs, cache=self._cache)
        # Greedy rows whose processors ignore the history (a logit bias, the EOS ban) are
        # processed for all positions at once; others position by position (`_sample_row`).
        fast = [
            r.sampler is GREEDY and all(position_free(p) for p in r.processors) for r in self._rows
        ]
        if any(fast[i] and r.processors for i, r in enumerate(self._rows)):
            per_row = []
            for i, r in enumerate(self._rows):
                row = logits[i]
                for processor in r.processors if fast[i] else ():
                    row = processor(None, row)
                per_row.append(row)
            logits = mx.stack(per_row)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # (B, k+1, V)
        picks = mx.argmax(logprobs, axis=-1) if any(fast) else None
        mx.eval(pending, *([picks] if picks is not None else []))
        current = ints(pending)
        picked = nested(picks) if picks is not None else []

        emitted: list[list[tuple[int, Any, bool]]] = []
        rejects, bonus, bonus_lp = [], [], []
        for i, r in enumerate(self._rows):
            d = drafts[i]
            if fast[i]:
                kept = []
                for j in range(len(d) + 1):
                    kept.append((picked[i][j], logprobs[i, j]))
                    if j == len(d) or picked[i][j] != d[j]:
                        break
            else:
                kept = self._sample_row(r, pending[i : i + 1], d, logits[i])
            accepted = len(kept) - 1
            rejects.append(k - accepted)
            emitted.append(
                [(current[i], self._next_logprobs[i], False)]
                + [(d[j], kept[j][1], True) for j in range(accepted)]
            )
            bonus.append(kept[-1][0])
            bonus_lp.append(kept[-1][1])
            if r.gate is not None:
                if d:
                    r.gate.observe(len(d), accepted)
                r.gate.known = kept[-1][0]
        for c in self._cache:
            c.reject(rejects)
        for r, toks in zip(self._rows, emitted, strict=True):
            r.tokens.extend(t for t, _, _ in toks)
        emitted = unsent(self._rows, emitted)
        self._next_tokens = mx.array(bonus, dtype=pending.dtype)
        self._next_logprobs = bonus_lp
        responses = self._respond(emitted)
        seconds = time.perf_counter() - start
        if after_plain:  # the pass also waited for the plain step queued before it
            seconds -= self.costs.plain.get(rows, 0.0)
        self.costs.observe_verify(rows, k + 1, seconds)
        self._after_plain = False
        return responses

    @staticmethod
    def _sample_row(
        r: Row, pending: mx.array, draft: list[int], logits: mx.array
    ) -> list[tuple[int, mx.array]]:
        """Row ``r``'s kept (token, logprobs) pairs, sampling position by position with its
        processors and sampler until a sampled token differs from the draft."""
        context = r.history(pending) if r.processors else None
        kept: list[tuple[int, mx.array]] = []
        for j in range(len(draft) + 1):
            row = logits[j : j + 1]
            for processor in r.processors:
                row = processor(context, row)
            lp = row - mx.logsumexp(row, axis=-1, keepdims=True)
            token = scalar(r.sampler(lp))
            kept.append((token, lp[0]))
            if j == len(draft) or token != draft[j]:
                break
            if r.processors:
                context = r.history(mx.array([draft[j]], dtype=mx.int32), fresh=False)
        return kept
