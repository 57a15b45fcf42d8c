"""The decode half of the continuous batch: a leaner step, and speculative decoding.

`LeanBatch` is mlx-lm's `GenerationBatch` without the log-softmax no row reads.

`SpeculativeBatch` (a `LeanBatch`) replaces it for a model loaded with
``speculative:ngram`` or a draft model (`DraftedModel`). At each step every row that
wants to speculate proposes up to k draft tokens (`decoding.ngram_spec.DraftGate`:
prompt lookup, with the solo path's back-off and width rules; or the draft model's
greedy tokens); if any row has a draft
and the step's cost model (`StepCosts`) says the wider pass pays, the target model runs
once on ``[pending token, d1..dK]`` for *all* rows (rows without a draft are padded and
accept nothing), each row keeps its longest agreeing prefix plus one token sampled by
the model, and its rejected entries are masked out of its KV (`HoleyBatchKVCache`).
Otherwise the step is `GenerationBatch`'s own pipelined single-token step.

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
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, GenerationBatch
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache
from mlx_lm.sample_utils import greedy_sampler

from decoding.ngram_spec import DraftGate, NgramStats
from seam.holes import HoleyBatchKVCache, speculable

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
        return self.target(inputs, cache=cache[: self.split], **kwargs)


@dataclass
class SpecResponse(GenerationBatch.Response):
    """`GenerationBatch.Response` plus ``drafted``: the token came from an accepted draft."""

    drafted: bool = False


class LeanBatch(GenerationBatch):
    """mlx-lm's `GenerationBatch` whose step skips the log-softmax over the vocabulary
    when no row needs it: every row greedy (mlx-lm's argmax sampler), without logits
    processors, and not in ``wants_logprobs`` (uids whose logprobs are read). The token is
    then argmax of the logits themselves (the log-softmax only subtracts a per-row
    constant) and the step's logprobs are None. `mlx_lm.server` pays for it on every
    step: ~1% of a step at one row, ~2% at eight (BENCHMARKS G's profile).
    """

    wants_logprobs: set[int]

    @classmethod
    def install(cls, gen: BatchGenerator) -> LeanBatch:
        """Put an empty batch of this class in ``gen`` as its generation batch."""
        batch = cls.empty(gen.model, gen.sampler)
        batch.wants_logprobs = set()
        # BatchGenerator builds its generation batch itself and has no hook for its step.
        gen._generation_batch = batch
        return batch

    def _step(self) -> tuple[list[int], list[Any]]:
        samplers = self.samplers or [self.fallback_sampler] * len(self.uids)
        if (
            any(self.logits_processors)
            or not all((s or self.fallback_sampler) is greedy_sampler for s in samplers)
            or not self.wants_logprobs.isdisjoint(self.uids)
        ):
            return super()._step()
        # GenerationBatch._step without the log-softmax (same pipelining: the next step
        # is queued before this one's tokens are read).
        self._current_tokens = inputs = self._next_tokens
        self._current_logprobs = self._next_logprobs
        logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]
        self._next_tokens = mx.argmax(logits, axis=-1)
        self._next_logprobs = [None] * len(self.uids)
        mx.async_eval(self._next_tokens)
        mx.eval(inputs)
        current = inputs.tolist()
        for tokens, t in zip(self.tokens, current, strict=True):
            tokens.append(t)
        return current, self._current_logprobs


class SpeculativeBatch(LeanBatch):
    """mlx-lm's `GenerationBatch` with n-gram speculation per row (see the module doc).

    Made by `install`; ``drafting`` maps the uid of a sequence that drafts to (its most
    draft tokens per step, the `NgramStats` to count in); the entry is taken when the
    row joins (absent: the row never drafts). Rows join through `extend` (from mlx-lm's
    prompt batch) and leave through `filter`, as in `GenerationBatch`; `next` may
    return several responses for one row (its accepted drafts, in order).
    """

    @classmethod
    def install(
        cls,
        gen: BatchGenerator,
        drafting: dict[int, tuple[int, NgramStats]],
        ngram_max: int,
        timed: bool = True,
    ) -> SpeculativeBatch:
        """Put an empty `SpeculativeBatch` in ``gen`` as its generation batch. Drafts come
        from n-gram lookup, or from the draft model when ``gen.model`` is a
        `DraftedModel` (greedy drafts; ``ngram_max`` unused)."""
        batch = super().install(gen)
        batch.drafter = gen.model if isinstance(gen.model, DraftedModel) else None
        batch.drafting = drafting
        batch.ngram_max = ngram_max
        batch.costs = StepCosts(timed)
        batch.gates = []  # DraftGate or None per row
        batch._after_plain = False
        return batch

    # -- rows joining and leaving ----------------------------------------------------
    def extend(self, batch: GenerationBatch) -> None:
        uids = list(batch.uids)
        tokens = [list(t) for t in batch.tokens]
        super().extend(batch)
        self.prompt_cache = [
            HoleyBatchKVCache.adopt(c) if type(c) is BatchKVCache else c for c in self.prompt_cache
        ]
        ok = speculable(self.prompt_cache)
        for uid, toks in zip(uids, tokens, strict=True):
            width, stats = self.drafting.pop(uid, (0, None))
            gate = None
            if ok and width:
                lookup = self.drafter is None  # a draft model needs no n-gram index
                gate = DraftGate(width, self.ngram_max, toks if lookup else (), stats=stats)
            self.gates.append(gate)

    def filter(self, keep: list[int]) -> None:
        super().filter(keep)
        self.gates = [self.gates[i] for i in keep]

    # -- stepping ----------------------------------------------------------------------
    def next(self) -> list[GenerationBatch.Response]:
        if not self.uids:
            return []
        drafts = self._drafts()
        if drafts is None:
            rows = len(self.uids)
            start = time.perf_counter()
            out = super().next()
            if self._after_plain:  # after a verify step this one only read a known token
                self.costs.observe_plain(rows, time.perf_counter() - start)
            self._after_plain = True
            if self.drafter is not None:  # nothing else reads the draft's KV this step
                mx.async_eval([c.state for c in self.prompt_cache[self.drafter.split :]])
            for gate in self.gates:
                if gate is not None:
                    gate.known = None
            return out
        return self._verify(drafts)

    def _drafts(self) -> list[list[int]] | None:
        """Each row's draft for this step (cut to the width that pays best), or None for
        a plain step."""
        if not any(g is not None for g in self.gates):
            return None
        if self.drafter is not None:
            return self._model_drafts()
        drafts, rates = [], []
        for i, gate in enumerate(self.gates):
            d: list[int] = []
            if gate is not None:
                gate.stats.steps += 1
                d = gate.propose(self.tokens[i], self.max_tokens[i] - self._num_tokens[i])
            drafts.append(d)
            rates.append(gate.rate if gate is not None else 0.0)
        k = self.costs.width(len(self.uids), [len(d) for d in drafts], rates)
        if k == 0:
            return None
        return [d[:k] for d in drafts]

    def _model_drafts(self) -> list[list[int]] | None:
        """Drafts from the draft model: k greedy tokens for every row (k chosen by the
        cost model from each row's allowed width), cut to each row's own width."""
        widths, rates = [], []
        for i, gate in enumerate(self.gates):
            w = 0
            if gate is not None:
                gate.stats.steps += 1
                w = max(min(gate.width, self.max_tokens[i] - self._num_tokens[i] - 1), 0)
            widths.append(w)
            rates.append(gate.rate if gate is not None else 0.0)
        k = self.costs.width(len(self.uids), widths, rates)
        if k == 0:
            return None
        # k + 1 draft steps: the last feeds d_k, so the draft's KV holds what the
        # target's will (pending, d1..dk) and both drop the same rejected entries.
        drafter, x, steps = self.drafter, self._next_tokens, []
        draft_cache = self.prompt_cache[drafter.split :]
        for j in range(k + 1):
            logits = drafter.draft(x[:, None], cache=draft_cache)[:, -1, :]
            x = mx.argmax(logits, axis=-1).astype(self._next_tokens.dtype)
            if j < k:
                steps.append(x)
        tokens = mx.stack(steps, axis=1).tolist()
        return [row[:w] for row, w in zip(tokens, widths, strict=True)]

    def _verify(self, drafts: list[list[int]]) -> list[GenerationBatch.Response]:
        start = time.perf_counter()
        after_plain = self._after_plain
        rows, k = len(self.uids), max(len(d) for d in drafts)
        pending = self._next_tokens
        padded = mx.array([d + [0] * (k - len(d)) for d in drafts], dtype=pending.dtype)
        inputs = mx.concatenate([pending[:, None], padded], axis=1)
        if self.drafter is not None:  # the draft's KV already holds these tokens
            split = self.drafter.split
            logits = self.drafter.target(inputs, cache=self.prompt_cache[:split])
        else:
            logits = self.model(inputs, cache=self.prompt_cache)
        samplers = [self.fallback_sampler if s is None else s for s in self.samplers]
        # Greedy rows whose processors ignore the history (a logit bias, the EOS ban) are
        # processed for all positions at once; others position by position (`_sample_row`).
        fast = [
            s is greedy_sampler and all(position_free(p) for p in self.logits_processors[i] or ())
            for i, s in enumerate(samplers)
        ]
        if any(fast[i] and self.logits_processors[i] for i in range(rows)):
            per_row = []
            for i in range(rows):
                row = logits[i]
                for processor in (self.logits_processors[i] or ()) if fast[i] else ():
                    row = processor(None, row)
                per_row.append(row)
            logits = mx.stack(per_row)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # (B, k+1, V)
        picks = mx.argmax(logprobs, axis=-1) if any(fast) else None
        mx.eval(pending, *([picks] if picks is not None else []))
        current = pending.tolist()
        picked = picks.tolist() if picks is not None else None

        emitted: list[list[tuple[int, mx.array, bool]]] = []
        rejects, bonus, bonus_lp = [], [], []
        for i in range(rows):
            d = drafts[i]
            if fast[i]:
                kept = []
                for j in range(len(d) + 1):
                    kept.append((picked[i][j], logprobs[i, j]))
                    if j == len(d) or picked[i][j] != d[j]:
                        break
            else:
                kept = self._sample_row(i, pending[i : i + 1], d, logits[i], samplers[i])
            accepted = len(kept) - 1
            rejects.append(k - accepted)
            emitted.append(
                [(current[i], self._next_logprobs[i], False)]
                + [(d[j], kept[j][1], True) for j in range(accepted)]
            )
            bonus.append(kept[-1][0])
            bonus_lp.append(kept[-1][1])
            gate = self.gates[i]
            if gate is not None:
                if d:
                    gate.observe(len(d), accepted)
                gate.known = kept[-1][0]
        for c in self.prompt_cache:
            c.reject(rejects)
        for i in range(rows):
            self.tokens[i].extend(t for t, _, _ in emitted[i])
        self._current_tokens = pending
        self._next_tokens = mx.array(bonus, dtype=pending.dtype)
        self._next_logprobs = bonus_lp
        responses = self._respond(emitted)
        seconds = time.perf_counter() - start
        if after_plain:  # the pass also waited for the plain step queued before it
            seconds -= self.costs.plain.get(rows, 0.0)
        self.costs.observe_verify(rows, k + 1, seconds)
        self._after_plain = False
        return responses

    def _sample_row(
        self, i: int, pending: mx.array, draft: list[int], logits: mx.array, sampler: Any
    ) -> list[tuple[int, mx.array]]:
        """Row ``i``'s kept (token, logprobs) pairs, sampling position by position with its
        processors and sampler until a sampled token differs from the draft."""
        processors = self.logits_processors[i] or ()
        context = self._token_context[i].update_and_fetch(pending) if processors else None
        kept = []
        for j in range(len(draft) + 1):
            row = logits[j : j + 1]
            for processor in processors:
                row = processor(context, row)
            lp = row - mx.logsumexp(row, axis=-1, keepdims=True)
            token = int(sampler(lp).item())
            kept.append((token, lp[0]))
            if j == len(draft) or token != draft[j]:
                break
            if processors:
                context = self._token_context[i].update_and_fetch(
                    mx.array([draft[j]], dtype=mx.int32)
                )
        return kept

    def _respond(self, emitted: list[list[tuple[int, mx.array, bool]]]) -> list[Any]:
        """Responses for ``emitted`` tokens with `GenerationBatch.next`'s stop rules; a row
        that ends inside its accepted drafts leaves with its KV trimmed to that token."""
        responses, keep = [], []
        for i, toks in enumerate(emitted):
            finish = None
            for n, (token, lp, drafted) in enumerate(toks):
                self._num_tokens[i] += 1
                if self._num_tokens[i] >= self.max_tokens[i]:
                    finish = "length"
                if self._matchers[i].advance(token):
                    finish = "stop"
                if finish is None:
                    responses.append(
                        SpecResponse(self.uids[i], token, lp, None, None, None, drafted)
                    )
                    continue
                extra = len(toks) - 1 - n
                cache, tokens = self.extract_cache(i), self.tokens[i]
                if extra:
                    for c in cache:
                        c.trim(extra)
                    tokens = tokens[:-extra]
                responses.append(
                    SpecResponse(self.uids[i], token, lp, finish, cache, tokens, drafted)
                )
                break
            if finish is None:
                keep.append(i)
        if len(keep) < len(self.uids):
            self.filter(keep)
        return responses
