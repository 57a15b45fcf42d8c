"""qwen3_xml and qwen3_coder (Qwen3-Coder, Qwen3.5): `<tool_call><function=NAME>
<parameter=KEY>VALUE</parameter>...</function></tool_call>`, each value converted by the
declared tool's JSON schema (vLLM's vllm/tool_parsers/qwen3coder_tool_parser.py and
qwen3xml_tool_parser.py; tests/tool_parsers/test_qwen3coder_tool_parser.py and
test_qwen3_xml_coder_shared.py).

Ours, not mlx-lm's mlx_lm/tool_parsers/qwen3_coder.py, whose conversion differs from vLLM's
where vLLM's tests look: a property typed by `anyOf` / `oneOf` / a type list (Pydantic's
Optional[T]) is left as text there (`"5"`, an object as JSON text); a string-typed "null"
becomes None; a value that is no number for an integer raises (the whole block is lost);
a Python repr (`{'k': 'v'}`, a JSON string holding one) and Python's `None` are not read.
mlx-lm's regex also swallows the next parameter when one is left unclosed, and reads only
the first function of a block. vLLM's rules, as its tests pin them:
- the type is the first non-null one of anyOf / oneOf / a type list; "null" (and Python's
  "None") is null unless the type is a string that is not nullable; an undeclared parameter
  stays text ("null" aside);
- integers and numbers that do not convert stay text; a boolean is whether it says "true";
- objects and arrays: JSON, else a Python literal, also when wrapped in a JSON string;
- one newline around a value is dropped; an unclosed parameter ends at the next one;
- every `<function=NAME>` of a block is a call; one whose name is not closed by `>` (or
  holds spaces, an unrendered `{{ template }}`) is left out;
- a call without its `<tool_call>` (`<function=...>...</function>` alone) is read too,
  and a stray `</tool_call>` after it is no content.
"""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from typing import Any

import regex

from decoding import call_formats
from decoding.tool_calls import XmlStream
from decoding.tool_formats import Block, ToolFormat, register

_FUNCTION = regex.compile(
    r"<function=(?P<name>[^\s<>{}]+)>(?P<body>.*?)</function>(?=\s*(?:<function=|$))", regex.S
)
_OPEN = regex.compile(r"<parameter=([^>]*)>")
_CLOSE = "</parameter>"
_AFTER_CLOSE = regex.compile(r"\s*(?:<parameter=([^>]*)>|$)")
_INT = ("int", "uint", "long", "short", "unsigned")
_TEXT = ("string", "str", "text", "varchar", "char", "enum")


def _properties(tools: Any, name: str) -> dict[str, Any] | None:
    """The declared parameters of tool ``name`` (None: no such tool declared)."""
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == name:
            params = function.get("parameters")
            props = params.get("properties") if isinstance(params, dict) else None
            return props if isinstance(props, dict) else {}
    return None


def _type_of(prop: Any) -> tuple[str, bool]:
    """(the first non-null type, whether null is allowed) of a property schema."""
    if not isinstance(prop, dict):
        return "", False
    types = prop.get("type")
    options: list[Any] = []
    if isinstance(types, list):
        options = types
    elif isinstance(types, str):
        options = [types]
    else:
        for key in ("anyOf", "oneOf"):
            if isinstance(prop.get(key), list):
                options = [o.get("type") for o in prop[key] if isinstance(o, dict)]
                break
    plain = [str(t).strip().lower() for t in options if t not in (None, "null")]
    return (plain[0] if plain else ""), "null" in options


def _container(value: str) -> Any:
    """JSON, else a Python literal; a string holding one is read once more."""
    for read in (json.loads, ast.literal_eval):
        try:
            out = read(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(out, str):
            inner = _container(out)
            return inner if isinstance(inner, dict | list) else out
        return out
    return value


def convert(value: str, prop: Any) -> Any:
    """One parameter's text converted by its schema (None: not declared), vLLM's rules."""
    if prop is None:
        return None if value.lower() == "null" else value
    kind, nullable = _type_of(prop)
    text = kind in _TEXT
    if (value.lower() == "null" or value == "None") and (nullable or not text):
        return None
    if not kind:
        return _container_or_text(value)
    if text:
        return value
    try:
        if kind.startswith(_INT):
            return int(value)
        if kind.startswith(("num", "float", "double")):
            number = float(value)
            return int(number) if number.is_integer() else number
    except ValueError:
        return value
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    return _container(value)


def _container_or_text(value: str) -> Any:
    """A property without a type: JSON objects and arrays are read, the rest stays text."""
    try:
        out = json.loads(value)
    except ValueError:
        return value
    return out if isinstance(out, dict | list) else value


def known_key(key: str, props: dict[str, Any] | None) -> bool:
    """Whether `<parameter=key>` is structural: a declared parameter (any key where the
    tool is not declared). vLLM reads an undeclared one inside a value as text."""
    return props is None or key.strip() in props


def _params(body: str, props: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(key, raw value) of each parameter of a function body. A value ends at the first
    `</parameter>` followed by another declared parameter or the body's end, or where it
    was left unclosed, at the next declared `<parameter=...>` not given yet; other tags
    are its text."""
    out: list[tuple[str, str]] = []
    pos = 0
    while True:
        seen = {k for k, _ in out}
        m = next((o for o in _OPEN.finditer(body, pos) if known_key(o[1], props)), None)
        if m is None:
            return out
        start = m.end()
        end: int | None = None
        after: int | None = None
        i = body.find(_CLOSE, start)
        while i >= 0:
            a = _AFTER_CLOSE.match(body, i + len(_CLOSE))
            if a is not None and (a[1] is None or known_key(a[1], props)):
                end, after = i, i + len(_CLOSE)
                break
            i = body.find(_CLOSE, i + 1)
        # a parameter already given, or this one, cannot open again: text of the value
        stop = next(
            (
                o.start()
                for o in _OPEN.finditer(body, start)
                if known_key(o[1], props) and o[1].strip() not in seen | {m[1].strip()}
            ),
            None,
        )
        if end is None or after is None or (stop is not None and stop < end):
            end = after = stop if stop is not None else len(body)
        out.append((m[1].strip(), body[start:end]))
        pos = after


def _call(name: str, body: str, tools: Any) -> dict[str, Any]:
    props = _properties(tools, name)
    args: dict[str, Any] = {}
    for key, value in _params(body, props):
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        args[key] = convert(value, None if props is None else props.get(key))
    return {"name": name, "arguments": args}


def parse(text: str, tools: Any = None) -> Any:
    """Every call of a block; ValueError when it holds none."""
    calls = [_call(m["name"], m["body"], tools) for m in _FUNCTION.finditer(text)]
    if not calls:
        raise ValueError("no <function=NAME>...</function> in the block")
    return calls[0] if len(calls) == 1 else calls


def _declared(tools: Any, name: str, key: str) -> bool:
    return known_key(key, _properties(tools, name))


STREAM = XmlStream(
    call_open=r"\s*<function=(?P<name>[^\s<>]+)>",
    param_first=r"\s*<parameter=(?P<key>[^\s<>]+)>",
    param_next=r"\s*<parameter=(?P<key>[^\s<>]+)>",
    value_close="</parameter>",
    call_close=r"\s*</function>",
    synth_close="</function>",
    trim="nl",
    # vLLM reads a parameter left unclosed up to the next one, and a close tag not
    # followed by a declared parameter or the function's end as text (`_params`)
    value_stop=("<parameter=",),
    close_follow=r"\s*(?:<parameter=(?P<key>[^>]*)>|</function>(?P<end>))",
    known_key=_declared,
)

_BLOCKS = (Block("<function=", "</function>", keep=True),)
_MARKERS = ("<tool_call>", "</tool_call>")
_GRAMMAR = call_formats.GRAMMARS["qwen3_coder"]
QWEN3_XML = register(
    ToolFormat(
        "qwen3_xml",
        parse,
        *_MARKERS,
        more=_BLOCKS,
        strip=_MARKERS[1:],
        grammar=_GRAMMAR,
        stream=STREAM,
    )
)
QWEN3_CODER = register(replace(QWEN3_XML, name="qwen3_coder"))  # one format, two names
