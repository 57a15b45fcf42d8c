"""What the engine reads of the loaded model's tokenizer: tokenize (any thread),
detokenize and the model's metadata (engine thread); each function takes the
`LoadedModel`. Score, Rerank and Embedding are tasks of their own (`tasks/`: the engine
calls each one's ``prepare_on`` and ``run_on``). Bad input raises ``InvalidArgument``;
``errors.as_backend_error`` maps it at the edge.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from decoding import reasoning_formats, tool_formats
from errors import InvalidArgument
from loading import vision
from loading.loaded_model import LoadedModel
from prompting import fit
from prompting import render as prompt_mod
from seam import tokenizer as seam_tokenizer

logger = logging.getLogger("localai.mlx." + __name__)


@dataclass(frozen=True)
class ModelMetadata:
    """What the tokenizer says about thinking and tool calls (mlx-lm's TokenizerWrapper)."""

    supports_thinking: bool
    rendered_template: str  # a one-user-turn probe rendered with thinking enabled
    # LocalAI's tool_parser name (e.g. "qwen3_xml") where one applies, else mlx-lm's parser
    # module (e.g. "json_tools"); "" when none
    tool_format: str
    tool_call_start: str
    tool_call_end: str
    think_start: str
    think_end: str
    # What marks an image in a prompt LocalAI renders itself (it replaces its own
    # "<__media__>" with it); "" for a model that takes no images.
    media_marker: str = ""


def tokenize(loaded: LoadedModel, text: str) -> list[int]:
    """Token ids of ``text`` (no second BOS); InvalidArgument for a text longer than the
    context can hold, measured before tokenizing (`parsing.bounds`). Any thread."""
    fit.check_task_text("Prompt (the text to tokenize)", text, loaded)
    return prompt_mod.encode(loaded.tokenizer, text)


def detokenize(loaded: LoadedModel, ids: list[int]) -> str:
    """Text of ``ids``; InvalidArgument for ids outside the vocabulary."""
    tokenizer = loaded.tokenizer
    vocab = seam_tokenizer.vocab_size(tokenizer)
    bad = [i for i in ids if i < 0 or i >= vocab]
    if bad:
        raise InvalidArgument(f"tokens {bad[:5]} are outside the vocabulary [0, {vocab})")
    return str(tokenizer.decode(ids))


def _tool_format_name(tok: Any, parser: Any) -> str:
    """The tool format's name: LocalAI's `tool_parser` name where one applies
    (decoding/tool_formats), else mlx-lm's parser module (e.g. "json_tools"); "" for none."""
    fmt = tool_formats.of(tok)
    if fmt is not None:
        return fmt.name
    return getattr(parser, "__module__", "").rsplit(".", 1)[-1] if parser else ""


def metadata(loaded: LoadedModel) -> ModelMetadata:
    """Thinking support, a rendered probe conversation and the tool-call markers."""
    tok = loaded.tokenizer
    rendered = ""
    if getattr(tok, "has_chat_template", False):
        try:
            rendered = tok.apply_chat_template(
                [{"role": "user", "content": "Hello"}],
                tokenize=False,
                add_generation_prompt=True,
                enable_thinking=True,
            )
        except Exception as exc:  # a template that needs other inputs: report none
            logger.warning("chat template did not render a probe conversation: %s", exc)
    parser = getattr(tok, "tool_parser", None)
    fmt = reasoning_formats.format_of(tok)
    think_start, think_end = fmt.markers if fmt is not None else ("", "")
    return ModelMetadata(
        supports_thinking=bool(getattr(tok, "has_thinking", False)),
        rendered_template=rendered,
        tool_format=_tool_format_name(tok, parser),
        tool_call_start=getattr(tok, "tool_call_start", None) or "",
        tool_call_end=getattr(tok, "tool_call_end", None) or "",
        think_start=think_start,
        think_end=think_end,
        media_marker=vision.MEDIA_MARKER if loaded.vision is not None else "",
    )
