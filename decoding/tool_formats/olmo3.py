"""olmo3 (OLMo 3): one pythonic call a line between `<function_calls>` and `</function_calls>`
(vLLM's olmo3_tool_parser.py), each line read by mlx-lm's pythonic parser.
"""

from __future__ import annotations

import json
from typing import Any

from decoding import call_formats
from decoding.tool_formats import ToolFormat, register


# mlx-lm's pythonic parser reads a list `[f(a=1)]`; OLMo 3 writes one call a line.
def _olmo3_parser(text: str, tools: Any = None) -> Any:
    """OLMo 3: newline-separated pythonic calls (JSON literals allowed), as vLLM's
    olmo3_tool_parser.py; each line parsed by mlx-lm's pythonic parser as a list of one
    (mlx-lm's main branch reads one call per list). A line that is no call with JSON
    arguments (bytes, 1e999) is left out while another line is one, as vLLM does
    (tests/tool_parsers/test_olmo3_tool_parser.py, bad sibling / non-finite argument)."""
    from mlx_lm.tool_parsers import pythonic

    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError("empty function_calls block")
    if len(lines) == 1 and lines[0].startswith("["):
        return pythonic.parse_tool_call(lines[0], tools)
    calls: list[dict[str, Any]] = []
    error: Exception | None = None
    for line in lines:
        try:
            parsed = pythonic.parse_tool_call(f"[{line}]", tools)
            items = parsed if isinstance(parsed, list) else [parsed]
            for item in items:
                json.dumps(item.get("arguments"), allow_nan=False)
        except (TypeError, ValueError, SyntaxError, AttributeError) as exc:
            error = exc
            continue
        calls.extend(items)
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
