"""Reasoning budget: end a think block after a fixed number of reasoning tokens.

LocalAI's `reasoning_budget` (its name for llama.cpp's option): -1 unlimited, 0 no
thinking, N > 0 at most N reasoning tokens. When a sequence has spent its budget inside a
reasoning block, the processor here makes the model emit its own end-of-thinking marker
(mlx-lm's `TokenizerWrapper.think_end_tokens`, i.e. the marker tokenized as the template
writes it) one token per step, by masking every other logit; the model then continues
with the answer. The forced marker goes through the output pipeline like a generated one,
so it ends the reasoning there and never shows as content.

mlx-lm has no such processor (its server has no reasoning budget), hence this module.
Everything here creates MLX arrays: call it on the engine's MLX thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import mlx.core as mx

from decoding import arrays
from parsing.tokens import common_prefix

__all__ = ["UNLIMITED", "ReasoningBudgetProcessor", "make_budget_processor"]

UNLIMITED = -1  # budget value: never interfere
REASONING = "reasoning"  # output.py's state name for "inside a think block"
# Generated tokens re-read on each call to notice a context rewritten in place (mlx-lm's
# speculative decoding rewinds rejected draft tokens); more than any draft length in use.
_OVERLAP = 70


class _State(NamedTuple):
    inside: bool  # inside a reasoning block after these tokens
    spent: int  # reasoning tokens generated so far (markers excluded)
    force: int | None  # index in the end marker of the token the next call forces
    done: bool  # the end marker was forced completely: never interfere again
    text: bytes = b""  # the last bytes of text (a marker may span tokens: `_text_marker`)


def _ends_with(tokens: list[int], marker: tuple[int, ...]) -> bool:
    return bool(marker) and len(tokens) >= len(marker) and tuple(tokens[-len(marker) :]) == marker


def _marker_prefix(tokens: list[int], marker: tuple[int, ...]) -> int:
    """Length of the longest proper prefix of `marker` that `tokens` ends with."""
    for k in range(min(len(marker) - 1, len(tokens)), 0, -1):
        if tuple(tokens[-k:]) == marker[:k]:
            return k
    return 0


class ReasoningBudgetProcessor:
    """Logits processor for one sequence: (tokens (T,) or (1, T) int, logits (1, V)) -> (1, V).

    Follows mlx-lm's contract (`GenerationBatch._step`, `generate_step`,
    `speculative_generate_step`): the first call sees the prompt (or its part not in a
    cached prefix), later calls that context plus the tokens generated since. The context
    may shrink or be rewritten near its end (speculative decoding rewinds rejected
    drafts): the state is kept per generated position and replayed from the first token
    that changed. Once the marker is complete, the context is no longer read, unless the
    calls so far showed such rewinds.

    Tracks whether the sequence is inside a reasoning block (initially when
    `initial_reasoning`, i.e. the prompt left a think block open; then the `start` / `end`
    marker token sequences in the generated tokens), counts the generated tokens inside
    (the markers excluded; a later block adds to the same count), and once the count has
    reached `budget` while inside, forces `end` one token per call: every logit is -inf
    except the next marker token, which gets 0, so any sampler picks it whatever the
    earlier processors did. After the marker is complete it never changes logits again.
    Reads the new tokens to the CPU on each call (as grammar.ConstraintProcessor does).

    budget: tokens, >= 0. start / end: non-empty token id sequences. Not thread-safe.
    """

    def __init__(
        self,
        budget: int,
        start: Sequence[int],
        end: Sequence[int],
        initial_reasoning: bool,
        *,
        markers: tuple[str, str] = ("", ""),
        decode: Callable[[list[int]], bytes] | None = None,
        other_ends: Sequence[str] = (),
    ) -> None:
        if budget < 0:
            raise ValueError(f"reasoning budget must be >= 0 tokens, got {budget}")
        if not end:
            raise ValueError("the end-of-thinking marker must have at least one token")
        self.budget = budget
        self._start = tuple(int(t) for t in start)
        self._end = tuple(int(t) for t in end)
        # The markers' text, matched in the decoded output too (as the output pipeline
        # routes reasoning), however the model split them into tokens: ` </think>`.
        # other_ends: the reasoning format's other ways to end a block (its `other_ends`
        # and `ends_reasoning`, decoding/reasoning_formats.py), where the output pipeline
        # ends it too.
        self._decode = decode
        texts = ((markers[0],), (markers[1], *other_ends)) if decode else ((), ())
        self._marks = tuple(tuple(m.encode("utf-8") for m in ms if m) for ms in texts)
        self._keep = max((len(m) for ms in self._marks for m in ms), default=1) - 1
        self._origin: int | None = None  # context length at the first call
        self._tokens: list[int] = []  # generated tokens seen so far
        self._length = 0  # context length at the last call
        self._steady = True  # every call so far was one token longer than the one before
        force = 0 if initial_reasoning and budget == 0 else None
        self._states = [_State(bool(initial_reasoning), 0, force, False)]  # after 0, 1, ...

    @property
    def reasoning_tokens(self) -> int:
        """Reasoning tokens counted so far (for the sequence as last seen)."""
        return self._states[-1].spent

    @property
    def done(self) -> bool:
        """True once the end marker has been forced completely."""
        return self._states[-1].done

    def forcing(self) -> int | None:
        """The token id the next call forces, or None."""
        force = self._states[-1].force
        return None if force is None else self._end[force]

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        length = tokens.size
        if self.done and self._steady and length == self._length + 1:
            self._length = length  # one token on, as always so far: no rewind to undo it
            return logits
        self._sync(tokens.reshape(-1))
        token = self.forcing()
        if token is None:
            return logits
        only = mx.broadcast_to(mx.arange(logits.shape[-1]) == token, logits.shape)
        return mx.where(only, mx.array(0.0, logits.dtype), mx.array(-mx.inf, logits.dtype))

    def _sync(self, flat: mx.array) -> None:
        length = flat.shape[0]
        if self._origin is None:
            self._origin = self._length = length
            return
        self._steady = self._steady and length == self._length + 1
        self._length = length
        n = length - self._origin  # generated tokens in this context
        if n < 0:
            raise RuntimeError(
                f"token context shrank below the prompt ({length} < {self._origin}): "
                "a ReasoningBudgetProcessor serves exactly one sequence"
            )
        known = len(self._tokens)
        lo = max(0, min(known, n) - _OVERLAP)
        fresh = arrays.ints(flat[self._origin + lo :]) if n > lo else []
        same = lo + common_prefix(self._tokens[lo:], fresh)
        if same == lo and lo > 0 and known > lo and fresh and fresh[0] != self._tokens[lo]:
            # Changed before the window too: replay from the start (never seen in mlx-lm).
            lo, fresh = 0, arrays.ints(flat[self._origin :])
            same = common_prefix(self._tokens, fresh)
        del self._tokens[same:]
        del self._states[same + 1 :]
        for token in fresh[same - lo :]:
            self._tokens.append(int(token))
            self._states.append(self._step(self._states[-1]))

    def _step(self, state: _State) -> _State:
        """The state after `self._tokens[-1]`, given the state before it."""
        inside, count, force, done, text = state
        if done:
            return state
        if force is not None:  # this token was forced as end[force]
            force += 1
            if force == len(self._end):
                return _State(False, count, None, True)
            return _State(True, count, force, False)
        text, spans = self._text_marker(text, self._marks[1] if inside else self._marks[0])
        if inside:
            if _ends_with(self._tokens, self._end) or spans:
                # The earlier tokens of a multi-token marker were counted; take them back.
                back = len(self._end) if _ends_with(self._tokens, self._end) else spans
                return _State(False, max(0, count - (back - 1)), None, False)
            count += 1
            if count < self.budget:
                return _State(True, count, None, False, text)
            # Spent. If the model already began the marker, force only its rest.
            return _State(True, count, _marker_prefix(self._tokens, self._end), False, text)
        if _ends_with(self._tokens, self._start) or spans:
            return _State(True, count, 0 if count >= self.budget else None, False)
        return _State(inside, count, force, done, text)

    def _text_marker(self, text: bytes, markers: tuple[bytes, ...]) -> tuple[bytes, int]:
        """(the kept text after `self._tokens[-1]`, the number of tokens that spell one of
        `markers` when the text now holds it, else 0)."""
        if not markers or self._decode is None:
            return b"", 0
        text += self._decode([self._tokens[-1]])
        at = min((i for m in markers if (i := text.find(m)) >= 0), default=-1)
        if at < 0:
            return text[-self._keep :] if self._keep else b"", 0
        need, spans = len(text) - at, 0
        for token in reversed(self._tokens):  # the tokens back to the marker's first byte
            need -= len(self._decode([token]))
            spans += 1
            if need <= 0:
                break
        return b"", spans


LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


def make_budget_processor(
    tokenizer: Any, budget: int, initial_state: str
) -> ReasoningBudgetProcessor | None:
    """The reasoning-budget processor for one sequence, or None when it has nothing to do.

    tokenizer: mlx-lm `TokenizerWrapper` (its `think_start_tokens` / `think_end_tokens`).
    budget: reasoning tokens allowed; -1 (or any negative) = unlimited -> None.
    initial_state: the output pipeline's starting state ("reasoning" when the prompt left
    a think block open: `output.initial_state_for`, `Job.initial_state`).
    Returns None also for a tokenizer without think markers (nothing to end).
    """
    if budget < 0 or not getattr(tokenizer, "has_thinking", False):
        return None
    start = tuple(getattr(tokenizer, "think_start_tokens", None) or ())
    end = tuple(getattr(tokenizer, "think_end_tokens", None) or ())
    if not end:
        return None
    markers = (
        getattr(tokenizer, "think_start", "") or "",
        getattr(tokenizer, "think_end", "") or "",
    )
    from decoding import grammar  # the grammar module imports MLX-free parts only

    ends, kept = grammar.reasoning_end_markers(tokenizer)
    return ReasoningBudgetProcessor(
        budget,
        start,
        end,
        initial_state == REASONING,
        markers=markers,
        decode=_decoder(tokenizer),
        other_ends=(*ends, *kept),
    )


def _decoder(tokenizer: Any) -> Callable[[list[int]], bytes] | None:
    """token ids -> their bytes: llguidance's view of the tokenizer (built at load,
    `grammar.warm_up`), else the tokenizer's own decode; None when neither works."""
    from decoding import grammar  # the grammar module imports MLX-free parts only

    try:
        return grammar.llg_tokenizer(tokenizer).decode_bytes
    except ValueError:
        decode = getattr(tokenizer, "decode", None)
        if decode is None:
            return None
        return lambda ids: str(decode(ids)).encode("utf-8")
