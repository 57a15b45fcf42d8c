"""LocalAI's `tool_parser:` / `reasoning_parser:` hints (vLLM names) override mlx-lm's guess.

Unit tests of the name mapping, and that `OutputPipeline` then routes the overriding markers
(and only those) on the real SmolLM2 tokenizer, whose template mlx-lm infers neither from.
"""

from __future__ import annotations

import copy

import pytest
from mlx_lm import tokenizer_utils
from mlx_lm.tool_parsers import glm47, json_tools, mistral, qwen3_coder

from decoding.output import OutputPipeline, initial_state_for
from decoding.parsers import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    apply_parser_overrides,
    resolve_reasoning_markers,
    resolve_tool_parser,
)
from decoding.tool_calls import merge_tool_call_deltas
from loading import gguf_convert, model_loader


@pytest.fixture(scope="module")
def smollm():
    return tokenizer_utils.load(gguf_convert.cached_conversion(model_loader.embedded_model_path()))


def run(tok, text: str):
    pipe = OutputPipeline(tok)
    deltas = [pipe.feed(t) for t in tok.encode(text, add_special_tokens=False)]
    deltas.append(pipe.finish("stop"))
    return pipe, deltas


def test_tool_parser_names_map_to_mlx_lm_parsers():
    assert resolve_tool_parser("hermes") == (
        json_tools.parse_tool_call,
        "<tool_call>",
        "</tool_call>",
    )
    assert resolve_tool_parser("qwen3_coder")[0] is qwen3_coder.parse_tool_call
    assert resolve_tool_parser("qwen3_xml")[0] is qwen3_coder.parse_tool_call
    assert resolve_tool_parser("Mistral") == (mistral.parse_tool_call, "[TOOL_CALLS]", "")
    assert resolve_tool_parser("glm45")[0] is glm47.parse_tool_call
    _, start, end = resolve_tool_parser("jamba")
    assert (start, end) == ("<tool_calls>", "</tool_calls>")
    for name in TOOL_PARSERS:  # every entry resolves to a callable and a start marker
        parser, start, _ = resolve_tool_parser(name)
        assert callable(parser) and start


def test_reasoning_parser_names_map_to_think_markers():
    assert resolve_reasoning_markers("deepseek_r1") == ("<think>", "</think>")
    assert resolve_reasoning_markers("qwen3") == ("<think>", "</think>")
    assert resolve_reasoning_markers("mistral") == ("[THINK]", "[/THINK]")
    assert resolve_reasoning_markers("seed-oss") == ("<seed:think>", "</seed:think>")
    assert all(s and e and s != e for s, e in REASONING_PARSERS.values())


@pytest.mark.parametrize(
    ("call", "option"),
    [(resolve_tool_parser, "tool_parser"), (resolve_reasoning_markers, "reasoning_parser")],
)
def test_unknown_names_fail_listing_the_known_ones(call, option):
    with pytest.raises(ValueError) as info:
        call("llama3_json" if option == "tool_parser" else "gpt_oss")
    msg = str(info.value)
    assert (msg.startswith(f"unknown {option} ") and "hermes" in msg) or "qwen3" in msg
    known = TOOL_PARSERS if option == "tool_parser" else REASONING_PARSERS
    assert all(name in msg for name in known)


def test_unknown_name_changes_nothing(smollm):
    tok = copy.copy(smollm)
    with pytest.raises(ValueError, match="reasoning_parser"):
        apply_parser_overrides(tok, "hermes", "nope")
    assert tok.tool_parser is smollm.tool_parser and tok.think_start == smollm.think_start


def test_overrides_set_the_wrappers_attributes(smollm):
    assert not smollm.has_tool_calling and not smollm.has_thinking  # SmolLM2: nothing inferred
    tok = copy.copy(smollm)
    apply_parser_overrides(tok, "qwen3_coder", "qwen3")
    assert tok.has_tool_calling and tok.tool_parser is qwen3_coder.parse_tool_call
    assert (tok.tool_call_start, tok.tool_call_end) == ("<tool_call>", "</tool_call>")
    assert tok.decode(list(tok.tool_call_start_tokens)) == "<tool_call>"
    assert tok.has_thinking and (tok.think_start, tok.think_end) == ("<think>", "</think>")
    assert tok.decode(list(tok.think_end_tokens)) == "</think>"
    assert not smollm.has_tool_calling  # the loaded wrapper itself is untouched
    # The prompt-side rule (an open think block) uses the override's token ids too.
    prompt = tok.encode("user: hi\n<think>\n", add_special_tokens=False)
    assert initial_state_for(tok, prompt) == "reasoning"


def test_pipeline_routes_the_overriding_markers(smollm):
    text = (
        "<think>plan</think>Sure<tool_call>\n"
        + '{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    )
    pipe, _ = run(smollm, text)
    assert pipe.content == text and pipe.tool_calls == []  # nothing inferred: all content

    tok = copy.copy(smollm)
    apply_parser_overrides(tok, "hermes", "deepseek_r1")
    pipe, deltas = run(tok, text)
    assert (pipe.reasoning, pipe.content) == ("plan", "Sure")
    assert [(c.name, c.arguments) for c in pipe.tool_calls] == [("f", '{"a": 1}')]
    assert merge_tool_call_deltas(p for d in deltas for p in d.tool_calls) == pipe.tool_calls


def test_mistral_markers_route_reasoning_and_calls_to_the_end(smollm):
    tok = copy.copy(smollm)
    apply_parser_overrides(tok, "mistral", "mistral")
    text = '[THINK]hmm[/THINK]Ok<think>x</think>[TOOL_CALLS]f[ARGS]{"a": 1}'
    pipe, _ = run(tok, text)
    # Only the override's markers count: "<think>" is plain text for this model.
    assert (pipe.reasoning, pipe.content) == ("hmm", "Ok<think>x</think>")
    assert [(c.name, c.arguments) for c in pipe.tool_calls] == [("f", '{"a": 1}')]
