"""granite (Granite 3.0 / 3.1): a JSON list of {"name", "arguments"} calls after
`<|tool_call|>` (3.0's token) or `<tool_call>` (3.1's text), running to the end of the
output (vLLM's granite_tool_parser.py; tests/tool_parsers/test_granite_tool_parser.py).
Keys in either order (arguments stream as raw JSON where the name comes first); text after
the list is left out, as vLLM leaves it. mlx-lm has no
parser for this format.
"""

from __future__ import annotations

import json
from typing import Any

from decoding.tool_calls import JSON_LIST
from decoding.tool_formats import Block, ToolFormat, register

_DECODER = json.JSONDecoder()


def parse(text: str, tools: Any = None) -> list[dict[str, Any]]:
    body = text.strip()
    if not body.startswith("["):
        raise ValueError("granite calls are a JSON list")
    calls, _ = _DECODER.raw_decode(body)
    out = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ValueError("not a call: no name")
        out.append({"name": call["name"], "arguments": call.get("arguments", {})})
    if not out:
        raise ValueError("an empty call list")
    return out


GRANITE = register(
    ToolFormat("granite", parse, "<|tool_call|>", more=(Block("<tool_call>"),), stream=JSON_LIST)
)
