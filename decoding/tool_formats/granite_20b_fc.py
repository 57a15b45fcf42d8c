"""granite-20b-fc (IBM granite-20b-functioncalling): each call is `<function_call>` and a
JSON object `{"name", "arguments"}`; the calls run to the end of the output, one more at
each `<function_call>` (vLLM's vllm/tool_parsers/granite_20b_fc_tool_parser.py;
tests/tool_parsers/test_granite_20b_fc_tool_parser.py). vLLM spells the name
`granite-20b-fc`; LocalAI's options are matched with `-` read as `_`.

As vLLM's: the text before the first marker is the content, as written; text after a
call's JSON object up to the next marker is dropped; a call that is no JSON object with a
string name and arguments leaves the whole output as content. mlx-lm has no parser for it.
"""

from __future__ import annotations

import json
from typing import Any

from decoding.tool_formats import ToolFormat, register

_MARKER = "<function_call>"


def parse(text: str, tools: Any = None) -> Any:
    decoder = json.JSONDecoder()
    calls = []
    for part in text.split(_MARKER):
        call, _ = decoder.raw_decode(part.lstrip())
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ValueError("a call is no JSON object with a name")
        if "arguments" not in call:
            raise ValueError(f"call {call['name']!r} has no arguments")
        calls.append({"name": call["name"], "arguments": call["arguments"]})
    return calls[0] if len(calls) == 1 else calls


GRANITE_20B_FC = register(
    ToolFormat(
        "granite_20b_fc",
        parse,
        _MARKER,
        whole="the calls run to the output's end, one more at each <function_call>: "
        "read when it ends",
    )
)
