"""LocalAI's parser hints: vLLM tool/reasoning parser names -> mlx-lm parsers and markers.

LocalAI's importer writes `Options` `tool_parser:NAME` and `reasoning_parser:NAME` (vLLM's
names) into model files. `apply_parser_overrides` makes them override what mlx-lm inferred
from the chat template, by setting the TokenizerWrapper's tool parser, tool-call markers and
think markers, so that `output.OutputPipeline` routes text by them.

| vLLM tool_parser                | mlx-lm parser   | markers                                   |
|---------------------------------|-----------------|-------------------------------------------|
| hermes                          | json_tools      | `<tool_call>` `</tool_call>`              |
| qwen3_coder, qwen3_xml          | qwen3_coder     | `<tool_call>` `</tool_call>`              |
| mistral                         | mistral         | `[TOOL_CALLS]` (runs to the end)          |
| pythonic                        | pythonic        | `<|tool_call_start|>` `<|tool_call_end|>` |
| kimi_k2                         | kimi_k2         | `<|tool_calls_section_begin|>` ... `_end|>` |
| glm45, glm47                    | glm47           | `<tool_call>` `</tool_call>`              |
| minimax_m2                      | minimax_m2      | `<minimax:tool_call>` ...                 |
| longcat                         | longcat         | `<longcat_tool_call>` ...                 |
| functiongemma                   | function_gemma  | `<start_function_call>` ...               |
| gemma4                          | gemma4          | `<|tool_call>` `<tool_call|>`             |
| internlm                        | JSON object     | `<|action_start|><|plugin|>` `<|action_end|>`|
| jamba                           | JSON list       | `<tool_calls>` `</tool_calls>`            |
| granite                         | JSON list       | `<|tool_call|>` (runs to the end)         |

vLLM names mlx-lm has no parser for (llama3_json, llama4_json, llama4_pythonic, deepseek_v3,
deepseek_v31, xlam, openai, minimax, step3, seed_oss, hunyuan_a13b, ...) fail with a message
that lists the supported ones.

Reasoning: deepseek_r1, deepseek_v3, qwen3, glm45, ernie45, minimax_m2, olmo3, hunyuan_a13b,
kimi_k2 -> `<think>`/`</think>`; mistral -> `[THINK]`/`[/THINK]`; seed_oss ->
`<seed:think>`/`</seed:think>`; granite -> "Here is my thought process:"/"Here is my
response:". gpt_oss / openai (Harmony channels) is not a start/end marker pair and fails.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from decoding.tool_calls import ToolParser

__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "apply_parser_overrides",
    "resolve_reasoning_markers",
    "resolve_tool_parser",
]


def _json_object_parser(text: str, tools: Any = None) -> Any:
    """A JSON object or list of {"name", "arguments"|"parameters"} between markers."""
    return json.loads(text.strip())


def _json_list_parser(text: str, tools: Any = None) -> Any:
    """A JSON list of {"name", "arguments"} objects between markers."""
    return json.loads(text.strip())


_json_object_parser.tool_stream_format = "json_tools"  # read by tool_calls.stream_format
_json_list_parser.tool_stream_format = "json_list"

# vLLM name -> mlx-lm tool parser module, or (parser, start, end) for formats mlx-lm's
# json_tools parser reads once the markers are known (it is json.loads of the block).
TOOL_PARSERS: dict[str, str | tuple[ToolParser, str, str]] = {
    "hermes": "json_tools",
    "qwen3_coder": "qwen3_coder",
    "qwen3_xml": "qwen3_coder",
    "mistral": "mistral",
    "pythonic": "pythonic",
    "kimi_k2": "kimi_k2",
    "glm45": "glm47",
    "glm47": "glm47",
    "minimax_m2": "minimax_m2",
    "longcat": "longcat",
    "functiongemma": "function_gemma",
    "gemma4": "gemma4",
    "internlm": (_json_object_parser, "<|action_start|><|plugin|>", "<|action_end|>"),
    "jamba": (_json_list_parser, "<tool_calls>", "</tool_calls>"),
    "granite": (_json_list_parser, "<|tool_call|>", ""),
}

_THINK = ("<think>", "</think>")
REASONING_PARSERS: dict[str, tuple[str, str]] = {
    "deepseek_r1": _THINK,
    "deepseek_v3": _THINK,
    "qwen3": _THINK,
    "glm45": _THINK,
    "ernie45": _THINK,
    "minimax_m2": _THINK,
    "olmo3": _THINK,
    "hunyuan_a13b": _THINK,
    "kimi_k2": _THINK,
    "mistral": ("[THINK]", "[/THINK]"),
    "seed_oss": ("<seed:think>", "</seed:think>"),
    "granite": ("Here is my thought process:", "Here is my response:"),
}


def _normal(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def resolve_tool_parser(name: str) -> tuple[ToolParser, str, str]:
    """vLLM tool parser name -> (parser(text, tools), start marker, end marker).

    The end marker is "" for formats whose calls run to the end of the output. Raises
    ValueError naming the option and listing the known names for an unknown one.
    """
    entry = TOOL_PARSERS.get(_normal(name))
    if entry is None:
        raise ValueError(
            f"unknown tool_parser {name!r}; use one of: {', '.join(sorted(TOOL_PARSERS))}"
        )
    if isinstance(entry, tuple):
        return entry
    module = importlib.import_module(f"mlx_lm.tool_parsers.{entry}")
    return module.parse_tool_call, module.tool_call_start, module.tool_call_end


def resolve_reasoning_markers(name: str) -> tuple[str, str]:
    """vLLM reasoning parser name -> (think start, think end) marker text.

    Raises ValueError naming the option and listing the known names for an unknown one.
    """
    markers = REASONING_PARSERS.get(_normal(name))
    if markers is None:
        known = ", ".join(sorted(REASONING_PARSERS))
        raise ValueError(f"unknown reasoning_parser {name!r}; use one of: {known}")
    return markers


def _encode(tokenizer: Any, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False))


def apply_parser_overrides(
    tokenizer: Any, tool_parser: str = "", reasoning_parser: str = ""
) -> None:
    """Override an mlx-lm `TokenizerWrapper`'s tool parser and think markers in place.

    tool_parser / reasoning_parser: vLLM names ("" leaves that part as mlx-lm inferred it).
    Sets what `TokenizerWrapper` exposes as tool_parser, tool_call_start/end (and their token
    ids), has_tool_calling, think_start/end (and token ids), has_thinking. Both names are
    resolved before anything is changed. Raises ValueError for an unknown name.
    """
    tool = resolve_tool_parser(tool_parser) if tool_parser else None
    think = resolve_reasoning_markers(reasoning_parser) if reasoning_parser else None
    # TokenizerWrapper keeps these in private attributes behind read-only properties.
    if tool is not None:
        parser, start, end = tool
        tokenizer._tool_parser = parser
        tokenizer._tool_call_start = start
        tokenizer._tool_call_end = end
        tokenizer._tool_call_start_tokens = _encode(tokenizer, start)
        tokenizer._tool_call_end_tokens = _encode(tokenizer, end)
    if think is not None:
        start, end = think
        tokenizer._think_start = start
        tokenizer._think_end = end
        tokenizer._think_start_tokens = _encode(tokenizer, start)
        tokenizer._think_end_tokens = _encode(tokenizer, end)
