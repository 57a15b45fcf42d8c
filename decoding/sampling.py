"""Per-request samplers and logits processors for our batch (`batch.decode`) and mlx-lm's
solo `generate_step`.

Owns turning a `GenerationParams` into the `sampler` and `logits_processors` a sequence
takes. The processors are small classes (`LogitBias`, `Penalty`, the grammar's
`ConstraintProcessor`), each callable per row, that `batch.logits` recognizes and
applies for all rows of a batch step at once. The filters come from mlx-lm's
`sample_utils` (top-p, min-p, top-k, penalties); what mlx-lm lacks is per-request
random state: its samplers draw from MLX's global RNG, so one request's seed would be
disturbed by every other request sampling in between, and seeding would change the
draws of all of them. Here every non-greedy sampler owns an `mx.random.key` that it
splits on each call and passes as `key=`; the global RNG is never read or seeded.

Everything here creates MLX arrays: call it on the engine's MLX thread.
"""

from __future__ import annotations

import contextlib
import math
import secrets
from collections.abc import Callable, Sequence

import mlx.core as mx
from mlx_lm.sample_utils import (
    apply_top_k,
    apply_top_p,
    make_frequency_penalty,
    make_presence_penalty,
    make_repetition_penalty,
)

from decoding import grammar
from params import GenerationParams

try:
    from mlx_lm.sample_utils import greedy_sampler  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # mlx-lm's main branch has none (make_sampler(0.0) is a new lambda)

    def greedy_sampler(logprobs: mx.array) -> mx.array:
        return mx.argmax(logprobs, axis=-1)


Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]

# mlx-lm's own argmax sampler (also BatchGenerator's fallback; ours where mlx-lm has none).
# Every greedy request gets this very object, so BatchGenerator samples a batch of greedy
# rows in one call.
GREEDY: Sampler = greedy_sampler


def _xtc_special_tokens(tokenizer: object) -> list[int]:
    """EOS ids and the newline token(s): XTC must never cut these (as the original)."""
    ids: set[int] = set(getattr(tokenizer, "eos_token_ids", None) or ())
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.add(int(eos))
    # A tokenizer that cannot encode "\n" just gets no newline protection.
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        ids.update(tokenizer.encode("\n", add_special_tokens=False))  # type: ignore[attr-defined]
    return sorted(ids)


def _apply_xtc(
    logprobs: mx.array,
    key: mx.array,
    probability: float,
    threshold: float,
    special_tokens: mx.array | None,
) -> mx.array:
    """Exclude Top Choices (XTC): with `probability`, per row, drop every token whose
    probability exceeds `threshold` except the least likely of them.

    Reimplemented from mlx-lm's `apply_xtc` (after the XTC sampler of
    oobabooga/text-generation-webui PR 6335) because that one draws its coin with the
    global `mx.random.uniform()`, which would break per-request seeding. Shapes:
    logprobs (B, V) -> (B, V); one coin per row.
    """
    probs = mx.softmax(logprobs, axis=-1)  # renormalized after earlier filters
    above = mx.where(probs > threshold, probs, mx.inf).min(axis=-1, keepdims=True)
    mask = probs > above  # above-threshold tokens except the least likely of them
    if special_tokens is not None:
        mask[..., special_tokens] = False
    coin = mx.random.uniform(shape=(logprobs.shape[0], 1), key=key)
    return mx.where((coin < probability) & mask, -mx.inf, logprobs)


class SeededSampler:
    """A temperature sampler with its own RNG key; callable as (B, V) logprobs -> (B,) ids.

    Filters run in mlx-lm's order: top-p, min-p, XTC, top-k, then a categorical draw
    at `temperature`. Each call splits the key, so a given seed yields the same token
    sequence regardless of what other samplers or the global RNG do in between.
    Not thread-safe (one request, one engine thread).
    """

    def __init__(
        self,
        temperature: float,
        seed: int,
        top_p: float = 1.0,
        min_p: float = 0.0,
        top_k: int = 0,
        xtc_probability: float = 0.0,
        xtc_threshold: float = 0.1,
        xtc_special_tokens: Sequence[int] = (),
    ) -> None:
        self.temperature = temperature
        self.top_p = top_p
        self.min_p = min_p
        # As arrays: mlx-lm's compiled filters recompile (~1-2 s on the engine thread,
        # stalling every stream) for each new Python float they are given.
        self._top_p = mx.array(top_p, dtype=mx.float32)
        self._log_min_p = mx.array(math.log(min_p) if min_p > 0 else 0.0, dtype=mx.float32)
        self.top_k = top_k
        self.xtc_probability = xtc_probability
        self.xtc_threshold = xtc_threshold
        self._xtc_special = mx.array(list(xtc_special_tokens)) if xtc_special_tokens else None
        self._key = mx.random.key(seed)

    def __call__(self, logprobs: mx.array) -> mx.array:
        self._key, xtc_key, draw_key = mx.random.split(self._key, 3)
        if 0.0 < self.top_p < 1.0:
            # mlx-lm annotates a float; an array (no host sync per step) works the same.
            logprobs = apply_top_p(logprobs, self._top_p)  # type: ignore[arg-type]
        if self.min_p > 0.0:
            # mlx-lm's apply_min_p needs a Python float (it validates and takes its log),
            # so the same rule is written here on an array: keep p >= min_p * max p.
            floor = logprobs.max(axis=-1, keepdims=True) + self._log_min_p
            logprobs = mx.where(logprobs < floor, -mx.inf, logprobs)
        if self.xtc_probability > 0.0:
            logprobs = _apply_xtc(
                logprobs,
                xtc_key,
                self.xtc_probability,
                self.xtc_threshold,
                self._xtc_special,
            )
        if 0 < self.top_k < logprobs.shape[-1]:  # apply_top_k rejects k >= vocab
            logprobs = apply_top_k(logprobs, self.top_k)
        return mx.random.categorical(logprobs * (1.0 / self.temperature), key=draw_key)


def make_sampler(params: GenerationParams, tokenizer: object) -> Sampler:
    """Build the sampler for one request: (B, V) float logprobs -> (B,) token ids.

    Temperature 0 or top_k 1 -> `GREEDY` (the shared argmax function). Otherwise a
    `SeededSampler` keyed by `params.seed`, or by a fresh `secrets` seed when it is
    None. The tokenizer is read only when XTC is on (its EOS and newline ids are
    exempt from XTC).
    """
    if params.temperature == 0.0 or params.top_k == 1:
        return GREEDY
    seed = params.seed if params.seed is not None else secrets.randbits(63)
    special = _xtc_special_tokens(tokenizer) if params.xtc_probability > 0.0 else ()
    return SeededSampler(
        temperature=params.temperature,
        seed=seed,
        top_p=params.top_p,
        min_p=params.min_p,
        top_k=params.top_k,
        xtc_probability=params.xtc_probability,
        xtc_threshold=params.xtc_threshold,
        xtc_special_tokens=special,
    )


class LogitBias:
    """Logits processor adding ``bias`` {token id: value} to the logits: (tokens, logits
    (n, V)) -> (n, V). The history is ignored (``position_free``: several positions'
    logits may go in one call, `batch.speculation.position_free`); `batch.logits`
    applies every row's biases of a step in one scatter (``ids``, ``values``)."""

    position_free = True

    def __init__(self, bias: dict[int, float]) -> None:
        self.ids = mx.array(list(bias.keys()))
        self.values = mx.array(list(bias.values()))

    def __call__(self, _tokens: mx.array, logits: mx.array) -> mx.array:
        return logits.at[:, self.ids].add(self.values.astype(logits.dtype))


#: The penalties `Penalty` builds, with mlx-lm's constructors (`sample_utils`).
PENALTIES: dict[str, Callable[[float, int], LogitsProcessor]] = {
    "repetition": make_repetition_penalty,
    "presence": make_presence_penalty,
    "frequency": make_frequency_penalty,
}


class Penalty:
    """One of mlx-lm's penalties (``kind`` a key of PENALTIES) on the last ``window``
    tokens: (tokens (T,) or (1, T) int, logits (1, V)) -> (1, V), as mlx-lm's
    ``make_{kind}_penalty(penalty, window)`` computes it (called here). `batch.logits`
    applies every row's penalty of a kind in one gather/scatter (tests/model/
    test_batch_processors.py compares the two)."""

    def __init__(self, kind: str, penalty: float, window: int) -> None:
        self.kind, self.penalty, self.window = kind, penalty, window
        self._apply = PENALTIES[kind](penalty, window)

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        # mlx-lm's penalties slice tokens[-n:], which on a (1, T) array would slice the
        # batch axis; BatchGenerator passes (T,), other callers may pass (1, T).
        return self._apply(tokens.reshape(-1), logits)


def _vocab_size(tokenizer: object) -> int | None:
    try:
        return len(tokenizer)  # type: ignore[arg-type]
    except TypeError:
        size = getattr(tokenizer, "vocab_size", None)
        return int(size) if size is not None else None


def check_logit_bias(params: GenerationParams, tokenizer: object) -> None:
    """ValueError naming LogitBias when one of its ids is outside ``tokenizer``'s vocabulary
    (the prepare step's check, `engine.prepare`)."""
    vocab = _vocab_size(tokenizer)
    bad = [i for i in params.logit_bias or () if vocab is not None and i >= vocab]
    if bad:
        raise ValueError(
            f"PredictOptions.LogitBias token ids must be in [0, {vocab}), got {bad[:5]}"
        )


def make_logits_processors(
    params: GenerationParams, tokenizer: object, initial_state: str = "normal"
) -> list[LogitsProcessor]:
    """Build the logits processors for one request, in application order.

    Each takes (tokens (T,) or (1, T) int, logits (1, V)) and returns logits (1, V),
    as `GenerationBatch._step` calls them with the sequence's prompt + generated
    tokens. Order: logit bias, EOS ban (ignore_eos), repetition penalty (skipped at
    0 or 1.0), presence penalty, frequency penalty; the penalties look at the last
    `repetition_context_size` tokens (mlx-lm's `make_*_penalty`).

    The tokenizer gives the EOS ids (for ignore_eos). LogitBias ids were checked against
    the vocabulary when the request was prepared (`check_logit_bias`). `initial_state`
    (the job's: "reasoning" when the prompt left a think block open), `grammar_scope` and
    `grammar_triggers` decide where the constraint starts (`grammar.make_gate`).
    """
    processors: list[LogitsProcessor] = []
    if params.logit_bias:
        processors.append(LogitBias(params.logit_bias))
    if params.ignore_eos:
        # As llama.cpp does: EOS can never be sampled, so generation runs to max_tokens.
        eos = set(getattr(tokenizer, "eos_token_ids", None) or ())
        eos_id = getattr(tokenizer, "eos_token_id", None)
        if eos_id is not None:
            eos.add(int(eos_id))
        if eos:
            processors.append(LogitBias(dict.fromkeys(sorted(eos), -mx.inf)))
    window = params.repetition_context_size
    if params.repetition_penalty not in (0.0, 1.0):
        processors.append(Penalty("repetition", params.repetition_penalty, window))
    if params.presence_penalty != 0.0:
        processors.append(Penalty("presence", params.presence_penalty, window))
    if params.frequency_penalty != 0.0:
        processors.append(Penalty("frequency", params.frequency_penalty, window))
    if params.constraint is not None:
        # Last: the grammar masks whatever the other processors left possible.
        processors.append(
            grammar.make_constraint_processor(
                params.constraint,
                tokenizer,
                initial_state,
                params.grammar_scope,
                params.grammar_triggers,
            )
        )
    return processors
