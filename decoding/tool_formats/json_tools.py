"""hermes, granite4 (mlx-lm's json_tools: `<tool_call>{"name", "arguments"}</tool_call>`),
internlm (one JSON object between `<|action_start|><|plugin|>` and `<|action_end|>`) and
jamba (a JSON list between `<tool_calls>` and `</tool_calls>`): JSON calls between markers.
"""

from __future__ import annotations

import json
from typing import Any

from mlx_lm.tool_parsers import json_tools as _mlx_json_tools

from decoding import call_formats
from decoding.tool_calls import JSON_LIST, JSON_OBJECT
from decoding.tool_formats import ToolFormat, register


def _json_object_parser(text: str, tools: Any = None) -> Any:
    """A JSON object or list of {"name", "arguments"|"parameters"} between markers."""
    return json.loads(text.strip())


def _json_list_parser(text: str, tools: Any = None) -> Any:
    """A JSON list of {"name", "arguments"} objects between markers."""
    return json.loads(text.strip())


HERMES = register(
    ToolFormat(
        "hermes",
        _mlx_json_tools.parse_tool_call,
        "<tool_call>",
        "</tool_call>",
        grammar=call_formats.json_tools,
        stream=JSON_OBJECT,
    )
)
GRANITE4 = register(  # <tool_call>{"name", "arguments"}</tool_call>, as hermes
    ToolFormat(
        "granite4",
        _mlx_json_tools.parse_tool_call,
        "<tool_call>",
        "</tool_call>",
        grammar=call_formats.json_tools,
        stream=JSON_OBJECT,
    )
)
INTERNLM = register(
    ToolFormat(
        "internlm",
        _json_object_parser,
        "<|action_start|><|plugin|>",
        "<|action_end|>",
        stream=JSON_OBJECT,
    )
)
JAMBA = register(
    ToolFormat("jamba", _json_list_parser, "<tool_calls>", "</tool_calls>", stream=JSON_LIST)
)
