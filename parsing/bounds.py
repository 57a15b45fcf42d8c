"""Bounds checked on cheap figures (lengths, counts) before any expensive work.

One rule for every text a request carries (a prompt, its messages, a Rerank document, a
Score candidate, an Embedding text, a TokenizeString prompt): a token covers at most
``per_token`` characters (the longest vocabulary entry, `loaded_model.max_token_chars`),
so a text of more than ``context * per_token`` characters has more tokens than the
context holds and is refused before it is tokenized, rendered or decoded. The windows
(``Repeat``, ``NKeep``) are bounded by the context itself, and the lists by the counts
below. Every refusal is a ``ValueError`` naming the field and the limit (the edge turns it
into INVALID_ARGUMENT). Pure Python: any thread, no model, no MLX.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# The context assumed where the model states none (and for a rotating KV cache, which
# never fills): windows and texts are bounded as for a context of this many tokens.
FALLBACK_CONTEXT = 1 << 17
MAX_TOOLS = 128  # OpenAI's documented maximum of functions per request
MAX_STOP_PROMPTS = 64  # stop sequences per request (OpenAI allows 4)
MAX_STOP_CHARS = 1024  # characters of one stop sequence
MAX_GRAMMAR_TRIGGERS = 256  # ModelOptions.GrammarTriggers words
MAX_TRIGGER_CHARS = 1024  # characters of one trigger word


@dataclass(frozen=True)
class Bounds:
    """What the loaded model lets a request hold: ``context`` tokens (None: unknown, then
    `FALLBACK_CONTEXT`) of at most ``per_token`` characters each (0: unknown, texts then
    unbounded by length here)."""

    context: int | None
    per_token: int = 0

    @property
    def tokens(self) -> int:
        return self.context or FALLBACK_CONTEXT

    @property
    def chars(self) -> int | None:
        """Most characters a text that fits the context can have; None = unbounded."""
        return self.tokens * self.per_token if self.per_token > 0 else None


def check_text(field: str, text: str, bounds: Bounds, *, tokens: int | None = None) -> None:
    """ValueError naming ``field`` when ``text`` has more characters than ``tokens`` (default:
    the context) tokens can cover."""
    if bounds.per_token <= 0:
        return
    room = bounds.tokens if tokens is None else tokens
    limit = room * bounds.per_token
    if len(text) > limit:
        what = f"the {room}-token context" if tokens is None else f"{room} tokens"
        raise ValueError(
            f"{field} is {len(text)} characters, more than {what} can hold (at most "
            f"{limit} characters at {bounds.per_token} per token): shorten it"
            + (" or raise ContextSize" if tokens is None else "")
        )


def check_texts(field: str, texts: Iterable[str], bounds: Bounds, total_tokens: int) -> None:
    """Each of ``texts`` (``field[i]``) within the context, and all together within
    ``total_tokens`` tokens' characters."""
    total = 0
    for i, text in enumerate(texts):
        check_text(f"{field}[{i}]", text, bounds)
        total += len(text)
        if bounds.per_token > 0 and total > total_tokens * bounds.per_token:
            raise ValueError(
                f"{field} add up to more than {total_tokens * bounds.per_token} characters by "
                f"{field}[{i}], more than their limit of {total_tokens} tokens can hold: send "
                "fewer or shorter ones"
            )


def check_window(field: str, value: int, bounds: Bounds) -> int:
    """A token window (``Repeat``, ``NKeep``): an integer in [0, context]."""
    if not 0 <= value <= bounds.tokens:
        raise ValueError(
            f"{field} must be an integer in [0, {bounds.tokens}] (a window of tokens cannot "
            f"be longer than the {bounds.tokens}-token context), got {value}"
        )
    return value


def check_count(field: str, count: int, limit: int) -> None:
    if count > limit:
        raise ValueError(f"{field} has {count} entries; the limit is {limit}")


def check_predict(req: Any, bounds: Bounds) -> None:
    """The sizes of a ``backend_pb2.PredictOptions`` that can be measured before it is
    parsed or rendered: the prompt text (``Prompt``, or the ``Messages`` that the template
    renders: every message renders its content at least, and a role marker), the lists
    (``StopPrompts``); Tools are counted once decoded (`check_tools`)."""
    if req.UseTokenizerTemplate and req.Messages:
        check_count("PredictOptions.Messages", len(req.Messages), bounds.tokens)
        if bounds.per_token > 0:
            chars = sum(
                len(m.content) + len(m.reasoning_content) + len(m.tool_calls) for m in req.Messages
            )
            limit = bounds.tokens * bounds.per_token
            if chars > limit:
                raise ValueError(
                    f"PredictOptions.Messages hold {chars} characters together, more than the "
                    f"{bounds.tokens}-token context can hold (at most {limit} characters at "
                    f"{bounds.per_token} per token): shorten them or raise ContextSize"
                )
    else:
        check_text("PredictOptions.Prompt (the prompt)", req.Prompt, bounds)
    check_count("PredictOptions.StopPrompts", len(req.StopPrompts), MAX_STOP_PROMPTS)
    for i, stop in enumerate(req.StopPrompts):
        if len(stop) > MAX_STOP_CHARS:
            raise ValueError(
                f"PredictOptions.StopPrompts[{i}] is {len(stop)} characters; the limit is "
                f"{MAX_STOP_CHARS}"
            )


def check_tools(tools: Iterable[Any] | None) -> None:
    """At most `MAX_TOOLS` tool definitions (OpenAI's limit)."""
    if tools is not None:
        check_count("PredictOptions.Tools", len(list(tools)), MAX_TOOLS)


def check_triggers(words: Iterable[str]) -> tuple[str, ...]:
    """``ModelOptions.GrammarTriggers`` words: at most `MAX_GRAMMAR_TRIGGERS`, each at most
    `MAX_TRIGGER_CHARS` characters; empty words dropped."""
    out = tuple(w for w in words if w)
    check_count("ModelOptions.GrammarTriggers", len(out), MAX_GRAMMAR_TRIGGERS)
    for i, word in enumerate(out):
        if len(word) > MAX_TRIGGER_CHARS:
            raise ValueError(
                f"ModelOptions.GrammarTriggers[{i}] is {len(word)} characters; the limit is "
                f"{MAX_TRIGGER_CHARS}"
            )
    return out
