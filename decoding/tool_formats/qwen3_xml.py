"""qwen3_xml and qwen3_coder (Qwen3-Coder, Qwen3.5): `<tool_call><function=NAME>
<parameter=KEY>VALUE</parameter>...</function></tool_call>`, each value converted by the
declared tool's JSON schema (vLLM's vllm/tool_parsers/qwen3coder_tool_parser.py and
qwen3xml_tool_parser.py; tests/tool_parsers/test_qwen3coder_tool_parser.py).

mlx-lm's mlx_lm/tool_parsers/qwen3_coder.py reads the markup and converts the values; ours
around it, where it differs from vLLM:
- a property typed by `anyOf` / `oneOf` / a list of types (Pydantic's Optional[T]) has no
  `type` mlx-lm reads: it is given the first non-null one (vLLM's rule), so `5` becomes 5
  and an object is not left as JSON text;
- a `<parameter=...>` left unclosed ends at the next `<parameter=` or `</function>`, as vLLM
  reads it (mlx-lm's regex would swallow the next parameter);
- every `<function=NAME>` of a block is a call (mlx-lm reads the first), and one whose name
  is not closed by `>` is left out (vLLM's test_none_tool_calls_filtered);
- a call without its `<tool_call>` (`<function=...>...</function>` alone) is read too
  (test_extract_tool_calls_fallback_no_tags), and a stray `</tool_call>` after it is no
  content.
"""

from __future__ import annotations

from typing import Any

import regex
from mlx_lm.tool_parsers import qwen3_coder

from decoding.tool_formats import Block, ToolFormat, register

_FUNCTION = regex.compile(r"<function=(?P<name>[^\s<>]+)>(?P<body>.*?)</function>", regex.S)
_PARAM_OPEN = regex.compile(r"<parameter=[^>]*>")


def _plain_type(prop: Any) -> Any:
    """``prop`` with `type` set to the first non-null type of its anyOf / oneOf / type list."""
    if not isinstance(prop, dict):
        return prop
    types = prop.get("type")
    if isinstance(types, list):
        first = next((t for t in types if t != "null"), None)
        return {**prop, "type": first} if first else prop
    if types is None:
        for key in ("anyOf", "oneOf"):
            options = prop.get(key)
            if isinstance(options, list):
                for option in options:
                    if isinstance(option, dict) and option.get("type") not in (None, "null"):
                        return {**prop, "type": option["type"]}
    return prop


def _plain_tools(tools: Any) -> Any:
    """The tools with each parameter's type made plain (`_plain_type`)."""
    if not tools:
        return tools
    out = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        params = function.get("parameters") if isinstance(function, dict) else None
        props = params.get("properties") if isinstance(params, dict) else None
        if not isinstance(props, dict):
            out.append(tool)
            continue
        props = {k: _plain_type(v) for k, v in props.items()}
        out.append({**tool, "function": {**function, "parameters": {**params, "properties": props}}})
    return out


def _close_parameters(body: str) -> str:
    """Close a `<parameter=...>` left open before the next one (or the function's end)."""
    opens = list(_PARAM_OPEN.finditer(body))
    if not opens:
        return body
    out, pos = [], 0
    for i, m in enumerate(opens):
        end = opens[i + 1].start() if i + 1 < len(opens) else len(body)
        segment = body[m.start() : end]
        out.append(body[pos : m.start()])
        if "</parameter>" not in segment:
            segment = segment.rstrip("\n") + "\n</parameter>\n"
        out.append(segment)
        pos = end
    out.append(body[pos:])
    return "".join(out)


def parse(text: str, tools: Any = None) -> Any:
    """Every call of a block; ValueError when it holds none."""
    plain = _plain_tools(tools)
    calls = [
        qwen3_coder.parse_tool_call(
            f"<function={m['name']}>{_close_parameters(m['body'])}</function>", plain
        )
        for m in _FUNCTION.finditer(text)
    ]
    if not calls:
        raise ValueError("no <function=NAME>...</function> in the block")
    return calls[0] if len(calls) == 1 else calls


parse.tool_stream_format = "qwen3_coder"  # type: ignore[attr-defined]

_BLOCKS = (Block("<function=", "</function>", keep=True),)
QWEN3_XML = register(
    ToolFormat("qwen3_xml", parse, "<tool_call>", "</tool_call>", more=_BLOCKS, strip=("</tool_call>",))
)
QWEN3_CODER = register(
    ToolFormat("qwen3_coder", parse, "<tool_call>", "</tool_call>", more=_BLOCKS, strip=("</tool_call>",))
)
