"""ernie45 (ERNIE 4.5): Hermes-style `<tool_call>{"name", "arguments"}</tool_call>` blocks,
read by mlx-lm's json_tools parser; whitespace around the calls is no content, as vLLM's
ernie45_tool_parser.py strips it (tests/tool_parsers/test_ernie45_moe_tool_parser.py).
"""

from __future__ import annotations

from mlx_lm.tool_parsers import json_tools

from decoding import call_formats
from decoding.tool_calls import JSON_OBJECT
from decoding.tool_formats import ToolFormat, register

ERNIE45 = register(
    ToolFormat(
        "ernie45",
        json_tools.parse_tool_call,
        "<tool_call>",
        "</tool_call>",
        trim_content=True,
        grammar=call_formats.json_tools,
        stream=JSON_OBJECT,
    )
)
