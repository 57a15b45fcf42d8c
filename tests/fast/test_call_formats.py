"""Tool-call grammars of the non-JSON formats (decoding/call_formats.py, issue 37 item 4):
for each parser name, the format's own text (as mlx-lm's / vLLM's parser of that name reads
it) passes the grammar token by token on the toy tokenizer and parses to the calls written;
undeclared names, undeclared parameters, values of the wrong type and missing required
parameters do not pass. Over gRPC with a scripted model: the end of this module.
"""

from __future__ import annotations

import json

import pytest
from helpers import PICK_TOOLS, chat_request, grammar_accepts, grammar_matcher
from inprocess import InProcessServer
from scripted import ScriptedModel
from toy_tokenizer import ids

import params
from decoding import call_formats, parsers, tool_grammar
from decoding.tool_calls import merge_tool_call_deltas, parse_tool_block
from prompting import render as prompt_mod
from seam.tokenizer import vocab_size

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ALARM = {
    "type": "object",
    "properties": {
        "hour": {"type": "integer"},
        "loud": {"type": "boolean"},
        "days": {"type": "array", "items": {"type": "string"}},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["hour"],
}
SCHEMAS = {"get_weather": WEATHER, "set_alarm": ALARM, "get_time": {"type": "object"}}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in SCHEMAS.items()]
EXPECTED = [
    ("get_weather", {"city": "Paris", "unit": "c"}),
    ("set_alarm", {"hour": 7, "loud": True, "days": ["mon", "tue"]}),
]

# name -> (the format's markers when the parser has none of its own, a block of two calls,
# a bad call for each rule: (what is wrong, text))
QWEN = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>"
    "<tool_call>\n<function=set_alarm>\n<parameter=hour>\n7\n</parameter>\n"
    '<parameter=loud>\ntrue\n</parameter>\n<parameter=days>\n["mon", "tue"]\n</parameter>\n'
    "</function>\n</tool_call>"
)
QWEN_BAD = {
    "name": "<tool_call>\n<function=§rm_rf>",
    "parameter": "<tool_call>\n<function=get_weather>\n<parameter=§country>",
    "type": "<tool_call>\n<function=set_alarm>\n<parameter=hour>\n§seven",
    "required": "<tool_call>\n<function=get_weather>\n<parameter=§unit>",
    "enum": "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n"
    "<parameter=unit>\n§k",
}
GLM = (
    "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
    "<arg_key>unit</arg_key><arg_value>c</arg_value></tool_call>"
    "<tool_call>set_alarm\n<arg_key>hour</arg_key>\n<arg_value>7</arg_value>\n"
    "<arg_key>loud</arg_key>\n<arg_value>true</arg_value>\n"
    '<arg_key>days</arg_key>\n<arg_value>["mon", "tue"]</arg_value>\n</tool_call>'
)
GLM_BAD = {
    "name": "<tool_call>§rm_rf<",
    "parameter": "<tool_call>get_weather<arg_key>§country<",
    "type": "<tool_call>set_alarm<arg_key>hour</arg_key><arg_value>§seven",
    "required": "<tool_call>get_weather<arg_key>§unit</arg_key>",
    "enum": "<tool_call>get_weather<arg_key>city</arg_key><arg_value>X</arg_value>"
    "<arg_key>unit</arg_key><arg_value>§k",
}
MINIMAX = (
    '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
    '<parameter name="unit">c</parameter>\n</invoke>\n<invoke name="set_alarm">\n'
    '<parameter name="hour">7</parameter>\n<parameter name="loud">true</parameter>\n'
    '<parameter name="days">["mon", "tue"]</parameter>\n</invoke>\n</minimax:tool_call>'
)
MINIMAX_BAD = {
    "name": '<minimax:tool_call>\n<invoke name="§rm_rf"',
    "parameter": '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="§country"',
    "type": '<minimax:tool_call>\n<invoke name="set_alarm">\n<parameter name="hour">§seven',
    "required": '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="§unit"',
    "enum": '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">X'
    '</parameter>\n<parameter name="unit">§k',
}
PY_CALLS = (
    "get_weather(city='Paris', unit=\"c\"), set_alarm(hour=7, loud=True, days=['mon', 'tue'])"
)
PY_BAD = {
    "name": "§rm_rf(",
    "parameter": "get_weather(§country=",
    "type": "set_alarm(hour=§'seven'",
    "required": "get_weather(§unit=",
    "enum": "get_weather(city='X', unit=§'k'",
}
PYTHONIC = f"[{PY_CALLS}]"  # vLLM's pythonic: a bare list where the output starts
MLX_PYTHONIC = f"<|tool_call_start|>[{PY_CALLS}]<|tool_call_end|>"  # mlx-lm's (LFM2)
OLMO = (
    "<function_calls>\nget_weather(city='Paris', unit=\"c\")\n"
    'set_alarm(hour=7, loud=true, days=["mon", "tue"])\n</function_calls>'
)
HARMONY = (
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city": "Paris", "unit": "c"}<|call|>'
)
HARMONY_CALL = "<|channel|>commentary to=functions."
HARMONY_BAD = {
    "name": "<|channel|>commentary to=functions.§rm_rf ",
    "parameter": HARMONY_CALL + 'get_weather <|constrain|>json<|message|>{§"country"',
    "type": HARMONY_CALL + 'set_alarm <|constrain|>json<|message|>{"hour": §"seven',
    "required": HARMONY_CALL + 'get_weather <|constrain|>json<|message|>{§"unit": "c"}<|call|>',
    "enum": HARMONY_CALL + 'get_weather <|constrain|>json<|message|>{"city": "X", "unit": §"k',
}
FORMATS = {
    "qwen3_coder": (QWEN, QWEN_BAD),
    "qwen3_xml": (QWEN, QWEN_BAD),
    "glm47": (GLM, GLM_BAD),
    "glm45": (GLM, GLM_BAD),
    "minimax_m2": (MINIMAX, MINIMAX_BAD),
    "pythonic": (PYTHONIC, {k: "[" + v for k, v in PY_BAD.items()}),
    "lfm2": (MLX_PYTHONIC, {k: "<|tool_call_start|>[" + v for k, v in PY_BAD.items()}),
    "olmo3": (OLMO, {k: "<function_calls>\n" + v for k, v in PY_BAD.items()}),
    "openai": (HARMONY, HARMONY_BAD),
}


def fmt_of(name: str):
    _, start, end = parsers.resolve_tool_parser(name)
    return tool_grammar.GRAMMARS[name](start, end), start, end


def blocks(text: str, start: str, end: str) -> list[str]:
    """The text between each pair of markers (what the output pipeline hands the parser);
    a list at the content's start (pythonic's `[`, part of the calls' text) is one block."""
    if start == "[":
        return [text]
    out = []
    for part in text.split(start)[1:]:
        out.append(part.split(end)[0] if end else part)
    return out


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_the_formats_own_text_passes_and_parses_to_the_calls(tok, name):
    text, _ = FORMATS[name]
    fmt, start, end = fmt_of(name)
    source = tool_grammar.build_grammar(
        tool_grammar.declared_tools(TOOLS), fmt, special=tool_grammar._special_finder(tok)
    )
    lead = "" if fmt.leading else "Let me check.\n"  # a bare list counts only at the start
    assert grammar_accepts(tok, source, f"{lead}{text}")
    parser = parsers.resolve_tool_parser(name)[0]
    calls = [c for b in blocks(text, start, end) for c in parse_tool_block(parser, b, TOOLS)]
    want = EXPECTED[:1] if name == "openai" else EXPECTED
    assert [(c.name, json.loads(c.arguments)) for c in calls] == want


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("wrong", ["name", "parameter", "type", "required", "enum"])
def test_undeclared_names_parameters_and_wrong_values_do_not_pass(tok, name, wrong):
    _, bad = FORMATS[name]
    fmt, _, _ = fmt_of(name)
    finder = tool_grammar._special_finder(tok)
    for opening in ("lazy", "required"):
        source = tool_grammar.build_grammar(
            tool_grammar.declared_tools(TOOLS), fmt, opening=opening, special=finder
        )
        good, wrong_part = bad[wrong].split("§")
        assert grammar_accepts(tok, source, good, ends=False), (opening, good)
        assert not grammar_accepts(tok, source, good + wrong_part, ends=False), (
            opening,
            wrong_part,
        )


def test_bare_pythonic_list_counts_only_at_the_start():
    # vLLM's pythonic parser (no markers): the output is a list of calls, or text.
    fmt = call_formats.GRAMMARS["pythonic"]("", "")
    assert fmt.leading and not fmt.repeat
    declared = tool_grammar.declared_tools(TOOLS)
    from toy_tokenizer import toy_tokenizer

    tok = toy_tokenizer()
    lazy = tool_grammar.build_grammar(declared, fmt, opening="lazy")
    assert grammar_accepts(tok, lazy, f"[{PY_CALLS}]")
    # The list is the whole output (vLLM reads text after it as no call): nothing follows.
    assert not grammar_accepts(tok, lazy, f" [{PY_CALLS}] and some text after", ends=False)
    assert not grammar_accepts(tok, lazy, f"[{PY_CALLS}]\n", ends=False)
    parser = parsers.resolve_tool_parser("pythonic")[0]
    with pytest.raises(ValueError):
        parse_tool_block(parser, f"[{PY_CALLS}] and some text after", TOOLS)
    assert grammar_accepts(tok, lazy, "Just talking, see [1] and [rm_rf()].")  # not at the start
    assert grammar_accepts(tok, lazy, "")
    assert not grammar_accepts(tok, lazy, "[rm_rf(", ends=False)
    required = tool_grammar.build_grammar(declared, fmt, opening="required")
    assert not grammar_accepts(tok, required, "Just talking", ends=False)
    assert grammar_accepts(tok, required, "[get_time()]")


def test_mlx_lm_pythonic_block_is_constrained_as_its_parser_reads_it(tok):
    # No tool_parser hint: mlx-lm infers its own pythonic parser (mlx_lm/tool_parsers/
    # pythonic.py) and LFM2's markers from the chat template; the grammar is that block's.
    from mlx_lm.tool_parsers import pythonic as mlx_pythonic

    wrapper = type("Tok", (), {})()
    wrapper.tool_parser = mlx_pythonic.parse_tool_call
    wrapper.tool_call_start, wrapper.tool_call_end = "<|tool_call_start|>", "<|tool_call_end|>"
    assert tool_grammar.format_name(wrapper) == "pythonic"
    fmt = tool_grammar.tool_format(wrapper)
    assert fmt is not None and not fmt.leading and fmt.start == "<|tool_call_start|>"
    source = tool_grammar.build_grammar(tool_grammar.declared_tools(TOOLS), fmt)
    assert grammar_accepts(tok, source, f"Let me check.\n{MLX_PYTHONIC}")
    assert not grammar_accepts(tok, source, "Let me check.\n<|tool_call_start|>[rm_rf(", ends=False)
    (block,) = blocks(MLX_PYTHONIC, fmt.start, "<|tool_call_end|>")
    calls = parse_tool_block(wrapper.tool_parser, block, TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == EXPECTED


def test_glm_string_values_are_read_as_written(tok):
    # vLLM's glm4_moe_tool_parser.py keeps a string value as written (`c\n` is not `c`),
    # so the grammar allows no newline around one; JSON values may have one.
    fmt, _, _ = fmt_of("glm47")
    finder = tool_grammar._special_finder(tok)
    source = tool_grammar.build_grammar(tool_grammar.declared_tools(TOOLS), fmt, special=finder)
    head = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
    assert grammar_accepts(tok, source, head + "<arg_key>unit</arg_key><arg_value>c", ends=False)
    assert not grammar_accepts(
        tok, source, head + "<arg_key>unit</arg_key><arg_value>c\n", ends=False
    )
    alarm = "<tool_call>set_alarm<arg_key>hour</arg_key><arg_value>7\n</arg_value></tool_call>"
    assert grammar_accepts(tok, source, alarm)
    parser = parsers.resolve_tool_parser("glm47")[0]
    text = "get_weather<arg_key>city</arg_key><arg_value> Paris\n</arg_value>"
    (call,) = parse_tool_block(parser, text, TOOLS)
    assert json.loads(call.arguments) == {"city": " Paris\n"}


def test_grammars_are_the_registered_formats_own(tok):
    # Each format module holds its grammar builder (ToolFormat.grammar); tool_grammar
    # finds it through the format the tokenizer carries, not by the parser's identity.
    from decoding import tool_formats

    assert set(tool_grammar.GRAMMARS) >= set(FORMATS) | {"hermes", "llama3_json"}
    for name, build in tool_grammar.GRAMMARS.items():
        assert tool_formats.get(name).grammar is build
    assert tool_grammar.format_name(parsers.apply_parser_overrides(tok, "glm45")) == "glm45"
    jamba = parsers.apply_parser_overrides(tok, "jamba")  # a format with no grammar yet
    assert tool_formats.of(jamba).name == "jamba" and tool_grammar.format_name(jamba) is None


def test_each_format_is_found_from_the_tokenizers_parser(tok):
    for name in FORMATS:
        hinted = parsers.apply_parser_overrides(tok, name)
        got = tool_grammar.format_name(hinted)
        # Names sharing one parser resolve to the first registered (same grammar).
        assert got is not None and tool_grammar.GRAMMARS[got] is tool_grammar.GRAMMARS[name]


# --- over gRPC: a scripted model that would call an undeclared tool ------------------------

# The undeclared name has the declared one's length, so the script lines up again after
# it (`PICK`: an enum value only).
GRPC_FORMATS = {
    "qwen3_coder": ["<tool_call>", "b:\n<function=kill>\n</function>\n", "</tool_call>"],
    "glm47": ["<tool_call>", "b:kill", "</tool_call>"],
    "pythonic": ["b:[kill(unit='c')]"],
    "lfm2": ["b:<|tool_call_start|>[kill(unit='c')]<|tool_call_end|>"],  # markers as text here
}


@pytest.fixture(scope="module")
def scripted(tok):
    servers = {}
    for name in GRPC_FORMATS:
        model = ScriptedModel(vocab_size(tok), tok.eos_token_id)
        servers[name] = (InProcessServer(model, tok, [f"tool_parser:{name}"]), model)
    yield servers
    for srv, _ in servers.values():
        srv.stop()


def calls_of(server, tok, req, *parts: str) -> list[tuple[str, dict]]:
    """Predict's calls for `req` scripted to `parts`, after checking the stream agrees."""
    srv, model = server
    prompt = len(prompt_mod.prepare_prompt(params.prompt_spec(req), tok).token_ids)
    model.set_script(prompt, ids(tok, *parts))
    deltas = [d for r in srv.stub.PredictStream(req) for d in r.chat_deltas]
    (whole,) = srv.stub.Predict(req).chat_deltas
    assert whole.content == "".join(d.content for d in deltas)
    merged = merge_tool_call_deltas(c for d in deltas for c in d.tool_calls)
    got = [(c.name, json.loads(c.arguments)) for c in whole.tool_calls]
    assert [(c.name, json.loads(c.arguments)) for c in merged] == got
    return got


@pytest.mark.parametrize("name", sorted(GRPC_FORMATS))
def test_scripted_undeclared_call_is_held_to_the_declared_tool(scripted, tok, name):
    req = chat_request("Hi", Tokens=120, Tools=PICK_TOOLS, Metadata={"tool_grammar": "on"})
    req.Metadata["enable_thinking"] = "false"
    assert calls_of(scripted[name], tok, req, *GRPC_FORMATS[name]) == [("pick", {"unit": "c"})]
    req.Metadata["tool_grammar"] = "off"  # without the grammar the scripted name comes through
    assert [c[0] for c in calls_of(scripted[name], tok, req, *GRPC_FORMATS[name])] == ["kill"]


# Not pythonic: past the script, the lowest id between ", " and "]" is "," (another call).
@pytest.mark.parametrize("name", ["glm47", "qwen3_coder"])
def test_scripted_talk_under_a_required_call_becomes_the_call(scripted, tok, name):
    req = chat_request("Hi", Tokens=120, Tools=PICK_TOOLS, ToolChoice='"required"')
    req.Metadata["enable_thinking"] = "false"
    assert calls_of(scripted[name], tok, req, "Hello", " world") == [("pick", {"unit": "c"})]


@pytest.mark.parametrize("name", ["qwen3_coder", "glm47", "minimax_m2"])
def test_raw_string_values_keep_their_max_length(tok, name):
    # A model that never writes the closing tag would otherwise fill max_tokens.
    short = {"type": "object", "properties": {"code": {"type": "string", "maxLength": 3}}}
    fmt, _, _ = fmt_of(name)
    finder = tool_grammar._special_finder(tok)
    source = tool_grammar.build_grammar({"f": short}, fmt, opening="required", special=finder)
    heads = {
        "qwen3_coder": ("<tool_call>\n<function=f>\n<parameter=code>\n", "\n</parameter>"),
        "glm47": ("<tool_call>f<arg_key>code</arg_key><arg_value>", "</arg_value>"),
        "minimax_m2": ('<minimax:tool_call>\n<invoke name="f">\n<parameter name="code">',
                       "</parameter>"),
    }  # fmt: skip
    head, close = heads[name]
    assert grammar_accepts(tok, source, head + "abc" + close, ends=False)
    assert not grammar_accepts(tok, source, head + "abcd", ends=False)


def test_pythonic_string_values_keep_their_max_length(tok):
    short = {"type": "object", "properties": {"code": {"type": "string", "maxLength": 3}}}
    fmt, _, _ = fmt_of("olmo3")
    source = tool_grammar.build_grammar({"f": short}, fmt, opening="required")
    assert grammar_accepts(tok, source, "<function_calls>\nf(code='abc')\n</function_calls>")
    assert grammar_accepts(tok, source, '<function_calls>\nf(code="a\\"c")', ends=False)
    assert not grammar_accepts(tok, source, "<function_calls>\nf(code='abcd", ends=False)


def test_harmony_with_its_markers_as_special_tokens(tok):
    # gpt-oss writes <|channel|>, <|constrain|>, <|message|>, <|call|> as special tokens;
    # the toy vocabulary's four added markers stand in for them here.
    think, unthink, call, uncall = tok.convert_tokens_to_ids(
        ["<think>", "</think>", "<tool_call>", "</tool_call>"]
    )
    ids_of = {"<|channel|>": think, "<|message|>": unthink, "<|constrain|>": call,
              "<|call|>": uncall}  # fmt: skip
    fmt, _, _ = fmt_of("openai")
    declared = tool_grammar.declared_tools(TOOLS)
    source = tool_grammar.build_grammar(
        declared, fmt, opening="required", special=ids_of.get, single=False
    )
    assert f"<[{uncall}]>?" in source  # <|call|> optional: gpt-oss stops on it (an EOS id)

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    args = '{"city": "Paris", "unit": "c"}'
    good = [think, *enc("commentary to=functions.get_weather "), call, *enc("json"), unthink,
            *enc(args), uncall]  # fmt: skip
    m = grammar_matcher(tok, source)
    assert m.validate_tokens(good) == len(good)
    bad = [think, *enc("commentary to=functions.rm_rf")]
    assert m.validate_tokens(bad) < len(bad)
