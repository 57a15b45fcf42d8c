"""mlx-lm's ``TokenizerWrapper`` and streaming detokenizers: what their public API lacks.

- ``rebuild``: a new wrapper of the same Hugging Face tokenizer through the wrapper's own
  constructor, with other tool-call markers, think markers or response format (LocalAI's
  ``tool_parser`` / ``reasoning_parser`` options, `decoding.parsers`). The constructor takes
  the tool parser, its markers and the response format; it infers the think markers from
  the vocabulary and takes none, so those four attributes are set after it.
- ``exact_detokenizer``: mlx-lm's naive and BPE detokenizers with two fixes (see below).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

from mlx_lm.tokenizer_utils import (
    BPEStreamingDetokenizer,
    NaiveStreamingDetokenizer,
    TokenizerWrapper,
)

_WRAPPER = ("mlx_lm.tokenizer_utils", "TokenizerWrapper")
_NAIVE = ("mlx_lm.tokenizer_utils", "NaiveStreamingDetokenizer")
_THINK = "think markers: inferred from the vocabulary, the constructor takes none"
_STATE = "the naive detokenizer's state, rewritten by our `text` (see _Utf8NaiveDetokenizer)"

PRIVATE = (
    (*_WRAPPER, "_tokenizer", "the Hugging Face tokenizer, for the constructor; no accessor"),
    (*_WRAPPER, "_chat_template", "a chat_template_type renderer to keep; no accessor"),
    (*_WRAPPER, "_think_start", _THINK),
    (*_WRAPPER, "_think_end", _THINK),
    (*_WRAPPER, "_think_start_tokens", _THINK),
    (*_WRAPPER, "_think_end_tokens", _THINK),
    (*_NAIVE, "_tokenizer", _STATE),
    (*_NAIVE, "_clean_spaces", _STATE),
    (*_NAIVE, "_current_tokens", _STATE),
    (*_NAIVE, "_current_text", _STATE),
    (*_NAIVE, "_text", _STATE),
    (
        "mlx_lm.tokenizer_utils",
        "BPEStreamingDetokenizer",
        "_maybe_trim_space",
        "the hook that drops the first leading space; overridden to keep it",
    ),
)


def vocab_size(tokenizer: Any) -> int:
    """``len(tokenizer)``: how many ids it knows, added tokens included (the wrapper of
    mlx-lm's main branch has no ``len()``; its vocabulary holds them all)."""
    try:
        return len(tokenizer)
    except TypeError:
        return len(tokenizer.get_vocab())


@functools.cache
def takes_response_format() -> bool:
    """Whether this mlx-lm's wrapper has response formats (channels such as Harmony's):
    0.32.2 does; mlx-lm's main branch has none."""
    return "response_format" in inspect.signature(TokenizerWrapper.__init__).parameters


def rebuild(
    tokenizer: Any,
    *,
    tool: tuple[Any, str, str] | None = None,
    think: tuple[str, str] | None = None,
    response_format: Mapping[str, Any] | None = None,
) -> Any:
    """A new ``TokenizerWrapper`` over ``tokenizer``'s Hugging Face tokenizer, as mlx-lm
    built ``tokenizer`` except: ``tool`` (parser, start, end) replaces its tool parser and
    markers, ``think`` (start, end) its think markers, ``response_format`` its response
    format (ignored by an mlx-lm without them: `takes_response_format`). ``tokenizer``
    itself is not changed; the new one shares its detokenizer (a copy each use)."""
    parser, start, end = tool or (
        tokenizer.tool_parser,
        tokenizer.tool_call_start,
        tokenizer.tool_call_end,
    )
    kwargs: dict[str, Any] = {
        "detokenizer_class": lambda _hf: tokenizer.detokenizer,
        "eos_token_ids": tokenizer.eos_token_ids,
        "chat_template": tokenizer._chat_template,
        "tool_parser": parser,
        "tool_call_start": start,
        "tool_call_end": end,
    }
    if takes_response_format():
        if response_format is None and (
            tokenizer.response_transitions or tokenizer.response_initial_state is not None
        ):
            response_format = {
                "transitions": tokenizer.response_transitions,
                "initial_state": tokenizer.response_initial_state,
            }
        kwargs["response_format"] = response_format
    new = TokenizerWrapper(tokenizer._tokenizer, **kwargs)
    if think is not None:
        start, end = think
        new._think_start, new._think_end = start, end
        new._think_start_tokens = tuple(new.encode(start, add_special_tokens=False))
        new._think_end_tokens = tuple(new.encode(end, add_special_tokens=False))
    return new


class _Utf8NaiveDetokenizer(NaiveStreamingDetokenizer):
    """mlx-lm's naive detokenizer, except that a newline never commits a character that is
    still incomplete: upstream drops its bytes ("\\n\\xc3" then "\\xa9" gives "\\n\\ufffd")."""

    @property  # mlx-lm declares ``text`` as an attribute; its own subclasses override it so
    def text(self) -> str:  # type: ignore[override, unused-ignore]
        if self._current_tokens:
            current = self._tokenizer.decode(self._current_tokens)
            incomplete = current.endswith("\ufffd")
            if incomplete:
                current = current.rstrip("\ufffd")
            elif self._clean_spaces and current.endswith(" "):
                current = current[:-1]
            self._current_text = current
            if current.endswith("\n") and not incomplete:
                self._text += current
                self._current_tokens.clear()
                self._current_text = ""
        return self._text + self._current_text


class _ExactBPEDetokenizer(BPEStreamingDetokenizer):
    """mlx-lm's BPE detokenizer without its SPM-style trim of the first leading space: our
    text must equal ``tokenizer.decode(ids)`` (a completion of "The capital is" is " Paris")."""

    def _maybe_trim_space(self, current_text: str) -> str:
        return current_text


def exact_detokenizer(detokenizer: Any) -> Any:
    """``detokenizer`` (a fresh one of the caller's) with the fixes above when it is mlx-lm's
    naive or BPE detokenizer (the subclasses add no state); any other as it is."""
    if type(detokenizer) is NaiveStreamingDetokenizer:
        detokenizer.__class__ = _Utf8NaiveDetokenizer
    elif type(detokenizer) is BPEStreamingDetokenizer:
        detokenizer.__class__ = _ExactBPEDetokenizer
    return detokenizer
