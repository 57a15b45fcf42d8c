"""kimi_k3 (Moonshot Kimi K3, its XTML channels): calls in a `tools` channel,
`<|open|>tools<|sep|>` ... `<|close|>tools<|sep|>`, each
`<|open|>call tool="NAME" index="N"<|sep|>` and its
`<|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>` elements, closed by
`<|close|>call<|sep|>` (vLLM's vllm/tool_parsers/kimi_k3_tool_parser.py;
tests/tool_parsers/test_kimi_k3_tool_parser.py).

As vLLM's: a `string` value is the text as written, any other type is JSON (the text where
it is none); attribute values are unescaped (`&quot;`, `&amp;`); a call with no tool name
or one not closed is none. The reply's `response` channel markers and the end-of-turn
`<|close|>message<|sep|>` are left out of the content. The markers are matched as the
tokenizer writes them (vLLM also reads them with spaces inside, which a detokenizer that
puts spaces between special tokens writes; this one does not). Found by string scans.
mlx-lm has no parser for this format.
"""

from __future__ import annotations

import json
from typing import Any

import regex

from decoding.tool_formats import ToolFormat, register

_CALL, _CALL_END = "<|open|>call ", "<|close|>call<|sep|>"
_ARG, _ARG_END = "<|open|>argument ", "<|close|>argument<|sep|>"
_SEP = "<|sep|>"
_ATTR = regex.compile(r'(\w+)="([^"]*)"')  # one attribute; linear


def _attrs(text: str) -> dict[str, str]:
    return {k: v.replace("&quot;", '"').replace("&amp;", "&") for k, v in _ATTR.findall(text)}


def _arguments(body: str) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for part in body.split(_ARG)[1:]:
        head, sep, rest = part.partition(_SEP)
        if not sep or _ARG_END not in rest:
            continue
        attrs = _attrs(head)
        value = rest.split(_ARG_END, 1)[0]
        if attrs.get("type", "string") == "string":
            args[attrs.get("key", "")] = value
        else:
            try:
                args[attrs.get("key", "")] = json.loads(value)
            except ValueError:
                args[attrs.get("key", "")] = value
    return args


def parse(text: str, tools: Any = None) -> Any:
    calls = []
    for part in text.split(_CALL)[1:]:
        head, sep, rest = part.partition(_SEP)
        if not sep or _CALL_END not in rest:
            continue
        name = _attrs(head).get("tool", "")
        if name:
            calls.append({"name": name, "arguments": _arguments(rest.split(_CALL_END, 1)[0])})
    if not calls:
        raise ValueError("no closed <|open|>call tool=...<|sep|> in the tools channel")
    return calls[0] if len(calls) == 1 else calls


KIMI_K3 = register(
    ToolFormat(
        "kimi_k3",
        parse,
        "<|open|>tools<|sep|>",
        "<|close|>tools<|sep|>",
        strip=(
            "<|open|>response<|sep|>",
            "<|close|>response<|sep|>",
            "<|close|>message<|sep|>",
        ),
        whole="a call is read once its <|close|>call<|sep|> arrives (as vLLM's stream sends it)",
    )
)
