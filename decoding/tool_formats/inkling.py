"""inkling (Thinking Machines' Inkling): the output is a sequence of typed blocks, each
opened by a content-kind marker and closed by `<|end_message|>` (or
`<|content_model_end_sampling|>`), later ones after `<|message_model|>`; a call is the block
`<|content_invoke_tool_json|>{"name": ..., "args": {...}}<|end_message|>` (vLLM's
vllm/parser/inkling.py; cases in tests/parser/engine/test_inkling.py). The thinking block
and the text markers are the reasoning format of the same name
(decoding/reasoning_formats.py), which the tool parser's name brings (vLLM's Inkling
parser reads both).

As vLLM's: missing `args` is `{}`; `args` that is no JSON object is no call. mlx-lm has
no parser for this format.
"""

from __future__ import annotations

import json
from typing import Any

from decoding.tool_formats import ToolFormat, register

TOOL_JSON = "<|content_invoke_tool_json|>"
END_MESSAGE = "<|end_message|>"
END_SAMPLING = "<|content_model_end_sampling|>"


def parse(text: str, tools: Any = None) -> Any:
    text = text.rstrip()
    if text.endswith(END_SAMPLING):  # the block's other closer, the output's last token
        text = text[: -len(END_SAMPLING)]
    call = json.loads(text, strict=False)
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ValueError("the call is no JSON object with a name")
    args = call.get("args", {})
    if not isinstance(args, dict):
        raise ValueError(f"call {call['name']!r}: args must be a JSON object")
    return {"name": call["name"], "arguments": args}


INKLING = register(
    ToolFormat(
        "inkling",
        parse,
        TOOL_JSON,
        END_MESSAGE,
        whole="each call's arguments are read when its block closes (the name comes first)",
    )
)
