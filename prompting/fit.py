"""Whether a request fits the loaded model: each decision made here, once.

- the context: a prompt text that cannot fit (`check_text`, before tokenizing), a prompt
  whose tokens fill it and what it may then generate (`max_tokens`, the cap of Tokens);
- the memory budget: a request that could never run, even alone (`check_memory`);
- images sent to a model that serves text only (`check_images`);
- a request for another model than the one loaded (`check_identity`).

The prepare step (`engine.prepare`) calls them before a request is queued; the scheduler
reads the cap it decided (``Job.max_tokens``) and the KV it reserves (`kv_tokens`). No
MLX, no engine state: any thread may call them.
"""

from __future__ import annotations

from typing import Protocol

from errors import InvalidArgument, NotFound, ResourceExhausted
from loading.loaded_model import LoadedModel
from params import MAX_TOKENS_CAP
from parsing import bounds as bounds_mod
from parsing.bounds import Bounds


def context_bound(loaded: LoadedModel) -> int | None:
    """The context, in tokens, that bounds a prompt and its generation: None when unknown,
    or with a rotating cache (``max_kv_size``), which never fills."""
    return None if loaded.params.max_kv_size is not None else loaded.context_len


def bounds(loaded: LoadedModel) -> Bounds:
    """What ``loaded`` lets a request hold (`parsing.bounds`): its context (`context_bound`)
    in tokens of at most ``max_token_chars`` characters."""
    return Bounds(context_bound(loaded), loaded.max_token_chars)


def task_bounds(loaded: LoadedModel) -> Bounds:
    """The bounds of Score, Rerank, Embedding and TokenizeString: the model's own context
    (they run whole sequences through the model, a rotating cache or not)."""
    return Bounds(loaded.context_len, loaded.max_token_chars)


def check_task_text(field: str, text: str, loaded: LoadedModel) -> None:
    """Refuse, without tokenizing, a text of Embedding or TokenizeString (``field``) that
    cannot fit the `task_bounds`: InvalidArgument naming the field and the limit."""
    try:
        bounds_mod.check_text(field, text, task_bounds(loaded))
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def check_text(text: str, loaded: LoadedModel) -> None:
    """Refuse, without tokenizing, a prompt text that cannot fit the context.

    Each token covers at most ``loaded.max_token_chars`` characters (the longest vocabulary
    entry), so a text longer than context x that many characters has more tokens than
    the context holds. Raises InvalidArgument naming the prompt and the limit.
    """
    context, per_token = context_bound(loaded), loaded.max_token_chars
    if not context or per_token <= 0:
        return
    limit = context * per_token
    if len(text) > limit:
        raise InvalidArgument(
            f"the prompt is {len(text)} characters, more than the {context}-token context "
            f"can hold (at most {limit} characters at {per_token} per token): shorten "
            "the prompt or raise ContextSize"
        )


def max_tokens(loaded: LoadedModel, prompt_len: int, requested: int) -> int:
    """What a prompt of ``prompt_len`` tokens may generate (the one cap of Tokens):
    ``requested``, at most MAX_TOKENS_CAP (so Tokens -1 still ends somewhere on a rotating
    cache, which never fills) and at most the room the context leaves (InvalidArgument
    when the prompt fills it)."""
    cap = min(requested, MAX_TOKENS_CAP)
    context = context_bound(loaded)
    if context:
        if prompt_len >= context:
            raise InvalidArgument(
                f"the prompt is {prompt_len} tokens but the context holds {context}: "
                "shorten the prompt or raise ContextSize"
            )
        return min(cap, context - prompt_len)
    return cap


def kv_tokens(loaded: LoadedModel, prompt_len: int, max_tokens: int) -> int:
    """Tokens a sequence's KV holds at its longest (a rotating cache: its window)."""
    total = prompt_len + max_tokens
    window = loaded.params.max_kv_size
    return min(total, window) if window is not None else total


class NeverFits(Protocol):
    """What `check_memory` asks of the memory budget (`engine.memory.MemoryBudget`)."""

    def never_fits(self, tokens: int) -> str | None: ...


def check_memory(budget: NeverFits, loaded: LoadedModel, prompt_len: int, cap: int) -> None:
    """ResourceExhausted, with the numbers, when a prompt of ``prompt_len`` tokens that may
    generate ``cap`` can never fit the memory ``budget``, even alone."""
    reason = budget.never_fits(kv_tokens(loaded, prompt_len, cap))
    if reason is not None:
        raise ResourceExhausted(reason)


def check_images(loaded: LoadedModel, images: int) -> None:
    """InvalidArgument when a request sends ``images`` to a model that serves text only."""
    if not images or loaded.vision is not None:
        return
    reason = getattr(loaded.model, "text_only_reason", "")
    raise InvalidArgument(
        f"PredictOptions.Images: the loaded model {loaded.name!r} serves text only"
        + (f" (its vision part is off: {reason})" if reason else "")
        + "; images need a vision-language model (config.json with a vision_config)"
    )


def check_identity(identity: str, loaded: LoadedModel | None) -> None:
    """NotFound when both the request's and the loaded ModelOptions.Model are non-empty
    and differ (LocalAI's router matches the text "model identity mismatch")."""
    serving = loaded.identity if loaded is not None else ""
    if identity and serving and identity != serving:
        raise NotFound(
            f"model identity mismatch: request is for '{identity}' but this "
            f"backend serves '{serving}'"
        )
