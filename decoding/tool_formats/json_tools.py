"""hermes, granite4 (mlx-lm's json_tools: `<tool_call>{"name", "arguments"}</tool_call>`),
internlm (one JSON object between `<|action_start|><|plugin|>` and `<|action_end|>`) and
jamba (a JSON list between `<tool_calls>` and `</tool_calls>`): JSON calls between markers.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from mlx_lm.tool_parsers import json_tools as _mlx_json_tools

from decoding import call_formats
from decoding.tool_calls import JSON_LIST, JSON_OBJECT, declared_names
from decoding.tool_formats import ToolFormat, register


def _json_object_parser(text: str, tools: Any = None) -> Any:
    """InternLM2's one JSON call {"name", "parameters"|"arguments"} between markers; where
    the request declares tools, a name it does not declare is no call (raises: the block
    stays content), as vLLM's internlm2_tool_parser.py
    (tests/tool_parsers/test_internlm2_tool_parser.py, unknown tool name not emitted)."""
    call = json.loads(text.strip())
    declared = declared_names(tools)
    if declared and isinstance(call, dict) and call.get("name") not in declared:
        raise ValueError(f"tool {call.get('name')!r} is not among the request's tools")
    return call


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
        # the stream leaves a call naming an undeclared tool unannounced, as the parse does
        stream=dataclasses.replace(JSON_OBJECT, declared_only=True),
    )
)
JAMBA = register(
    ToolFormat("jamba", _json_list_parser, "<tool_calls>", "</tool_calls>", stream=JSON_LIST)
)
