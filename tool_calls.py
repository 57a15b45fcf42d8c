"""Tool calls: the `ToolCall` value and turning one tool-call block of model text into calls.

Owns only the parsing of the text found *between* a model's tool-call markers (the markers
themselves are found by `output.py`). The format-specific work is done by the tokenizer's
mlx-lm tool parser (`mlx_lm/tool_parsers/*.py`, chosen by `mlx_lm.tokenizer_utils.load` from
the chat template, e.g. `json_tools` for Hermes/Qwen `<tool_call>{"name":…,"arguments":{…}}`);
this module checks its result and normalises it to OpenAI's shape, like mlx-lm's server
`ToolCallFormatter` does, except that a malformed call raises instead of being dropped.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

ToolParser = Callable[[str, Any], Any]


@dataclass(frozen=True)
class ToolCall:
    """One complete function call, as OpenAI's `tool_calls[i]` (and LocalAI's ToolCallDelta).

    index: position among this request's calls (0, 1, ...); id: unique ("call_<24 hex>"
    unless the parser supplied one); name: the function name; arguments: a JSON object
    serialised as a string (never a dict).
    """

    index: int
    id: str
    name: str
    arguments: str


def new_call_id() -> str:
    """A fresh OpenAI-style call id: "call_" and 24 random hex digits (96 bits)."""
    return "call_" + secrets.token_hex(12)


def parse_tool_block(
    parser: ToolParser,
    text: str,
    tools: Sequence[dict] | None = None,
    first_index: int = 0,
) -> list[ToolCall]:
    """Parse the text between one pair of tool-call markers into calls.

    `parser` is `TokenizerWrapper.tool_parser` (called as `parser(text, tools)`; it returns a
    dict or a list of dicts with "name" and "arguments"). Indices start at `first_index`.
    Raises ValueError when the text is not a well-formed call: the parser failed, a name is
    missing, or the arguments are not a JSON object. Nothing is returned partially.
    """
    try:
        parsed = parser(text, list(tools) if tools is not None else None)
    except Exception as exc:  # third-party parsers raise many kinds on malformed model text
        raise ValueError(f"tool parser failed: {type(exc).__name__}: {exc}") from exc
    items = parsed if isinstance(parsed, list) else [parsed]
    if not items:
        raise ValueError("tool parser found no call")
    calls = []
    for offset, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"tool call is a {type(item).__name__}, not an object")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError("tool call has no name")
        # Some models write "parameters" (Llama style); a call without arguments has none.
        args = item.get("arguments", item.get("parameters", {}))
        call_id = item.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = new_call_id()
        calls.append(ToolCall(first_index + offset, call_id, name, _arguments_json(args)))
    return calls


def _arguments_json(args: Any) -> str:
    """Arguments as a JSON object string; accepts a dict or a string holding a JSON object."""
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"tool call arguments are not JSON: {exc}") from exc
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ValueError(f"tool call arguments are a {type(args).__name__}, not an object")
    return json.dumps(args, ensure_ascii=False)
