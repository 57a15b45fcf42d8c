"""seed_oss (ByteDance Seed-OSS): Qwen3-Coder's XML calls between `<seed:tool_call>` and
`</seed:tool_call>` (vLLM's vllm/tool_parsers/seed_oss_tool_parser.py), read by mlx-lm's
qwen3_coder parser (values typed by the declared tool's schema; streamed per parameter).
"""

from __future__ import annotations

from decoding.tool_formats import ToolFormat, register
from decoding.tool_formats.qwen3_xml import STREAM, parse

SEED_OSS = register(
    ToolFormat("seed_oss", parse, "<seed:tool_call>", "</seed:tool_call>", stream=STREAM)
)
