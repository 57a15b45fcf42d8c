"""Tool-call formats, one object per format, registered by vLLM's parser name.

A `ToolFormat` holds all that the output pipeline and the tool-call grammar need to find,
read, stream and constrain one model family's tool calls:
- its markers: the block's `start` / `end`, and other blocks it reads (`more`, `Block`s;
  `at_content_start` ones open only where the content starts, as vLLM's pythonic parsers
  look at the output's start);
- the whole-block parser (`parse(text, tools)` -> a call dict or a list of them, raising on
  malformed text);
- the streaming parse (`stream`: a `tool_calls.JsonStream` or `XmlStream`, what
  `tool_calls.BlockStreamer` streams the arguments by), or `whole`: why its calls are
  emitted whole at the block's end instead;
- its tool-call grammar builder (`grammar`, from decoding/call_formats.py; what
  decoding/tool_grammar.py builds the request's grammar with), None where it has none.

Adding a format is one module here that calls `register(ToolFormat(...))`, plus its vLLM
cases in tests/vllm_parser_cases.py. `decoding.parsers` resolves LocalAI's `tool_parser`
names here (`resolve_tool_format`) and installs the format on the tokenizer (`of` reads it
back). Without a `tool_parser` name, mlx-lm's own parser module inferred from the chat
template is in effect: mlx_modules.py describes those modules as formats too (their
markers, stream and grammar; `describe_mlx_lm`, found by the parser function:
`for_parser`), unregistered; `in_effect` finds either.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from decoding.tool_calls import StreamSpec

ToolParser = Callable[[str, Any], Any]

__all__ = [
    "ToolFormat",
    "describe_mlx_lm",
    "for_parser",
    "get",
    "in_effect",
    "names",
    "of",
    "register",
    "stream_of",
]


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
    text of one block); start / end: the block's markers
    (end "": to the end of the output), what ModelMetadata shows; more: other blocks the
    format reads (`Block`); content_start_after: where an at_content_start block may open
    besides the start of the content; trim_content: whitespace between the content and a
    block is left out (vLLM strips the content around the calls); blank_content: content
    that is only whitespace is left out where calls follow (vLLM's None); strip: markers left out
    of the content where they stray (a `</tool_call>` after a call without its opening
    marker); inert: (open, close) regions of the content where the format reads no calls
    (minimax's `<think>` ... `</think>` where no reasoning parser takes it: markers and
    text stay content as written); grammar: the tool-call
    grammar builder (`call_formats.GRAMMARS`: tokenizer markers (start, end) -> the call
    format `tool_grammar.build_grammar` takes), None where the format has none yet;
    stream: how its calls' arguments stream while generated (`tool_calls.JsonStream` /
    `XmlStream`), None: each call is emitted whole at the block's end, and `whole` says
    why (every format has one or the other: tests/fast/test_tool_calls_streaming.py)."""

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
    inert: tuple[tuple[str, str], ...] = ()
    grammar: Callable[..., Any] | None = None
    stream: StreamSpec | None = None
    whole: str = ""

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
            "streams": self.stream is not None,
        }


_REGISTRY: dict[str, ToolFormat] = {}
_MLX_LM: dict[Any, ToolFormat] = {}  # mlx-lm's parser function -> its module's format
_loaded = False


def register(fmt: ToolFormat) -> ToolFormat:
    """Add ``fmt`` under its name (a second format of the same name is a bug: raises)."""
    if fmt.name in _REGISTRY and _REGISTRY[fmt.name] is not fmt:
        raise ValueError(f"tool format {fmt.name!r} registered twice")
    _REGISTRY[fmt.name] = fmt
    return fmt


def describe_mlx_lm(fmt: ToolFormat) -> ToolFormat:
    """Add ``fmt`` as the format of mlx-lm's parser function ``fmt.parse`` (mlx_modules.py;
    not registered by name: mlx-lm infers these from the chat template). The first format
    given a function keeps it (laguna's parser is glm47's)."""
    _MLX_LM.setdefault(fmt.parse, fmt)
    return fmt


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
    _loaded = True


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


def in_effect(tokenizer: Any) -> ToolFormat | None:
    """The tool format ``tokenizer`` reads calls by: the one a `tool_parser` name installed
    (`of`), else mlx-lm's own parser module inferred from the chat template
    (`for_parser`); None for a tokenizer without a tool parser, or one whose
    mlx-lm module is not described there (its calls are emitted whole, no grammar)."""
    fmt = of(tokenizer)
    return fmt if fmt is not None else for_parser(getattr(tokenizer, "tool_parser", None))


def for_parser(parser: Any) -> ToolFormat | None:
    """The format of mlx-lm's parser function ``parser`` (a `TokenizerWrapper.tool_parser`
    mlx-lm chose from the chat template: mlx_modules.py), or None (no parser, or one not
    described there)."""
    _load_all()
    try:
        return _MLX_LM.get(parser)
    except TypeError:  # an unhashable stand-in
        return None


def stream_of(tokenizer: Any) -> StreamSpec | None:
    """How the calls of the format in effect stream (`ToolFormat.stream`; None: whole)."""
    fmt = in_effect(tokenizer)
    return fmt.stream if fmt is not None else None
