"""gigachat3 (Sber GigaChat 3 / 3.1): one call, a JSON object `{"name", "arguments"}` after
`<|message_sep|>\\n\\nfunction call<|role_sep|>\\n` (GigaChat 3) or `<|function_call|>`
(GigaChat 3.1), to the end of the output, where a trailing `</s>` is no part of it
(vLLM's vllm/tool_parsers/gigachat3_tool_parser.py;
tests/tool_parsers/test_gigachat3_tool_parser.py).

As vLLM's: the text before the marker is the content, as written; the arguments must be a
JSON object, else there is no call. mlx-lm has no parser for this format.
"""

from __future__ import annotations

import json
from typing import Any

from decoding.tool_calls import JSON_OBJECT
from decoding.tool_formats import Block, ToolFormat, register

_EOS = "</s>"


def parse(text: str, tools: Any = None) -> Any:
    text = text.rstrip()
    if text.endswith(_EOS):
        text = text[: -len(_EOS)]
    call = json.loads(text, strict=False)
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ValueError("the call is no JSON object with a name")
    if not isinstance(call.get("arguments"), dict):
        raise ValueError(f"call {call['name']!r} has no arguments object")
    return {"name": call["name"], "arguments": call["arguments"]}


GIGACHAT3 = register(
    ToolFormat(
        "gigachat3",
        parse,
        "<|message_sep|>\n\nfunction call<|role_sep|>\n",
        more=(Block("<|function_call|>"),),
        stream=JSON_OBJECT,
    )
)
