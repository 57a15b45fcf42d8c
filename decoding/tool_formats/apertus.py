"""apertus (Swiss AI Apertus): `<|tools_prefix|>[{"NAME": {ARGS}}, ...]<|tools_suffix|>`, a
JSON list of one-key objects, each a call (vLLM's vllm/tool_parsers/apertus_tool_parser.py;
tests/tool_parsers/test_apertus_tool_parser.py). A list cut off (no suffix, or its JSON not
closed) is read as far as it goes, its open brackets closed, as vLLM's partial JSON reading
does. mlx-lm has no parser for this format.
"""

from __future__ import annotations

import json
from typing import Any

from decoding.tool_formats import ToolFormat, register

_CLOSERS = {"[": "]", "{": "}"}


def _closed(text: str) -> str:
    """``text`` with the brackets it leaves open closed (a string left open is no JSON)."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            in_string = escaped or ch != '"'
            escaped = not escaped and ch == "\\"
        elif ch == '"':
            in_string = True
        elif ch in _CLOSERS:
            stack.append(_CLOSERS[ch])
        elif ch in "]}" and stack and stack[-1] == ch:
            stack.pop()
    return text + "".join(reversed(stack))


def parse(text: str, tools: Any = None) -> Any:
    text = text.strip()
    try:
        calls = json.loads(text)
    except ValueError:
        calls = json.loads(_closed(text))
    if not isinstance(calls, list) or not calls:
        raise ValueError("the block is no JSON list of calls")
    out = []
    for call in calls:
        if not isinstance(call, dict) or len(call) != 1:
            raise ValueError("a call is no one-key JSON object")
        ((name, args),) = call.items()
        out.append({"name": name, "arguments": args})
    return out[0] if len(out) == 1 else out


APERTUS = register(
    ToolFormat(
        "apertus",
        parse,
        "<|tools_prefix|>",
        "<|tools_suffix|>",
        whole="its calls are one JSON list, read when it closes (or the output ends)",
    )
)
