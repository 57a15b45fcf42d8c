"""Exact streamed deltas through the real engine and servicer, over gRPC.

A scripted model (tests/scripted.py) replays fixed token ids through the toy tokenizer
with Qwen/Hermes-style think and tool-call markers (tests/toy_tokenizer.py). Asserts the
exact sequence of streamed deltas, that nothing is sent twice, and that the joined stream
equals Predict's structured reply. UTF-8 through the real SmolLM2 tokenizer:
tests/model/test_streaming.py.
"""

from __future__ import annotations

import json

import grpc
import pytest
from helpers import chat_request, joined_from
from inprocess import InProcessServer
from scripted import ScriptedModel
from toy_tokenizer import WEATHER, ids

import backend_pb2
import params
from prompting import render as prompt_mod
from seam.tokenizer import vocab_size

GET_TIME = '{"name": "get_time", "arguments": {}}'


@pytest.fixture(scope="module")
def served(tok):
    model = ScriptedModel(vocab_size(tok), tok.eos_token_id)
    srv = InProcessServer(model, tok)
    yield srv, model
    srv.stop()


def chat(**fields) -> backend_pb2.PredictOptions:
    return chat_request("Hi", Tokens=60, **fields)


def script(served, tok, req, *parts: str) -> None:
    _, model = served
    model.set_script(
        len(prompt_mod.prepare_prompt(params.prompt_spec(req), tok).token_ids), ids(tok, *parts)
    )


def view(replies) -> list[tuple]:
    """Per streamed reply: (content, reasoning, ((index, name, arguments), ...))."""
    out = []
    for r in replies:
        for d in r.chat_deltas:
            calls = tuple((c.index, c.name, c.arguments) for c in d.tool_calls)
            out.append((d.content, d.reasoning_content, calls))
    return out


def test_reasoning_content_and_tool_calls_stream_as_structured_deltas(served, tok):
    srv, _ = served
    req = chat()
    assert prompt_mod.prepare_prompt(params.prompt_spec(req), tok).text.endswith(
        "<think>\n"
    )  # opened by template
    script(
        served, tok, req,
        "Let", " me", " think", "</think>", "\n\n", "Sure", "!",
        "<tool_call>", "\n", WEATHER, "\n", "</tool_call>", "<tool_call>", GET_TIME, "</tool_call>",
    )  # fmt: skip
    replies = list(srv.stub.PredictStream(req))
    # Replies come one per engine step, or joined when this reader lags behind.
    assert joined_from(view(replies), [
        ("", "Let", ()),
        ("", " me", ()),
        ("", " think", ()),
        ("\n\n", "", ()),
        ("Sure", "", ()),
        ("!", "", ()),
        # Each call streams its name first (empty arguments), then argument fragments.
        ("", "", ((0, "get_weather", ""), (0, "", '{"city": "Paris"}'))),
        ("", "", ((1, "get_time", ""), (1, "", "{}"))),
    ]), view(replies)  # fmt: skip
    ids_seen = [c.id for r in replies for d in r.chat_deltas for c in d.tool_calls if c.id]
    assert len(set(ids_seen)) == 2 and all(i.startswith("call_") for i in ids_seen)
    for r in replies:  # message bytes are the content only: no markup, nothing repeated
        assert r.message.decode() == "".join(d.content for d in r.chat_deltas)
        assert b"<" not in r.message
    # Usage rides on every chunk; the last one has the totals (EOS included).
    assert [r.tokens for r in replies] == sorted(r.tokens for r in replies)
    assert replies[-1].tokens == 16 and replies[-1].prompt_tokens > 0

    whole = srv.stub.Predict(req)
    (d,) = whole.chat_deltas
    assert whole.message.decode() == d.content == "\n\nSure!"
    assert d.reasoning_content == "Let me think"
    calls = [(c.index, c.name, json.loads(c.arguments)) for c in d.tool_calls]
    assert calls == [(0, "get_weather", {"city": "Paris"}), (1, "get_time", {})]
    streamed = view(replies)
    assert "".join(v[0] for v in streamed) == d.content
    assert "".join(v[1] for v in streamed) == d.reasoning_content


def test_thinking_disabled_and_malformed_tool_call(served, tok):
    srv, _ = served
    req = chat()
    req.Metadata["enable_thinking"] = "false"
    assert prompt_mod.prepare_prompt(params.prompt_spec(req), tok).text.endswith("</think>\n\n")
    script(served, tok, req, "Sure", "<tool_call>", "{not json", "</tool_call>", "!")
    d = srv.stub.Predict(req).chat_deltas[0]
    assert d.reasoning_content == ""
    assert list(d.tool_calls) == []
    # A malformed call is returned as content (markers included), never dropped.
    assert d.content == "Sure<tool_call>{not json</tool_call>!"
    streamed = view(srv.stub.PredictStream(req))
    assert "".join(v[0] for v in streamed) == d.content


def test_stop_sequence_inside_scripted_content(served, tok):
    srv, _ = served
    req = chat(StopPrompts=["D!x"])
    script(served, tok, req, "</think>", "The", " EN", "D!", "xENDy", " more")
    streamed = view(srv.stub.PredictStream(req))
    assert "".join(v[0] for v in streamed) == "The EN"
    assert srv.stub.Predict(req).message.decode() == "The EN"


def test_model_metadata_reports_markers(served):
    srv, _ = served
    meta = srv.stub.ModelMetadata(backend_pb2.ModelOptions())
    assert meta.supports_thinking
    assert meta.rendered_template.endswith("<|im_start|>assistant\n<think>\n")
    tf = meta.tool_format
    assert (tf.format_type, tf.section_start, tf.section_end) == (
        "json_tools",
        "<tool_call>",
        "</tool_call>",
    )
    assert (tf.reasoning_start, tf.reasoning_end) == ("<think>", "</think>")


def test_tokens_minus_one_generates_until_eos(served, tok):
    srv, _ = served
    req = backend_pb2.PredictOptions(Prompt="Count:", Tokens=-1)
    script(served, tok, req, *([" more"] * 600))
    reply = srv.stub.Predict(req)
    assert reply.tokens == 601  # 600 scripted tokens, then EOS: not cut at the 512 default
    assert reply.message.decode() == " more" * 600
    req.Tokens = 0
    assert srv.stub.Predict(req).tokens == 512
    req.Tokens = -2
    with pytest.raises(grpc.RpcError) as err:
        srv.stub.Predict(req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_trailing_assistant_message_is_continued_over_grpc(served, tok):
    srv, _ = served
    req = chat()
    req.Messages.add(role="assistant", content='{"city": "')
    text = prompt_mod.prepare_prompt(params.prompt_spec(req), tok).text
    assert text.endswith('<|im_start|>assistant\n{"city": "')
    script(served, tok, req, "Hello", " world")
    d = srv.stub.Predict(req).chat_deltas[0]
    assert d.content == "Hello world"  # the continuation only; the prefill is the client's
