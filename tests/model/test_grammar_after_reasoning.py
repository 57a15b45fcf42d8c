"""Constraints after the reasoning, and lazy grammars, on the embedded SmolLM2 over gRPC.

The issue's setting (issue 31): a chat template that leaves a think block open (as
DeepSeek-R1 distills and Qwen3 thinking templates do) with `reasoning_parser:deepseek_r1`
markers ("<think>" / "</think>", several tokens in SmolLM2's vocabulary), LocalAI's JSON
mode (its JSON GBNF) or a json_schema, and a reasoning budget whose forced close hands
over to the grammar. The content alone must parse (and match the schema), the reasoning
streams as reasoning_content, and Predict equals the concatenated stream.
"""

from __future__ import annotations

import asyncio
import json
import threading

import grpc
import jsonschema
import pytest
from helpers import chat_request, greedy, stream_text
from inprocess import InProcessServer

import backend_pb2
import params

# LocalAI's JSON-mode grammar (pkg/functions/json_mode.go, as tests/model/test_grammar.py).
JSON_GBNF = r"""root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\] | "\\" (["\\/bfnrt] | "u" hex hex hex hex) )* "\"" ws
hex    ::= [0-9a-fA-F]
number ::= ("-"? ([0-9] | [1-9] [0-9]*)) ("." [0-9]+)? ([eE] [-+]? [0-9]+)? ws
ws ::= ([ \t\n] ws)?
"""

THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
PARIS = "The capital of France is"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def served(smol):
    model, tok = smol
    tok._tokenizer.chat_template = THINK_TEMPLATE  # this module's copy of the model
    srv = InProcessServer(model, tok, ["reasoning_parser:deepseek_r1"])
    yield srv
    srv.stop()


@pytest.mark.parametrize("kind", ["json_mode", "json_schema"])
def test_budget_hands_over_to_the_constraint_and_content_parses(served, kind):
    fields: dict = {"Tokens": 40, "Temperature": 0.0}
    if kind == "json_mode":
        fields["Grammar"] = JSON_GBNF
    req_meta = {"reasoning_budget": "4"}
    if kind == "json_schema":
        req_meta["json_schema"] = json.dumps(SCHEMA)
    content, reasoning, deltas = ask_with(served, fields, req_meta)
    assert reasoning.strip() and "{" not in reasoning  # free reasoning, streamed as such
    assert any(r for _, r in deltas) and any(c for c, _ in deltas)
    value = json.loads(content)
    assert isinstance(value, dict)
    if kind == "json_schema":
        jsonschema.validate(value, SCHEMA)


def test_scope_all_puts_the_json_in_the_reasoning_as_before(served):
    fields = {"Tokens": 12, "Temperature": 0.0, "Grammar": JSON_GBNF}
    _, reasoning, _ = ask_with(served, fields, {"reasoning_budget": "4", "grammar_scope": "all"})
    assert reasoning.lstrip().startswith("{")


def ask_with(srv, fields: dict, metadata: dict) -> tuple[str, str, list]:
    req = chat_request("Give me a person as JSON with a name and an age.", **fields)
    req.Metadata.update(metadata)
    replies = list(srv.stub.PredictStream(req, timeout=300))
    deltas = [(d.content, d.reasoning_content) for r in replies for d in r.chat_deltas]
    (whole,) = srv.stub.Predict(req, timeout=300).chat_deltas
    assert whole.content == "".join(c for c, _ in deltas)
    assert whole.reasoning_content == "".join(r for _, r in deltas)
    return whole.content, whole.reasoning_content, deltas


@pytest.fixture(scope="module")
def lazy(smol):
    """The plain SmolLM2 (no think markers) loaded with LocalAI's GrammarTriggers."""
    model, tok = smol
    srv = InProcessServer()
    words = [backend_pb2.GrammarTrigger(word=" Paris")]
    load = params.load_params(backend_pb2.ModelOptions(Model="smol", GrammarTriggers=words))
    asyncio.run_coroutine_threadsafe(srv.engine.install(model, tok, load), srv.loop).result(60)
    yield srv
    srv.stop()


LAZY_GBNF = 'root ::= " Paris, the city of light."'


def test_lazy_grammar_is_free_until_its_trigger_then_holds(lazy):
    free = lazy.stub.Predict(greedy(PARIS, 12), timeout=300).message.decode()
    assert " Paris" in free  # the model's own greedy text reaches the trigger
    before = free[: free.index(" Paris")]
    got = lazy.stub.Predict(greedy(PARIS, 24, Grammar=LAZY_GBNF), timeout=300).message.decode()
    assert got == before + " Paris, the city of light."  # the trigger included, then EOS


def test_lazy_grammar_without_its_trigger_leaves_the_output_alone(lazy):
    prompt = "1, 2, 3, 4,"
    free = lazy.stub.Predict(greedy(prompt, 8), timeout=300).message.decode()
    assert " Paris" not in free
    got = lazy.stub.Predict(greedy(prompt, 8, Grammar=LAZY_GBNF), timeout=300).message.decode()
    assert got == free


def test_output_ending_inside_the_reasoning_is_an_error_beside_an_innocent(served, smol):
    # Issue 41 item 2: a model biased to end (EOS) while still thinking never reaches the
    # grammar; the reply is FAILED_PRECONDITION naming the field, never an OK whose content
    # the grammar did not hold. A greedy stream running beside keeps its solo text.
    eos = smol[1].eos_token_id
    req = chat_request("Give me JSON.", Tokens=16, Temperature=0.0, Grammar=JSON_GBNF,
                       LogitBias=json.dumps({str(eos): 100}))  # fmt: skip
    innocent = greedy(PARIS, 24, IgnoreEOS=True)
    solo = stream_text(served.stub, innocent, 300)[0]
    beside: dict = {}

    def run_innocent() -> None:
        beside["text"] = stream_text(served.stub, innocent, 300)[0]

    thread = threading.Thread(target=run_innocent)
    thread.start()
    stub = served.stub
    for call in (stub.Predict, lambda r, timeout: list(stub.PredictStream(r, timeout=timeout))):
        with pytest.raises(grpc.RpcError) as info:
            call(req, timeout=300)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert info.value.details().startswith(
            "PredictOptions.Grammar: the output ended inside the reasoning"
        )
    thread.join(300)
    assert beside["text"] == solo
