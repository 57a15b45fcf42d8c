"""Tool-call grammars over real gRPC (issue 31 item 3, issue 37 item 4): hermes `<tool_call>`,
Llama 3 JSON, Qwen3-Coder XML parameters and pythonic lists held to the declared tools, in
process (`inprocess.InProcessServer`).

- ToolChoice "required" / a named function, on the tiny random-weight llama (the embedded
  tokenizer, `tool_parser` hint per format) with a +30 logit bias on "delete": the call
  still names a declared tool (or the named one), its arguments parse and validate under
  the tool's schema with `jsonschema`, and Predict equals the merged stream; an innocent
  greedy stream running beside keeps its solo text.
- Issue 41 item 2: a call the token limit cuts (a recursive schema, as reported) ends with
  RESOURCE_EXHAUSTED naming PredictOptions.Tools, never an OK reply with a fragment.

Lazy calls between free text, beside reasoning, with a scripted model certain of an
undeclared name: tests/fast/test_tool_grammar.py (over gRPC too).
"""

from __future__ import annotations

import json
import threading

import grpc
import jsonschema
import pytest
import tiny_models
from helpers import chat_request, greedy, stream_text
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
FORMATS = ("hermes", "llama3_json", "qwen3_coder", "pythonic")
INNOCENT = greedy("Once upon a time, in a small village,", 40, IgnoreEOS=True)


class Beside:
    """An innocent greedy stream in a thread while the block runs: `text`, `error`."""

    def __init__(self, stub) -> None:
        self.stub, self.text, self.error = stub, "", ""
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            for reply in self.stub.PredictStream(INNOCENT, timeout=300):
                self.started.set()
                self.text += reply.message.decode("utf-8")
        except grpc.RpcError as err:
            self.error = f"{err.code().name}: {err.details()}"
        finally:
            self.started.set()

    def __enter__(self) -> Beside:
        self.thread.start()
        assert self.started.wait(300)
        return self

    def __exit__(self, *exc) -> None:
        self.thread.join(300)


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
    fields = {"Tools": TOOLS, "Tokens": 80, **fields}
    return chat_request("What time is it?", Temperature=0.0, LogitBias=json.dumps(bias), **fields)


@pytest.mark.parametrize("fmt", FORMATS)
def test_required_call_names_a_declared_tool_despite_the_bias(tiny, fmt):
    servers, tok = tiny
    # The biased model lists five pythonic calls before it closes the list.
    req = biased(tok, ToolChoice='"required"', Tokens=200 if fmt == "pythonic" else 80)
    solo = stream_text(servers[fmt].stub, INNOCENT, 300)[0]
    with Beside(servers[fmt].stub) as innocent:
        _, calls = calls_of(servers[fmt], req)
    assert (innocent.error, innocent.text) == ("", solo)
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


RECURSIVE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "description": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["name", "description"],
        }
    },
    "$ref": "#/$defs/node",
}


def test_call_cut_by_the_token_limit_is_an_error_beside_an_innocent(tiny):
    # Issue 41: a recursive schema's call cut by max_tokens came back OK with arguments
    # `{"name": "get_weather", "description": "`; now a status naming the field.
    servers, tok = tiny
    srv = servers["hermes"]
    tools = json.dumps(
        [{"type": "function", "function": {"name": "get_weather", "parameters": RECURSIVE}}]
    )
    req = biased(tok, ToolChoice='"required"', Tools=tools, Tokens=24)
    solo = stream_text(srv.stub, INNOCENT, 300)[0]
    for call in (
        srv.stub.Predict,
        lambda r, timeout: list(srv.stub.PredictStream(r, timeout=timeout)),
    ):
        with Beside(srv.stub) as innocent, pytest.raises(grpc.RpcError) as info:
            call(req, timeout=300)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert info.value.details().startswith("PredictOptions.Tools: the token limit was reached")
        assert (innocent.error, innocent.text) == ("", solo)
