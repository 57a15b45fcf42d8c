"""deepseek_v4 (DeepSeek-V4's DSML): DeepSeek V3.2's invokes (decoding/tool_formats/
deepseek_v32.py) inside `<｜DSML｜tool_calls>` ... `</｜DSML｜tool_calls>` instead of
function_calls, which vLLM's deepseek_v4 parser does not read
(tests/tool_parsers/test_deepseekv4_tool_parser.py: test_function_calls_block_is_not_accepted).
"""

from __future__ import annotations

from decoding.tool_formats import ToolFormat, register
from decoding.tool_formats.deepseek_v32 import DEEPSEEK_V32

DEEPSEEK_V4 = register(
    ToolFormat(
        "deepseek_v4",
        DEEPSEEK_V32.parse,
        "<｜DSML｜tool_calls>",
        "</｜DSML｜tool_calls>",
        whole=DEEPSEEK_V32.whole,
    )
)
