"""hunyuan_a13b (Hunyuan-A13B): a JSON list of {"name", "arguments"} calls between
`<tool_calls>` and `</tool_calls>` (vLLM's hunyuan_a13b_tool_parser.py), as Jamba writes
them; arguments stream as their raw JSON text (decoding/tool_calls.py JSON_LIST).
mlx-lm has no parser for this format.
"""

from __future__ import annotations

import json
from typing import Any

from decoding.tool_calls import JSON_LIST
from decoding.tool_formats import ToolFormat, register


def parse(text: str, tools: Any = None) -> Any:
    return json.loads(text.strip())


HUNYUAN_A13B = register(
    ToolFormat("hunyuan_a13b", parse, "<tool_calls>", "</tool_calls>", stream=JSON_LIST)
)
