"""mistral: `[TOOL_CALLS]` calls to the end of the output: mlx-lm's mistral parser first, ours
for the forms vLLM also reads (v11 `NAME{...}`, a list with text around it).
"""

from __future__ import annotations

from typing import Any

import regex

from decoding.tool_calls import JsonStream
from decoding.tool_formats import ToolFormat, register
from decoding.tool_formats.llama_json import _DECODER, _call

_MISTRAL_V11 = regex.compile(r"\s*(?P<name>[\w.-]+)\s*(?=\{)")


def _json_list_calls(text: str) -> list[dict[str, Any]]:
    """The calls of the first JSON list of calls in ``text``; text around it is dropped."""
    start = text.find("[")
    if start < 0:
        raise ValueError("no JSON list of calls")
    calls, _ = _DECODER.raw_decode(text, start)
    if not isinstance(calls, list) or not calls:
        raise ValueError("the JSON list holds no call")
    return [_call(c) for c in calls]


# mlx-lm's mistral parser reads `NAME[ARGS]{...}` and a bare list `[{...}]`, nothing more;
# vLLM's mistral_tool_parser.py also reads a list with text around it (pre-v11 tokenizers)
# and v11's `NAME{...}` (tests/tool_parsers/test_mistral_tool_parser.py).
def _mistral_parser(text: str, tools: Any = None) -> Any:
    """Mistral calls after `[TOOL_CALLS]`: mlx-lm's mistral parser first; else each
    `[TOOL_CALLS]`-separated part is `NAME{args}` (v11) or holds a JSON list of calls."""
    from mlx_lm.tool_parsers import mistral

    try:
        return mistral.parse_tool_call(text, tools)
    except Exception:  # mlx-lm raises ValueError / JSONDecodeError / KeyError here
        pass
    calls: list[dict[str, Any]] = []
    for part in text.split(mistral.tool_call_start):
        if not part.strip():
            continue
        head = _MISTRAL_V11.match(part)
        if head is not None:
            args, _ = _DECODER.raw_decode(part, head.end())
            calls.append({"name": head["name"], "arguments": args})
        else:
            calls.extend(_json_list_calls(part))
    if not calls:
        raise ValueError("no Mistral tool call")
    return calls


MISTRAL = register(
    ToolFormat(
        "mistral",
        _mistral_parser,
        "[TOOL_CALLS]",
        # `NAME[ARGS]{...}` calls stream (the `[{...}]` list form is emitted whole)
        stream=JsonStream(
            r"\s*(?P<name>[\w-]+)\s*\[ARGS\]\s*\{",
            r"\s*(?:\[TOOL_CALLS\]\s*)?(?P<name>[\w-]+)\s*\[ARGS\]\s*\{",
            quoted=False,
        ),
    )
)
