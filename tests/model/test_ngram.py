"""ngram_spec: n-gram (prompt lookup) speculation matches plain decoding exactly.

Real models: the embedded SmolLM2-135M (greedy identity, KV bookkeeping, max_tokens,
seeded sampling, processors' histories) and a tiny random-weight qwen2 (a frequency
test of sampled output over many seeds).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

import backend_pb2 as pb
from decoding import sampling
from decoding.ngram_spec import NgramStats, ngram_generate_step
from params import generation_params

PLANETS_LINE = "Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus, Neptune\n"
PLANETS = PLANETS_LINE * 4 + "Mercury, Venus,"
NO_REPEAT = "Quick zebras jump; vexed fog whirls over pink cliffs."


def ids_of(tok, text: str) -> mx.array:
    return mx.array(tok.encode(text), dtype=mx.uint32)


def plain(model, prompt: mx.array, n: int, **kw) -> list[int]:
    return [int(t) for t, _ in generate_step(prompt, model, max_tokens=n, **kw)]


def spec(model, prompt: mx.array, n: int, **kw):
    """(tokens, drafted flags, kv, stats) of one ngram_generate_step run."""
    kv = make_prompt_cache(model)
    stats = NgramStats()
    out = list(ngram_generate_step(prompt, model, max_tokens=n, prompt_cache=kv, stats=stats, **kw))
    return [t for t, _, _ in out], [d for _, _, d in out], kv, stats


# ---- greedy: token for token plain decoding ---------------------------------------


@pytest.mark.parametrize(
    ("name", "text"),
    [("planets", PLANETS), ("no_repeat", NO_REPEAT), ("chat", None)],
)
def test_greedy_identical_to_generate_step(smol, name, text):
    model, tok = smol
    if text is None:
        messages = [{"role": "user", "content": "List three colours, one per line."}]
        prompt = mx.array(tok.apply_chat_template(messages, add_generation_prompt=True))
    else:
        prompt = ids_of(tok, text)
    n = 40
    tokens, drafted, kv, stats = spec(model, prompt, n, num_draft_tokens=4)
    assert tokens == plain(model, prompt, n)
    assert all(c.offset == len(prompt) + n for c in kv)  # exactly prompt + generated
    assert sum(drafted) == stats.accepted
    if name == "planets":
        # The continuation repeats the lines: most tokens come from accepted drafts.
        assert stats.accepted > n // 2
        assert stats.steps < n // 2


def test_max_tokens_exact_when_a_verify_accepts_several(smol):
    model, tok = smol
    prompt = ids_of(tok, PLANETS)
    reference = plain(model, prompt, 12)
    for n in (1, 2, 3, 6, 11):
        tokens, _, kv, _ = spec(model, prompt, n, num_draft_tokens=5)
        assert tokens == reference[:n]
        assert all(c.offset == len(prompt) + n for c in kv)
    # The last of 6 tokens came from a draft: the budget cut a verify step short.
    assert spec(model, prompt, 6, num_draft_tokens=5)[1][-1] is True


def test_closing_midway_leaves_exactly_the_yielded_tokens(smol):
    model, tok = smol
    prompt = ids_of(tok, PLANETS)
    kv = make_prompt_cache(model)
    steps = ngram_generate_step(prompt, model, num_draft_tokens=6, max_tokens=50, prompt_cache=kv)
    seen = []
    for token, _, drafted in steps:
        seen.append(token)
        if drafted and len(seen) >= 3:
            break  # mid-verify: draft entries beyond this token are in the KV
    steps.close()
    assert all(c.offset == len(prompt) + len(seen) for c in kv)
    # The cache continues correctly: plain decoding from it reproduces the reference.
    reference = plain(model, prompt, len(seen) + 4)
    assert seen == reference[: len(seen)]
    rest = plain(model, mx.array(seen[-1:], dtype=mx.uint32), 4, prompt_cache=_trimmed(kv, 1))
    assert rest == reference[len(seen) :]


def _trimmed(kv, n):
    for c in kv:
        c.trim(n)
    return kv


def test_cached_prefix_is_searched_through_context_tokens(smol):
    model, tok = smol
    ids = tok.encode(PLANETS)
    cut = len(ids) - 3
    kv = make_prompt_cache(model)
    model(mx.array(ids[:cut])[None], cache=kv)
    stats = NgramStats()
    rest = mx.array(ids[cut:], dtype=mx.uint32)
    steps = ngram_generate_step(
        rest, model, max_tokens=20, prompt_cache=kv, context_tokens=ids[:cut], stats=stats
    )
    tokens = [t for t, _, _ in steps]
    assert tokens == plain(model, mx.array(ids, dtype=mx.uint32), 20)
    assert stats.accepted > 0
    assert all(c.offset == len(ids) + 20 for c in kv)


# ---- sampling and processors --------------------------------------------------------


def test_seeded_sampling_same_tokens_as_plain(smol):
    model, tok = smol
    prompt = ids_of(tok, PLANETS)

    def sampler():
        return sampling.SeededSampler(temperature=0.7, seed=1234, top_p=0.95, top_k=40)

    n = 30
    tokens, _, kv, stats = spec(model, prompt, n, num_draft_tokens=4, sampler=sampler())
    assert tokens == plain(model, prompt, n, sampler=sampler())
    assert stats.accepted > 0
    assert all(c.offset == len(prompt) + n for c in kv)


class Recorder:
    """A logits processor that records every token history it is shown."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        self.calls.append(tokens.reshape(-1).tolist())
        return logits


def test_processors_see_the_plain_decoding_histories(smol):
    model, tok = smol
    prompt = ids_of(tok, PLANETS)
    n = 24

    def processors(recorder):
        params = dataclasses.replace(
            generation_params(pb.PredictOptions()), repetition_penalty=1.05
        )
        return [recorder, *sampling.make_logits_processors(params, tok)]

    seen_plain, seen_spec = Recorder(), Recorder()
    expected = plain(model, prompt, n, logits_processors=processors(seen_plain))
    tokens, _, _, stats = spec(model, prompt, n, logits_processors=processors(seen_spec))
    assert tokens == expected
    assert stats.accepted > 0
    # Same calls in the same order: each history is the previous one plus one token.
    assert seen_spec.calls == seen_plain.calls[: len(seen_spec.calls)]
    assert len(seen_spec.calls) in (n, n + 1)  # + the step that sampled the unused next


# ---- the sampled distribution -------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    """A random-weight qwen2 with a 16-token vocabulary (fast enough for many samples)."""
    from mlx.utils import tree_map
    from mlx_lm.models import qwen2

    config = dict(
        model_type="qwen2",
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=16,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    mx.random.seed(3)
    model = qwen2.Model(qwen2.ModelArgs(**config))
    model.set_dtype(mx.float32)
    model.update(tree_map(lambda a: a * 3.0 if a.ndim == 2 else a, model.parameters()))
    mx.eval(model.parameters())
    return model


def _boost(ids):
    # Makes the drafted tokens likely (acceptance both frequent and far from certain).
    bias = mx.zeros((16,)).at[mx.array(ids)].add(2.5)

    def processor(_tokens, logits):
        return logits + bias

    return processor


def test_sampled_distribution_matches_plain_decoding(tiny):
    """Frequencies of 3-token continuations, plain vs speculative, over different seeds.

    Seeds differ between the two (so the runs are not trivially identical); the
    statistic is deterministic (fixed seeds). A chi-square two-sample test over the
    joint outcome of the second and third token.
    """
    prompt = mx.array([1, 2, 3, 4, 1, 2, 3, 4, 1, 2], dtype=mx.uint32)
    runs, n = 300, 3
    joint_plain, joint_spec = Counter(), Counter()
    stats = NgramStats()
    for i in range(runs):
        kw = dict(logits_processors=[_boost([3, 4, 1])])
        a = plain(tiny, prompt, n, sampler=sampling.SeededSampler(1.0, seed=i), **kw)
        steps = ngram_generate_step(
            prompt,
            tiny,
            sampler=sampling.SeededSampler(1.0, seed=10_000 + i),
            max_tokens=n,
            num_draft_tokens=3,
            stats=stats,
            **kw,
        )
        b = [t for t, _, _ in steps]
        joint_plain[tuple(a[1:])] += 1
        joint_spec[tuple(b[1:])] += 1
    assert 0 < stats.accepted < stats.drafted  # drafts both kept and rejected
    outcomes = set(joint_plain) | set(joint_spec)
    # Pool rare outcomes so every cell has a reasonable expected count.
    common = [k for k in outcomes if joint_plain[k] + joint_spec[k] >= 10]
    cells = [(joint_plain[k], joint_spec[k]) for k in common]
    rare = (
        sum(joint_plain[k] for k in outcomes if k not in common),
        sum(joint_spec[k] for k in outcomes if k not in common),
    )
    if sum(rare):
        cells.append(rare)
    chi2 = sum((x - y) ** 2 / (x + y) for x, y in cells)  # equal sample sizes
    df = len(cells) - 1
    # Wilson-Hilferty approximation of the chi-square 0.999 quantile.
    z = 3.09
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    assert len(cells) >= 4  # enough distinct outcomes for the test to mean something
    assert chi2 < critical, (chi2, critical, cells)
