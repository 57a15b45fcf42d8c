"""Tool-call arguments stream as they are generated, for every format mlx-lm parses.

Scripted model text is tokenized with the real SmolLM2 tokenizer (markers are several tokens
there, so they are also found across token boundaries), the ids are fed to `OutputPipeline`
one by one, and the streamed `ToolCallDelta`s are checked: a call's first piece has index,
id and name with arguments "", later pieces only argument fragments that join to exactly the
final arguments; whole-only formats send each call as one piece; malformed markup is content.
"""

from __future__ import annotations

import json
import logging

import pytest
from mlx_lm.tool_parsers import (
    json_tools,
    kimi_k2,
    minimax_m2,
    mistral,
    pythonic,
    qwen3_coder,
)

from decoding.output import OutputPipeline
from decoding.parsers import apply_parser_overrides
from decoding.tool_calls import ToolCall, ToolCallDelta, merge_tool_call_deltas
from seam import tokenizer as seam_tokenizer


def with_parser(base, module=None, *, vllm: str = ""):
    """A copy of the tokenizer wrapper using an mlx-lm parser module or a vLLM parser name."""
    if vllm:
        return apply_parser_overrides(base, vllm, "")
    return seam_tokenizer.rebuild(
        base, tool=(module.parse_tool_call, module.tool_call_start, module.tool_call_end)
    )


def needs_several_calls(module, block: str) -> None:
    """Skip unless ``module`` (an mlx-lm tool parser) reads ``block`` as several calls: the
    mistral and pythonic parsers of mlx-lm's main branch read one call only."""
    try:
        several = isinstance(module.parse_tool_call(block), list)
    except ValueError:
        several = False
    if not several:
        pytest.skip(f"this mlx-lm's {module.__name__} parser reads one call only")


def stream(tok, text: str, tools=None, reason: str = "stop"):
    """Feed `text`'s token ids one by one; returns (per-token deltas + finish's, pipeline)."""
    pipe = OutputPipeline(tok, tools=tools)
    deltas = [pipe.feed(t) for t in tok.encode(text, add_special_tokens=False)]
    deltas.append(pipe.finish(reason))
    return deltas, pipe


def pieces(deltas) -> list[ToolCallDelta]:
    return [p for d in deltas for p in d.tool_calls]


def check_streamed(deltas, pipe, expected: list[tuple[str, dict]]) -> list[list[str]]:
    """The shape every streamed call must have; returns each call's argument fragments."""
    calls = pipe.tool_calls
    assert [(c.index, c.name) for c in calls] == [(i, n) for i, (n, _) in enumerate(expected)]
    assert [json.loads(c.arguments) for c in calls] == [a for _, a in expected]
    assert merge_tool_call_deltas(pieces(deltas)) == calls
    fragments = []
    for call in calls:
        mine = [p for p in pieces(deltas) if p.index == call.index]
        assert (mine[0].id, mine[0].name, mine[0].arguments) == (call.id, call.name, "")
        assert all(not p.name and not p.id and p.arguments and not p.dropped for p in mine[1:])
        assert "".join(p.arguments for p in mine) == call.arguments
        fragments.append([p.arguments for p in mine[1:]])
    return fragments


def first_delta_with(deltas, predicate) -> int:
    return next(i for i, d in enumerate(deltas) if any(predicate(p) for p in d.tool_calls))


# --- JSON formats: the raw argument text streams as generated ---------------------------


WRITE = (
    '{"name": "write_file", "arguments": {"path":"a.py", '
    '"content": "print(\'hi\')\\nx = {\\"k\\": [1, 2]}\\n"}}'
)


def test_hermes_streams_raw_arguments_two_calls(smollm):
    tok = with_parser(smollm, vllm="hermes")
    text = (
        f"Sure.<tool_call>\n{WRITE}\n</tool_call>\n"
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    deltas, pipe = stream(tok, text)
    args = {"path": "a.py", "content": "print('hi')\nx = {\"k\": [1, 2]}\n"}
    frags = check_streamed(deltas, pipe, [("write_file", args), ("get_time", {})])
    # The raw text as generated is the final arguments, not a re-serialisation.
    assert pipe.tool_calls[0].arguments == WRITE[WRITE.index('{"path"') : -1]
    assert len(frags[0]) > 5 and frags[1] == ["{}"]
    # Exact sequence for the first call: SmolLM2's tokens of the arguments, one per delta.
    body = WRITE[WRITE.index('{"path"') : -1]
    assert "".join(frags[0]) == body and frags[0][0].startswith("{")
    assert frags[0][-1].endswith("}") and pipe.content == "Sure.\n"
    # The name is out before the arguments end, and those before the closing marker.
    named = first_delta_with(deltas, lambda p: p.name == "write_file")
    last_frag = max(i for i, d in enumerate(deltas) for p in d.tool_calls if p.index == 0)
    assert named < last_frag < text.index("</tool_call>")  # token count < char count
    assert pipe.tool_calls[0].id.startswith("call_")


def test_hermes_deltas_are_exactly_the_tokens_of_the_arguments(smollm):
    tok = with_parser(smollm, json_tools)
    deltas, pipe = stream(tok, '<tool_call>{"name": "f", "arguments": {"a": "xyz"}}</tool_call>')
    seq = [(p.index, p.name, p.arguments) for d in deltas for p in d.tool_calls]
    ids = tok.encode('{"name": "f", "arguments": {"a": "xyz"}}', add_special_tokens=False)
    # Every piece after the name is the text of the arguments that one token added.
    assert seq[0] == (0, "f", "")
    assert "".join(a for _, _, a in seq[1:]) == '{"a": "xyz"}'
    assert len(seq) - 1 >= 3 and len(seq) - 1 <= len(ids)
    assert pipe.tool_calls == [ToolCall(0, pipe.tool_calls[0].id, "f", '{"a": "xyz"}')]


def test_mistral_calls_stream_one_after_another(smollm):
    needs_several_calls(mistral, 'get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}')
    tok = with_parser(smollm, mistral)
    text = 'Ok[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}'
    deltas, pipe = stream(tok, text)
    check_streamed(deltas, pipe, [("get_weather", {"city": "Paris"}), ("get_time", {})])
    assert pipe.content == "Ok"
    # The first call is complete before the second one's name is known.
    first_done = max(i for i, d in enumerate(deltas) for p in d.tool_calls if p.index == 0)
    assert first_done < first_delta_with(deltas, lambda p: p.name == "get_time")


def test_kimi_k2_keeps_the_models_call_ids(smollm):
    tok = with_parser(smollm, kimi_k2)
    call = "<|tool_call_begin|>functions.{}:{}<|tool_call_argument_begin|>{}<|tool_call_end|>"
    text = (
        "<|tool_calls_section_begin|>"
        + call.format("get_weather", 0, '{"city": "Paris"}')
        + call.format("get_time", 1, "{}")
        + "<|tool_calls_section_end|>"
    )
    deltas, pipe = stream(tok, text)
    check_streamed(deltas, pipe, [("get_weather", {"city": "Paris"}), ("get_time", {})])
    assert [c.id for c in pipe.tool_calls] == ["functions.get_weather:0", "functions.get_time:1"]


TWO = '[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]'


@pytest.mark.parametrize(
    ("name", "text"),
    [
        (
            "internlm",
            '<|action_start|><|plugin|>{"name": "f", "parameters": {"a": 1}}<|action_end|>',
        ),
        ("jamba", f"<tool_calls>{TWO}</tool_calls>"),
        ("granite", f"<|tool_call|>{TWO}"),
    ],
)
def test_json_formats_from_vllm_names_stream(smollm, name, text):
    tok = with_parser(smollm, vllm=name)
    deltas, pipe = stream(tok, text + ("<|action_end|>" if name == "internlm" else ""))
    expected = [("f", {"a": 1})] + ([("g", {})] if name != "internlm" else [])
    check_streamed(deltas, pipe, expected)


# --- XML-parameter formats: JSON built per parameter, strings char by char --------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "lines": {"type": "integer"},
                    "content": {"type": "string"},
                },
            },
        },
    }
]
CONTENT = 'line one\nline "two" is a bit longer\n  indented {braces}'


def test_qwen3_coder_streams_string_values_as_they_are_generated(smollm):
    tok = with_parser(smollm, vllm="qwen3_coder")
    text = (
        "<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n"
        f"<parameter=lines>\n3\n</parameter>\n<parameter=content>\n{CONTENT}\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    deltas, pipe = stream(tok, text, tools=TOOLS)
    args = {"path": "a.py", "lines": 3, "content": CONTENT}
    frags = check_streamed(deltas, pipe, [("write_file", args)])
    assert pipe.tool_calls[0].arguments == json.dumps(args, ensure_ascii=False)
    assert frags[0][0].startswith('{"path": "a')  # strings open with their first character
    assert ', "lines": 3' in frags[0]  # typed values come whole when they close
    content_frags = frags[0][frags[0].index(', "lines": 3') + 1 :]
    assert content_frags[0].startswith(', "content": "') and len(content_frags) > 5
    # a close tag counts once what follows it shows it is no text of the value (vLLM's
    # rule): the value's end and the object's come together
    assert frags[0][-1] == '"}'
    # Equal to what mlx-lm's own parser makes of the block.
    assert (
        json.loads(pipe.tool_calls[0].arguments)
        == qwen3_coder.parse_tool_call(text[len("<tool_call>") : -len("</tool_call>")], TOOLS)[
            "arguments"
        ]
    )


def test_qwen3_coder_null_and_untyped_values(smollm):
    tok = with_parser(smollm, qwen3_coder)
    text = (
        "<tool_call>\n<function=f>\n<parameter=a>\nnull\n</parameter>\n"
        "<parameter=b>\nnullable\n</parameter>\n</function>\n</tool_call>"
    )
    deltas, pipe = stream(tok, text)
    check_streamed(deltas, pipe, [("f", {"a": None, "b": "nullable"})])


def test_minimax_m2_streams_two_invokes(smollm):
    tok = with_parser(smollm, minimax_m2)
    text = (
        '<minimax:tool_call><invoke name="write_file"><parameter name="path">a.py</parameter>'
        f'<parameter name="lines">3</parameter><parameter name="content">{CONTENT}</parameter>'
        '</invoke><invoke name="get_time"></invoke></minimax:tool_call>'
    )
    deltas, pipe = stream(tok, text, tools=TOOLS)
    args = {"path": "a.py", "lines": 3, "content": CONTENT.strip()}
    frags = check_streamed(deltas, pipe, [("write_file", args), ("get_time", {})])
    assert len(frags[0]) > 5 and frags[1] == ["{}"]


def test_glm47_types_values_from_the_tools(smollm):
    tok = with_parser(smollm, vllm="glm45")
    text = (
        "<tool_call>write_file<arg_key>path</arg_key><arg_value>a.py</arg_value>"
        "<arg_key>lines</arg_key><arg_value>3</arg_value>"
        f"<arg_key>content</arg_key><arg_value>{CONTENT}</arg_value></tool_call>"
    )
    deltas, pipe = stream(tok, text, tools=TOOLS)
    args = {"path": "a.py", "lines": 3, "content": CONTENT.strip()}
    frags = check_streamed(deltas, pipe, [("write_file", args)])
    assert len(frags[0]) > 5 and frags[0][-1] == "}"
    # Without tools glm47 guesses each value's type from its text: values come whole.
    deltas, pipe = stream(tok, text)
    frags = check_streamed(deltas, pipe, [("write_file", {**args, "path": "a.py"})])
    assert frags[0][:2] == ['{"path": "a.py"', ', "lines": 3']


# --- formats that only parse at their end ------------------------------------------------


def test_pythonic_is_emitted_whole_at_the_end(smollm):
    needs_several_calls(pythonic, '[get_weather(city="Paris"), get_time()]')
    tok = with_parser(smollm, pythonic)
    text = '<|tool_call_start|>[get_weather(city="Paris"), get_time()]<|tool_call_end|>'
    deltas, pipe = stream(tok, text)
    seq = [(p.index, p.name, p.arguments) for p in pieces(deltas)]
    assert seq == [(0, "get_weather", '{"city": "Paris"}'), (1, "get_time", "{}")]
    assert merge_tool_call_deltas(pieces(deltas)) == pipe.tool_calls


def test_json_with_other_key_order_is_emitted_whole(smollm):
    tok = with_parser(smollm, json_tools)
    deltas, _ = stream(tok, '<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>')
    assert [(p.index, p.name, p.arguments) for p in pieces(deltas)] == [(0, "f", '{"a": 1}')]


# --- malformed markup is content -----------------------------------------------------------


def test_malformed_after_streaming_is_dropped_and_comes_back_as_content(smollm, caplog):
    tok = with_parser(smollm, json_tools)
    bad = '<tool_call>{"name": "f", "arguments": {"a": 1}} junk</tool_call>'
    text = f'{bad}<tool_call>{{"name": "g", "arguments": {{}}}}</tool_call>'
    with caplog.at_level(logging.WARNING, logger="output"):
        deltas, pipe = stream(tok, text)
    seq = [(p.index, p.name, p.arguments, p.dropped) for p in pieces(deltas)]
    # Call 0 streamed, then was dropped at its closing marker; call 1 keeps its own index.
    assert seq[0] == (0, "f", "", False) and (0, "", "", True) in seq
    assert "".join(a for i, _, a, _ in seq if i == 0) == '{"a": 1}'
    assert pipe.content == bad and "malformed tool call" in caplog.text
    assert [(c.index, c.name) for c in pipe.tool_calls] == [(1, "g")]
    assert merge_tool_call_deltas(pieces(deltas)) == pipe.tool_calls


def test_unparseable_block_streams_nothing_and_is_content(smollm):
    tok = with_parser(smollm, json_tools)
    deltas, pipe = stream(tok, "<tool_call>{not json</tool_call>!")
    assert pieces(deltas) == [] and pipe.content == "<tool_call>{not json</tool_call>!"


def test_unterminated_call_is_dropped_and_its_text_is_content(smollm):
    tok = with_parser(smollm, json_tools)
    text = '<tool_call>{"name": "f", "arguments": {"a": "long'
    deltas, pipe = stream(tok, text, reason="length")
    assert pieces(deltas)[0].name == "f" and pieces(deltas)[-1] == ToolCallDelta(0, dropped=True)
    assert pipe.content == text and pipe.tool_calls == []
    assert merge_tool_call_deltas(pieces(deltas)) == []


def test_streamed_call_that_disagrees_with_the_parse_is_resent_whole(smollm):
    tok = with_parser(smollm, qwen3_coder)
    text = (
        "<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n</function>\n"
        "<function=g>\n<parameter=b>\ny\n</parameter>\n</function>\n</tool_call>"
    )
    deltas, pipe = stream(tok, text)
    seq = pieces(deltas)
    # Streamed as f {"a": "x"} and g {"b": "y"}; mlx-lm parses one call f {"a": "x", "b": "y"}:
    # both streamed calls are dropped and the parsed one is sent whole under a fresh index.
    assert [p.index for p in seq if p.dropped] == [0, 1]
    parsed = qwen3_coder.parse_tool_call(text[len("<tool_call>") : -len("</tool_call>")])
    assert [(c.index, c.name, json.loads(c.arguments)) for c in pipe.tool_calls] == [
        (2, parsed["name"], parsed["arguments"])
    ]
    assert seq[-1] == ToolCallDelta(2, pipe.tool_calls[0].id, "f", pipe.tool_calls[0].arguments)
    assert merge_tool_call_deltas(seq) == pipe.tool_calls
