"""Prompt preparation: a parsed `PromptSpec` -> rendered prompt text and token ids.

Owns rendering the tokenizer's chat template, tokenizing without a doubled BOS, and telling
whether the prompt leaves the model inside an open think block. Reads no request message
(the parsing layer, `params.py`, already did) and never touches MLX, so it may run on any
thread: the prepare step (`engine.prepare`) runs it on its worker pool, off the event loop
and off the engine.

Rules:
- `spec.messages` None: `spec.prompt` is used as is. Otherwise the messages go through
  `tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
  tools=spec.template_tools, **spec.template_kwargs)`.
- A trailing assistant message is continued (as transformers' `continue_final_message`
  and llama.cpp's server do): rendered without a generation prompt and cut right after
  its content, so the model goes on from there (a prefilled JSON opening, a code fence,
  an opened think block).
- A tokenizer without a chat template (LocalAI only sets UseTokenizerTemplate when the
  model has one) gets the message contents joined by newlines, with a warning.
- Volatile spans (load option volatile_spans, `parsing.volatile_spans`) leave the raw
  prompt and every message's content before anything is rendered (`without_volatile`),
  so the chat template, the chat boundary and image prompts all see the same text.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import jinja2

from decoding.output import initial_state_for
from params import PromptSpec
from parsing.tokens import common_prefix
from parsing.volatile_spans import TIMEOUT_S, VolatileSpans

log = logging.getLogger("localai.mlx." + __name__)

_CONTINUE_MARK = "\ue000continue\ue001"  # private-use characters: in no real message


@dataclass(frozen=True)
class PreparedPrompt:
    """A rendered prompt: `text` is what the model sees, `token_ids` its ids
    (`encode(tokenizer, text)`), `initial_state` the output pipeline's starting state
    ("reasoning" when the prompt leaves a think block open; see `output.initial_state_for`).
    `checkpoints`: token positions (ascending, each in 1..len(token_ids)-1) where a later
    prompt likely diverges (see `chat_boundary`); empty unless asked for.
    """

    text: str
    token_ids: tuple[int, ...]
    initial_state: str
    checkpoints: tuple[int, ...] = ()  # token positions worth a prefill snapshot


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` without a second BOS.

    When the text already starts with the tokenizer's BOS token text (chat templates
    usually write it), encode with add_special_tokens=False; otherwise use the
    tokenizer's normal behaviour (which may add BOS).
    """
    bos = getattr(tokenizer, "bos_token", None)
    if bos and text.startswith(bos):
        ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        ids = tokenizer.encode(text)
    return [int(i) for i in ids]


def without_volatile(spec: PromptSpec, spans: VolatileSpans) -> PromptSpec:
    """``spec`` with the matches of ``spans`` removed from its raw prompt (``messages``
    None) or from every message's string content; ``spec`` itself when nothing matched.
    All patterns on all texts share one `TIMEOUT_S` (`VolatileSpans.remove`). Never raises.
    """
    if not spans:
        return spec
    deadline = time.monotonic() + TIMEOUT_S
    if spec.messages is None:
        text = spans.remove(spec.prompt, deadline)
        return spec if text == spec.prompt else replace(spec, prompt=text)
    messages, changed = [], False
    for message in spec.messages:
        content = message.get("content")
        if isinstance(content, str) and content:
            text = spans.remove(content, deadline)
            if text != content:
                message, changed = MappingProxyType({**message, "content": text}), True
        messages.append(message)
    return replace(spec, messages=tuple(messages)) if changed else spec


def _has_chat_template(tokenizer: Any) -> bool:
    flag = getattr(tokenizer, "has_chat_template", None)
    if flag is None:
        flag = getattr(tokenizer, "chat_template", None) is not None
    return bool(flag)


def render(spec: PromptSpec, tokenizer: Any) -> str:
    """The prompt text of `spec`; ValueError naming Messages when the template refuses it."""
    if spec.messages is None:
        return spec.prompt
    # Templates get plain, private dicts (they may index, copy or even mutate them).
    messages = [copy.deepcopy(dict(m)) for m in spec.messages]
    if not _has_chat_template(tokenizer):
        log.warning("tokenizer has no chat template: joining message contents with newlines")
        return "\n".join(m["content"] for m in messages)
    if spec.continue_final:
        # Continue the last assistant message: render it with a marker at the end of its
        # content and cut there (transformers' continue_final_message does the same, but
        # mlx-lm's own Python chat templates do not take that argument).
        messages[-1]["content"] = f"{messages[-1]['content']}{_CONTINUE_MARK}"
    try:
        text: str = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=not spec.continue_final,
            tools=spec.template_tools,
            **spec.template_kwargs,
        )
    except jinja2.TemplateError as err:
        # Templates reject bad conversations (e.g. roles not alternating) this way.
        raise ValueError(f"PredictOptions.Messages rejected by the chat template: {err}") from None
    return cut_continued(text, spec.continue_final)


def cut_continued(text: str, continue_final: bool) -> str:
    """``text`` rendered with the final assistant message marked (`_CONTINUE_MARK`), cut
    where that message's content ends, so the model continues it; unchanged when
    ``continue_final`` is False. ValueError when the template dropped the content."""
    if not continue_final:
        return text
    cut = text.rfind(_CONTINUE_MARK)
    if cut < 0:
        raise ValueError(
            "PredictOptions.Messages: the chat template does not render the final "
            "assistant message's content, so it cannot be continued; end with a user turn"
        )
    return text[:cut]


def chat_boundary(spec: PromptSpec, tokenizer: Any, token_ids: tuple[int, ...]) -> int:
    """Token position (int) where the part of a chat prompt before its last user message
    (system, tools, history) ends; 0 when there is none or it cannot be told.

    Renders the messages before the last user message without a generation prompt
    (same tools and template arguments) and tokenizes them; the boundary is the longest
    common prefix of those ids with `token_ids`, so BPE merging across the boundary (or a
    template that renders earlier messages differently) only moves it earlier: the
    returned position always holds exactly `token_ids[:position]`. Never raises.
    """
    messages = spec.messages
    if not messages or not _has_chat_template(tokenizer):
        return 0
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=0)
    if last_user <= 0:
        return 0
    head = [copy.deepcopy(dict(m)) for m in messages[:last_user]]
    try:
        text: str = tokenizer.apply_chat_template(
            head,
            tokenize=False,
            add_generation_prompt=False,
            tools=spec.template_tools,
            **spec.template_kwargs,
        )
        ids = encode(tokenizer, text)
    except Exception as exc:  # a template may refuse a conversation without a user turn
        log.debug("no chat checkpoint: the template refused the leading messages: %s", exc)
        return 0
    n = common_prefix(ids, token_ids)
    return n if n < len(token_ids) - 1 else 0


def prepare_prompt(
    spec: PromptSpec,
    tokenizer: Any,
    check_text: Callable[[str], None] | None = None,
    checkpoints: bool = False,
) -> PreparedPrompt:
    """Render and tokenize `spec` for an mlx-lm `TokenizerWrapper`.

    `check_text`: called with the rendered text before tokenizing, to refuse a prompt
    that cannot fit (`prompting.fit.check_text`). `checkpoints`: also find the chat boundary
    (`chat_boundary`; one more template render and tokenization) for models whose cache
    cannot be trimmed. Raises ValueError naming the field: Messages (template
    error), Prompt when the prompt gives no tokens at all or cannot fit.
    """
    text = render(spec, tokenizer)
    if check_text is not None:
        check_text(text)
    token_ids = tuple(encode(tokenizer, text))
    if not token_ids:
        raise ValueError("PredictOptions.Prompt is empty: the prompt has no tokens")
    state = initial_state_for(tokenizer, token_ids) if hasattr(tokenizer, "has_thinking") else ""
    boundary = chat_boundary(spec, tokenizer, token_ids) if checkpoints else 0
    return PreparedPrompt(
        text=text,
        token_ids=token_ids,
        initial_state=state or "normal",
        checkpoints=(boundary,) if boundary > 0 else (),
    )
