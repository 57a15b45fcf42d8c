"""Each tool format declares how its calls stream (`ToolFormat.stream`) or why they are emitted
whole (`ToolFormat.whole`), and the declared spec streams what the format's own parser reads.

The 545 vLLM cases (tests/fast/test_parser_references.py) check the pipeline byte by byte;
these check the registry's rule and each spec against its parser directly."""

from __future__ import annotations

import importlib
import json
import pkgutil

import mlx_lm.tool_parsers
import pytest

from decoding import tool_calls, tool_formats
from decoding.tool_calls import BlockStreamer, merge_tool_call_deltas

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]
EXPECTED = ("get_weather", {"city": "Paris", "days": 3})

_OBJ = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
_QWEN = (
    "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n"
)
_GLM = (
    "get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
    "<arg_key>days</arg_key><arg_value>3</arg_value>"
)
# One block's text (between its markers) per streaming format, in the format's own shape
# (a format that streams without one here fails below).
BLOCKS = {
    "hermes": _OBJ,
    "granite4": _OBJ,
    "ernie45": _OBJ,
    "internlm": _OBJ,
    "gigachat3": _OBJ,
    "minimax": f"\n{_OBJ}\n",
    "jamba": f"[{_OBJ}]",
    "granite": f"[{_OBJ}]",
    "hunyuan_a13b": f"[{_OBJ}]",
    "mistral": 'get_weather[ARGS]{"city": "Paris", "days": 3}',
    "kimi_k2": "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "Paris", "days": 3}<|tool_call_end|>',
    "qwen3_coder": _QWEN,
    "qwen3_xml": _QWEN,
    "seed_oss": _QWEN,
    "step3p5": _QWEN,
    "mimo": _QWEN,
    "minimax_m2": '<invoke name="get_weather"><parameter name="city">Paris</parameter>'
    '<parameter name="days">3</parameter></invoke>',
    "glm45": _GLM,
    "poolside_v1": _GLM,
    "hy_v3": "<tool_call>get_weather<tool_sep><arg_key>city</arg_key><arg_value>Paris</arg_value>"
    "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
    "glm47": _GLM,
}

STREAMING = sorted(n for n in tool_formats.names() if tool_formats.get(n).stream is not None)


def test_every_registered_format_streams_or_says_why_not():
    for name in tool_formats.names():
        fmt = tool_formats.get(name)
        assert (fmt.stream is None) == bool(fmt.whole.strip()), (
            f"{name}: declare ToolFormat.stream, or ToolFormat.whole saying why not (not both)"
        )
    for name in STREAMING:  # the module docstring's table lists each
        assert name in tool_calls.__doc__, name


def test_every_mlx_lm_parser_module_is_described():
    # A parser mlx-lm infers from the chat template (no tool_parser name) has its format in
    # mlx_modules.py, found by the parser function itself.
    for info in pkgutil.iter_modules(mlx_lm.tool_parsers.__path__):
        module = importlib.import_module(f"mlx_lm.tool_parsers.{info.name}")
        fmt = tool_formats.for_parser(module.parse_tool_call)
        assert fmt is not None, f"mlx_lm.tool_parsers.{info.name} is not in mlx_modules.MLX_LM"
        assert (fmt.start, fmt.end) == (module.tool_call_start, module.tool_call_end)
        assert (fmt.stream is None) == bool(fmt.whole.strip()), info.name
    assert tool_formats.for_parser(None) is None


@pytest.mark.parametrize("name", STREAMING)
def test_declared_spec_streams_what_the_parser_reads(name):
    fmt = tool_formats.get(name)
    assert name in BLOCKS, f"{name} streams: add a block of its shape to BLOCKS"
    text = BLOCKS[name]
    streamer = BlockStreamer(fmt.parse, TOOLS, 0, fmt.stream)
    pieces, early, named_at = [], False, None
    for i, ch in enumerate(text):
        out = streamer.push(ch)
        pieces += out
        early = early or (i < len(text) - 1 and any(p.arguments for p in out))
        if named_at is None and any(p.name for p in out):
            named_at = i
    assert early, "no argument text before the block ended"
    # the announcement waits for the arguments' start only: it comes before the first value
    assert named_at is not None and named_at < text.index("Paris")
    closing, calls, ok = streamer.close(True)
    assert ok and not any(p.dropped for p in closing)  # the stream agreed with the parse
    (call,) = calls
    assert (call.name, json.loads(call.arguments)) == EXPECTED
    assert merge_tool_call_deltas(pieces + closing) == calls


@pytest.mark.parametrize("name", ["json_tools", "qwen3_coder", "glm47", "pythonic"])
def test_the_mlx_lm_parser_in_effect_brings_its_stream(name):
    module = importlib.import_module(f"mlx_lm.tool_parsers.{name}")
    tok = type("Tok", (), {"tool_parser": staticmethod(module.parse_tool_call)})()
    fmt = tool_formats.in_effect(tok)
    assert fmt is not None and fmt.name == name
    assert tool_formats.stream_of(tok) is fmt.stream
    assert (fmt.stream is None) == (name == "pythonic")


def test_minimax_streams_each_line_as_a_call():
    # JSON_LINES: the second object of a block streams as the next call, the stream agreeing
    # with the whole parse (no dropped index)
    fmt = tool_formats.get("minimax")
    streamer = BlockStreamer(fmt.parse, TOOLS, 0, fmt.stream)
    pieces = [p for ch in f"\n{_OBJ}\n{_OBJ}\n" for p in streamer.push(ch)]
    assert [(p.index, p.name) for p in pieces if p.name] == [(0, "get_weather"), (1, "get_weather")]
    closing, calls, ok = streamer.close(True)
    assert ok and not any(p.dropped for p in closing)
    assert [json.loads(c.arguments) for c in calls] == [EXPECTED[1], EXPECTED[1]]
    assert merge_tool_call_deltas(pieces + closing) == calls


def test_unclosed_json_arguments_stop_streaming_where_they_stop_being_json():
    # vLLM's kimi_k2 invalid_json_still_extracted: the first call's arguments never close;
    # the next call's markers are no part of them (before: streamed as its arguments)
    fmt = tool_formats.get("kimi_k2")
    text = (
        '<|tool_call_begin|>functions.bad:0 <|tool_call_argument_begin|>{"city": "Beijing"'
        "<|tool_call_end|><|tool_call_begin|>functions.good:1 <|tool_call_argument_begin|>"
        '{"city": "Shanghai"}<|tool_call_end|>'
    )
    streamer = BlockStreamer(fmt.parse, None, 0, fmt.stream)
    pieces = [p for ch in text for p in streamer.push(ch)]
    assert [p.name for p in pieces if p.name] == ["bad"]
    assert "".join(p.arguments for p in pieces) == '{"city": "Beijing"'
    closing, calls, ok = streamer.close(True)
    assert (calls, ok) == ([], False)  # the block is malformed: its text is content
    assert closing == [tool_calls.ToolCallDelta(0, dropped=True)]
