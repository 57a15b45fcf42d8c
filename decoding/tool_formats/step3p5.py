"""step3p5 (StepFun Step-3.5): Qwen3-Coder's XML calls, `<tool_call><function=NAME>
<parameter=KEY>VALUE</parameter>...</function></tool_call>`, values typed by the declared
tool's schema (vLLM's vllm/tool_parsers/step3p5_tool_parser.py runs its own copy of the
streaming XML parser qwen3_xml used; tests/tool_parsers/test_step3p5_tool_parser.py).
Read as qwen3_xml reads it (decoding/tool_formats/qwen3_xml.py), but for the text
between calls: vLLM's step3p5 parser hands it on only where it is more than whitespace
(the newline between two calls is no content there; qwen3_xml keeps it).
"""

from __future__ import annotations

from decoding.tool_formats import ToolFormat, register
from decoding.tool_formats.qwen3_xml import QWEN3_XML

STEP3P5 = register(
    ToolFormat(
        "step3p5",
        QWEN3_XML.parse,
        QWEN3_XML.start,
        QWEN3_XML.end,
        more=QWEN3_XML.more,
        strip=QWEN3_XML.strip,
        blank_content=True,
        grammar=QWEN3_XML.grammar,
        stream=QWEN3_XML.stream,
    )
)
