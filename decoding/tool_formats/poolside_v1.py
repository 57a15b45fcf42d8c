"""poolside_v1 (Poolside's Laguna): GLM-4's calls, `<tool_call>NAME<arg_key>K</arg_key>
<arg_value>V</arg_value>...</tool_call>` (vLLM's vllm/tool_parsers/poolside_v1_tool_parser.py,
a GLM-4 parser of its own; tests/tool_parsers/test_poolside_v1_tool_parser.py): read as glm45
reads them (decoding/tool_formats/glm.py): string values verbatim, others deserialized;
content that is only whitespace before the calls is none. Only a block that opens with a
name holding no `<` or newline is a call (vLLM's func_detail_regex); any other is content.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from decoding.tool_formats import register
from decoding.tool_formats.glm import GLM45


def parse(text: str, tools: Any = None) -> Any:
    # Read without a regex: one like vLLM's (`\s*([^\n<]+?)\s*\n?\s*`) backtracks
    # through every split of a run of spaces (a 4 KB block of them took minutes).
    name = text.split("<arg_key>", 1)[0].strip()
    if not name or "<" in name or "\n" in name:
        raise ValueError("the block does not open with a function name")
    return GLM45.parse(text, tools)


POOLSIDE_V1 = register(replace(GLM45, name="poolside_v1", parse=parse))
