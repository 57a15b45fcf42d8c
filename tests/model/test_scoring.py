"""tasks.scoring.py on the real embedded SmolLM2-135M: Score log-probs and Embedding vectors."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest

from errors import Cancelled
from loading import model_loader
from prompt_cache import PromptCache
from tasks import embedding, scoring

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def lm():
    return model_loader.load_model(str(model_loader.embedded_model_path()))


def full_forward_logprob(model, tokenizer, prompt: str, candidate: str) -> float:
    """The reference: one plain forward pass over the whole sequence, no KV cache."""
    p = tokenizer.encode(prompt)
    f = tokenizer.encode(prompt + candidate)
    k = 0
    while k < min(len(p), len(f)) and p[k] == f[k]:
        k += 1
    if k == 0:
        f, k = [tokenizer.bos_token_id, *f], 1
    logits = model(mx.array(f)[None])[0].astype(mx.float32)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return math.fsum(lp[i - 1, f[i]].item() for i in range(k, len(f)))


def cosine(a, b) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


# --------------------------------------------------------------------------- score
@pytest.fixture(scope="module")
def france(lm):
    """Scores of the main prompt's candidates, with per-token log-probs."""
    model, tok = lm
    return scoring.score(
        model, tok, PROMPT, [" Paris", " Berlin", " a big city"], include_token_logprobs=True
    )


def test_ranks_paris_above_berlin_with_consistent_fields(france):
    paris, berlin, city = france
    assert paris.log_prob > berlin.log_prob
    for r in france:
        assert r.log_prob <= 0
        assert r.length_normalized_log_prob == pytest.approx(r.log_prob / r.num_tokens)
    assert (paris.num_tokens, berlin.num_tokens, city.num_tokens) == (1, 1, 3)


def test_token_logprobs_sum_to_log_prob_and_spell_the_candidate(lm, france):
    model, tok = lm
    city = france[2]
    assert len(city.tokens) == city.num_tokens
    assert "".join(text for text, _ in city.tokens) == " a big city"
    for r in france:
        assert math.fsum(lp for _, lp in r.tokens) == pytest.approx(r.log_prob, abs=1e-4)
        assert all(lp <= 0 for _, lp in r.tokens)
    (bare,) = scoring.score(model, tok, PROMPT, [" Paris"])
    assert bare.tokens == ()


def test_forked_kv_matches_one_full_forward_pass(lm, france):
    model, tok = lm
    reference = full_forward_logprob(model, tok, PROMPT, " a big city")
    assert france[2].log_prob == pytest.approx(reference, abs=1e-3)


@pytest.mark.parametrize(
    ("prompt", "candidates"),
    [
        # "is " + "Paris" merges into " Paris" while "1" does not: contexts differ.
        (PROMPT + " ", ["Paris", "1"]),
        # "The" + "re" merges into "There": conditioned on BOS alone.
        ("The", ["re"]),
        ("", ["Hi"]),
    ],
)
def test_boundary_cases_match_one_full_forward_pass(lm, prompt, candidates):
    model, tok = lm
    # One token per forward call: also exercises the chunked prefill and feeding.
    results = scoring.score(model, tok, prompt, candidates, prefill_step=1)
    for cand, r in zip(candidates, results, strict=True):
        assert r.log_prob == pytest.approx(full_forward_logprob(model, tok, prompt, cand), abs=1e-3)


def test_a_merged_boundary_scores_the_text_actually_written(lm, france):
    model, tok = lm
    (merged,) = scoring.score(model, tok, PROMPT + " ", ["Paris"])
    assert merged.num_tokens == 1
    assert merged.log_prob == pytest.approx(france[0].log_prob, abs=1e-4)


def test_prompt_cache_second_call_is_a_hit_with_identical_numbers(lm, france):
    model, tok = lm
    cache = PromptCache(max_entries=4)
    cands = [" Paris", " Berlin"]
    first = scoring.score(model, tok, PROMPT, cands, cache=cache, model_key="m")
    s1 = cache.stats()
    assert (s1.hits, s1.misses, s1.entries) == (0, 1, 1)
    second = scoring.score(model, tok, PROMPT, cands, cache=cache, model_key="m")
    s2 = cache.stats()
    assert (s2.hits, s2.misses, s2.entries) == (1, 1, 1)
    assert s2.tokens_reused == len(tok.encode(PROMPT)) - 1
    assert second == first
    for a, b in zip(france[:2], first, strict=True):
        assert b.log_prob == pytest.approx(a.log_prob, abs=1e-4)


class _NoBos:
    """The real tokenizer without a BOS token."""

    bos_token = None
    bos_token_id = None

    def __init__(self, tok) -> None:
        self.encode = tok.encode


@pytest.mark.parametrize(
    ("prompt", "candidates", "bos", "options", "words"),
    [
        (PROMPT, [], True, {}, "candidates is empty"),
        (PROMPT, [" Paris", ""], True, {}, r"candidates\[1\]"),
        ("", [" Paris"], False, {}, "prompt is empty"),
        ("The", ["re is"], False, {}, r"candidates\[0\] merges"),
        (PROMPT, [" Paris"], True, {"context_len": 5}, "context holds 5"),
    ],
    ids=["no-candidates", "empty-candidate", "no-prompt-no-bos", "merged-no-bos", "past-context"],
)
def test_score_errors(lm, prompt, candidates, bos, options, words):
    model, tok = lm
    with pytest.raises(ValueError, match=words):
        scoring.score(model, tok if bos else _NoBos(tok), prompt, candidates, **options)


class Counting:
    """The real model, counting forward calls (of the model, or of its decoder stack)."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._inner(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_should_stop_cancels_between_candidates(lm):
    model, tok = lm
    counted = Counting(model)
    candidates = [f" city number {i}" for i in range(10)]
    # One forward call for the shared prompt, then one per candidate: stop after 3.
    with pytest.raises(Cancelled, match="Score cancelled") as err:
        scoring.score(counted, tok, PROMPT, candidates, should_stop=lambda: counted.calls >= 4)
    assert err.value.status == "CANCELLED"
    assert counted.calls == 4


def test_should_stop_cancels_between_chunks_of_one_candidate(lm):
    """Chunked feeding checks before every chunk too: 1-token chunks, stop after 3 calls."""
    model, tok = lm
    counted = Counting(model)
    with pytest.raises(Cancelled):
        scoring.score(
            counted,
            tok,
            PROMPT,
            [" a big city"],
            prefill_step=1,
            should_stop=lambda: counted.calls >= 3,
        )
    assert counted.calls == 3


def test_a_should_stop_that_never_fires_changes_nothing(lm, france):
    model, tok = lm
    results = scoring.score(
        model,
        tok,
        PROMPT,
        [" Paris", " Berlin", " a big city"],
        include_token_logprobs=True,
        should_stop=lambda: False,
    )
    assert results == france


@pytest.mark.parametrize(
    ("candidates", "options", "words"),
    [
        ([" x"] * 257, {}, r"^candidates has 257 entries; the limit is 256"),
        ([" a", " b", " c", " d"], {"max_candidates": 3}, "the limit is 3 "),
        # " a big city" is 3 tokens: two of them exceed a 5-token budget at candidates[1].
        ([" a big city"] * 2, {"max_candidate_tokens": 5}, r"6 tokens .* by candidates\[1\]; "),
    ],
    ids=["MAX_SCORE_CANDIDATES", "max_candidates", "max_candidate_tokens"],
)
def test_score_refuses_past_its_bounds(lm, candidates, options, words):
    model, tok = lm
    with pytest.raises(ValueError, match=words):
        scoring.score(model, tok, PROMPT, candidates, **options)


def test_candidates_within_the_token_budget_are_scored(lm):
    model, tok = lm
    (ok,) = scoring.score(model, tok, PROMPT, [" a big city"], max_candidate_tokens=3)
    assert ok.num_tokens == 3


# --------------------------------------------------------------------------- embeddings
def test_paraphrases_are_closer_than_unrelated_sentences(lm):
    model, tok = lm
    a = embedding.embed(model, tok, "The cat sat on the mat.")
    b = embedding.embed(model, tok, "A cat was sitting on the mat.")
    c = embedding.embed(model, tok, "The stock market fell sharply today.")
    assert cosine(a.vector, b.vector) > cosine(a.vector, c.vector)
    assert cosine(a.vector, b.vector) > cosine(b.vector, c.vector)
    for e, text in ((a, "The cat sat on the mat."), (c, "The stock market fell sharply today.")):
        assert e.dim == len(e.vector) == 576
        assert e.rows == 1
        assert math.sqrt(sum(v * v for v in e.vector)) == pytest.approx(1.0, abs=1e-4)
        assert e.prompt_tokens == len(tok.encode(text))


def test_pooling_options_match_the_hidden_states(lm):
    model, tok = lm
    text = "Hidden states."
    ids = tok.encode(text)
    h = model.model(mx.array(ids)[None])[0].astype(mx.float32)
    mean = embedding.embed(model, tok, text, normalize=False)
    assert mean.vector == pytest.approx(h.mean(axis=0).tolist(), abs=1e-3)
    last = embedding.embed(model, tok, text, pooling="last", normalize=1)
    assert last.vector == pytest.approx((h[-1] / mx.abs(h[-1]).sum()).tolist(), abs=1e-5)
    rows = embedding.embed(model, tok, text, pooling="none")
    assert (rows.rows, rows.dim, rows.prompt_tokens) == (len(ids), 576, len(ids))
    assert rows.per_token and not mean.per_token
    assert rows.vector == pytest.approx(h.reshape(-1).tolist(), abs=1e-3)
    # Chunks with a KV cache give what one pass gives.
    chunked = embedding.embed_tokens(model, ids, normalize=False, step=2)
    assert chunked.vector == pytest.approx(mean.vector, abs=1e-3)


class WithCountedBody:
    """The real model whose decoder stack (``model.model``) counts its calls."""

    def __init__(self, model) -> None:
        self._inner = model
        self.model = Counting(model.model)

    def __getattr__(self, name):
        return getattr(self._inner, name)


TEN = "One two three four five six seven eight nine ten."


def test_should_stop_cancels_embeddings_between_chunks(lm):
    model, tok = lm
    counted = WithCountedBody(model)
    with pytest.raises(Cancelled, match="Embedding cancelled"):
        embedding.embed(counted, tok, TEN, step=2, should_stop=lambda: counted.model.calls >= 2)
    assert counted.model.calls == 2


def test_should_stop_is_asked_before_the_first_chunk(lm):
    model, tok = lm
    counted = WithCountedBody(model)
    with pytest.raises(Cancelled):
        embedding.embed_tokens(counted, tok.encode(TEN), should_stop=lambda: True)
    assert counted.model.calls == 0


def test_a_should_stop_that_never_fires_changes_no_embedding(lm):
    model, tok = lm
    plain = embedding.embed(model, tok, TEN, step=2)
    assert embedding.embed(model, tok, TEN, step=2, should_stop=lambda: False) == plain


@pytest.mark.parametrize(
    ("text", "options", "words"),
    [
        ("hi", {"pooling": "cls"}, "embedding_pooling"),
        ("hi", {"normalize": -2}, "embedding_normalize"),
        ("", {}, "empty"),
    ],
    ids=["pooling", "normalize", "empty-text"],
)
def test_embedding_errors(lm, text, options, words):
    model, tok = lm
    with pytest.raises(ValueError, match=words):
        embedding.embed(model, tok, text, **options)


def test_tokens_outside_the_vocabulary_are_refused(lm):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        embedding.embed_tokens(lm[0], [1, 10**9])


def test_a_model_without_hidden_states_is_refused(lm):
    with pytest.raises(ValueError, match="no hidden states"):
        embedding.embed(lambda ids, cache=None: ids, lm[1], "hi")
