"""Unit tests for sampling.py: greedy sharing, per-request seeded RNG, processors."""

from __future__ import annotations

import mlx.core as mx
import pytest
from helpers import gen_params
from mlx_lm import sample_utils

from decoding import sampling

greedy_sampler = getattr(sample_utils, "greedy_sampler", sampling.GREEDY)  # main: none

VOCAB = 32
EOS = 2
NEWLINE = 5


class FakeTokenizer:
    """Just what sampling.py reads: len(), eos ids, encode("\\n")."""

    eos_token_id = EOS
    eos_token_ids = frozenset({EOS})

    def __len__(self) -> int:
        return VOCAB

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert text == "\n"
        return [NEWLINE]


TOK = FakeTokenizer()


def flat_logprobs(batch: int = 1) -> mx.array:
    logits = mx.random.normal((batch, VOCAB), key=mx.random.key(0)) * 0.5
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def draws(sampler, logprobs: mx.array, n: int) -> list[int]:
    return [sampler(logprobs).item() for _ in range(n)]


def test_greedy_is_the_shared_mlx_lm_argmax() -> None:
    a = sampling.make_sampler(gen_params(temperature=0.0), TOK)
    b = sampling.make_sampler(gen_params(temperature=0.0, seed=3, top_p=0.5), TOK)
    assert a is b is sampling.GREEDY is greedy_sampler
    lp = flat_logprobs(batch=3)
    assert a(lp).tolist() == mx.argmax(lp, axis=-1).tolist()


def test_top_k_one_is_argmax() -> None:
    s = sampling.make_sampler(gen_params(temperature=1.5, top_k=1), TOK)
    lp = flat_logprobs()
    assert draws(s, lp, 10) == [mx.argmax(lp, axis=-1).item()] * 10


def test_same_seed_same_tokens_despite_interleaving() -> None:
    lp = flat_logprobs()
    p = gen_params(temperature=1.0, seed=1234)
    reference = draws(sampling.make_sampler(p, TOK), lp, 50)

    mine = sampling.make_sampler(p, TOK)
    other_seeded = sampling.make_sampler(gen_params(temperature=1.0, seed=99), TOK)
    unseeded = sampling.make_sampler(gen_params(temperature=0.8), TOK)
    got = []
    for i in range(50):
        other_seeded(lp)
        mx.random.seed(i)  # somebody touching the global RNG
        mx.random.uniform()
        got.append(mine(lp).item())
        unseeded(lp)
    assert got == reference
    assert len(set(reference)) > 1  # really sampling, not argmax


def test_different_seeds_differ() -> None:
    lp = flat_logprobs()
    a = draws(sampling.make_sampler(gen_params(temperature=1.0, seed=1), TOK), lp, 50)
    b = draws(sampling.make_sampler(gen_params(temperature=1.0, seed=2), TOK), lp, 50)
    assert a != b


def test_unseeded_samplers_differ() -> None:
    lp = flat_logprobs()
    a = draws(sampling.make_sampler(gen_params(temperature=1.0), TOK), lp, 50)
    b = draws(sampling.make_sampler(gen_params(temperature=1.0), TOK), lp, 50)
    assert a != b


def test_sampling_leaves_global_rng_alone() -> None:
    mx.random.seed(5)
    expected = mx.random.uniform(shape=(4,)).tolist()
    mx.random.seed(5)
    s = sampling.make_sampler(
        gen_params(
            temperature=1.0,
            seed=8,
            top_p=0.9,
            min_p=0.01,
            top_k=10,
            xtc_probability=0.5,
        ),
        TOK,
    )
    draws(s, flat_logprobs(), 5)
    assert mx.random.uniform(shape=(4,)).tolist() == expected


def test_batched_shapes() -> None:
    s = sampling.make_sampler(gen_params(temperature=0.7, top_p=0.9, top_k=5, min_p=0.05), TOK)
    out = s(flat_logprobs(batch=4))
    assert out.shape == (4,)
    assert all(0 <= t < VOCAB for t in out.tolist())


def test_top_k_larger_than_vocab_is_no_filter() -> None:
    s = sampling.make_sampler(gen_params(temperature=1.0, top_k=VOCAB + 10, seed=1), TOK)
    assert len(draws(s, flat_logprobs(), 10)) == 10


def test_top_k_restricts_choices() -> None:
    lp = flat_logprobs()
    top2 = set(mx.argsort(-lp, axis=-1)[0, :2].tolist())
    s = sampling.make_sampler(gen_params(temperature=5.0, top_k=2, seed=3), TOK)
    assert set(draws(s, lp, 40)) == top2


def test_xtc_cuts_top_choices_but_keeps_special_tokens() -> None:
    probs = mx.full((1, VOCAB), 1e-6)
    probs[0, 7] = 0.5
    probs[0, 8] = 0.3
    probs[0, 9] = 0.2
    lp = mx.log(probs / probs.sum())
    p = gen_params(temperature=0.01, seed=1, xtc_probability=1.0, xtc_threshold=0.1)
    # 7 and 8 are cut; 9 is the least likely above the threshold and survives
    assert set(draws(sampling.make_sampler(p, TOK), lp, 10)) == {9}

    probs[0, EOS] = 0.6  # an EOS above the threshold is never cut
    lp = mx.log(probs / probs.sum())
    assert set(draws(sampling.make_sampler(p, TOK), lp, 10)) == {EOS}


# --- logits processors ---------------------------------------------------------------


def logits_with_argmax(index: int) -> mx.array:
    logits = mx.zeros((1, VOCAB))
    logits[0, index] = 5.0
    logits[0, index + 1] = 4.0
    return logits


def apply(processors, tokens: mx.array, logits: mx.array) -> mx.array:
    for processor in processors:
        logits = processor(tokens, logits)
    return logits


def test_no_processors_by_default() -> None:
    assert sampling.make_logits_processors(gen_params(), TOK) == []


def test_logit_bias_changes_greedy_choice() -> None:
    logits = logits_with_argmax(10)
    procs = sampling.make_logits_processors(gen_params(logit_bias={10: -100.0}), TOK)
    out = apply(procs, mx.array([1, 2, 3]), logits)
    assert greedy_sampler(out).item() == 11


def test_logit_bias_id_out_of_vocab() -> None:
    with pytest.raises(ValueError, match="LogitBias"):
        sampling.check_logit_bias(gen_params(logit_bias={VOCAB: 1.0}), TOK)
    sampling.check_logit_bias(gen_params(logit_bias={VOCAB - 1: 1.0}), TOK)


def test_ignore_eos_bans_eos() -> None:
    procs = sampling.make_logits_processors(gen_params(ignore_eos=True), TOK)
    out = apply(procs, mx.array([1]), logits_with_argmax(EOS))
    assert out[0, EOS].item() == float("-inf")
    assert greedy_sampler(out).item() == EOS + 1


@pytest.mark.parametrize("shape", ["flat", "row"])
def test_processors_compose_with_batch_generator_shapes(shape: str) -> None:
    p = gen_params(
        logit_bias={3: 1.0},
        repetition_penalty=2.0,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        repetition_context_size=3,
    )
    procs = sampling.make_logits_processors(p, TOK)
    assert len(procs) == 4
    history = [9, 10, 10, 11]  # window 3 sees 10, 10, 11; 9 is outside it
    # GenerationBatch._step passes TokenBuffer contents (T,) int32 and logits[e:e+1]
    tokens = mx.array(history, dtype=mx.int32)
    if shape == "row":
        tokens = tokens[None]
    logits = mx.full((1, VOCAB), 2.0, dtype=mx.bfloat16)
    out = apply(procs, tokens, logits)
    assert out.shape == (1, VOCAB)
    assert out.dtype == mx.bfloat16
    row = out[0].astype(mx.float32).tolist()
    assert row[3] == 3.0  # bias only
    assert row[9] == 2.0  # outside the window
    assert row[11] == pytest.approx(2.0 / 2.0 - 0.5 - 0.25)
    assert row[10] == pytest.approx(2.0 / 2.0 - 0.5 - 0.5)  # counted twice by frequency
    assert row[0] == 2.0


def test_penalty_one_is_disabled() -> None:
    assert sampling.make_logits_processors(gen_params(repetition_penalty=1.0), TOK) == []


def test_processors_and_sampler_in_a_batch_generator_step() -> None:
    # The per-row path of GenerationBatch._step: processors on logits[e:e+1], then
    # normalized logprobs into each row's own sampler.
    logits = mx.concatenate([logits_with_argmax(4), logits_with_argmax(20)])
    rows = [
        (
            sampling.make_logits_processors(gen_params(logit_bias={4: -100.0}), TOK),
            sampling.GREEDY,
        ),
        ([], sampling.make_sampler(gen_params(temperature=0.5, top_k=1), TOK)),
    ]
    out = []
    for e, (procs, sampler) in enumerate(rows):
        row = apply(procs, mx.array([1, 2], dtype=mx.int32), logits[e : e + 1])
        out.append(sampler(row - mx.logsumexp(row, axis=-1, keepdims=True)))
    assert mx.concatenate(out).tolist() == [5, 20]
