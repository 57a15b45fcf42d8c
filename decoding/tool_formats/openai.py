"""openai (gpt-oss Harmony): each call message ` to=functions.NAME ... <|message|>{args}`, up to
`<|call|>`; gpt-oss's channels are the Harmony response format (decoding/parsers.py
HARMONY_FORMAT). mlx-lm has no Harmony support.
"""

from __future__ import annotations

import json
from typing import Any

import regex

from decoding import call_formats
from decoding.tool_formats import ToolFormat, register

_HARMONY_NAME = regex.compile(r"\s*(?P<name>[^\s<]+)")


# mlx-lm has no Harmony (gpt-oss) support.
def _harmony_parser(text: str, tools: Any = None) -> dict[str, Any]:
    """gpt-oss: the text after ` to=functions.`: `NAME <|constrain|>json<|message|>{args}` (the
    recipient in the channel) or `NAME<|channel|>commentary json<|message|>{args}` (in the
    role), up to `<|call|>` (OpenAI's Harmony format; vLLM's openai_tool_parser.py)."""
    name = _HARMONY_NAME.match(text)
    _, sep, args = text.partition("<|message|>")
    if name is None or not sep:
        raise ValueError("no function name or no <|message|> in the Harmony call")
    args = args.split("<|call|>", 1)[0].strip()
    return {"name": name["name"], "arguments": json.loads(args) if args else {}}


HARMONY_TOOL_START = " to=functions."
OPENAI = register(
    ToolFormat(
        "openai",
        _harmony_parser,
        HARMONY_TOOL_START,
        grammar=call_formats.GRAMMARS["openai"],
        whole="the call message is read when `<|call|>` ends it",
    )
)
