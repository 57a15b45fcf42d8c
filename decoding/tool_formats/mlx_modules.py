"""minimax_m2 and longcat: mlx-lm's own parser modules of those names, with their markers."""

from __future__ import annotations

from mlx_lm.tool_parsers import longcat as _longcat
from mlx_lm.tool_parsers import minimax_m2 as _minimax_m2

from decoding import call_formats
from decoding.tool_formats import ToolFormat, register

MINIMAX_M2 = register(
    ToolFormat(
        "minimax_m2",
        _minimax_m2.parse_tool_call,
        _minimax_m2.tool_call_start,
        _minimax_m2.tool_call_end,
        grammar=call_formats.GRAMMARS["minimax_m2"],
    )
)
LONGCAT = register(
    ToolFormat(
        "longcat",
        _longcat.parse_tool_call,
        _longcat.tool_call_start,
        _longcat.tool_call_end,
        # vLLM's longcat parser is its hermes one: the content is the text before the first
        # call, None when that is empty (tests/tool_parsers/test_longcat_tool_parser.py)
        blank_content=True,
    )
)
