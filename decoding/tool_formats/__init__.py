"""Tool-call formats, one object per format, registered by vLLM's parser name.

A `ToolFormat` holds what the output pipeline needs to find and read one model family's
tool calls: the markers that open and close a block (`start` / `end`, plus `also_start`
markers that open one anywhere and `content_start` markers that open one only where the
content starts, as vLLM's pythonic parsers look at the output's start), the whole-block
parser (`parse(text, tools)` -> a call dict or a list of them, raising on malformed text)
and the slot for its tool-call grammar builder (`grammar`, from decoding/tool_grammar.py).

Adding a format is one module here that calls `register(ToolFormat(...))`, plus its vLLM
cases in tests/vllm_parser_cases.py. The vLLM names mapped onto mlx-lm's own parsers, and
the older formats parsed in decoding/parsers.py, are in `decoding.parsers.TOOL_PARSERS`
(each resolved to a ToolFormat by `decoding.parsers.resolve_tool_format`).
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
class ToolFormat:
    """One tool-call format. name: vLLM's parser name; parse: the whole-block parser (the
    text between the markers; its mlx-lm-style `tool_stream_format` attribute, if any, names
    how its arguments stream: decoding/tool_calls.py); start / end: the markers of a block
    (end "": the block runs to the end of the output); also_start: more markers opening a
    block (closed by `end` or `also_end`); content_start: markers that open a block only
    before any content (leading whitespace aside) or right after one of
    `content_start_after`; trim_content: whitespace between the content and a block is
    left out (vLLM strips the content before the calls); grammar: the tool-call grammar
    builder, None where the format has none yet."""

    name: str
    parse: ToolParser
    start: str
    end: str = ""
    also_start: tuple[str, ...] = ()
    also_end: tuple[str, ...] = ()
    content_start: tuple[str, ...] = ()
    content_start_after: tuple[str, ...] = ()
    trim_content: bool = False
    grammar: Callable[..., Any] | None = None

    @property
    def markers(self) -> dict[str, Any]:
        """Every marker of the format (what ModelMetadata and logs show)."""
        return {
            "start": self.start,
            "end": self.end,
            "also_start": list(self.also_start),
            "also_end": list(self.also_end),
            "content_start": list(self.content_start),
        }

    @property
    def anywhere_start(self) -> tuple[str, ...]:
        """The markers that open a block wherever they appear."""
        return tuple(m for m in (self.start, *self.also_start) if m and m not in self.content_start)

    @property
    def ends(self) -> tuple[str, ...]:
        return tuple(m for m in (self.end, *self.also_end) if m)


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
