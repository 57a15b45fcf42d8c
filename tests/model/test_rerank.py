"""Rerank on the embedded SmolLM2-135M-Instruct over real gRPC (tests/inprocess.py), with
LocalAI's request shape (core/backend/rerank.go, core/http/endpoints/jina/rerank.go): the
scores equal what the served model gives when mlx-lm runs it directly, one plain forward
pass per document, no KV cache, no batch.

- likelihood (the default for a model whose name has no "rerank"): exp of the mean
  log-probability of the query's tokens after the passage prompt;
- yes_no (option rerank:yes_no, or auto on a model named like a reranker): the
  probability of "yes" against "no" after the judge conversation rendered by the model's
  own chat template, as Qwen3-Reranker's model card computes it.
"""

from __future__ import annotations

import math
from pathlib import Path

import grpc
import mlx.core as mx
import pytest

import backend_pb2
from loading import model_loader
from parsing.options import DEFAULT_RERANK_INSTRUCTION
from prompt_cache import PromptCache
from tasks import rerank

QUERY = "Organic skincare products for sensitive skin"
# LocalAI's documentation example (docs/content/features/reranker.md), shortened.
DOCUMENTS = [
    "Eco-friendly kitchenware for modern homes",
    "Biodegradable cleaning supplies for eco-conscious consumers",
    "Natural organic skincare range for sensitive skin",
    "Tech gadgets for smart homes: 2024 edition",
]
SKINCARE = 2
JUDGE_USER = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}"


def load(srv, model: Path | str, *options: str) -> None:
    res = srv.stub.LoadModel(
        backend_pb2.ModelOptions(Model=str(model), Reranking=True, Options=list(options)),
        timeout=300,
    )
    assert res.success, res.message


def localai_request(top_n: int, model: str = "", documents=DOCUMENTS):
    return backend_pb2.RerankRequest(
        query=QUERY, documents=documents, top_n=top_n, ModelIdentity=model
    )


def reference_likelihood(model, tok, doc: str) -> float:
    """exp(mean log P(query token | passage prompt, earlier query tokens)), one forward."""
    head = f"Passage: {doc}\nPlease write a question based on this passage.\nQuestion:"
    context = tok.encode(head)
    full = tok.encode(f"{head} {QUERY}")
    k = 0
    while k < len(context) and context[k] == full[k]:
        k += 1
    logits = model(mx.array(full)[None])[0].astype(mx.float32)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    picked = [lp[i - 1, full[i]].item() for i in range(k, len(full))]
    return math.exp(math.fsum(picked) / len(picked))


def reference_yes(model, tok, doc: str, instruction: str = DEFAULT_RERANK_INSTRUCTION) -> float:
    """Qwen3-Reranker's card: softmax over the last position's [no, yes] logits."""
    messages = [
        {"role": "system", "content": rerank.JUDGE},
        {
            "role": "user",
            "content": JUDGE_USER.format(instruction=instruction, query=QUERY, doc=doc),
        },
    ]
    ids = tok.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, enable_thinking=False
    )
    last = model(mx.array(ids)[None])[0, -1].astype(mx.float32)
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    return mx.softmax(mx.stack([last[no], last[yes]]))[1].item()


def served(srv):
    loaded = srv.engine.loaded
    return loaded.model, loaded.tokenizer


def test_likelihood_rerank_equals_direct_computation_sorted(srv):
    path = model_loader.embedded_model_path()
    load(srv, path)
    # top_n 0: every document (LocalAI's router asks so; its /v1/rerank clamps to the count).
    res = srv.stub.Rerank(localai_request(top_n=0, model=str(path)))
    assert sorted(r.index for r in res.results) == list(range(len(DOCUMENTS)))
    scores = [r.relevance_score for r in res.results]
    assert scores == sorted(scores, reverse=True)
    assert res.results[0].index == SKINCARE
    model, tok = served(srv)
    for r in res.results:
        assert r.text == DOCUMENTS[r.index]
        assert r.relevance_score == pytest.approx(
            reference_likelihood(model, tok, r.text), rel=1e-4
        )
    # Usage: every document's whole sequence, as llama.cpp counts tokens evaluated.
    assert res.usage.prompt_tokens == res.usage.total_tokens
    assert res.usage.total_tokens == sum(
        len(tok.encode(f"Passage: {d}\nPlease write a question based on this passage.\n"
                       f"Question: {QUERY}"))
        for d in DOCUMENTS
    )  # fmt: skip


def test_yes_no_rerank_equals_the_direct_probability_of_yes(srv):
    load(srv, model_loader.embedded_model_path(), "rerank:yes_no")
    res = srv.stub.Rerank(localai_request(top_n=len(DOCUMENTS)))
    model, tok = served(srv)
    assert sorted(r.index for r in res.results) == list(range(len(DOCUMENTS)))
    scores = [r.relevance_score for r in res.results]
    assert scores == sorted(scores, reverse=True)
    for r in res.results:
        assert 0 < r.relevance_score < 1
        assert r.relevance_score == pytest.approx(reference_yes(model, tok, r.text), abs=1e-5)


def test_yes_no_instruction_option_changes_the_prompt(srv):
    instruction = "Find products for a shop customer"
    load(
        srv,
        model_loader.embedded_model_path(),
        "rerank:yes_no",
        f"rerank_instruction:{instruction}",
    )
    res = srv.stub.Rerank(localai_request(top_n=1, documents=DOCUMENTS[1:3]))
    model, tok = served(srv)
    (best,) = res.results
    assert best.relevance_score == pytest.approx(
        reference_yes(model, tok, best.text, instruction), abs=1e-5
    )


def test_auto_is_yes_no_on_a_model_named_like_a_reranker(srv, tmp_path):
    named = tmp_path / "SmolLM2-Reranker-135M.gguf"
    named.symlink_to(model_loader.embedded_model_path())
    load(srv, named)
    res = srv.stub.Rerank(localai_request(top_n=2, documents=DOCUMENTS[1:3]))
    model, tok = served(srv)
    for r in res.results:
        assert r.relevance_score == pytest.approx(reference_yes(model, tok, r.text), abs=1e-5)


def test_a_document_past_the_context_is_invalid_argument(srv):
    load(srv, model_loader.embedded_model_path(), "rerank:likelihood")
    request = backend_pb2.RerankRequest(query=QUERY, documents=["ok", "word " * 9000])
    with pytest.raises(grpc.RpcError) as err:
        srv.stub.Rerank(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "documents[1]" in err.value.details()


@pytest.fixture(scope="module")
def batched(smol):
    """Three documents of three lengths reranked together (yes_no) through a prompt
    cache: (the result, the cache)."""
    model, tok = smol
    cache = PromptCache(max_entries=4)
    out = rerank.rerank(model, tok, QUERY, DOCUMENTS[1:], mode="yes_no", cache=cache,
                        model_key="m")  # fmt: skip
    return out, cache


def test_batched_forks_equal_solo_forks(smol, batched):
    """Several documents per forward call (right-padded) give each document's solo
    numbers."""
    model, tok = smol
    by_index = {r.index: r.relevance_score for r in batched[0].results}
    for i, d in enumerate(DOCUMENTS[1:]):
        solo = rerank.rerank(model, tok, QUERY, [d], mode="yes_no").results[0].relevance_score
        assert by_index[i] == pytest.approx(solo, abs=1e-5)


def test_the_shared_judge_prefix_comes_from_the_prompt_cache(smol, batched):
    model, tok = smol
    out, cache = batched
    hits = cache.stats().hits
    again = rerank.rerank(model, tok, QUERY, DOCUMENTS[1:], mode="yes_no", cache=cache,
                          model_key="m")  # fmt: skip
    assert again == out and cache.stats().hits == hits + 1


def test_chunked_forward_calls_give_the_whole_call_s_scores(smol):
    """3-token chunks exercise the column chunking."""
    model, tok = smol
    chunked = rerank.rerank(model, tok, QUERY, DOCUMENTS[1:3], mode="likelihood", prefill_step=3)
    whole = rerank.rerank(model, tok, QUERY, DOCUMENTS[1:3], mode="likelihood")
    assert [r.index for r in chunked.results] == [r.index for r in whole.results]
    for a, b in zip(chunked.results, whole.results, strict=True):
        assert a.relevance_score == pytest.approx(b.relevance_score, rel=1e-4)
