"""LocalAI's parser hints: vLLM tool/reasoning parser names -> tool formats and markers.

LocalAI's importer writes `Options` `tool_parser:NAME` and `reasoning_parser:NAME` (vLLM's
names, from LocalAI's core/config/parser_defaults.json via core/gallery/importers/mlx.go)
into model files. `apply_parser_overrides` makes them override what mlx-lm inferred from the
chat template: it returns a TokenizerWrapper with their tool parser, tool-call markers, think
markers and (Harmony) response format, so that `output.OutputPipeline` routes text by them.

A name never fails the load: LocalAI passes options meant for other backends too. A vLLM name
with no MLX equivalent, or a name in no table, logs a warning and leaves what mlx-lm detected
from the chat template in place.

vLLM tool_parser -> its `ToolFormat` (markers, whole-block parser, streaming, tool-call
grammar slot): one module each in decoding/tool_formats/ (`tool_formats.names()` lists
them). `TOOL_PARSERS` below holds the vLLM names with no MLX equivalent here.

Reasoning (reasoning_parser): one `ReasoningFormat` per name in
`decoding.reasoning_formats` (markers, where the output starts, trimming); openai_gptoss
is the Harmony channels, the same response format as tool_parser openai.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from decoding import reasoning_formats, tool_formats
from decoding.reasoning_formats import HARMONY_FORMAT
from decoding.tool_calls import ToolParser
from decoding.tool_formats import ToolFormat
from decoding.tool_formats.llama_json import LLAMA_JSON_START
from decoding.tool_formats.openai import HARMONY_TOOL_START
from seam import tokenizer as seam_tokenizer

__all__ = [
    "HARMONY_FORMAT",
    "HARMONY_TOOL_START",
    "LLAMA_JSON_START",
    "RESPONSE_FORMATS",
    "TOOL_PARSERS",
    "apply_parser_overrides",
    "resolve_reasoning_markers",
    "resolve_tool_format",
    "resolve_tool_parser",
]

logger = logging.getLogger("localai.mlx." + __name__)


# vLLM tool_parser names whose formats no parser here reads yet (a warning; mlx-lm's detection
# from the chat template stays). Every other name is a format of decoding/tool_formats/.
TOOL_PARSERS: dict[str, None] = {}

# Tool-parser names whose vLLM parser also splits the reasoning (and strips the answer's
# markers): with no reasoning_parser the reasoning format of this name applies (vLLM's
# cohere_command_tool_parser.py; tests/tool_parsers/test_cohere_command_tool_parser.py
# expects the reasoning from the tool parser alone).
TOOL_REASONING: dict[str, str] = {
    "cohere_command3": "cohere_command3",
    "cohere_command4": "cohere_command4",
    "inkling": "inkling",  # vllm/parser/inkling.py reads both
}

# Names (tool or reasoning) whose format is a set of channels: installed as the tokenizer's
# response format whichever of the two options names it.
RESPONSE_FORMATS: dict[str, Mapping[str, Any]] = {
    "openai": HARMONY_FORMAT,
    "openai_gptoss": HARMONY_FORMAT,
}


def _normal(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def resolve_tool_format(name: str) -> ToolFormat | None:
    """vLLM tool parser name -> its `ToolFormat` (decoding/tool_formats/), or None for a
    name with no MLX equivalent (TOOL_PARSERS) or an unknown name."""
    return tool_formats.get(_normal(name))


def resolve_tool_parser(name: str) -> tuple[ToolParser, str, str] | None:
    """vLLM tool parser name -> (parser(text, tools), start marker, end marker), or None.

    The end marker is "" for formats whose calls run to the end of the output. None for a
    name with no MLX equivalent and for an unknown name (see `apply_parser_overrides`).
    """
    fmt = resolve_tool_format(name)
    return None if fmt is None else (fmt.parse, fmt.start, fmt.end)


def resolve_reasoning_markers(name: str) -> tuple[str, str] | None:
    """vLLM reasoning parser name -> (think start, think end) marker text, or None (no
    marker pair: a channel format, no MLX equivalent, or an unknown name)."""
    fmt = reasoning_formats.resolve(name)
    return (fmt.start, fmt.end) if fmt is not None and fmt.start and fmt.end else None


def _fallback(option: str, name: str, table: Mapping[str, Any], detected: str) -> None:
    """Warn that ``name`` changes nothing: what mlx-lm detected (``detected``) stays."""
    if _normal(name) in table and table[_normal(name)] is None:
        why = f"{option} {name!r} (a vLLM name) has no MLX equivalent here"
    else:
        usable = sorted(
            {k for k, v in table.items() if v is not None or k in RESPONSE_FORMATS}
            | (set(tool_formats.names()) if table is TOOL_PARSERS else set())
        )
        why = f"unknown {option} {name!r} (the names that apply: {', '.join(usable)})"
    logger.warning("%s; keeping what mlx-lm detected from the chat template: %s", why, detected)


def _detected_tool(tokenizer: Any) -> str:
    parser = getattr(tokenizer, "tool_parser", None)
    if not parser:
        return "no tool parser"
    module = getattr(parser, "__module__", "").rsplit(".", 1)[-1]
    return f"tool parser {module} ({getattr(tokenizer, 'tool_call_start', '')!r})"


def _detected_think(tokenizer: Any) -> str:
    if not getattr(tokenizer, "has_thinking", False):
        return "no think markers"
    return f"think markers {tokenizer.think_start!r} {tokenizer.think_end!r}"


def apply_parser_overrides(
    tokenizer: Any, tool_parser: str = "", reasoning_parser: str = ""
) -> Any:
    """An mlx-lm `TokenizerWrapper` like ``tokenizer`` with LocalAI's parser hints applied.

    tool_parser / reasoning_parser: vLLM names ("" leaves that part as mlx-lm inferred it).
    The new wrapper (built by `seam.tokenizer.rebuild`, through the wrapper's constructor)
    has the hinted tool_parser, tool_call_start/end (and their token ids), think_start/end
    (and token ids), and for Harmony (openai / openai_gptoss) the response format
    (response_transitions); ``tokenizer`` itself is not changed, and is returned as it is
    when nothing applies. A name with no MLX equivalent, or unknown, logs a warning and
    leaves that part as mlx-lm inferred it; this never raises for a name.
    """
    tool = think = None
    tool_fmt = None
    formats = []
    if tool_parser and not reasoning_parser:
        reasoning_parser = TOOL_REASONING.get(_normal(tool_parser), "")
    if tool_parser:
        tool_fmt = resolve_tool_format(tool_parser)
        tool = None if tool_fmt is None else (tool_fmt.parse, tool_fmt.start, tool_fmt.end)
        if tool is None:
            _fallback("tool_parser", tool_parser, TOOL_PARSERS, _detected_tool(tokenizer))
        formats.append(RESPONSE_FORMATS.get(_normal(tool_parser)))
    fmt = reasoning_formats.resolve(reasoning_parser) if reasoning_parser else None
    if reasoning_parser:
        think = (fmt.start, fmt.end) if fmt is not None and fmt.start and fmt.end else None
        if fmt is None:
            table = {**reasoning_formats.FORMATS, **dict.fromkeys(reasoning_formats.NO_FORMAT)}
            _fallback("reasoning_parser", reasoning_parser, table, _detected_think(tokenizer))
        formats.append(fmt.channels if fmt is not None else None)
    channels = next((f for f in formats if f is not None), None)
    if channels is not None and not seam_tokenizer.takes_response_format():
        logger.warning(
            "this mlx-lm's tokenizer has no response formats: the %s channels are not "
            "routed (content only)",
            tool_parser if RESPONSE_FORMATS.get(_normal(tool_parser)) else reasoning_parser,
        )
        channels = None
    if tool is None and fmt is None and channels is None:
        return tokenizer
    new = seam_tokenizer.rebuild(tokenizer, tool=tool, think=think, response_format=channels)
    if fmt is not None:  # read by decoding.output (reasoning_formats.format_of)
        new._reasoning_format = fmt
    # Read by decoding.output (tool_formats.of): the format's other markers (None: mlx-lm's
    # own parser, its two markers only).
    new._tool_format = tool_fmt if tool_fmt is not None else tool_formats.of(tokenizer)
    return new
