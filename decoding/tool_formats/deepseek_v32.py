"""deepseek_v32 (DeepSeek V3.2's DSML): `<｜DSML｜function_calls>` holding
`<｜DSML｜invoke name="NAME">` elements, each with `<｜DSML｜parameter name="KEY"
string="true|false">VALUE</｜DSML｜parameter>` (vLLM's deepseekv32_tool_parser.py and
deepseekv32_engine_tool_parser.py; tests/tool_parsers/test_deepseekv32_tool_parser.py).

A declared parameter is typed by the tool's schema as the XML-parameter formats type it
(`qwen3_xml.convert`); an undeclared one is JSON where `string="false"`, else text. A lone
`arguments` / `input` parameter the schema does not declare, holding an object of declared
keys, is unwrapped (vLLM's wrapper repair). mlx-lm has no parser for this format.
"""

from __future__ import annotations

import json
from typing import Any

import regex

from decoding.tool_formats import ToolFormat, register
from decoding.tool_formats.qwen3_xml import _container, _properties, convert

_INVOKE = regex.compile(
    r'<｜DSML｜invoke name="(?P<name>[^"]+)">(?P<body>.*?)</｜DSML｜invoke>', regex.S
)
_PARAM = regex.compile(
    r'<｜DSML｜parameter name="(?P<key>[^"]+)"(?: string="(?P<string>true|false)")?>'
    r"(?P<value>.*?)</｜DSML｜parameter>",
    regex.S,
)


def _undeclared(value: str, string: bool) -> Any:
    if string:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _call(name: str, body: str, tools: Any) -> dict[str, Any]:
    props = _properties(tools, name)
    args: dict[str, Any] = {}
    for m in _PARAM.finditer(body):
        prop = None if props is None else props.get(m["key"])
        value = m["value"]
        args[m["key"]] = (
            _undeclared(value, m["string"] != "false") if prop is None else convert(value, prop)
        )
    if props and len(args) == 1:  # a lone wrapper of the declared arguments
        ((key, value),) = args.items()
        inner = _container(value) if isinstance(value, str) else value
        wrapper = key in ("arguments", "input") and key not in props
        if wrapper and isinstance(inner, dict) and inner and set(inner) <= set(props):
            args = {k: convert(v, props[k]) if isinstance(v, str) else v for k, v in inner.items()}
    return {"name": name, "arguments": args}


def parse(text: str, tools: Any = None) -> Any:
    """Every invoke of a function_calls block; ValueError when it holds none."""
    calls = [_call(m["name"], m["body"], tools) for m in _INVOKE.finditer(text)]
    if not calls:
        raise ValueError("no <｜DSML｜invoke name=...> in the block")
    return calls[0] if len(calls) == 1 else calls


DEEPSEEK_V32 = register(
    ToolFormat(
        "deepseek_v32",
        parse,
        "<｜DSML｜function_calls>",
        "</｜DSML｜function_calls>",
        whole="no streaming parse yet: values typed by the schema when the block closes",
    )
)
