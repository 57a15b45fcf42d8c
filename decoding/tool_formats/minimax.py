"""minimax (MiniMax-M1): calls are JSON objects `{"name", "arguments"}`, one a line, between
`<tool_calls>` and `</tool_calls>` (or to the end of the output); a block inside a
`<think>` ... `</think>` region is no call and stays in the content as written (vLLM's
vllm/tool_parsers/minimax_tool_parser.py; tests/tool_parsers/test_minimax_tool_parser.py).

As vLLM's: a line that is not a JSON object, or an object without both a name and
arguments, is skipped; the content is stripped around the block. Unlike vLLM's, an object
written over several lines is read too (vLLM's test marks that as not supported: it gives
neither call nor content). Read by a scan of the text (json's raw_decode at each "{").
mlx-lm has no parser for this format.
"""

from __future__ import annotations

import json
from typing import Any

from decoding.tool_calls import JSON_LINES
from decoding.tool_formats import ToolFormat, register

_DECODER = json.JSONDecoder()


def parse(text: str, tools: Any = None) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    pos = 0
    while pos < len(text):
        if text[pos].isspace():
            pos += 1
            continue
        value: Any = None
        if text[pos] == "{":
            try:
                value, pos = _DECODER.raw_decode(text, pos)
            except ValueError:
                value = None
        if value is None:  # not a JSON object here: skip the rest of the line
            end = text.find("\n", pos)
            pos = len(text) if end == -1 else end + 1
            continue
        if isinstance(value, dict) and isinstance(value.get("name"), str) and "arguments" in value:
            calls.append({"name": value["name"], "arguments": value["arguments"]})
    if not calls:
        raise ValueError("no JSON object with a name and arguments in the block")
    return calls


MINIMAX = register(
    ToolFormat(
        "minimax",
        parse,
        "<tool_calls>",
        "</tool_calls>",
        trim_content=True,
        inert=(("<think>", "</think>"),),
        stream=JSON_LINES,
    )
)
