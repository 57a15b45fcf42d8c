"""solar_open2 (Upstage Solar Open 2): each call is `<|tool_call:start|>NAME\\n` then
arguments `<|tool_arg:start|>KEY<|tool_arg:value|>VALUE<|tool_arg:end|>`, then
`<|tool_call:end|>` (vLLM's vllm/tool_parsers/solar_open2_tool_parser.py;
tests/tool_parsers/test_solar_open2_tool_parser.py).

As vLLM's: the content is the text before the first call's start marker (only whitespace:
none); what follows it is the calls, text between and after them left out. The name is the
rest of the start marker's line; a call marker before that line ends skips the block. A
call ends at its end marker or, where the model dropped it, at the next start marker; a
call still open at the end of the output is no call (no call at all: the output comes
back as content, as written). A value ends at `<|tool_arg:end|>`, or at the next
`<|tool_arg:start|>` or the call's end; a key written twice keeps its first value. Values
are typed by the declared parameter's schema as vLLM's `coerce_to_schema_type`
(vllm/tool_parsers/utils.py) does: null, integer, number (7.0 is 7), boolean (true / 1,
false / 0), object / array (JSON), string, in that order of preference; with no
declared type a value is text. Read by string scans. mlx-lm has no parser for this format.
"""

from __future__ import annotations

import json
import math
from typing import Any

from decoding.tool_formats import ToolFormat, register
from decoding.tool_formats.qwen3_xml import _properties

CALL_START, CALL_END = "<|tool_call:start|>", "<|tool_call:end|>"
ARG_START, ARG_VALUE, ARG_END = "<|tool_arg:start|>", "<|tool_arg:value|>", "<|tool_arg:end|>"

# vLLM's type aliases (utils.py _TYPE_ALIASES)
_ALIASES = {
    **dict.fromkeys(("str", "text", "varchar", "char", "enum"), "string"),
    **dict.fromkeys(
        ("int", "int32", "int64", "uint", "uint32", "uint64", "long", "short", "unsigned"),
        "integer",
    ),
    **dict.fromkeys(("float", "float32", "float64", "double"), "number"),
    "bool": "boolean",
    "dict": "object",
    **dict.fromkeys(("arr", "list", "sequence"), "array"),
}


def _types(schema: Any) -> set[str]:
    """The JSON types ``schema`` declares (vLLM's extract_types_from_schema): its type(s),
    its enum values' types, and its anyOf / oneOf / allOf choices'; none: string."""
    if not isinstance(schema, dict):
        return {"string"}
    out: set[str] = set()
    kind = schema.get("type")
    if isinstance(kind, str):
        out.add(kind)
    elif isinstance(kind, list):
        out.update(k for k in kind if isinstance(k, str))
    for value in schema.get("enum") or ():
        out.add(
            "null"
            if value is None
            else "boolean"
            if isinstance(value, bool)
            else "integer"
            if isinstance(value, int)
            else "number"
            if isinstance(value, float)
            else "string"
            if isinstance(value, str)
            else "array"
            if isinstance(value, list)
            else "object"
        )
    for key in ("anyOf", "oneOf", "allOf"):
        for choice in schema.get(key) or ():
            out |= _types(choice) if isinstance(choice, dict) else set()
    return out or {"string"}


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def _json(text: str) -> tuple[bool, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return False, None
    return _finite(value), value


def coerce(text: str, types: set[str]) -> Any:
    """``text`` as the first of ``types`` it reads as (vLLM's coerce_to_schema_type)."""
    kinds = {_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in types}
    for kind in ("null", "integer", "number", "boolean", "object", "array", "string"):
        if kind not in kinds:
            continue
        if kind == "null" and text.lower() == "null":
            return None
        if kind == "string":
            return text
        if kind == "integer":
            try:
                return int(text)
            except ValueError:
                continue
        if kind == "number":
            try:
                number = float(text)
            except ValueError:
                continue
            if math.isfinite(number):
                return int(number) if number == int(number) else number
        if kind == "boolean":
            word = text.lower().strip()
            if word in ("true", "1", "false", "0"):
                return word in ("true", "1")
        if kind in ("object", "array"):
            ok, value = _json(text)
            if ok:
                return value
    ok, value = _json(text)
    return value if ok else text


def _first(text: str, pos: int, *markers: str) -> tuple[int, str]:
    """The first of ``markers`` in text[pos:]: (where, which), or (-1, "")."""
    best, which = -1, ""
    for m in markers:
        i = text.find(m, pos)
        if i != -1 and (best == -1 or i < best):
            best, which = i, m
    return best, which


def _arguments(body: str, name: str, tools: Any) -> dict[str, Any]:
    props = _properties(tools, name)
    args: dict[str, Any] = {}
    pos = body.find(ARG_START)
    while pos != -1:
        key_at = pos + len(ARG_START)
        value_at = body.find(ARG_VALUE, key_at)
        restart = body.find(ARG_START, key_at)
        if value_at == -1 or (restart != -1 and restart < value_at):
            pos = restart  # the key ran into the next argument: no key
            continue
        key = body[key_at:value_at]
        start = value_at + len(ARG_VALUE)
        end, _ = _first(body, start, ARG_END, ARG_START)
        end = len(body) if end == -1 else end
        if key not in args:
            schema = props.get(key) if isinstance(props, dict) else None
            args[key] = coerce(body[start:end], _types(schema))
        pos = body.find(ARG_START, end)
    return args


def parse(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """The calls in ``text``, which starts at the first call's start marker."""
    calls: list[dict[str, Any]] = []
    pos = text.find(CALL_START)
    while pos != -1:
        name_at = pos + len(CALL_START)
        newline = text.find("\n", name_at)
        bound, _ = _first(text, name_at, CALL_START, CALL_END)
        if newline == -1:
            break
        if bound != -1 and bound < newline:  # no name line: resync on the boundary
            pos = text.find(
                CALL_START, bound + (len(CALL_END) if text.startswith(CALL_END, bound) else 0)
            )
            continue
        end, which = _first(text, newline + 1, CALL_START, CALL_END)
        if end == -1:  # cut off: no call
            break
        name = text[name_at:newline].strip()
        calls.append({"name": name, "arguments": _arguments(text[newline + 1 : end], name, tools)})
        pos = end if which == CALL_START else text.find(CALL_START, end + len(CALL_END))
    if not calls:
        raise ValueError("no complete solar_open2 call")
    return calls


SOLAR_OPEN2 = register(
    ToolFormat(
        "solar_open2",
        parse,
        CALL_START,
        keep=True,
        blank_content=True,
        whole="vLLM's content ends at the first call and every later call is read from the "
        "rest of the output (text between and after calls left out): the block runs to the "
        "end of the output, so its calls are read whole there",
    )
)
