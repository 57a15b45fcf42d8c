"""olmo3 (OLMo 3): one pythonic call a line between `<function_calls>` and `</function_calls>`
(vLLM's olmo3_tool_parser.py), each line read as the pythonic format reads a list.
"""

from __future__ import annotations

from typing import Any

from decoding import call_formats
from decoding.tool_formats import ToolFormat, register
from decoding.tool_formats.pythonic import parse as _pythonic


def _olmo3_parser(text: str, tools: Any = None) -> Any:
    """OLMo 3: newline-separated pythonic calls (JSON literals allowed), as vLLM's
    olmo3_tool_parser.py; each line read as a list of one by the pythonic format's reader
    (decoding/tool_formats/pythonic.py: mlx-lm's pythonic parser reads `foo(x=1])` as a call
    with x "1]", vLLM's reads no call: test_streaming_mismatched_brackets_reported_once). A
    line that is no call with JSON arguments (bytes, 1e999) is left out while another line
    is one, as vLLM does (tests/tool_parsers/test_olmo3_tool_parser.py, bad sibling /
    non-finite argument)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError("empty function_calls block")
    if len(lines) == 1 and lines[0].startswith("["):
        return _pythonic(lines[0], tools)
    calls: list[dict[str, Any]] = []
    error: Exception | None = None
    for line in lines:
        try:
            calls.extend(_pythonic(f"[{line}]", tools))
        except (TypeError, ValueError, SyntaxError) as exc:
            error = exc
    if not calls:
        raise ValueError(f"no call in the function_calls block: {error}")
    return calls[0] if len(calls) == 1 else calls


OLMO3 = register(
    ToolFormat(
        "olmo3",
        _olmo3_parser,
        "<function_calls>",
        "</function_calls>",
        grammar=call_formats.GRAMMARS["olmo3"],
        whole="pythonic calls: Python literals are read when the block closes",
    )
)
