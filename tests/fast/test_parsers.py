"""LocalAI's `tool_parser:` / `reasoning_parser:` hints (vLLM names): the mapping to
mlx-lm's parsers and think markers (no tokenizer). On the real SmolLM2 tokenizer:
tests/model/test_parsers.py."""

from __future__ import annotations

import pytest
from mlx_lm.tool_parsers import glm47, json_tools, mistral, qwen3_coder

from decoding import tool_formats
from decoding.parsers import (
    TOOL_PARSERS,
    resolve_reasoning_markers,
    resolve_tool_parser,
)
from decoding.reasoning_formats import FORMATS
from decoding.tool_calls import parse_tool_block


def test_tool_parser_names_map_to_mlx_lm_parsers():
    assert resolve_tool_parser("hermes") == (
        json_tools.parse_tool_call,
        "<tool_call>",
        "</tool_call>",
    )
    call = "<function=f>\n<parameter=a>\n1\n</parameter>\n</function>"
    for name in ("qwen3_coder", "qwen3_xml", "seed_oss"):  # mlx-lm's qwen3_coder reads them
        assert resolve_tool_parser(name)[0](call) == qwen3_coder.parse_tool_call(call)
    # Mistral: mlx-lm's parser first, ours for the forms it does not read (v11, pre-v11
    # lists with text around them), as vLLM's mistral_tool_parser.py reads them.
    parser, start, end = resolve_tool_parser("Mistral")
    assert (start, end) == (mistral.tool_call_start, mistral.tool_call_end) == ("[TOOL_CALLS]", "")
    assert parser('add[ARGS]{"a": 1}') == mistral.parse_tool_call('add[ARGS]{"a": 1}')
    assert parser('add{"a": 1}') == [{"name": "add", "arguments": {"a": 1}}]
    # GLM: ours (string values as written), mlx-lm's glm47 for its other forms
    glm = "get_weather<arg_key>city</arg_key><arg_value> Paris </arg_value>"
    assert resolve_tool_parser("glm45")[0](glm) == {
        "name": "get_weather",
        "arguments": {"city": "Paris"},
    }
    assert glm47.parse_tool_call(glm)["arguments"] == {"city": "Paris"}
    _, start, end = resolve_tool_parser("jamba")
    assert (start, end) == ("<tool_calls>", "</tool_calls>")
    for name in tool_formats.names():  # every format: a callable and a start marker
        parser, start, _ = resolve_tool_parser(name)
        assert callable(parser) and start and tool_formats.get(name).name == name
    for name in TOOL_PARSERS:  # vLLM names with no MLX equivalent
        assert resolve_tool_parser(name) is None and tool_formats.get(name) is None


def test_reasoning_parser_names_map_to_think_markers():
    assert resolve_reasoning_markers("deepseek_r1") == ("<think>", "</think>")
    assert resolve_reasoning_markers("qwen3") == ("<think>", "</think>")
    assert resolve_reasoning_markers("mistral") == ("[THINK]", "[/THINK]")
    assert resolve_reasoning_markers("seed-oss") == ("<seed:think>", "</seed:think>")
    assert all(f.start != f.end for f in FORMATS.values() if f.start or f.end)


def test_arguments_that_are_no_json_make_the_call_malformed():
    # A pythonic parser can return bytes or inf (OLMo's `f(x=b'z')`, `f(x=1e999)`): the
    # call is malformed (ValueError: its block comes back as content), never a crash and
    # never "Infinity" in the arguments.
    for value in (b"z", float("inf")):
        with pytest.raises(ValueError, match="not JSON"):
            parse_tool_block(lambda text, tools, v=value: {"name": "f", "arguments": {"x": v}}, "")


def test_llama4_pythonic_also_reads_the_json_the_llama4_template_asks_for():
    # vLLM's llama4_pythonic reads pythonic lists (its own template's); the model's Llama 4
    # chat template asks for Llama 3.x's JSON call: both are calls.
    parser = resolve_tool_parser("llama4_pythonic")[0]
    want = [{"name": "get_weather", "arguments": {"city": "LA"}}]
    assert parser("[get_weather(city='LA')]") == want
    assert parser('{"name": "get_weather", "parameters": {"city": "LA"}}') == want
