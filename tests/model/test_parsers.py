"""LocalAI's `tool_parser:` / `reasoning_parser:` hints override mlx-lm's guess:
`OutputPipeline` then routes the overriding markers (and only those) on the real SmolLM2
tokenizer (the ``smollm`` fixture), whose template mlx-lm infers neither from; unknown
names warn, listing the known ones.
"""

from __future__ import annotations

import pytest
from mlx_lm.tool_parsers import json_tools, qwen3_coder

from decoding.output import OutputPipeline, initial_state_for
from decoding.parsers import (
    apply_parser_overrides,
    resolve_reasoning_markers,
    resolve_tool_parser,
)
from decoding.tool_calls import merge_tool_call_deltas


def run(tok, text: str):
    pipe = OutputPipeline(tok)
    deltas = [pipe.feed(t) for t in tok.encode(text, add_special_tokens=False)]
    deltas.append(pipe.finish("stop"))
    return pipe, deltas


# Issue 25: LocalAI passes options meant for other backends too, so an unknown name no
# longer fails the load (it used to raise ValueError listing the known names): it resolves
# to None, and apply_parser_overrides warns, listing the names that apply.
@pytest.mark.parametrize(
    ("call", "option"),
    [(resolve_tool_parser, "tool_parser"), (resolve_reasoning_markers, "reasoning_parser")],
)
def test_unknown_names_warn_listing_the_known_ones(call, option, smollm, caplog):
    assert call("no_such_parser") is None
    with caplog.at_level("WARNING", logger="localai.mlx.decoding.parsers"):
        tok = apply_parser_overrides(smollm, **{option: "no_such_parser"})
    assert tok is smollm  # nothing applies: the loaded wrapper, unchanged
    msg = caplog.text
    assert f"unknown {option} 'no_such_parser'" in msg and "mlx-lm detected" in msg
    assert ("hermes" in msg and "llama3_json" in msg) or ("qwen3" in msg and "gemma4" in msg)


def test_unknown_name_changes_only_its_part(smollm):
    tok = apply_parser_overrides(smollm, "hermes", "nope")  # a warning, no error
    assert tok.tool_parser is json_tools.parse_tool_call
    assert tok.think_start == smollm.think_start and not tok.has_thinking


def test_overrides_set_the_wrappers_attributes(smollm):
    assert not smollm.has_tool_calling and not smollm.has_thinking  # SmolLM2: nothing inferred
    tok = apply_parser_overrides(smollm, "qwen3_coder", "qwen3")
    # decoding/tool_formats/qwen3_xml.py: mlx-lm's qwen3_coder markup, vLLM's typing
    call = "<function=f>\n<parameter=a>\nx\n</parameter>\n</function>"
    assert tok.has_tool_calling and tok.tool_parser(call) == qwen3_coder.parse_tool_call(call)
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

    tok = apply_parser_overrides(smollm, "hermes", "deepseek_r1")
    pipe, deltas = run(tok, text)
    assert (pipe.reasoning, pipe.content) == ("plan", "Sure")
    assert [(c.name, c.arguments) for c in pipe.tool_calls] == [("f", '{"a": 1}')]
    assert merge_tool_call_deltas(p for d in deltas for p in d.tool_calls) == pipe.tool_calls


def test_mistral_markers_route_reasoning_and_calls_to_the_end(smollm):
    tok = apply_parser_overrides(smollm, "mistral", "mistral")
    text = '[THINK]hmm[/THINK]Ok<think>x</think>[TOOL_CALLS]f[ARGS]{"a": 1}'
    pipe, _ = run(tok, text)
    # Only the override's markers count: "<think>" is plain text for this model.
    assert (pipe.reasoning, pipe.content) == ("hmm", "Ok<think>x</think>")
    assert [(c.name, c.arguments) for c in pipe.tool_calls] == [("f", '{"a": 1}')]
