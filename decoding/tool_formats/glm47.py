"""glm47 (GLM-4.7, GLM-5): `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...
</tool_call>`, read by mlx-lm's glm47 parser (values typed by the declared tool); content
that is only whitespace before the calls is none, as vLLM's glm47_moe_tool_parser.py
gives (tests/tool_parsers/test_glm47_moe_tool_parser.py test_whitespace_content_none).
"""

from __future__ import annotations

from mlx_lm.tool_parsers import glm47

from decoding.tool_formats import ToolFormat, register

GLM47 = register(
    ToolFormat("glm47", glm47.parse_tool_call, "<tool_call>", "</tool_call>", blank_content=True)
)
