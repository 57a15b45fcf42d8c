"""Prompt preparation: `PredictOptions` -> rendered prompt text and token ids.

Owns reading `Prompt`, `UseTokenizerTemplate`, `Messages`, `Tools` and `Metadata`,
rendering the tokenizer's chat template, tokenizing without a doubled BOS, and telling
whether the prompt leaves the model inside an open think block. Never touches MLX.

Rules:
- `Prompt` is used as given unless `UseTokenizerTemplate` is set and `Messages` is
  non-empty; then the messages go through `tokenizer.apply_chat_template(messages,
  tokenize=False, add_generation_prompt=True, tools=<Tools or None>, **kwargs)`.
- kwargs: `enable_thinking` from Metadata["enable_thinking"] ("true"/"false", any
  case; empty = unset), then Metadata["chat_template_kwargs"] (a JSON object) merged
  over it, so a per-request chat_template_kwargs.enable_thinking wins.
- Each message passes role and content; name, tool_call_id and reasoning_content when
  non-empty; tool_calls (a JSON list of OpenAI tool calls) decoded, with each
  `function.arguments` string decoded to an object when it is a JSON object (templates
  index into it and `tojson` it). Arguments that are not a JSON object stay strings,
  so a model's malformed call is echoed back verbatim rather than rejected.
- A tokenizer without a chat template (LocalAI only sets UseTokenizerTemplate when the
  model has one) gets the message contents joined by newlines, with a warning.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import jinja2

from params import parse_tools

log = logging.getLogger(__name__)

# chat_template_kwargs may not override what prepare_prompt itself passes.
_RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "tokenize",
        "return_dict",
        "add_generation_prompt",
    }
)


@dataclass(frozen=True)
class PreparedPrompt:
    """A rendered prompt.

    text: what the model sees. token_ids: `encode(tokenizer, text)`.
    starts_in_reasoning: the text, right-stripped, ends with the tokenizer's
    think_start (the template opened a think block for the assistant), so generated
    tokens are reasoning until think_end. enable_thinking: the value passed to the
    template (None = not requested; mlx-lm's TokenizerWrapper then passes
    `has_thinking`).
    """

    text: str
    token_ids: tuple[int, ...]
    starts_in_reasoning: bool
    enable_thinking: bool | None


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


def _decode_tool_calls(index: int, raw: str) -> list[dict[str, Any]] | None:
    field = f"PredictOptions.Messages[{index}].tool_calls"
    try:
        calls = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ValueError(f"{field} must be a JSON array of tool calls: {err}") from None
    if calls is None:
        return None
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise ValueError(f"{field} must be a JSON array of tool-call objects")
    for call in calls:
        function = call.get("function")
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            try:
                arguments = json.loads(function["arguments"])
            except json.JSONDecodeError:
                continue  # not JSON: keep the string (see the module docstring)
            if isinstance(arguments, dict):
                function["arguments"] = arguments
    return calls or None


def _messages(req: Any) -> list[dict[str, Any]]:
    messages = []
    for i, msg in enumerate(req.Messages):
        if not msg.role:
            raise ValueError(f"PredictOptions.Messages[{i}].role must not be empty")
        out: dict[str, Any] = {"role": msg.role, "content": msg.content}
        for name in ("name", "tool_call_id", "reasoning_content"):
            if getattr(msg, name):
                out[name] = getattr(msg, name)
        if msg.tool_calls.strip():
            calls = _decode_tool_calls(i, msg.tool_calls)
            if calls:
                out["tool_calls"] = calls
        messages.append(out)
    return messages


def _template_kwargs(metadata: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    flag = metadata.get("enable_thinking", "").strip().lower()
    if flag in ("true", "false"):
        kwargs["enable_thinking"] = flag == "true"
    elif flag:
        raise ValueError(
            "PredictOptions.Metadata.enable_thinking must be true or false, "
            f"got {metadata['enable_thinking']!r}"
        )
    raw = metadata.get("chat_template_kwargs", "")
    if raw.strip():
        field = "PredictOptions.Metadata.chat_template_kwargs"
        try:
            extra = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"{field} must be a JSON object: {err}") from None
        if not isinstance(extra, dict):
            raise ValueError(f"{field} must be a JSON object, got {type(extra).__name__}")
        reserved = sorted(_RESERVED_TEMPLATE_KWARGS & extra.keys())
        if reserved:
            raise ValueError(f"{field} may not set {', '.join(reserved)}")
        kwargs.update(extra)
    return kwargs


def _has_chat_template(tokenizer: Any) -> bool:
    flag = getattr(tokenizer, "has_chat_template", None)
    if flag is None:
        flag = getattr(tokenizer, "chat_template", None) is not None
    return bool(flag)


def _render(req: Any, tokenizer: Any) -> tuple[str, bool | None]:
    messages = _messages(req)
    # ToolChoice "none" (OpenAI): the model must not call tools, so none are offered.
    tools = None if req.ToolChoice.strip().lower() == "none" else parse_tools(req.Tools)
    kwargs = _template_kwargs(req.Metadata)
    thinking = kwargs.get("enable_thinking")
    enable_thinking = thinking if isinstance(thinking, bool) else None
    if not _has_chat_template(tokenizer):
        log.warning("tokenizer has no chat template: joining message contents with newlines")
        return "\n".join(m["content"] for m in messages), enable_thinking
    try:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, tools=tools, **kwargs
        )
    except jinja2.TemplateError as err:
        # Templates reject bad conversations (e.g. roles not alternating) this way.
        raise ValueError(f"PredictOptions.Messages rejected by the chat template: {err}") from None
    return text, enable_thinking


def _starts_in_reasoning(tokenizer: Any, text: str) -> bool:
    if not getattr(tokenizer, "has_thinking", False):
        return False
    start = getattr(tokenizer, "think_start", None)
    return bool(start) and text.rstrip().endswith(start)


def prepare_prompt(req: Any, tokenizer: Any) -> PreparedPrompt:
    """Render and tokenize the prompt of a `backend_pb2.PredictOptions`.

    `tokenizer` is an mlx-lm `TokenizerWrapper` (or a Hugging Face tokenizer; then
    starts_in_reasoning is always False). Tokenizes on the calling thread (CPU only).
    Raises ValueError naming the field: Tools, Messages[i].role / tool_calls,
    Metadata.enable_thinking / chat_template_kwargs, Messages (template error), or
    Prompt when the prompt gives no tokens at all.
    """
    enable_thinking: bool | None = None
    if req.UseTokenizerTemplate and req.Messages:
        text, enable_thinking = _render(req, tokenizer)
    else:
        text = req.Prompt
    token_ids = tuple(encode(tokenizer, text))
    if not token_ids:
        raise ValueError("PredictOptions.Prompt is empty: the prompt has no tokens")
    return PreparedPrompt(
        text=text,
        token_ids=token_ids,
        starts_in_reasoning=_starts_in_reasoning(tokenizer, text),
        enable_thinking=enable_thinking,
    )
