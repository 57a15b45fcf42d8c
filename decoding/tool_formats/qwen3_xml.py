"""qwen3_xml and qwen3_coder (Qwen3-Coder, Qwen3.5): `<tool_call><function=NAME>
<parameter=KEY>VALUE</parameter>...</function></tool_call>`, each value converted by the
declared tool's JSON schema (vLLM's vllm/tool_parsers/qwen3coder_tool_parser.py and
qwen3xml_tool_parser.py). mlx-lm's mlx_lm/tool_parsers/qwen3_coder.py reads the markup.
"""

from __future__ import annotations

from typing import Any

from mlx_lm.tool_parsers import qwen3_coder

from decoding.tool_formats import ToolFormat, register


def parse(text: str, tools: Any = None) -> Any:
    return qwen3_coder.parse_tool_call(text, tools)


parse.tool_stream_format = "qwen3_coder"  # type: ignore[attr-defined]

QWEN3_XML = register(ToolFormat("qwen3_xml", parse, "<tool_call>", "</tool_call>"))
QWEN3_CODER = register(ToolFormat("qwen3_coder", parse, "<tool_call>", "</tool_call>"))
