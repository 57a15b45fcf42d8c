"""glm45 and glm47 (GLM-4.5 / 4.6, GLM-4.7 / 5): `<tool_call>NAME<arg_key>K</arg_key>
<arg_value>V</arg_value>...</tool_call>` (vLLM's glm4_moe_tool_parser.py and
glm47_moe_tool_parser.py; tests/tool_parsers/test_glm4_moe_tool_parser.py and
test_glm47_moe_tool_parser.py). glm47: content that is only whitespace before or between
the calls is none, as vLLM gives; glm45 keeps the text before a call as it is.

Ours around mlx-lm's mlx_lm/tool_parsers/glm47.py, where that one differs from vLLM: it
strips a string value (vLLM keeps `    indented code    `), reads a parameter typed by
anyOf / a type list as JSON (`"42"` of an Optional[str] becomes 42), and makes an empty
block a call named "unknown". mlx-lm still reads the forms without `<arg_key>` (a JSON
payload, `name a=1`), which vLLM's tests do not cover.
"""

from __future__ import annotations

import ast
import json
from typing import Any

import regex
from mlx_lm.tool_parsers import glm47

from decoding import call_formats
from decoding.tool_calls import XmlStream
from decoding.tool_formats import ToolFormat, register
from decoding.tool_formats.qwen3_xml import _properties, _type_of

_NAME = regex.compile(r"^(.*?)<arg_key>", regex.S)
_ARG = regex.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", regex.S)
_TEXT = ("string", "str", "text")


def _deserialize(value: str) -> Any:
    for read in (json.loads, ast.literal_eval):
        try:
            return read(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return value


def parse(text: str, tools: Any = None) -> dict[str, Any]:
    if not text.strip():
        raise ValueError("an empty tool_call block")
    m = _NAME.search(text)
    if m is None:
        call: dict[str, Any] = glm47.parse_tool_call(text, tools)
        if call.get("name") == "unknown":
            raise ValueError("no function name in the block")
        return call
    name = m.group(1).strip()
    if not name:
        raise ValueError("no function name in the block")
    props = _properties(tools, name) or {}
    args: dict[str, Any] = {}
    for key, value in _ARG.findall(text):
        key = key.strip()
        kind, _ = _type_of(props.get(key))
        args[key] = value if kind in _TEXT else _deserialize(value.strip())
    return {"name": name, "arguments": args}


# String values as written (vLLM keeps their whitespace; mlx-lm's glm47 strips them:
# mlx_modules.py).
STREAM = XmlStream(
    call_open=r"\s*(?P<name>[^<\s][^<]*?)\s*<arg_key>",
    param_first=r"(?P<key>[^<]*)</arg_key>\s*<arg_value>",
    param_next=r"\s*<arg_key>(?P<key>[^<]*)</arg_key>\s*<arg_value>",
    value_close="</arg_value>",
    call_close=None,
    synth_close="",
    trim="none",
)

_MARKERS = ("<tool_call>", "</tool_call>")
_GRAMMAR = call_formats.GRAMMARS["glm47"]
GLM45 = register(
    ToolFormat("glm45", parse, *_MARKERS, blank_content=True, grammar=_GRAMMAR, stream=STREAM)
)
GLM47 = register(
    ToolFormat("glm47", parse, *_MARKERS, blank_content=True, grammar=_GRAMMAR, stream=STREAM)
)
