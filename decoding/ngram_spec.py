"""Draft-free speculative decoding: prompt lookup (n-gram) drafts verified in one pass.

Owns `ngram_generate_step`, a drop-in for mlx-lm's `speculative_generate_step` that
needs no draft model: the draft for the next tokens is what followed the most recent
earlier occurrence of the longest n-gram (``ngram_max`` down to ``ngram_min`` tokens)
that ends the prompt + generated text. The model runs once on ``[last token, d1..dk]``;
the longest agreeing prefix of the draft is kept plus one token sampled by the model,
and the KV entries of the rejected draft tokens are trimmed away. mlx-lm has no
draft-free speculation (its `speculative_generate_step` requires a draft model), hence
this module.

**Exactness.** Every emitted token comes from calling the request's own logits
processors and sampler, once per emitted token, on exactly the token history plain
decoding (mlx-lm's `generate_step`) would give them: the verify pass's rows are
processed in order and processing stops at the first row whose sampled token differs
from the draft. A draft token is accepted iff the sampler drew it. For a deterministic
draft (a point mass on d) this *is* standard speculative sampling: d is kept with
probability p(d) (p being the sampler's own filtered, tempered distribution: top-p,
min-p, top-k, XTC all included, whatever the sampler does), and on rejection the token
is distributed as p without d, renormalized. So

* greedy output is token-for-token plain decoding;
* sampled output has exactly plain decoding's distribution; with a seeded sampler that
  splits its key once per call (`sampling.SeededSampler`) it is even the same token
  sequence, because the sampler is called exactly as often and in the same order;
* stateful processors (the grammar's `ConstraintProcessor`, which cannot rewind) see a
  history that only grows by the token sampled at their previous call, as with
  `generate_step`; nothing is shown to them that is later taken back.

The only difference from plain decoding is numerical: a row of a multi-token forward
pass can differ from the single-token pass in the last bits of float precision.

**Cost control.** Without a draft a step is `generate_step`'s pipelined single-token
step (the next step is queued before the current token is read), plus a dict lookup.
A draft costs a wider forward pass, which on a CPU is far from free (on this project's
2-core host a 4-token pass costs ~2-2.5 single-token ones), so drafting is gated:

* after a verify step that kept nothing, drafting pauses for `FIRST_BACKOFF` steps,
  doubling with each consecutive miss up to `MAX_BACKOFF`; a hit resets it;
* a match shorter than `SURE_MATCH` tokens (a lone repeated token, common in prose) is
  drafted only right after a verify step that kept a draft token;
* drafts start at `START_WIDTH` tokens and double (up to `num_draft_tokens`) after each
  verify step that kept its whole draft, so long repeats get long drafts and a miss on
  fresh text costs a short one.

None of this affects which tokens come out, only how many forward passes they take.

Runs on the engine's MLX thread, like every MLX call.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import (
    DEFAULT_QUANTIZED_KV_START,
    generation_stream,
    maybe_quantize_kv_cache,
)
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache
from mlx_lm.sample_utils import greedy_sampler

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]

#: Most decode steps drafting pauses for after consecutive drafts that all missed.
MAX_BACKOFF = 64
#: Steps drafting pauses for after a first miss (doubled per further miss).
FIRST_BACKOFF = 4
#: Matches shorter than this (a lone repeated token) are drafted only right after a
#: verify step that kept a draft token: on prose they mostly miss.
SURE_MATCH = 2
#: Draft length after a miss or a partial hit; it doubles (up to num_draft_tokens)
#: after each verify step that kept its whole draft.
START_WIDTH = 3


@dataclass
class NgramStats:
    """Counters a caller may pass to `ngram_generate_step` to watch it (updated in place).

    `drafted`: draft tokens sent to verification; `accepted`: of those, kept;
    `verify_steps`: forward passes that verified a draft; `steps`: all decode forward
    passes (verify or single-token).
    """

    drafted: int = 0
    accepted: int = 0
    verify_steps: int = 0
    steps: int = 0


class NgramIndex:
    """Most recent earlier occurrence of every n-gram (n in [n_min, n_max]) of a token list.

    `extend` appends tokens (O(n_max) dict updates per token); `propose(k)` returns up to
    k tokens that followed the most recent earlier occurrence of the longest n-gram
    ending the list (n from n_max down to n_min), or [] when none occurred before. When
    that occurrence is so recent that fewer than k tokens follow it, the match implies a
    period (the text since it repeats), and the proposal continues that period.
    """

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self.matched = 0  # length of the n-gram the last `propose` matched (0: none)
        # n -> n-gram -> end (exclusive) of its latest occurrence before the list's end.
        self._last: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(n_min, n_max + 1)}

    def extend(self, tokens: Sequence[int]) -> None:
        """Append `tokens` (ints) to the indexed list."""
        toks = self.tokens
        for t in tokens:
            end = len(toks)
            # The n-grams ending here stop being the list's suffix: index them.
            for n, table in self._last.items():
                if end >= n:
                    table[tuple(toks[end - n : end])] = end
            toks.append(int(t))

    def propose(self, k: int) -> list[int]:
        """Up to `k` draft tokens continuing the list, longest match first; [] if none."""
        toks = self.tokens
        size = len(toks)
        for n in range(min(self.n_max, size), self.n_min - 1, -1):
            end = self._last[n].get(tuple(toks[size - n :]))
            if end is None:
                continue
            draft = toks[end : end + k]
            period = size - end
            while len(draft) < k:  # continue the repetition the match implies
                draft.append(draft[len(draft) - period])
            self.matched = n
            return draft
        self.matched = 0
        return []


class DraftGate:
    """One sequence's drafting state: its n-gram index and when, and how wide, to draft.

    The rules of `ngram_generate_step`'s cost control (module doc): back-off after verify
    steps that kept nothing, lone-token matches only right after a kept draft, widths
    from `START_WIDTH` doubling up to ``width`` while whole drafts are kept. ``known``: the
    pending token's id when the caller has it (after a verify step), else None (the
    lookup then predicts it first). ``rate``: moving average of the kept fraction of
    drafts (starts at 0.5), the caller's estimate of what a draft will keep.
    """

    def __init__(
        self,
        width: int,
        ngram_max: int,
        tokens: Sequence[int],
        ngram_min: int = 1,
        stats: NgramStats | None = None,
    ) -> None:
        _check_options(width, ngram_max, ngram_min)
        self.width = width
        self.index = NgramIndex(ngram_min, ngram_max)
        self.index.extend(tokens)
        self.stats = stats if stats is not None else NgramStats()
        self.known: int | None = None
        self.rate = 0.5
        self._backoff = self._misses = 0
        self._streak = False
        self._span = START_WIDTH

    def propose(self, tokens: Sequence[int], left: int) -> list[int]:
        """Draft tokens to follow the pending one ([] for none this step).

        ``tokens``: the sequence so far (prompt and emitted tokens, not the pending one);
        it may have grown since the last call. ``left``: tokens the sequence may still
        emit, the pending one included (the draft is at most ``left - 1`` long).
        """
        have = len(self.index.tokens)
        if have < len(tokens):
            self.index.extend(tokens[have:])
        if self.known is not None and len(self.index.tokens) == len(tokens):
            self.index.extend([self.known])
        width = min(self.width, self._span, left - 1)
        if width <= 0:
            return []
        if self._backoff > 0:
            self._backoff -= 1
            return []
        if self.known is not None:
            draft = self.index.propose(width)
        else:  # the lookup predicts the pending token first
            draft = self.index.propose(width + 1)[1:]
        if self.index.matched < SURE_MATCH and not self._streak:
            return []
        return draft

    def observe(self, drafted: int, accepted: int) -> None:
        """A verify pass kept ``accepted`` of the ``drafted`` tokens proposed."""
        self.stats.verify_steps += 1
        self.stats.drafted += drafted
        self.stats.accepted += accepted
        self._streak = accepted > 0
        self._span = min(2 * self._span, self.width) if accepted == drafted else START_WIDTH
        if accepted:
            self._misses = 0
        else:
            self._misses += 1
            self._backoff = min(FIRST_BACKOFF * 2 ** (self._misses - 1), MAX_BACKOFF)
        self.rate += 0.3 * (accepted / drafted - self.rate)


def _check_options(num_draft_tokens: int, ngram_max: int, ngram_min: int) -> None:
    if not isinstance(num_draft_tokens, int) or num_draft_tokens < 0:
        raise ValueError(
            f"num_draft_tokens must be an integer >= 0 (0 turns drafting off), "
            f"got {num_draft_tokens!r}"
        )
    if not isinstance(ngram_min, int) or ngram_min < 1:
        raise ValueError(f"ngram_min must be an integer >= 1, got {ngram_min!r}")
    if not isinstance(ngram_max, int) or ngram_max < ngram_min:
        raise ValueError(
            f"ngram_size (the longest n-gram matched) must be an integer >= {ngram_min}, "
            f"got {ngram_max!r}"
        )


def _can_draft(cache: list[Any], width: int) -> bool:
    """True when `width` tokens can be fed and any of them trimmed back afterwards."""
    for c in cache:
        if not c.is_trimmable():
            return False
        size = getattr(c, "max_size", None)  # a rotating cache must not wrap meanwhile
        if size is not None and c.offset + width > size:
            return False
    return True


def ngram_generate_step(
    prompt: mx.array,
    model: nn.Module,
    stream: Any = generation_stream,
    *,
    num_draft_tokens: int = 3,
    ngram_max: int = 3,
    ngram_min: int = 1,
    max_tokens: int = 256,
    sampler: Sampler | None = None,
    logits_processors: list[LogitsProcessor] | None = None,
    prompt_cache: list[Any] | None = None,
    prefill_step_size: int = 512,
    kv_bits: int | None = None,
    kv_group_size: int = 64,
    quantized_kv_start: int = DEFAULT_QUANTIZED_KV_START,
    context_tokens: Sequence[int] | None = None,
    stats: NgramStats | None = None,
) -> Generator[tuple[int, mx.array, bool], None, None]:
    """Generate tokens with n-gram (prompt lookup) speculation; yields (token, logprobs, drafted).

    Same arguments and yields as mlx-lm's `speculative_generate_step` minus the draft
    model. `prompt`: (T,) int token ids, T >= 1, the part of the prompt not yet in
    `prompt_cache` (a list of per-layer caches, updated in place; a fresh one is made
    when None). Yields `(token id, logprobs (V,) float after processors, drafted)` where
    `drafted` is True for a token that came from an accepted draft. `max_tokens` bounds
    the tokens yielded (-1: unbounded), also when one step accepts several.

    Options (the engine's load options in brackets): `num_draft_tokens`
    [num_draft_tokens]: most draft tokens per verify pass (0 = plain decoding);
    `ngram_max` [ngram_size]: longest n-gram matched; `ngram_min`: shortest.
    `context_tokens`: ids already in `prompt_cache` before `prompt` (a cached prefix):
    searched for drafts and, like BatchGenerator's `all_tokens`, shown to the logits
    processors ahead of `prompt` (mlx-lm's `generate_step` shows them only `prompt`;
    pass None for exactly that). `stats`: optional counters updated in place.

    The cache: every yielded token is in it when it is yielded (as with `generate_step`);
    when the generator ends or is closed it holds exactly context + prompt + yielded
    tokens (surplus draft entries trimmed). A cache that cannot be trimmed (a rotating
    cache that has wrapped, recurrent layers) just disables drafting.

    Raises ValueError for an empty prompt or a bad option (the message names it).
    """
    _check_options(num_draft_tokens, ngram_max, ngram_min)
    if len(prompt) == 0:
        raise ValueError("prompt must hold at least one token")
    sampler = sampler or greedy_sampler
    processors = list(logits_processors or ())
    batched_greedy = sampler is greedy_sampler and not processors
    if prompt_cache is None:
        prompt_cache = make_prompt_cache(model)
    prompt = prompt.astype(mx.uint32)
    context = [int(t) for t in (context_tokens or ())]
    index = NgramIndex(ngram_min, ngram_max)
    index.extend(context)
    index.extend(prompt.tolist())
    stats = stats if stats is not None else NgramStats()

    def quantize() -> None:
        maybe_quantize_kv_cache(prompt_cache, quantized_kv_start, kv_group_size, kv_bits)

    # Processors' token history as an array (only kept when there are processors).
    history = mx.array(context, dtype=mx.uint32) if processors else None

    def sample(logits: mx.array, tokens: mx.array | None) -> tuple[mx.array, mx.array]:
        """(1, V) logits after `tokens` -> (sampled (1,), logprobs (V,)), lazily."""
        for processor in processors:
            logits = processor(tokens, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return sampler(logprobs), logprobs.squeeze(0)

    def forward(tokens: mx.array) -> mx.array:
        """Feed (n,) tokens into the cache; (n, V) logits."""
        logits = model(tokens[None], cache=prompt_cache)[0]
        quantize()
        return logits

    def grow(tokens: mx.array) -> mx.array | None:
        return mx.concatenate([history, tokens]) if processors else None

    prompt_total = len(prompt)
    fed = 0  # tokens fed into the cache by this generator
    yielded = 0
    try:
        with mx.stream(stream):
            while len(prompt) - 1 > 0:  # prefill all but the last prompt token
                chunk = prompt[: min(prefill_step_size, len(prompt) - 1)]
                model(chunk[None], cache=prompt_cache)
                quantize()
                mx.eval([c.state for c in prompt_cache])
                fed += len(chunk)
                history = grow(chunk)
                prompt = prompt[len(chunk) :]
                mx.clear_cache()
            history = grow(prompt)
            pending, pending_lp = sample(forward(prompt)[-1:], history)
            fed += 1
            mx.async_eval(pending, pending_lp)
            known: int | None = None  # the pending token's id once read
            backoff = misses = 0
            streak = False  # the last verify step kept a draft token
            span = START_WIDTH  # draft length allowed now (grows while drafts hold)
            while True:
                left = max_tokens - yielded if max_tokens >= 0 else num_draft_tokens + 1
                width = min(num_draft_tokens, span, left - 1)  # pending + accepted <= left
                draft: list[int] = []
                if width > 0 and backoff == 0 and _can_draft(prompt_cache, width + 1):
                    if known is not None:
                        draft = index.propose(width)
                    else:  # the lookup predicts the pending token first
                        draft = index.propose(width + 1)[1:]
                    if index.matched < SURE_MATCH and not streak:
                        draft = []
                elif backoff > 0:
                    backoff -= 1
                token_arr = pending.reshape(1).astype(mx.uint32)
                stats.steps += 1
                if stats.steps % 256 == 0:
                    mx.clear_cache()
                if not draft:
                    # generate_step's pipelined step: queue the next one, then read this.
                    history = grow(token_arr)
                    nxt, nxt_lp = sample(forward(token_arr), history)
                    fed += 1
                    mx.async_eval(nxt, nxt_lp)
                    token = known if known is not None else pending.item()
                    if known is None:
                        index.extend([token])
                    yielded += 1
                    yield token, pending_lp, False
                    if yielded == max_tokens:
                        return
                    pending, pending_lp, known = nxt, nxt_lp, None
                    continue

                # Verify: one pass over [pending, d1..dk]; row i predicts after d_i.
                n = len(draft)
                stats.verify_steps += 1
                stats.drafted += n
                draft_arr = mx.array(draft, dtype=mx.uint32)
                logits = forward(mx.concatenate([token_arr, draft_arr]))
                fed += n + 1
                history = grow(token_arr)
                if batched_greedy:
                    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
                    picks = mx.argmax(logprobs, axis=-1)
                    mx.async_eval(picks, logprobs)
                else:
                    first = sample(logits[:1], history)
                    mx.async_eval(*first)
                token = known if known is not None else pending.item()
                if known is None:
                    index.extend([token])
                yielded += 1
                yield token, pending_lp, False
                if yielded == max_tokens:
                    return

                out: list[tuple[int, mx.array]] = []  # (sampled, logprobs) per kept row
                if batched_greedy:
                    ids = picks.tolist()
                    for i in range(n + 1):
                        out.append((ids[i], logprobs[i]))
                        if i == n or ids[i] != draft[i]:
                            break
                else:
                    row = first
                    for i in range(n + 1):
                        out.append((row[0].item(), row[1]))
                        if i == n or out[-1][0] != draft[i]:
                            break
                        history = grow(draft_arr[i : i + 1])
                        row = sample(logits[i + 1 : i + 2], history)
                accepted = len(out) - 1
                rejected = n - accepted
                if rejected:
                    trim_prompt_cache(prompt_cache, rejected)
                    fed -= rejected
                stats.accepted += accepted
                streak = accepted > 0
                span = min(2 * span, num_draft_tokens) if accepted == n else START_WIDTH
                if accepted:
                    misses = 0
                else:
                    misses += 1
                    backoff = min(FIRST_BACKOFF * 2 ** (misses - 1), MAX_BACKOFF)
                bonus, bonus_lp = out[-1]
                index.extend([*draft[:accepted], bonus])
                for i in range(accepted):
                    yielded += 1
                    yield draft[i], out[i][1], True
                    if yielded == max_tokens:
                        return
                pending, pending_lp, known = mx.array(bonus, dtype=mx.uint32), bonus_lp, bonus
    finally:
        # Leave the cache holding exactly context + prompt + yielded tokens.
        surplus = fed - prompt_total - yielded
        if surplus > 0:
            trim_prompt_cache(prompt_cache, surplus)
