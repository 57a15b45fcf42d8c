"""minimax_m3 (MiniMax-M3): every tag carries the `]<]minimax[>[` prefix; a block
`NS<tool_call>` ... `NS</tool_call>` holds calls `NS<invoke name="NAME">` ... `NS</invoke>`
whose parameters are elements `NS<KEY>VALUE NS</KEY>`, nested for objects and arrays
(vLLM's vllm/tool_parsers/minimax_m3_tool_parser.py, a RustToolParser whose grammar lives in
vLLM's Rust crate; tests/tool_parsers/test_minimax_m3_tool_parser.py).

As vLLM's tests give it: a value is typed by the declared parameter's schema: a leaf is
an integer, number or boolean where the schema says so and it reads as one (`018956` as
an integer is 18956), else text as written; an element holding elements is an object (a
key written twice collects its values in a list), or, where the schema says array, a list
of its children (each typed by `items`). Where nothing is declared a leaf is JSON where it
reads as JSON, else text. Read by string scans (no regex over the values).
mlx-lm has no parser for this format.
"""

from __future__ import annotations

import json
from typing import Any

from decoding.tool_formats import ToolFormat, register
from decoding.tool_formats.qwen3_xml import _properties

NS = "]<]minimax[>["
_INVOKE, _INVOKE_END = NS + '<invoke name="', NS + "</invoke>"


def _kinds(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind} if isinstance(kind, str) else set()
    for option in schema.get("anyOf") or schema.get("oneOf") or ():
        kinds |= _kinds(option)
    return kinds - {"null"}


def _leaf(text: str, schema: Any) -> Any:
    kinds = _kinds(schema)
    if "boolean" in kinds and text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    if "integer" in kinds:
        try:
            return int(text.strip())
        except ValueError:
            pass
    if "number" in kinds:
        for read in (int, float):
            try:
                return read(text.strip())
            except ValueError:
                pass
    if kinds and kinds <= {"string", "boolean", "integer", "number"}:
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _elements(text: str) -> list[tuple[str, str]] | None:
    """The top-level `NS<KEY>...NS</KEY>` elements of ``text`` (None: it holds none, or
    something else than elements: a leaf). Raises on an element left open."""
    out: list[tuple[str, str]] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return out or None
        if not text.startswith(NS + "<", pos) or text.startswith(NS + "</", pos):
            if out:
                raise ValueError(f"text between elements: {text[pos : pos + 40]!r}")
            return None
        close = text.find(">", pos + len(NS) + 1)
        if close == -1:
            raise ValueError("an element's tag is not closed")
        key = text[pos + len(NS) + 1 : close]
        start = close + 1
        end_tag, open_tag = f"{NS}</{key}>", f"{NS}<{key}>"
        depth, scan = 1, start
        while depth:  # the matching end tag, same-named elements nested inside counted
            end = text.find(end_tag, scan)
            if end == -1:
                raise ValueError(f"element {key!r} is not closed")
            depth += text.count(open_tag, scan, end) - 1
            scan = end + len(end_tag)
        out.append((key, text[start:end]))
        pos = scan


def _value(text: str, schema: Any) -> Any:
    children = _elements(text)
    if children is None:
        return _leaf(text, schema)
    schema = schema if isinstance(schema, dict) else {}
    if "array" in _kinds(schema):
        return [_value(body, schema.get("items")) for _, body in children]
    return _object(children, schema)


def _object(children: list[tuple[str, str]], schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    extra = schema.get("additionalProperties")
    out: dict[str, Any] = {}
    for key, body in children:
        value = _value(body, props.get(key, extra if isinstance(extra, dict) else None))
        if key in out:  # a key written twice: its values in a list
            previous = out[key]
            out[key] = [*previous, value] if isinstance(previous, list) else [previous, value]
        else:
            out[key] = value
    return out


def parse(text: str, tools: Any = None) -> Any:
    calls = []
    for part in text.split(_INVOKE)[1:]:
        name, sep, rest = part.partition('">')
        if not sep or _INVOKE_END not in rest:
            continue
        body = rest.split(_INVOKE_END, 1)[0]
        props = _properties(tools, name)
        calls.append(
            {"name": name, "arguments": _object(_elements(body) or [], {"properties": props})}
        )
    if not calls:
        raise ValueError("no closed invoke in the tool_call block")
    return calls[0] if len(calls) == 1 else calls


MINIMAX_M3 = register(
    ToolFormat(
        "minimax_m3",
        parse,
        NS + "<tool_call>",
        NS + "</tool_call>",
        whole="nested values are typed by the schema when their call closes",
    )
)
