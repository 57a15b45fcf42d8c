"""llama3_json, llama4_json (Llama 3.x / 4): `{"name": ..., "parameters": {...}}` calls with no
opening marker (vLLM's llama_tool_parser.py looks at the output's start): a block starts at
`{"name"`; a JSON object that is no call (no `parameters` / `arguments`) comes back as
content. A `<|python_tag|>` before the JSON stays in content. mlx-lm has no parser for this
format (its json_tools needs `<tool_call>` around one object).
"""

from __future__ import annotations

import json
from typing import Any

from decoding import call_formats
from decoding.tool_formats import ToolFormat, register

_DECODER = json.JSONDecoder()
LLAMA_JSON_START = '{"name"'


def _call(obj: Any) -> dict[str, Any]:
    """{"name", "arguments"} of one decoded call; ValueError when it is no call."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("not a call: no name")
    if "arguments" in obj:
        return {"name": obj["name"], "arguments": obj["arguments"]}
    if "parameters" in obj:  # vLLM's llama3_json / phi4_mini_json accept either key
        return {"name": obj["name"], "arguments": obj["parameters"]}
    raise ValueError("not a call: no parameters or arguments")


# mlx-lm has no parser for this format (json_tools needs <tool_call> around one object).
def _llama_json_parser(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """Llama 3.x / 4 calls: `{"name": ..., "parameters": {...}}`, several separated by `;`
    or a newline.

    `text` follows the `{"name"` marker. The first object must be a call (else this raises
    and the block comes back as content); the calls end at the first text that is no call
    (prose, an object without a name), which is dropped, as vLLM's llama_tool_parser.py
    does (tests/tool_parsers/test_llama3_json_tool_parser.py: brace / JSON in trailing text).
    """
    body, pos = LLAMA_JSON_START + text, 0
    calls: list[dict[str, Any]] = []
    while True:
        try:
            obj, end = _DECODER.raw_decode(body, pos)
            call = _call(obj)
        except ValueError:
            if not calls:
                raise
            return calls
        calls.append(call)
        rest = body[end:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
        if not rest.startswith("{"):
            return calls
        pos = len(body) - len(rest)


_GRAMMAR = call_formats.llama_json
_WHOLE = "a JSON object is a call only once whole (no `parameters`: content)"
LLAMA3_JSON = register(
    ToolFormat("llama3_json", _llama_json_parser, LLAMA_JSON_START, grammar=_GRAMMAR, whole=_WHOLE)
)
LLAMA4_JSON = register(
    ToolFormat("llama4_json", _llama_json_parser, LLAMA_JSON_START, grammar=_GRAMMAR, whole=_WHOLE)
)
