"""cohere_command3 / cohere_command4 (Cohere Command A / Command A Reasoning): the calls are
one JSON list in `<|START_ACTION|>` ... `<|END_ACTION|>`, each item
`{"tool_call_id", "tool_name", "parameters"}`; reasoning in `<|START_THINKING|>` blocks and
the answer in `<|START_RESPONSE|>` blocks with `<co>` citations are the reasoning format of
the same name (decoding/reasoning_formats.py).

vLLM's vllm/tool_parsers/cohere_command_tool_parser.py hands the parsing to an external
package, so this module follows what tests/tool_parsers/test_cohere_command_tool_parser.py
asserts (names, arguments as JSON, order) rather than that package's code. mlx-lm has no
parser for this format.
"""

from __future__ import annotations

import json
from typing import Any

from decoding.tool_formats import ToolFormat, register

_START, _END = "<|START_ACTION|>", "<|END_ACTION|>"


def parse(text: str, tools: Any = None) -> Any:
    calls = json.loads(text, strict=False)
    if isinstance(calls, dict):
        calls = [calls]
    if not isinstance(calls, list):
        raise ValueError("the action is no JSON list of calls")
    out = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("tool_name"), str):
            raise ValueError("a call is no JSON object with a tool_name")
        args = call.get("parameters", {})
        if not isinstance(args, dict):
            raise ValueError(f"call {call['tool_name']!r} has no parameters object")
        out.append({"name": call["tool_name"], "arguments": args})
    return out


_WHOLE = "its calls are one JSON list, read when the action block closes (or the output ends)"
COHERE_COMMAND3 = register(ToolFormat("cohere_command3", parse, _START, _END, whole=_WHOLE))
COHERE_COMMAND4 = register(ToolFormat("cohere_command4", parse, _START, _END, whole=_WHOLE))
