"""functiongemma (FunctionGemma): `<start_function_call>call:NAME{key:<escape>value<escape>,
...}<end_function_call>` (vLLM's functiongemma_tool_parser.py). A value is JSON where it
reads as JSON (`<escape>42<escape>` is 42), else text; content before a call is trimmed.

Ours, not mlx-lm's mlx_lm/tool_parsers/function_gemma.py: that one keeps an escaped value
as text (`"42"`), and skips one character after each escaped value, so keys written
without a comma between them (vLLM's streaming tests) lose their first letter.
"""

from __future__ import annotations

import json
from typing import Any

import regex

from decoding.tool_formats import ToolFormat, register

_CALL = regex.compile(r"\s*call:(?P<name>[\w.-]+)\{(?P<args>.*)\}\s*", regex.S)
_ARG = regex.compile(
    r"\s*,?\s*(?P<key>[\w.-]+):(?:<escape>(?P<text>.*?)<escape>|(?P<bare>[^,}]*))", regex.S
)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_arguments(text: str) -> dict[str, Any]:
    args: dict[str, Any] = {}
    pos = 0
    while pos < len(text.rstrip()):
        m = _ARG.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"unreadable arguments at {text[pos:]!r}")
        value = m["text"] if m["text"] is not None else m["bare"].strip()
        args[m["key"]] = _value(value)
        pos = m.end()
    return args


def parse(text: str, tools: Any = None) -> dict[str, Any]:
    m = _CALL.fullmatch(text)
    if m is None:
        raise ValueError("no call:NAME{...} in the block")
    return {"name": m["name"], "arguments": parse_arguments(m["args"])}


FUNCTIONGEMMA = register(
    ToolFormat(
        "functiongemma",
        parse,
        "<start_function_call>",
        "<end_function_call>",
        trim_content=True,
        whole="a value is JSON or text only once its `<escape>` closes: read at the end",
    )
)
