"""Tool-call grammars over real gRPC (issue 31 item 3): hermes `<tool_call>` and Llama 3 JSON
calls held to the declared tools, in process (`inprocess.InProcessServer`).

- ToolChoice "required" / a named function, on the tiny random-weight llama (the embedded
  tokenizer, `tool_parser` hint per format) with a +30 logit bias on "delete": the call
  still names a declared tool (or the named one), its arguments parse and validate under
  the tool's schema with `jsonschema`, and Predict equals the merged stream.

Lazy calls between free text, beside reasoning, with a scripted model certain of an
undeclared name: tests/fast/test_tool_grammar.py (over gRPC too).
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import tiny_models
from helpers import chat_request
from inprocess import InProcessServer

import backend_pb2
from decoding.tool_calls import merge_tool_call_deltas
from loading import model_loader

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "unit": {"type": "string", "enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 6}},
    "required": ["zone"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
TOOLS = json.dumps(
    [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in SCHEMAS.items()]
)
FORMATS = ("hermes", "llama3_json")


def calls_of(srv: InProcessServer, req: backend_pb2.PredictOptions) -> tuple[str, list]:
    """The reply's content and calls [(name, arguments)], after checking that Predict
    equals the stream."""
    stream = [d for r in srv.stub.PredictStream(req, timeout=300) for d in r.chat_deltas]
    (whole,) = srv.stub.Predict(req, timeout=300).chat_deltas
    assert whole.content == "".join(d.content for d in stream)
    merged = merge_tool_call_deltas(c for d in stream for c in d.tool_calls)
    assert [(c.name, c.arguments) for c in merged] == [
        (c.name, c.arguments) for c in whole.tool_calls
    ]
    return whole.content, [(c.name, json.loads(c.arguments)) for c in whole.tool_calls]


def valid(call: tuple[str, dict]) -> bool:
    name, arguments = call
    jsonschema.validate(arguments, SCHEMAS[name])
    return True


@pytest.fixture(scope="module")
def tiny(model_root):
    model, tok = model_loader.load_model(str(tiny_models.build("llama", model_root)))
    servers = {f: InProcessServer(model, tok, [f"tool_parser:{f}"]) for f in FORMATS}
    yield servers, tok
    for srv in servers.values():
        srv.stop()


def biased(tok, **fields) -> backend_pb2.PredictOptions:
    bias = {str(i): 30 for i in tok.encode("delete", add_special_tokens=False)}
    return chat_request(
        "What time is it?", Tokens=48, Temperature=0.0, Tools=TOOLS,
        LogitBias=json.dumps(bias), **fields,
    )  # fmt: skip


@pytest.mark.parametrize("fmt", FORMATS)
def test_required_call_names_a_declared_tool_despite_the_bias(tiny, fmt):
    servers, tok = tiny
    req = biased(tok, ToolChoice='"required"')
    _, calls = calls_of(servers[fmt], req)
    first = calls[0]
    assert first[0] in SCHEMAS and all(valid(c) for c in calls)
    # Without the grammar the biased model writes no call at all.
    req.Metadata["tool_grammar"] = "off"
    reply = servers[fmt].stub.Predict(req, timeout=300)
    assert not reply.chat_deltas[0].tool_calls and "delete" in reply.message.decode()


@pytest.mark.parametrize("fmt", FORMATS)
def test_named_function_is_the_one_called(tiny, fmt):
    servers, tok = tiny
    choice = json.dumps({"type": "function", "function": {"name": "get_time"}})
    _, calls = calls_of(servers[fmt], biased(tok, ToolChoice=choice))
    assert calls[0][0] == "get_time" and valid(calls[0])
