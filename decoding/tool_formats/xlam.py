"""xlam (Salesforce xLAM): a JSON list of {"name", "arguments"} calls, bare at the start of
the content (or right after a `</think>`), in a ```json fence, after `[TOOL_CALLS]` or
between `<tool_call>` tags (vLLM's vllm/tool_parsers/xlam_tool_parser.py). Text before the
calls is content, trimmed as vLLM trims it. mlx-lm has no parser for this format.
"""

from __future__ import annotations

import json
from typing import Any

from decoding.tool_formats import Block, ToolFormat, register

_DECODER = json.JSONDecoder()


def parse(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """The calls of the JSON list (or single call object) the block holds; text after it
    (a closing fence) is left out."""
    body = text.strip()
    if body.startswith("json"):  # a ```json fence
        body = body[4:].lstrip()
    value, _ = _DECODER.raw_decode(body)
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValueError("not a call: no name")
        calls.append({"name": item["name"], "arguments": item.get("arguments", {})})
    if not calls:
        raise ValueError("an empty call list")
    return calls


XLAM = register(
    ToolFormat(
        "xlam",
        parse,
        "[",
        at_content_start=True,
        keep=True,
        more=(Block("[TOOL_CALLS]"), Block("<tool_call>", "</tool_call>"), Block("```json", "```")),
        content_start_after=("</think>",),
        trim_content=True,
        whole="a list is calls only where it parses whole; else it is content",
    )
)
