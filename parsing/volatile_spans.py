r"""Volatile spans: text a client puts in every prompt that changes from one request to the
next while telling the model nothing (a nonce, a request hash), removed before the prompt
is tokenized so that the prompt cache can reuse the prefix after it.

Load option ``volatile_spans`` (`parsing.options`) lists them as regular expressions. The
default removes Claude Code's billing header: Claude Code (Anthropic's coding agent, 2.1.x)
sends as the first block of its system prompt

    x-anthropic-billing-header: cc_version=2.1.100.7b4; cc_entrypoint=cli; cch=eb6c6;

whose ``cch`` (and the version's suffix) is recomputed for every request (captured in
anthropics/claude-code issue #68900, waybarrios/vllm-mlx PR #277; vLLM drops the block in
vllm/entrypoints/anthropic/serving.py ``_convert_system_message``, PR #36829; SGLang
PR #21064). LocalAI joins the system blocks with nothing between them
(core/schema/anthropic.go ``AnthropicSystemParam.UnmarshalJSON``), so the header runs
straight into "You are Claude Code, ...": the default pattern removes the header's
``key=value;`` fields only, never the text after them, and the line break after it when
the header stands on a line of its own.

How the option value is read (one rule, `_words`): none/off/false/empty or ``[]`` remove
nothing; a value that parses as a JSON array is a list of patterns and `NAMED` names;
anything else is one pattern (``[\s\S]+`` too, although it starts with ``[``).

Matching uses the `regex` module (mlx-lm's dependency, through transformers) for its
``timeout``: an operator's pattern that backtracks catastrophically on some client text
costs at most `TIMEOUT_S` per request and then leaves the prompt as it was (a warning,
never a failed request; repeats of it are counted, not logged, by the process's
`engine.request_log.RepeatFilter`). Patterns are compiled with MULTILINE (``^``/``$`` at line ends).
Nothing here imports MLX.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import regex

log = logging.getLogger("localai.mlx." + __name__)

OPTION = "volatile_spans"
# Claude Code's billing header (module doc): the name, then `key=value;` fields (the last
# one may end the line without its `;`), then the line break if the header ends its line.
CLAUDE_CODE_BILLING_HEADER = (
    r"x-anthropic-billing-header:(?:[ \t]*[\w.-]+=[^;\n]*(?:;|$))*[ \t]*(?:\r?\n)?"
)
# Names an operator may list instead of writing the pattern out.
NAMED = {"claude_code": CLAUDE_CODE_BILLING_HEADER}
DEFAULT = ("claude_code",)
OFF_WORDS = ("", "none", "off", "false", "[]")
TIMEOUT_S = 0.1  # seconds of matching per request, all patterns and texts together


class VolatileSpans:
    """The compiled patterns of option ``volatile_spans``: ``sources`` as written (a name
    of `NAMED` expanded), ``compiled`` theirs. Equal (and hashed) by the sources. Build
    with `read`. Not a dataclass: ``dataclasses.asdict(LoadParams)`` keeps it whole."""

    __slots__ = ("compiled", "sources")

    def __init__(self, sources: tuple[str, ...] = (), compiled: tuple[Any, ...] = ()) -> None:
        self.sources = sources
        self.compiled = compiled

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VolatileSpans) and other.sources == self.sources

    def __hash__(self) -> int:
        return hash(self.sources)

    def __repr__(self) -> str:
        return f"VolatileSpans({self.sources!r})"

    def __bool__(self) -> bool:
        return bool(self.sources)

    def remove(self, text: str, deadline: float | None = None) -> str:
        """``text`` without every match of every pattern, in order. ``deadline``
        (`time.monotonic` seconds) bounds the matching: a pattern still matching then
        leaves the text as it was before it (a warning). Never raises."""
        if deadline is None:
            deadline = time.monotonic() + TIMEOUT_S
        for source, pattern in zip(self.sources, self.compiled, strict=True):
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("option %s: no time left to remove %r from this prompt", OPTION, source)
                break
            try:
                text = pattern.sub("", text, timeout=left)
            except TimeoutError:
                log.warning(
                    "option %s: %r took over %.2f s on this prompt; not removed (make "
                    "the pattern cheaper, e.g. anchor it with ^ or a literal)",
                    OPTION,
                    source,
                    TIMEOUT_S,
                )
        return text


def _words(value: str) -> list[str]:
    """The patterns written in an option value, by one rule: a value that parses as a JSON
    array is a list of patterns (each a non-empty string); any other value is one pattern
    (so ``[\\s\\S]+``, which starts with ``[`` but is no JSON, is a pattern)."""
    text = value.strip()
    if text.lower() in OFF_WORDS:
        return []
    try:
        items = json.loads(text) if text.startswith("[") else None
    except json.JSONDecodeError:
        items = None
    if items is None:
        return [text]
    if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
        raise ValueError(
            f"option {OPTION} is a JSON array, so it must hold non-empty strings (patterns "
            f'or names), e.g. {OPTION}:["claude_code", "^Today\'s date is .*\\\\n"]'
        )
    return items


def read(value: str | None) -> VolatileSpans:
    """The `VolatileSpans` of an option value: None (absent) = `DEFAULT`; "", none, off,
    false or [] = nothing removed; a JSON array of patterns or `NAMED` names; else one
    pattern. ValueError naming the option and the pattern that does not compile."""
    words = list(DEFAULT) if value is None else _words(value)
    sources = tuple(NAMED.get(w, w) for w in words)
    compiled = []
    for source in sources:
        try:
            compiled.append(regex.compile(source, regex.MULTILINE))
        except (regex.error, ValueError, OverflowError) as exc:
            raise ValueError(
                f"option {OPTION}: {source!r} is not a valid regular expression ({exc}) nor a "
                "JSON array of them; write one Python regular expression, a JSON array of "
                "them, or none"
            ) from None
    return VolatileSpans(sources, tuple(compiled))
