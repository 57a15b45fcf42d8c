"""phi4_mini_json (Phi-4-mini): a JSON list of calls after `functools[`, to the end."""

from __future__ import annotations

from typing import Any

from decoding.tool_formats import ToolFormat, register
from decoding.tool_formats.llama_json import _DECODER, _call


# mlx-lm has no parser for this format.
def _phi4_mini_parser(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """Phi-4-mini: `functools[{"name", "arguments"|"parameters"}, ...]` (vLLM's
    phi4mini_tool_parser.py); `text` follows `functools[`. Text after the list is dropped,
    as vLLM does (tests/tool_parsers/test_phi4mini_tool_parser.py, surrounding text)."""
    body = "[" + text.strip()
    calls, _ = _DECODER.raw_decode(body)
    if not isinstance(calls, list) or not calls:
        raise ValueError("functools[...] holds no call")
    return [_call(c) for c in calls]


PHI4_MINI_JSON = register(
    ToolFormat(
        "phi4_mini_json",
        _phi4_mini_parser,
        "functools[",
        whole="no streaming parse yet: the list is read at the end",
    )
)
