"""Rerank without a real model: the request checks (over real gRPC, a real engine), the
`reranking` load flag and options, the mode choice, and the reply's shape and order with
a scripted model (tests/scripted.py) and the toy tokenizer. The scores themselves, against
mlx-lm computed directly: tests/model/test_rerank.py."""

from __future__ import annotations

import grpc
import pytest
from helpers import code_of
from inprocess import InProcessServer
from scripted import ScriptedModel

import backend_pb2
from errors import InvalidArgument
from params import load_params
from parsing.bounds import Bounds
from parsing.options import DEFAULT_RERANK_INSTRUCTION
from seam.tokenizer import vocab_size
from tasks import rerank


@pytest.fixture(scope="module")
def served(tok):
    srv = InProcessServer(ScriptedModel(vocab_size(tok), tok.eos_token_id), tok)
    yield srv
    srv.stop()


def request(query="Which city is the capital of France?", documents=None, top_n=0, **kw):
    # LocalAI's shape (core/http/endpoints/jina/rerank.go, core/backend/rerank.go): query,
    # documents, top_n clamped to len(documents) (or 0 from its router), ModelIdentity.
    docs = ["Paris is the capital.", "Bananas are yellow."] if documents is None else documents
    return backend_pb2.RerankRequest(query=query, documents=docs, top_n=top_n, **kw)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"documents": []}, "documents is empty"),
        ({"query": ""}, "query is empty"),
        ({"query": "  \n"}, "query is empty"),
        ({"top_n": -1}, "top_n is -1"),
        ({"documents": ["d"] * (rerank.MAX_RERANK_DOCUMENTS + 1)}, "MAX_RERANK_DOCUMENTS"),
    ],
)
def test_bad_requests_are_invalid_argument_with_what_to_change(served, fields, words):
    with pytest.raises(grpc.RpcError) as err:
        served.stub.Rerank(request(**fields))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in err.value.details()


def test_check_request_accepts_top_n_zero_and_above_the_count():
    rerank.check_request("q", ["a"], 0)
    rerank.check_request("q", ["a"], 5)
    with pytest.raises(InvalidArgument, match="top_n"):
        rerank.check_request("q", ["a"], -3)


def test_check_request_measures_texts_before_tokenizing():
    """A 40 MB document was tokenized for 67 s before it was refused (issue 41): the
    characters are counted first, against context x the longest token's characters, and
    the documents together against MAX_RERANK_TOKENS' worth."""
    b = Bounds(512, 81)  # 41,472 characters per text
    rerank.check_request("q" * 41_472, ["d" * 41_472], 0, b)
    with pytest.raises(InvalidArgument, match=r"documents\[1\] is 41473 characters"):
        rerank.check_request("q", ["d", "d" * 41_473], 0, b)
    with pytest.raises(InvalidArgument, match=r"query is 41473 characters"):
        rerank.check_request("q" * 41_473, ["d"], 0, b)
    with pytest.raises(InvalidArgument, match=r"documents add up to more than 810 characters"):
        rerank.check_request("q", ["d" * 500, "d" * 500], 0, b, max_tokens=10)


def test_identity_mismatch_is_not_found(served):
    code = code_of(lambda: served.stub.Rerank(request(ModelIdentity="another-model")))
    assert code == grpc.StatusCode.NOT_FOUND


def test_reply_is_sorted_by_score_with_every_field_and_top_n(served):
    docs = ["a", "a much longer document than the others here", "bb", "a"]
    res = served.stub.Rerank(request(documents=docs))
    scores = [r.relevance_score for r in res.results]
    assert sorted(r.index for r in res.results) == [0, 1, 2, 3]
    assert scores == sorted(scores, reverse=True)
    assert all(r.text == docs[r.index] for r in res.results)
    assert all(0 < s <= 1 for s in scores)
    assert res.usage.prompt_tokens == res.usage.total_tokens > 0
    # Equal documents score alike and keep their request order (llama.cpp's stable sort).
    same = [r.index for r in res.results if r.index in (0, 3)]
    assert same == [0, 3]
    top = served.stub.Rerank(request(documents=docs, top_n=2))
    assert list(top.results) == list(res.results[:2])
    assert len(served.stub.Rerank(request(documents=docs, top_n=9)).results) == 4


def test_reranking_is_accepted_at_load_with_the_mode_options():
    lp = load_params(backend_pb2.ModelOptions(Model="m", Reranking=True))
    assert (lp.rerank, lp.rerank_instruction) == ("auto", DEFAULT_RERANK_INSTRUCTION)
    lp = load_params(
        backend_pb2.ModelOptions(
            Model="m", Options=["rerank:YES_NO", "rerank_instruction:Find the answer"]
        )
    )
    assert (lp.rerank, lp.rerank_instruction) == ("yes_no", "Find the answer")
    with pytest.raises(ValueError, match="option rerank must be one of auto, yes_no, likelihood"):
        load_params(backend_pb2.ModelOptions(Model="m", Options=["rerank:cross"]))


def test_auto_mode_is_yes_no_for_a_reranker_name_with_a_template(tok):
    # The toy tokenizer has a chat template and byte tokens; "yes" is three of them.
    assert rerank.yes_no_ids(tok) is None
    assert rerank.choose_mode("auto", "org/Qwen3-Reranker-0.6B", tok) == "likelihood"
    with pytest.raises(InvalidArgument, match="rerank:likelihood"):
        rerank.choose_mode("yes_no", "m", tok)

    class OneTokenWords:
        has_chat_template = True

        def convert_tokens_to_ids(self, word):
            return {"yes": 7, "no": 9}[word]

    words = OneTokenWords()
    assert rerank.yes_no_ids(words) == (7, 9)
    assert rerank.choose_mode("auto", "/models/Qwen3-Reranker-4B-mlx", words) == "yes_no"
    assert rerank.choose_mode("auto", "mlx-community/Qwen3-4B", words) == "likelihood"
    assert rerank.choose_mode("likelihood", "x-reranker", words) == "likelihood"


def test_yes_no_prompt_is_the_judge_conversation_in_the_template(tok):
    text = rerank.yes_no_prompt(tok, "Find it", "q?", "doc.")
    # The toy template is Qwen's shape: with thinking off it ends in an empty think block,
    # as Qwen3-Reranker's card writes its suffix.
    assert text == (
        f"<|im_start|>system\n{rerank.JUDGE}<|im_end|>\n"
        "<|im_start|>user\n<Instruct>: Find it\n<Query>: q?\n<Document>: doc.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
