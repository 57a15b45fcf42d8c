"""Draft-free speculative decoding's drafts: prompt lookup (n-gram) and its gate.

The draft for the next tokens is what followed the most recent earlier occurrence of the
longest n-gram (``ngram_max`` down to ``ngram_min`` tokens) that ends the prompt +
generated text (`NgramIndex`). The batch (`batch.speculation.SpeculativeBatch`) runs the
model once on ``[last token, d1..dk]`` for all rows, keeps each row's longest agreeing
prefix plus one token sampled by the model, and drops the rejected entries from the row's
KV. mlx-lm has no draft-free speculation (its `speculative_generate_step` requires a draft
model), hence this module. A request that must decode outside the batch decodes without
n-gram drafts (mlx-lm's `generate_step`).

**Exactness** (`batch.speculation`): every emitted token comes from calling the request's
own logits processors and sampler, once per emitted token, on exactly the token history
plain decoding would give them; a draft token is accepted iff the sampler drew it. For a
deterministic draft (a point mass on d) this *is* standard speculative sampling: d is
kept with probability p(d), and on rejection the token is distributed as p without d,
renormalized. So greedy output is token-for-token plain decoding and sampled output has
exactly plain decoding's distribution.

**Cost control** (`DraftGate`). A draft costs a wider forward pass, which on a CPU is far
from free (on this project's 2-core host a 4-token pass costs ~2-2.5 single-token ones),
so drafting is gated:

* after a verify step that kept nothing, drafting pauses for `FIRST_BACKOFF` steps,
  doubling with each consecutive miss up to `MAX_BACKOFF`; a hit resets it;
* a match shorter than `SURE_MATCH` tokens (a lone repeated token, common in prose) is
  drafted only right after a verify step that kept a draft token;
* drafts start at `START_WIDTH` tokens and double (up to `num_draft_tokens`) after each
  verify step that kept its whole draft, so long repeats get long drafts and a miss on
  fresh text costs a short one.

None of this affects which tokens come out, only how many forward passes they take.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    """One sequence's speculation counters (updated in place by its `DraftGate`).

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

    The rules of the cost control (module doc): back-off after verify
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
