"""gemma4 (Gemma 4): `<|tool_call>call:NAME{key:value,...}<tool_call|>`, strings between
`<|"|>` delimiters, bare keys, nested `{}` / `[]`, bare numbers, true / false / null (vLLM's
vllm/tool_parsers/gemma4_tool_parser.py). Content before a call is trimmed, as vLLM's is.

Ours, not mlx-lm's mlx_lm/tool_parsers/gemma4.py: that one reads names of `[\\w-]` only (a
dotted `weather.get` call is dropped, tests/tool_parsers/test_gemma4_tool_parser.py
test_dotted_function_name) and turns the arguments into JSON by text substitution, which
fails on a bare string value, an empty value (`key:`) or an unterminated string.
"""

from __future__ import annotations

from typing import Any

import regex

from decoding.tool_formats import Block, ToolFormat, register

QUOTE = '<|"|>'
_CALL = regex.compile(r"\s*call:(?P<name>[^{\s]+)\{(?P<args>.*)\}\s*", regex.S)


def _bare(text: str) -> Any:
    """A bare value: true / false / null, a number, else the text itself."""
    text = text.strip()
    if text in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


class _Reader:
    def __init__(self, text: str) -> None:
        self.s, self.i = text, 0

    def _skip(self) -> None:
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1

    def string(self) -> str:
        start = self.i + len(QUOTE)
        end = self.s.find(QUOTE, start)
        if end < 0:  # unterminated: the rest (vLLM's rule)
            self.i = len(self.s)
            return self.s[start:]
        self.i = end + len(QUOTE)
        return self.s[start:end]

    def value(self, stops: str) -> Any:
        self._skip()
        if self.s.startswith(QUOTE, self.i):
            return self.string()
        if self.s.startswith("{", self.i):
            self.i += 1
            obj = self.pairs("}")
            self.i += 1
            return obj
        if self.s.startswith("[", self.i):
            self.i += 1
            items = self.items("]")
            self.i += 1
            return items
        start = self.i
        while self.i < len(self.s) and self.s[self.i] not in stops:
            self.i += 1
        return _bare(self.s[start : self.i])

    def key(self) -> str:
        self._skip()
        if self.s.startswith(QUOTE, self.i):
            key = self.string()
            self._skip()
        else:
            start = self.i
            while self.i < len(self.s) and self.s[self.i] not in ":,}":
                self.i += 1
            key = self.s[start : self.i].strip()
        if not self.s.startswith(":", self.i):
            raise ValueError(f"no ':' after the key {key!r}")
        self.i += 1
        return key

    def pairs(self, close: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        while True:
            self._skip()
            if self.i >= len(self.s) or self.s[self.i] == close:
                return out
            key = self.key()
            out[key] = self.value(",}" if close == "}" else ",")
            self._skip()
            if self.s.startswith(",", self.i):
                self.i += 1

    def items(self, close: str) -> list[Any]:
        out: list[Any] = []
        while True:
            self._skip()
            if self.i >= len(self.s) or self.s[self.i] == close:
                return out
            out.append(self.value(",]"))
            self._skip()
            if self.s.startswith(",", self.i):
                self.i += 1
            elif self.i < len(self.s) and self.s[self.i] != close:
                raise ValueError(f"unexpected {self.s[self.i]!r} in an array")


def parse_arguments(text: str) -> dict[str, Any]:
    """The arguments inside a call's outer braces, as a dict."""
    reader = _Reader(text)
    args = reader.pairs("\x00")
    if reader.i < len(text):
        raise ValueError(f"unexpected text in the arguments: {text[reader.i :]!r}")
    return args


def parse(text: str, tools: Any = None) -> dict[str, Any]:
    """One call: the text between `<|tool_call>` and `<tool_call|>`, or a bare
    `call:NAME{...}` to the end of the output."""
    m = _CALL.fullmatch(text)
    if m is None:
        raise ValueError("no call:NAME{...} in the block")
    return {"name": m["name"], "arguments": parse_arguments(m["args"])}


GEMMA4 = register(
    ToolFormat(
        "gemma4",
        parse,
        start="<|tool_call>",
        end="<tool_call|>",
        # A bare `call:NAME{...}` where the content starts (right after the thought
        # channel's `<channel|>`), as vLLM's gemma4 engine parser reads it
        # (tests/tool_parsers/test_gemma4_regex_and_bare_calls.py,
        # test_engine_tool_parser_bare_call_extraction).
        more=(Block("call:", at_content_start=True, keep=True),),
        content_start_after=("<channel|>",),
        trim_content=True,
        whole='its bare keys and `<|"|>` strings become JSON only when read whole',
    )
)
