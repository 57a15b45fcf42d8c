"""minicpm5 (OpenBMB MiniCPM5): each call is `<function name="NAME"><param name="K">V</param>
...</function>`, with no block around the calls (vLLM's
vllm/tool_parsers/minicpm5xml_tool_parser.py; tests/tool_parsers/test_minicpm5xml_tool_parser.py).

As vLLM's: a block is read as XML (a value's CDATA as written, entities decoded), else, where
it is no well-formed XML (an undefined `&xxe;`), by its `<param name="K">` elements as
written; byte-level markers (`Ġ` for a space, `Ċ` for a newline) and the collapsed
`<functionname=` / `<paramname=` are read as spaces. A value is stripped; a declared string
stays text, any other value is JSON or a Python literal where it reads as one. A call is
none (its block stays content) when its name is not among the request's tools, a `<param>`
has no name, a parameter is written twice or a required one is missing; parameters the tool
does not declare are left out, and a `properties` / `arguments` parameter holding an object
(OpenAI's wrapper) gives its declared keys. The names MiniCPM5 writes for tools it was
trained on (`get_details_by_phone` for `get_customer_by_phone`, ...) are mapped to the
declared tool as vLLM maps them (`_ALIASES`). mlx-lm has no parser for this format.
"""

from __future__ import annotations

import ast
import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

from decoding.tool_formats import ToolFormat, register

_CDATA, _CDATA_END = "<![CDATA[", "]]>"


def _normal(text: str) -> str:
    text = text.replace("\u0120", " ").replace("\u010a", "\n")
    return text.replace("<functionname=", "<function name=").replace("<paramname=", "<param name=")


def _read(value: str) -> tuple[Any, bool]:
    for read in (json.loads, ast.literal_eval):
        try:
            return read(value), True
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return value, False


def _tools(tools: Any) -> dict[str, dict[str, Any]]:
    """Declared tool name -> its parameters schema."""
    out = {}
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name"):
            params = function.get("parameters")
            out[function["name"]] = params if isinstance(params, dict) else {}
    return out


def _first(args: dict[str, Any], *keys: str) -> Any:
    return next((args[k] for k in keys if args.get(k)), None)


def _refuel(args: dict[str, Any]) -> dict[str, Any]:
    mapped = {k: args[k] for k in ("customer_id",) if k in args}
    line, amount = (
        _first(args, "line_id", "id"),
        _first(args, "amount_gb", "gb", "gb_amount", "amount"),
    )
    mapped.update({k: v for k, v in (("line_id", line), ("amount_gb", amount)) if v is not None})
    return mapped


def _by_name(args: dict[str, Any]) -> dict[str, Any]:
    name, dob = _first(args, "full_name", "name"), _first(args, "date_of_birth", "dob")
    mapped = {"full_name": name} if name is not None else {}
    return mapped | ({"date_of_birth": dob, "dob": dob} if dob is not None else {})


def _one(key: str, *sources: str, **extra: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def mapped(args: dict[str, Any]) -> dict[str, Any]:
        value = _first(args, *sources)
        return {key: value, **extra} if value is not None else {}

    return mapped


# (the name written, the declared tool) -> its arguments mapped (empty: no mapping)
_ALIASES: dict[tuple[str, str], Callable[[dict[str, Any]], dict[str, Any]]] = {
    ("get_details_by_phone", "get_customer_by_phone"): _one(
        "phone_number", "phone_number", "phone"
    ),
    ("get_details_by_name", "get_customer_by_name"): _by_name,
    **{
        (alias, "get_details_by_id"): _one("id", "line_id", "id")
        for alias in ("get_line_details", "get_line_status", "get_roaming_status")
    },
    ("get_plan_details", "get_details_by_id"): _one("id", "plan_id", "id"),
    ("enable_roaming", "toggle_roaming"): _one("line_id", "line_id", "id", enabled=True),
    ("disable_roaming", "toggle_roaming"): _one("line_id", "line_id", "id", enabled=False),
    ("add_refueled_data", "refuel_data"): _refuel,
    ("add_data_to_line", "refuel_data"): _refuel,
}


def _params_xml(block: str) -> tuple[str, list[tuple[str | None, str]]] | None:
    try:
        root = ET.fromstring(block)
    except ET.ParseError:
        return None
    if root.tag != "function":
        return None
    nodes = root.findall("param")
    if not nodes and root.find("arguments") is not None:
        nodes = root.find("arguments").findall("param")  # type: ignore[union-attr]
    return (root.get("name") or "").strip(), [(p.get("name"), p.text or "") for p in nodes]


def _params_text(block: str) -> tuple[str, list[tuple[str | None, str]]]:
    """The name and `<param name="K">V</param>` elements read as written (string scans)."""
    head = block.split(">", 1)[0]
    name = ""
    for quote in ('"', "'"):
        if f"name={quote}" in head:
            name = head.split(f"name={quote}", 1)[1].split(quote, 1)[0]
            break
    params: list[tuple[str | None, str]] = []
    for part in block.split("<param")[1:]:
        tag, sep, rest = part.partition(">")
        if not sep:
            continue
        if "name=" not in tag:
            params.append((None, ""))
            continue
        key = tag.split("name=", 1)[1].strip("\"' ")
        if "</param>" not in rest:
            continue
        value = rest.split("</param>", 1)[0]
        if value.startswith(_CDATA) and value.endswith(_CDATA_END):
            value = value[len(_CDATA) : -len(_CDATA_END)]
        params.append((key, value))
    return name.strip(), params


def _value(value: Any, prop: Any) -> Any:
    if isinstance(prop, dict) and prop.get("type") == "string":
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return _read(value)[0] if isinstance(value, str) else value


def parse(text: str, tools: Any = None) -> Any:
    block = _normal(text).strip()
    if not block.endswith("</function>"):
        raise ValueError("the <function> block is not closed")
    read = _params_xml(block) or _params_text(block)
    name, params = read
    declared = _tools(tools)
    props = declared.get(name, {}).get("properties") or {}
    allowed = set(props) if isinstance(props, dict) else set()
    args: dict[str, Any] = {}
    for key, raw in params:
        if not key:
            raise ValueError("a <param> without a name")
        value = raw.strip()
        if key in ("properties", "arguments") and allowed and key not in allowed:
            wrapped, ok = _read(value)
            if not ok or not isinstance(wrapped, dict):
                raise ValueError(f"{key!r} holds no object")
            kept = {k: v for k, v in wrapped.items() if k in allowed}
            if not kept or set(kept) & set(args):
                raise ValueError(f"{key!r} holds no declared parameter, or one given twice")
            args.update({k: _value(v, props.get(k)) for k, v in kept.items()})
            continue
        if allowed and key not in allowed:
            continue
        if key in args:
            raise ValueError(f"parameter {key!r} written twice")
        args[key] = _value(value, props.get(key))
    if name not in declared:
        for (alias, tool), mapping in _ALIASES.items():
            if alias == name and tool in declared and (mapped := mapping(args)):
                name, args = tool, mapped
                break
    if name not in declared:
        raise ValueError(f"tool {name!r} is not among the request's tools")
    required = declared[name].get("required") or []
    if isinstance(required, list) and not set(required) <= set(args):
        raise ValueError(f"call {name!r} misses a required parameter")
    return {"name": name, "arguments": args}


MINICPM5 = register(
    ToolFormat(
        "minicpm5",
        parse,
        "<function",
        "</function>",
        keep=True,
        whole="a call is checked against the request's tools when it closes (vLLM drops "
        "an undeclared or invalid one)",
    )
)
