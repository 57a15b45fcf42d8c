"""Tool-call grammars (decoding/tool_grammar.py) on the toy tokenizer: ToolChoice as LocalAI
sends it, when the grammar applies, and what the grammar lets through, token by token
(llguidance's matcher on the toy vocabulary; no model). Over gRPC on SmolLM2:
tests/model/test_tool_grammar.py.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from helpers import chat_request, grammar_accepts, grammar_matcher, served
from inprocess import InProcessServer
from scripted import ScriptedModel
from toy_tokenizer import EOS_TEXT, ids

import backend_pb2
import params
from decoding import grammar, parsers, tool_grammar
from decoding.tool_calls import merge_tool_call_deltas
from decoding.tool_grammar import HERMES, LLAMA_JSON
from engine import prepare
from errors import FailedPrecondition, InvalidArgument
from parsing.tool_choice import ToolChoice, read_tool_choice
from prompting import render as prompt_mod
from seam.tokenizer import vocab_size

UNITS = {"type": "string", "enum": ["c", "f"]}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": UNITS},
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {"type": "function", "function": {"name": "get_time"}},  # no parameters: any object
]
DECLARED = tool_grammar.declared_tools(TOOLS)
CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'


# --- ToolChoice as LocalAI sends it (json.Marshal of the request's tool_choice) -----------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", ToolChoice("auto")),
        ('"auto"', ToolChoice("auto")),
        ("auto", ToolChoice("auto")),
        ('"none"', ToolChoice("none")),
        ("none", ToolChoice("none")),
        ('"required"', ToolChoice("required")),
        ("REQUIRED", ToolChoice("required")),
        ('{"type": "function", "function": {"name": "f"}}', ToolChoice("function", "f")),
        ('{"type": "function", "name": "f"}', ToolChoice("function", "f")),
        (json.dumps(json.dumps({"type": "function", "function": {"name": "f"}})),
         ToolChoice("function", "f")),
        ('{"type": "required"}', ToolChoice("required")),
        ("{not json", ToolChoice("auto")),
        ("[1, 2]", ToolChoice("auto")),
        ("something else", ToolChoice("auto")),
    ],
)  # fmt: skip
def test_tool_choice_shapes(raw, expected):
    assert read_tool_choice(raw) == expected
    assert expected.forces_call == (expected.mode in ("required", "function"))


def test_quoted_none_offers_no_tools_to_the_template():
    spec = params.prompt_spec(
        backend_pb2.PredictOptions(
            UseTokenizerTemplate=True, Tools=json.dumps(TOOLS), ToolChoice='"none"',
            Messages=[backend_pb2.Message(role="user", content="hi")],
        )
    )  # fmt: skip
    assert spec.tool_choice == "none" and spec.template_tools is None


def test_declared_tools_skip_nameless_and_repeated():
    tools = [*TOOLS, {"type": "function", "function": {"name": "get_time", "parameters": 1}}]
    tools.append({"type": "function", "function": {"description": "no name"}})
    got = tool_grammar.declared_tools(tools)
    assert list(got) == ["get_weather", "get_time"]
    assert got["get_time"] == {"type": "object"}


# --- what the grammar lets through ---------------------------------------------------------


def test_hermes_calls_between_free_text(tok):
    fmt = tool_grammar.tool_format(tok)
    assert fmt == HERMES  # the toy template makes mlx-lm infer json_tools
    source = tool_grammar.build_grammar(DECLARED, fmt, special=tool_grammar._special_finder(tok))
    two = f'Sure.\n<tool_call>\n{CALL}\n</tool_call>\nand <tool_call>{{"name": "get_time", "arguments": {{}}}}</tool_call> done'  # noqa: E501
    assert grammar_accepts(tok, source, two)
    assert grammar_accepts(tok, source, "Hello world, no call at all")
    assert grammar_accepts(tok, source, "")  # EOS at once: free text may be empty
    assert not grammar_accepts(tok, source, 'Hi <tool_call>\n{"name": "delete_all"', ends=False)
    bad_args = '<tool_call>{"name": "get_weather", "arguments": {"city": 3'
    assert not grammar_accepts(tok, source, bad_args, ends=False)
    unit = '<tool_call>{"name": "get_weather", "arguments": {"city": "a", "unit": "k"'
    assert not grammar_accepts(tok, source, unit, ends=False)
    # An open call cannot end the output; its closing marker must follow the arguments.
    assert not grammar_accepts(tok, source, f"<tool_call>{CALL}")
    assert not grammar_accepts(tok, source, f"<tool_call>{CALL} text", ends=False)


def special(tok):
    return tool_grammar._special_finder(tok)


def test_required_opens_with_a_call(tok):
    source = tool_grammar.build_grammar(DECLARED, HERMES, opening="required", special=special(tok))
    assert not grammar_accepts(tok, source, "Hello", ends=False)
    assert not grammar_accepts(tok, source, "")  # no EOS before the call
    assert grammar_accepts(tok, source, f"\n<tool_call>\n{CALL}\n</tool_call>")
    assert grammar_accepts(tok, source, f"<tool_call>{CALL}</tool_call> and then text")


def test_triggered_grammar_starts_at_the_marker_as_text_or_token(tok):
    source = tool_grammar.build_grammar(DECLARED, HERMES, opening="triggered", special=special(tok))
    marker = tok.convert_tokens_to_ids("<tool_call>")
    text_marker = list(b"<tool_call>")  # how a TriggerGate's tokenize_bytes gives it back
    body = tok.encode(f"{CALL}</tool_call> then text", add_special_tokens=False)
    for opening in ([marker], text_marker):
        m = grammar_matcher(tok, source)
        assert m.consume_tokens([*opening, *body]) and m.is_accepting()
    assert not grammar_accepts(tok, source, "Hello", ends=False)


def test_named_function_only(tok):
    source = tool_grammar.build_grammar(
        {"get_time": {"type": "object"}}, HERMES, opening="required", special=special(tok)
    )
    assert grammar_accepts(
        tok, source, '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )
    assert not grammar_accepts(tok, source, f"<tool_call>{CALL}", ends=False)


def test_llama_json_calls(tok):
    source = tool_grammar.build_grammar(DECLARED, LLAMA_JSON)
    first = '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "f"}}'
    assert grammar_accepts(
        tok, source, f'Text first {first}; {{"name": "get_time", "parameters": {{}}}}'
    )
    assert not grammar_accepts(tok, source, '{"name": "get_wrong"', ends=False)
    assert not grammar_accepts(tok, source, '{"name": "get_weather", "arguments"', ends=False)
    required = tool_grammar.build_grammar(DECLARED, LLAMA_JSON, opening="required")
    assert grammar_accepts(tok, required, first) and not grammar_accepts(
        tok, required, "Hi", ends=False
    )


def test_special_token_marker_is_matched_as_the_token(tok):
    special = tok.convert_tokens_to_ids("<|im_start|>")
    fmt = tool_grammar.ToolFormat("test", "<|im_start|>", '{"name": ', "arguments", "")
    finder = tool_grammar._special_finder(tok)
    # Added tokens are special to llguidance, marked special or not (Qwen's <tool_call>).
    assert finder("<|im_start|>") == special
    assert finder("<tool_call>") == tok.convert_tokens_to_ids("<tool_call>")
    assert finder("{not json") is None  # text of several tokens
    source = tool_grammar.build_grammar(DECLARED, fmt, special=finder)
    assert f"<[{special}]>" in source
    m = grammar_matcher(tok, source)
    body = tok.encode('{"name": "get_time", "arguments": {}} after', add_special_tokens=False)
    assert m.consume_tokens([*tok.encode("Hi ", add_special_tokens=False), special, *body])


def test_too_many_tools_is_a_clear_error():
    tools = {f"tool_{i}": {"type": "object", "description": "x" * 400} for i in range(200)}
    with pytest.raises(ValueError, match=r"PredictOptions\.Tools: .* tool_grammar:off"):
        tool_grammar.build_grammar(tools, HERMES)


# --- when it applies (the prepare step) -----------------------------------------------------


def prepared(tok, options=(), **fields):
    meta = fields.pop("Metadata", {})
    req = backend_pb2.PredictOptions(Prompt="hi", Tools=json.dumps(TOOLS), **fields)
    req.Metadata.update(meta)
    return prepare.prepare(req, prepare.Intake(served(tok, 4096, tuple(options)))).request


@pytest.mark.parametrize(
    ("options", "fields", "applies"),
    [
        ((), {}, False),  # the default: only when a call is required
        ((), {"ToolChoice": '"auto"'}, False),
        ((), {"ToolChoice": '"required"'}, True),
        ((), {"ToolChoice": '{"type": "function", "function": {"name": "get_time"}}'}, True),
        (("tool_grammar:on",), {}, True),
        (("tool_grammar:on",), {"ToolChoice": '"none"'}, False),
        (("tool_grammar:off",), {"ToolChoice": '"required"'}, False),
        ((), {"Metadata": {"tool_grammar": "on"}}, True),
        (("tool_grammar:on",), {"Metadata": {"tool_grammar": "off"}}, False),
        # An explicit constraint wins (LocalAI's own function grammar, a JSON schema).
        ((), {"ToolChoice": '"required"', "Grammar": 'root ::= "x"'}, False),
        ((), {"ToolChoice": '"required"', "Metadata": {"json_schema": '{"type": "object"}'}},
         False),
    ],
)  # fmt: skip
def test_when_the_tool_grammar_applies(tok, options, fields, applies):
    request = prepared(tok, options, **fields)
    got = request.params.constraint
    assert (got is not None and got.kind == "lark") == applies
    if applies:
        assert got.field == "PredictOptions.Tools"
        # Not required: dormant until the call marker (a trigger), then the call.
        lazy = "ToolChoice" not in fields
        assert request.params.grammar_triggers == (("<tool_call>",) if lazy else ())


def test_named_function_limits_the_names(tok):
    choice = '{"type": "function", "function": {"name": "get_time"}}'
    source = prepared(tok, ToolChoice=choice).params.constraint.source
    assert "get_time" in source and "get_weather" not in source
    assert source.splitlines()[1].startswith("start: /")  # required: opens with a call


def test_named_function_not_declared_is_invalid(tok):
    choice = '{"type": "function", "function": {"name": "rm_rf"}}'
    with pytest.raises(InvalidArgument, match=r"ToolChoice names function 'rm_rf'.*get_weather"):
        prepared(tok, ToolChoice=choice)


def test_bad_metadata_value_names_the_field(tok):
    with pytest.raises(InvalidArgument, match=r"Metadata\.tool_grammar must be one of"):
        prepared(tok, Metadata={"tool_grammar": "maybe"})


def test_a_grammar_asked_for_a_format_without_one_is_an_error(tok):
    # Issue 41: asked for (a required call, tool_grammar on) and not buildable is an error
    # naming the field that asked, never calls that nothing held.
    jamba = parsers.apply_parser_overrides(tok, "jamba")
    assert tool_grammar.tool_format(jamba) is None
    assert tool_grammar.tool_format(parsers.apply_parser_overrides(tok, "llama3_json")) == (
        LLAMA_JSON
    )
    loaded = served(jamba, 4096)
    req = backend_pb2.PredictOptions(Prompt="hi", Tools=json.dumps(TOOLS), ToolChoice="required")
    with pytest.raises(FailedPrecondition, match=r"^PredictOptions\.ToolChoice: .*'<tool_calls>'"):
        prepare.prepare(req, prepare.Intake(loaded))
    req = backend_pb2.PredictOptions(Prompt="hi", Tools=json.dumps(TOOLS))
    req.Metadata["tool_grammar"] = "on"
    with pytest.raises(FailedPrecondition, match=r"^Metadata\.tool_grammar: .*tool_grammar:off"):
        prepare.prepare(req, prepare.Intake(loaded))
    req.Metadata["tool_grammar"] = "off"  # what the message says to send: unconstrained
    assert prepare.prepare(req, prepare.Intake(loaded)).request.params.constraint is None


def test_the_grammar_compiles_and_its_processor_masks(tok):
    request = prepared(tok, ToolChoice='"required"')
    processor = grammar.make_constraint_processor(request.params.constraint, tok, "normal")
    m = processor.matcher
    ids = tok.encode(f"<tool_call>{CALL}</tool_call>", add_special_tokens=False)
    assert m.consume_tokens(ids) and m.is_accepting()
    eos = tok.convert_tokens_to_ids(EOS_TEXT)
    assert m.consume_token(eos) and m.is_stopped()


# --- over gRPC: a scripted model certain of an undeclared name -----------------------------


@pytest.fixture(scope="module")
def scripted(tok):
    """{format: (server, model)}: the scripted model behind the real engine and servicer,
    with the toy tokenizer (its template leaves a think block open) and each parser."""
    servers = {}
    for fmt in ("hermes", "llama3_json"):
        model = ScriptedModel(vocab_size(tok), tok.eos_token_id)
        servers[fmt] = (InProcessServer(model, tok, [f"tool_parser:{fmt}"]), model)
    yield servers
    for srv, _ in servers.values():
        srv.stop()


def run_script(server, tok, req, *parts: str):
    """Predict's one delta for `req` with the model scripted to `parts`, after checking
    that the stream's content, reasoning and merged calls equal it."""
    srv, model = server
    model.set_script(
        len(prompt_mod.prepare_prompt(params.prompt_spec(req), tok).token_ids), ids(tok, *parts)
    )
    deltas = [d for r in srv.stub.PredictStream(req) for d in r.chat_deltas]
    (whole,) = srv.stub.Predict(req).chat_deltas
    assert whole.content == "".join(d.content for d in deltas)
    assert whole.reasoning_content == "".join(d.reasoning_content for d in deltas)
    merged = merge_tool_call_deltas(c for d in deltas for c in d.tool_calls)
    assert [(c.name, c.arguments) for c in merged] == [
        (c.name, c.arguments) for c in whole.tool_calls
    ]
    return whole


def checked_calls(whole) -> list[str]:
    """The calls' names, each call's arguments validated under its tool's schema."""
    for call in whole.tool_calls:
        jsonschema.validate(json.loads(call.arguments), BOUNDED[call.name])
    return [c.name for c in whole.tool_calls]


# Bounded (strings with maxLength, no other keys): a scripted model's flat logits would
# otherwise write a string until max_tokens once its script no longer fits.
BOUNDED = {
    "get_weather": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}, "unit": UNITS},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "get_time": {
        "type": "object",
        "properties": {"zone": {"type": "string", "maxLength": 4}},
        "required": ["zone"],
        "additionalProperties": False,
    },
}
BOUNDED_TOOLS = json.dumps(
    [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in BOUNDED.items()]
)
FORECAST = {
    "hermes": ["<tool_call>", 'b:\n{"name": "get_forecast", "arguments": {"city": "Rome"}}\n',
               "</tool_call>"],
    "llama3_json": ['b:{"name": "get_forecast", "parameters": {"city": "Rome"}}'],
}  # fmt: skip


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json"])
def test_lazy_call_after_reasoning_and_free_text(scripted, tok, fmt):
    req = chat_request("Hi", Tokens=80, Tools=BOUNDED_TOOLS, Metadata={"tool_grammar": "on"})
    parts = ["plan", "</think>", "Sure", "b: I will check.\n", *FORECAST[fmt]]
    whole = run_script(scripted[fmt], tok, req, *parts)
    assert whole.reasoning_content == "plan"  # the reasoning is free (the gate)
    assert whole.content.startswith("Sure I will check.\n")  # so is the text before the call
    assert checked_calls(whole) and checked_calls(whole)[0] in BOUNDED  # not get_forecast
    # Without the grammar the scripted name comes through.
    req.Metadata["tool_grammar"] = "off"
    assert [c.name for c in run_script(scripted[fmt], tok, req, *parts).tool_calls] == [
        "get_forecast"
    ]


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json"])
def test_required_call_when_the_model_would_only_talk(scripted, tok, fmt):
    req = chat_request("Hi", Tokens=80, Tools=BOUNDED_TOOLS, ToolChoice='"required"')
    whole = run_script(scripted[fmt], tok, req, "plan", "</think>", "Hello", " world", "!")
    assert whole.reasoning_content == "plan"
    assert checked_calls(whole)[0] in BOUNDED
    assert not whole.content.startswith("Hello")  # the call came first


# --- issue 41 item 2: only complete, schema-valid calls; no cut-off call with OK ------------

RECURSIVE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "description": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
        }
    },
    "$ref": "#/$defs/node",
}


def rpc_errors(server, tok, req, *parts: str) -> list[tuple]:
    """(code, details) of Predict and of PredictStream for `req` scripted to `parts`."""
    import grpc

    srv, model = server
    model.set_script(
        len(prompt_mod.prepare_prompt(params.prompt_spec(req), tok).token_ids), ids(tok, *parts)
    )
    errors = []
    for call in (lambda: srv.stub.Predict(req), lambda: list(srv.stub.PredictStream(req))):
        with pytest.raises(grpc.RpcError) as info:
            call()
        errors.append((info.value.code(), info.value.details()))
    return errors


def test_call_cut_by_the_token_limit_is_an_error_not_a_fragment(scripted, tok):
    import grpc

    # Issue 41: a recursive schema, the arguments' string cut by max_tokens: the stream had
    # already sent `{"name": "get_weather", "description": "` as the call's arguments.
    tools = json.dumps([{"type": "function", "function": {"name": "get_weather",
                                                          "parameters": RECURSIVE}}])  # fmt: skip
    req = chat_request("Hi", Tokens=30, Tools=tools, ToolChoice='"required"')
    req.Metadata["enable_thinking"] = "false"
    head = 'b:{"name": "get_weather", "arguments": {"name": "get_weather", "description": "'
    errors = rpc_errors(scripted["hermes"], tok, req, "<tool_call>", head, "b:" + "a" * 40)
    for code, details in errors:
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert details.startswith("PredictOptions.Tools: the token limit was reached inside")
    # With room to finish, the recursive schema's grammar holds and the call is complete.
    req.Tokens = 200
    end = 'b:", "children": [{"name": "x"}]}}'
    whole = run_script(scripted["hermes"], tok, req, "<tool_call>", head, "b:sunny", end,
                       "</tool_call>")  # fmt: skip
    (call,) = whole.tool_calls
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, RECURSIVE)
    assert arguments["children"] == [{"name": "x"}]


def test_without_a_grammar_calls_are_reported_as_the_parser_reads_them(scripted, tok):
    # No grammar (tool_grammar off): vLLM's parsers report a well-formed call whatever its
    # schema says (tests/tool_parsers/test_deepseekv32_tool_parser.py, conversion
    # fallbacks: `bad_int: "abc"` stays a call); a call turned into text stops an agent.
    req = chat_request("Hi", Tokens=80, Tools=BOUNDED_TOOLS, Metadata={"tool_grammar": "off"})
    req.Metadata["enable_thinking"] = "false"
    bad = 'b:{"name": "get_weather", "arguments": {"city": 3, "unit": "k"}}'
    whole = run_script(scripted["hermes"], tok, req, "<tool_call>", bad, "</tool_call>")
    assert [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == [
        ("get_weather", {"city": 3, "unit": "k"})
    ]
    assert whole.content == ""


# uniqueItems: a keyword llguidance does not enforce (lenient), so the grammar lets
# ["mon", "mon"] through and the final check is what catches it.
UNIQUE = {
    "type": "object",
    "properties": {"days": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
    "required": ["days"],
}
UNIQUE_TOOLS = json.dumps(
    [{"type": "function", "function": {"name": "plan", "parameters": UNIQUE}}]
)


def test_call_its_grammar_let_break_its_schema_is_an_error(scripted, tok):
    import grpc

    # Issue 41 item 2: a tool-call grammar was applied; a final call its schema rejects
    # is the constraint failing: INVALID_ARGUMENT naming the field, never an OK reply.
    req = chat_request("Hi", Tokens=80, Tools=UNIQUE_TOOLS, Metadata={"tool_grammar": "on"})
    req.Metadata["enable_thinking"] = "false"
    bad = 'b:{"name": "plan", "arguments": {"days": ["mon", "mon"]}}'
    for code, details in rpc_errors(scripted["hermes"], tok, req, "<tool_call>", bad,
                                    "</tool_call>"):  # fmt: skip
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert details.startswith("PredictOptions.Tools: the tool-call grammar could not hold")
        assert "non-unique" in details
    good = 'b:{"name": "plan", "arguments": {"days": ["mon", "tue"]}}'
    whole = run_script(scripted["hermes"], tok, req, "<tool_call>", good, "</tool_call>")
    assert [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == [
        ("plan", {"days": ["mon", "tue"]})
    ]
    # The same call without the grammar is reported as read (no schema filter).
    req.Metadata["tool_grammar"] = "off"
    whole = run_script(scripted["hermes"], tok, req, "<tool_call>", bad, "</tool_call>")
    assert [json.loads(c.arguments) for c in whole.tool_calls] == [{"days": ["mon", "mon"]}]


def test_tool_schema_that_is_no_schema_is_refused_when_a_grammar_is_built(tok):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": 12}}}]
    req = backend_pb2.PredictOptions(Prompt="hi", Tools=json.dumps(tools), ToolChoice="required")
    match = r"PredictOptions\.Tools: the parameters of function 'f' are not a valid JSON schema"
    with pytest.raises(InvalidArgument, match=match):
        prepare.prepare(req, prepare.Intake(served(tok, 4096)))


def test_named_function_is_one_call(tok):
    # OpenAI's named tool_choice: that function, once (no second call after it).
    named = {"get_time": {"type": "object"}}
    source = tool_grammar.build_grammar(
        named, HERMES, opening="required", special=special(tok), single=True
    )
    one = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    assert grammar_accepts(tok, source, one + " done")
    assert not grammar_accepts(tok, source, one + one)  # no second call
