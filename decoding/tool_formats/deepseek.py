"""deepseek_v3 (DeepSeek V3 / R1) and deepseek_v31 (V3.1): calls between
`<｜tool▁calls▁begin｜>` and `<｜tool▁calls▁end｜>`. mlx-lm has no DeepSeek parser.
"""

from __future__ import annotations

import json
from typing import Any

import regex

from decoding.tool_formats import ToolFormat, register

_DS_CALL = regex.compile(
    r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", regex.S
)
_DS_FENCED = regex.compile(r"(?P<name>[^\n]*)\n```(?:json)?\n(?P<args>.*?)\n?```\s*$", regex.S)


# mlx-lm has no DeepSeek parser.
def _deepseek_parser(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """DeepSeek calls between `<｜tool▁calls▁begin｜>` and `<｜tool▁calls▁end｜>` (vLLM's
    deepseekv3_tool_parser.py and deepseekv31_tool_parser.py), each
    `<｜tool▁call▁begin｜>HEAD<｜tool▁sep｜>TAIL<｜tool▁call▁end｜>`: V3 / R1 have HEAD
    `function` and TAIL `NAME\\n```json\\n{args}\\n```; V3.1 has HEAD `NAME`, TAIL `{args}`."""
    calls = []
    for head, tail in _DS_CALL.findall(text):
        fenced = _DS_FENCED.match(tail)
        if fenced:  # V3: head is the type ("function"), the name opens the tail
            calls.append({"name": fenced["name"].strip(), "arguments": json.loads(fenced["args"])})
        else:
            calls.append({"name": head.strip(), "arguments": json.loads(tail)})
    if not calls:
        raise ValueError("no <｜tool▁call▁begin｜> call in the block")
    return calls


_B, _E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_WHOLE = "no streaming parse yet: each call is read when the block closes"
DEEPSEEK_V3 = register(ToolFormat("deepseek_v3", _deepseek_parser, _B, _E, whole=_WHOLE))
DEEPSEEK_V31 = register(ToolFormat("deepseek_v31", _deepseek_parser, _B, _E, whole=_WHOLE))
