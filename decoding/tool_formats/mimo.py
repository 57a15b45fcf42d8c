"""mimo (Xiaomi MiMo): vLLM registers the name for the same parser class as qwen3_coder
and qwen3_xml (vllm/tool_parsers/__init__.py: Qwen3EngineToolParser), so it is
qwen3_coder's format here under a second name (decoding/tool_formats/qwen3_xml.py). vLLM
has no test file for the name: qwen3_coder's cases stand for it.
"""

from __future__ import annotations

from dataclasses import replace

from decoding.tool_formats import register
from decoding.tool_formats.qwen3_xml import QWEN3_CODER

MIMO = register(replace(QWEN3_CODER, name="mimo"))
