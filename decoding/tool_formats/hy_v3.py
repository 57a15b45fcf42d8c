"""hy_v3 (Tencent Hy3): `<tool_calls>` holding calls `<tool_call>NAME<tool_sep>
<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>` (vLLM's
vllm/tool_parsers/hy_v3_tool_parser.py; tests/tool_parsers/test_hy_v3_tool_parser.py).

As vLLM's: the text before `<tool_calls>` is the content, as written; a value is typed by
the declared parameter's schema (its type, a type list, anyOf / oneOf; `int*` / `uint*` /
`long*` read as integer, `num*` / `float*` as number): a boolean, integer or number where
it reads as one, JSON for other non-string types, else the text as written (a parameter
or tool not declared reads as a string, vLLM's fallback schema). A call cut off before
its `</tool_call>` is read as far as it goes. Values are found by string scans. mlx-lm has
no parser for this format.
"""

from __future__ import annotations

import json
from typing import Any

from decoding.tool_calls import XmlStream
from decoding.tool_formats import ToolFormat, register
from decoding.tool_formats.glm import _deserialize
from decoding.tool_formats.qwen3_xml import _properties

_CALL, _CALL_END, _SEP = "<tool_call>", "</tool_call>", "<tool_sep>"
_KEY, _KEY_END, _VALUE, _VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
_ALIASES = {
    "str": "string",
    "text": "string",
    "varchar": "string",
    "char": "string",
    "enum": "string",
    "bool": "boolean",
    "binary": "boolean",
    "int": "integer",
    "float": "number",
    "double": "number",
    "list": "array",
    "dict": "object",
    "map": "object",
}


def _normal(kind: str) -> str:
    if kind in _ALIASES:
        return _ALIASES[kind]
    lower = kind.lower()
    if lower.startswith(("int", "uint", "long", "short", "unsigned")):
        return "integer"
    if lower.startswith(("num", "float")):
        return "number"
    return kind


def _types(prop: Any) -> set[str]:
    """The declared non-null types of a parameter (none declared: string, as vLLM's)."""
    prop = prop if isinstance(prop, dict) else {}
    if "type" in prop:
        kinds = prop["type"] if isinstance(prop["type"], list) else [prop["type"]]
        options = [{"type": k} for k in kinds]
    elif isinstance(prop.get("anyOf"), list):
        options = prop["anyOf"]
    elif isinstance(prop.get("oneOf"), list):
        options = prop["oneOf"]
    else:
        options = [{"type": "string"}]
    return {
        _normal(str(o.get("type", "string"))) if isinstance(o, dict) else "string" for o in options
    } - {"null"}


def _number(value: str) -> int | float | None:
    try:
        return float(value) if any(c in value for c in ".eE") else int(value)
    except ValueError:
        return None


def _value(value: str, prop: Any) -> Any:
    types = _types(prop)
    if "boolean" in types and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if "integer" in types:
        try:
            return int(value)
        except ValueError:
            pass
    if "number" in types and (number := _number(value)) is not None:
        return number
    if types - {"string", "boolean", "integer", "number"}:
        try:
            return json.loads(value)
        except ValueError:
            pass
    return value if "string" in types else _deserialize(value)


def _arguments(body: str, props: dict[str, Any]) -> dict[str, Any]:
    """`<arg_key>K</arg_key> <arg_value>V</arg_value>` pairs, read by string scans."""
    args: dict[str, Any] = {}
    pos = 0
    while (start := body.find(_KEY, pos)) != -1:
        key_end = body.find(_KEY_END, start)
        if key_end == -1:
            break
        after = body[key_end + len(_KEY_END) :]
        rest = after.lstrip()
        if not rest.startswith(_VALUE):
            pos = key_end
            continue
        value_start = key_end + len(_KEY_END) + (len(after) - len(rest)) + len(_VALUE)
        value_end = body.find(_VALUE_END, value_start)
        if value_end == -1:
            break
        key = body[start + len(_KEY) : key_end]
        args[key] = _value(body[value_start:value_end], props.get(key))
        pos = value_end + len(_VALUE_END)
    return args


def parse(text: str, tools: Any = None) -> Any:
    calls = []
    for part in text.split(_CALL)[1:]:
        if _SEP not in part:
            continue
        name, body = part.split(_SEP, 1)
        name = name.strip()
        body = body.split(_CALL_END, 1)[0]
        calls.append({"name": name, "arguments": _arguments(body, _properties(tools, name) or {})})
    if not calls:
        raise ValueError("no <tool_call>NAME<tool_sep> call in the block")
    return calls[0] if len(calls) == 1 else calls


STREAM = XmlStream(
    call_open=r"\s*<tool_call>\s*(?P<name>[^<\s]++)\s*<tool_sep>",
    param_first=r"\s*<arg_key>(?P<key>[^<]*)</arg_key>\s*<arg_value>",
    param_next=r"\s*<arg_key>(?P<key>[^<]*)</arg_key>\s*<arg_value>",
    value_close="</arg_value>",
    call_close=r"\s*</tool_call>",
    synth_close="</tool_call>",
    trim="none",
)

HY_V3 = register(ToolFormat("hy_v3", parse, "<tool_calls>", "</tool_calls>", stream=STREAM))
