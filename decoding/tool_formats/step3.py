"""step3 (StepFun Step3): `<｜tool_calls_begin｜>` holding calls
`<｜tool_call_begin｜>[function<｜tool_sep｜>NAME\\n]<steptml:invoke name="NAME">
<steptml:parameter name="KEY">VALUE</steptml:parameter>...</steptml:invoke><｜tool_call_end｜>`
(vLLM's vllm/tool_parsers/step3_tool_parser.py; tests/tool_parsers/test_step3_tool_parser.py).

As vLLM's streaming path reads it (its tests mark the non-streaming one buggy for most
outputs): the text before and after the block is content as written; a value is the text up
to the next `<`; a declared string keeps its whitespace (TestStep3ParameterWhitespace),
integers, numbers and booleans are converted where they read as such, anything else stays
text. A call without its `<｜tool_call_end｜>` is none (vLLM's non-streaming result for a
block cut off). mlx-lm has no parser for this format.
"""

from __future__ import annotations

import contextlib
from typing import Any

import regex

from decoding.tool_formats import ToolFormat, register
from decoding.tool_formats.qwen3_xml import _properties

_CALL_BEGIN, _CALL_END = "<｜tool_call_begin｜>", "<｜tool_call_end｜>"
_INVOKE = regex.compile(r'<steptml:invoke name="([^"]+)">')
_PARAM = regex.compile(r'<steptml:parameter name="([^"]+)">([^<]*)</steptml:parameter>')


def _cast(value: str, prop: Any) -> Any:
    kind = prop.get("type") if isinstance(prop, dict) else None
    if kind == "integer":
        with contextlib.suppress(ValueError):
            return int(value)
    elif kind == "number":
        with contextlib.suppress(ValueError):
            return float(value)
    elif kind == "boolean" and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    elif kind == "null" and value.strip().lower() == "null":
        return None
    return value


def parse(text: str, tools: Any = None) -> Any:
    calls = []
    for part in text.split(_CALL_BEGIN)[1:]:
        if _CALL_END not in part:
            continue
        body = part.split(_CALL_END, 1)[0]
        invoke = _INVOKE.search(body)
        if invoke is None:
            continue
        props = _properties(tools, invoke[1]) or {}
        args = {k: _cast(v, props.get(k)) for k, v in _PARAM.findall(body, invoke.end())}
        calls.append({"name": invoke[1], "arguments": args})
    if not calls:
        raise ValueError("no complete <steptml:invoke> call in the block")
    return calls[0] if len(calls) == 1 else calls


STEP3 = register(
    ToolFormat(
        "step3",
        parse,
        "<｜tool_calls_begin｜>",
        "<｜tool_calls_end｜>",
        whole="each call's arguments are sent when it closes, typed by the schema then "
        "(as vLLM's streaming path sends them)",
    )
)
