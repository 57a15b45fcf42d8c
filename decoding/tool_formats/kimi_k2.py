"""kimi_k2 (Kimi K2): `<|tool_calls_section_begin|>` holding calls
`<|tool_call_begin|>functions.NAME:N <|tool_call_argument_begin|>{args}<|tool_call_end|>`
(vLLM's kimi_k2_tool_parser.py; tests/tool_parsers/test_kimi_k2_tool_parser.py). The id
(`functions.NAME:N`) is the call's id; arguments stream as their raw JSON text.

Ours around mlx-lm's mlx_lm/tool_parsers/kimi_k2.py, which reads one call: a call whose id
is malformed (`functions.invalid.0`) is left out while the others stay (mlx-lm rejects the
whole block), and a bare counter id (`0`, Kimi's newer template) names the declared tool
its arguments fit: the only tool, or the one tool whose parameters hold every argument
key; no call where that is ambiguous, as vLLM decides.
"""

from __future__ import annotations

import json
from typing import Any

import regex
from mlx_lm.tool_parsers import kimi_k2

from decoding.tool_calls import JsonStream
from decoding.tool_formats import ToolFormat, register

_CALL = regex.compile(r"<\|tool_call_begin\|>(.*?)<\|tool_call_end\|>", regex.S)
_ID = regex.compile(
    r"\s*(?:(?:functions\.)?(?P<name>[^\s:<]+):\d+|(?P<counter>\d+))\s*<\|tool_call_argument_begin\|>",
    regex.S,
)


def _tool_keys(tools: Any) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            params = function.get("parameters") or {}
            props = params.get("properties") if isinstance(params, dict) else None
            out[function["name"]] = set(props) if isinstance(props, dict) else set()
    return out


def _infer(args_text: str, tools: Any) -> str | None:
    """The declared tool a bare-counter call is for, or None where it is not clear."""
    declared = _tool_keys(tools)
    if len(declared) == 1:
        return next(iter(declared))
    try:
        args = json.loads(args_text)
    except ValueError:
        return None
    if not isinstance(args, dict):
        return None
    fits = [name for name, keys in declared.items() if set(args) <= keys]
    return fits[0] if len(fits) == 1 else None


def parse(text: str, tools: Any = None) -> list[dict[str, Any]]:
    calls = []
    for body in _CALL.findall(text) or [text]:
        m = _ID.match(body)
        if m is None:
            continue  # a malformed id: vLLM skips the call
        args_text = body[m.end() :].strip()
        name = m["name"] or _infer(args_text, tools)
        if name is None:
            continue
        call_id = body[: m.end()].split("<|")[0].strip()
        calls.append({"id": call_id, "name": name, "arguments": json.loads(args_text)})
    if not calls:
        raise ValueError("no readable call in the tool-call section")
    return calls


_HEAD = (  # `<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>{`
    r"\s*<\|tool_call_begin\|>\s*(?P<id>(?:functions\.)?(?P<name>[^\s<:]+?):\d+)\s*"
    r"<\|tool_call_argument_begin\|>\s*\{"
)
STREAM = JsonStream(_HEAD, r"\s*<\|tool_call_end\|>" + _HEAD, quoted=False)

KIMI_K2 = register(
    ToolFormat("kimi_k2", parse, kimi_k2.tool_call_start, kimi_k2.tool_call_end, stream=STREAM)
)
