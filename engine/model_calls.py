"""What the engine runs on the loaded model besides generation: tokenize, detokenize,
model metadata, Score, Rerank and Embedding (engine thread; each function takes the
`LoadedModel`).

Score, Rerank and Embedding run inline between batch steps, so they pause decoding meanwhile
(their texts are tokenized before, on the prepare pool: `prepare_score`, `prepare_rerank`,
`embedding_ids`); they are bounded (`scoring.MAX_SCORE_CANDIDATES`) and stop between
candidates / chunks once ``should_stop`` says their caller has left. Bad input raises
``ValueError`` (or ``InvalidArgument``); ``errors.as_backend_error`` maps it at the edge.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from caches.prompt_tiers import PromptTiers
from decoding import reasoning_formats, tool_formats
from errors import FailedPrecondition, InvalidArgument
from loading import vision
from loading.loaded_model import LoadedModel
from parsing import bounds
from prompting import fit
from prompting import render as prompt_mod
from seam import tokenizer as seam_tokenizer
from tasks import embedding, scoring
from tasks import rerank as rerank_task

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
    _check_text("Prompt (the text to tokenize)", text, loaded)
    return prompt_mod.encode(loaded.tokenizer, text)


def embedding_ids(loaded: LoadedModel, text: str) -> list[int]:
    """The tokens `embedding.embed` reads of ``text``, measured first (any thread)."""
    _check_text("Embeddings (the text to embed)", text, loaded)
    ids = prompt_mod.encode(loaded.tokenizer, text)
    if not ids:
        raise InvalidArgument("the text to embed is empty: give some text (Embeddings)")
    return ids


def _check_text(field: str, text: str, loaded: LoadedModel) -> None:
    try:
        bounds.check_text(field, text, fit.task_bounds(loaded))
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


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


def prepare_score(
    loaded: LoadedModel,
    prompt: str,
    candidates: list[str],
    include_token_logprobs: bool,
    stable_prefix_len: int = 0,
) -> scoring.ScoreInput:
    """`scoring.prepare` with the loaded model's settings: the tokenizing, run on the
    prepare pool, off the engine thread (``stable_prefix_len``: characters of the prompt
    later requests share)."""
    return scoring.prepare(
        loaded.tokenizer,
        prompt,
        candidates,
        include_token_logprobs=include_token_logprobs,
        context_len=loaded.context_len,
        per_token=loaded.max_token_chars,
        stable_prefix_len=stable_prefix_len,
        model_key=loaded.cache_key,
    )


def score(
    loaded: LoadedModel,
    cache: PromptTiers | None,
    prepared: scoring.ScoreInput,
    should_stop: Callable[[], bool] | None = None,
) -> list[scoring.CandidateResult]:
    """`scoring.run` of a `prepare_score`d request (engine thread); the prompt's KV shared
    via ``cache``. FailedPrecondition when the model was replaced since it was tokenized."""
    if prepared.model_key != loaded.cache_key:
        raise FailedPrecondition("the model was replaced while the Score was prepared: retry")
    p = loaded.params
    return scoring.run(
        loaded.model,
        loaded.tokenizer,
        prepared,
        cache=cache,
        prefill_step=p.prefill_step_size,
        max_kv_size=p.max_kv_size,
        should_stop=should_stop,
    )


def prepare_rerank(
    loaded: LoadedModel, query: str, documents: list[str], top_n: int
) -> rerank_task.RerankInput:
    """`rerank.prepare` with the loaded model's settings (option ``rerank``, ``auto``
    resolved from the model's name and tokenizer; ``rerank_instruction``): the tokenizing,
    run on the prepare pool, off the engine thread."""
    p = loaded.params
    return rerank_task.prepare(
        loaded.tokenizer,
        query,
        documents,
        top_n,
        mode=rerank_task.choose_mode(p.rerank, loaded.name, loaded.tokenizer),
        instruction=p.rerank_instruction,
        context_len=loaded.context_len,
        per_token=loaded.max_token_chars,
        model_key=loaded.cache_key,
    )


def rerank(
    loaded: LoadedModel,
    cache: PromptTiers | None,
    prepared: rerank_task.RerankInput,
    should_stop: Callable[[], bool] | None = None,
) -> rerank_task.RerankOutput:
    """`rerank.run` of a `prepare_rerank`d request on the loaded model (engine thread); the
    shared prefix's KV via ``cache``. FailedPrecondition when the model was replaced since
    the request was tokenized."""
    if prepared.model_key != loaded.cache_key:
        raise FailedPrecondition("the model was replaced while the Rerank was prepared: retry")
    p = loaded.params
    return rerank_task.run(
        loaded.model,
        prepared,
        cache=cache,
        prefill_step=p.prefill_step_size,
        max_kv_size=p.max_kv_size,
        should_stop=should_stop,
    )


def embed(
    loaded: LoadedModel,
    text: str,
    token_ids: list[int],
    should_stop: Callable[[], bool] | None = None,
) -> embedding.EmbeddingOutput:
    """`embedding.embed` (or `embed_tokens` when ``token_ids``) with the load options."""
    p = loaded.params
    kw: dict[str, Any] = dict(
        pooling=p.embedding_pooling,
        normalize=p.embedding_normalize,
        context_len=loaded.context_len,
        step=p.prefill_step_size,
        should_stop=should_stop,
    )
    if token_ids:
        return embedding.embed_tokens(loaded.model, token_ids, **kw)
    return embedding.embed(loaded.model, loaded.tokenizer, text, **kw)
