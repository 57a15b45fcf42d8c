"""Tool-call formats, one object per format, registered by vLLM's parser name.

A `ToolFormat` holds what the output pipeline needs to find and read one model family's
tool calls: the markers that open and close a block (`start` / `end`, plus `also_start`
markers that open one anywhere and `content_start` markers that open one only where the
content starts, as vLLM's pythonic parsers look at the output's start), the whole-block
parser (`parse(text, tools)` -> a call dict or a list of them, raising on malformed text)
and its tool-call grammar builder (`grammar`, from decoding/call_formats.py; what
decoding/tool_grammar.py builds the request's grammar with).

Adding a format is one module here that calls `register(ToolFormat(...))`, plus its vLLM
cases in tests/vllm_parser_cases.py. `decoding.parsers` resolves LocalAI's `tool_parser`
names here (`resolve_tool_format`) and installs the format on the tokenizer (`of` reads it
back). How each format's arguments stream is the parser's `tool_stream_format` (the specs of
decoding/tool_calls.py).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ToolParser = Callable[[str, Any], Any]

__all__ = ["ToolFormat", "get", "names", "of", "register"]


@dataclass(frozen=True)
class Block:
    """One way a block of calls opens and closes. start / end: its markers (end "": it runs
    to the end of the output); at_content_start: the start marker counts only before any
    content (leading whitespace aside) or right after one of the format's
    `content_start_after` (vLLM's pythonic parsers read a list at the output's start);
    keep: the markers are part of the calls' text the parser reads (`[` of a pythonic list,
    `<function=` ... `</function>` of a Qwen3-Coder call without its `<tool_call>`)."""

    start: str
    end: str = ""
    at_content_start: bool = False
    keep: bool = False


@dataclass(frozen=True)
class ToolFormat:
    """One tool-call format. name: vLLM's parser name; parse: the whole-block parser (the
    text of one block; an mlx-lm-style `tool_stream_format` attribute on it, if any, names
    how its arguments stream: decoding/tool_calls.py); start / end: the block's markers
    (end "": to the end of the output), what ModelMetadata shows; more: other blocks the
    format reads (`Block`); content_start_after: where an at_content_start block may open
    besides the start of the content; trim_content: whitespace between the content and a
    block is left out (vLLM strips the content around the calls); blank_content: content
    that is only whitespace is left out where calls follow (vLLM's None); strip: markers left out
    of the content where they stray (a `</tool_call>` after a call without its opening
    marker); grammar: the tool-call
    grammar builder (`call_formats.GRAMMARS`: tokenizer markers (start, end) -> the call
    format `tool_grammar.build_grammar` takes), None where the format has none yet."""

    name: str
    parse: ToolParser
    start: str
    end: str = ""
    more: tuple[Block, ...] = ()
    at_content_start: bool = False
    keep: bool = False
    content_start_after: tuple[str, ...] = ()
    trim_content: bool = False
    blank_content: bool = False
    strip: tuple[str, ...] = ()
    grammar: Callable[..., Any] | None = None

    @property
    def blocks(self) -> tuple[Block, ...]:
        """Every block of the format, the main one first."""
        return (Block(self.start, self.end, self.at_content_start, self.keep), *self.more)

    @property
    def markers(self) -> dict[str, Any]:
        """Every marker of the format (what ModelMetadata and logs show)."""
        return {
            "start": self.start,
            "end": self.end,
            "more": [(b.start, b.end) for b in self.more],
        }


_REGISTRY: dict[str, ToolFormat] = {}


def register(fmt: ToolFormat) -> ToolFormat:
    """Add ``fmt`` under its name (a second format of the same name is a bug: raises)."""
    if fmt.name in _REGISTRY and _REGISTRY[fmt.name] is not fmt:
        raise ValueError(f"tool format {fmt.name!r} registered twice")
    _REGISTRY[fmt.name] = fmt
    return fmt


def _load_all() -> None:
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


def get(name: str) -> ToolFormat | None:
    """The format registered as ``name`` (vLLM's spelling), or None."""
    _load_all()
    return _REGISTRY.get(name)


def names() -> list[str]:
    """Every registered format name, sorted."""
    _load_all()
    return sorted(_REGISTRY)


def of(tokenizer: Any) -> ToolFormat | None:
    """The format `decoding.parsers.apply_parser_overrides` gave ``tokenizer`` (None: mlx-lm's
    own parser from the chat template, read by its two markers). Kept as the wrapper's
    private `_tool_format`: mlx-lm's TokenizerWrapper stores public attributes on the shared
    Hugging Face tokenizer."""
    fmt = vars(tokenizer).get("_tool_format") if hasattr(tokenizer, "__dict__") else None
    return fmt if isinstance(fmt, ToolFormat) else None
