"""Embeddings: the math behind the Embedding RPC.

:func:`embed` / :func:`embed_tokens`: mean- or last-token-pooled final hidden states of a
decoder model (or the raw per-token states), optionally normalized the way llama.cpp's
``embd_normalize`` does. The engine splits a request in two: `prepare_on` measures and
tokenizes the text on the prepare pool, `run_on` runs the model on the engine thread.
Cancellable between forward chunks through ``should_stop`` (see `scoring.stopper`).
Raises ``ValueError`` for bad input, which the engine turns into INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from caches.prompt_tiers import PromptTiers
from errors import InvalidArgument
from loading.loaded_model import LoadedModel
from params import embd_normalize_code
from prompting import fit
from prompting import render as prompt_mod
from seam.arrays import floats
from tasks.scoring import DEFAULT_STEP, ShouldStop, check_step, stopper

POOLINGS = ("mean", "last", "none")


@dataclass(frozen=True)
class EmbeddingOutput:
    """An embedding.

    ``vector``: ``rows * dim`` floats, row-major; ``dim``: the hidden size; ``rows``: 1
    for a pooled vector, the token count for pooling "none" (per-token layout);
    ``prompt_tokens``: tokens the model read; ``per_token``: True for pooling "none"
    (EMBEDDING_LAYOUT_PER_TOKEN; one row alone cannot tell it from a pooled vector).
    """

    vector: tuple[float, ...]
    dim: int
    prompt_tokens: int
    rows: int = 1
    per_token: bool = False


@dataclass(frozen=True)
class EmbeddingInput:
    """An Embedding request ready for the engine thread (`prepare_on`): the tokens to read
    and the model they are for (``model_key``: `LoadedModel.cache_key`)."""

    ids: tuple[int, ...]
    model_key: str = ""

    @property
    def tokens(self) -> int:
        return len(self.ids)


def prepare_on(loaded: LoadedModel, text: str, token_ids: Sequence[int]) -> EmbeddingInput:
    """The tokens of an Embedding request for the loaded model: ``token_ids`` as given, else
    ``text`` measured against the task bounds (`prompting.fit.task_bounds`, before it is
    tokenized) and tokenized. No MLX: the engine runs it on the prepare pool."""
    if not token_ids:
        fit.check_task_text("Embeddings (the text to embed)", text, loaded)
        token_ids = _ids_of(loaded.tokenizer, text)
    return EmbeddingInput(tuple(int(t) for t in token_ids), loaded.cache_key)


def run_on(
    loaded: LoadedModel,
    cache: PromptTiers | None,
    prepared: EmbeddingInput,
    should_stop: ShouldStop | None = None,
) -> EmbeddingOutput:
    """`embed_tokens` of a `prepare_on`'d request on the loaded model, with its load options
    (engine thread; ``cache`` unused: an embedding stores no KV)."""
    p = loaded.params
    return embed_tokens(
        loaded.model,
        prepared.ids,
        pooling=p.embedding_pooling,
        normalize=p.embedding_normalize,
        context_len=fit.task_bounds(loaded).context,
        step=p.prefill_step_size,
        should_stop=should_stop,
    )


def _ids_of(tokenizer: Any, text: str) -> list[int]:
    """The tokens `embed` reads of ``text`` (as TokenizeString counts them); InvalidArgument
    for a text with none."""
    ids = prompt_mod.encode(tokenizer, text)
    if not ids:
        raise InvalidArgument("the text to embed is empty: give some text (Embeddings)")
    return ids


def embed(
    model: Any,
    tokenizer: Any,
    text: str,
    *,
    pooling: str = "mean",
    normalize: bool | int = True,
    context_len: int | None = None,
    step: int = DEFAULT_STEP,
    should_stop: ShouldStop | None = None,
) -> EmbeddingOutput:
    """Embed ``text``: :func:`embed_tokens` of ``prompt.encode(tokenizer, text)``.

    The token count matches TokenizeString's. Raises ValueError as :func:`embed_tokens`,
    and for a text with no tokens; errors.Cancelled when ``should_stop()`` returns True
    (checked after tokenizing and before every chunk).
    """
    return embed_tokens(
        model,
        _ids_of(tokenizer, text),
        pooling=pooling,
        normalize=normalize,
        context_len=context_len,
        step=step,
        should_stop=should_stop,
    )


def embed_tokens(
    model: Any,
    token_ids: Sequence[int],
    *,
    pooling: str = "mean",
    normalize: bool | int = True,
    context_len: int | None = None,
    step: int = DEFAULT_STEP,
    should_stop: ShouldStop | None = None,
) -> EmbeddingOutput:
    """Pooled final hidden states (after the final norm) of ``token_ids``.

    Uses ``model.model(ids (1, L), cache=kv) -> (1, L, dim)``, the decoder stack of
    mlx-lm's llama-style models; long inputs go through in ``step``-token chunks with a
    KV cache, so each token still sees the whole prefix (causal attention).

    Args:
        model: an mlx-lm model with a ``model`` attribute (the decoder stack).
        token_ids: the input tokens, non-empty, each in ``[0, vocab)``.
        pooling: "mean" (average over all tokens), "last" (the last token's state) or
            "none" (every token's state, ``rows = len(token_ids)``, never normalized: the
            caller pools).
        normalize: True = L2, False = none; or llama.cpp's ``embd_normalize`` integer:
            -1 none, 0 max-abs scaled to int16 range, 1 taxicab, 2 L2, p > 2 p-norm.
        context_len: the model's context in tokens; longer inputs are refused.
        step: most tokens per forward call.
        should_stop: called (cheaply, from this thread) before every chunk; True
            cancels the request.

    Returns:
        An :class:`EmbeddingOutput` of float32 values.

    Raises:
        ValueError: an unknown pooling (names option ``embedding_pooling``) or
            normalization (names ``embedding_normalize``); an architecture without
            ``model.model``; empty, out-of-vocabulary or too many tokens.
        errors.Cancelled: ``should_stop()`` returned True.
    """
    if pooling not in POOLINGS:
        raise ValueError(
            f"option embedding_pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}"
        )
    norm = embd_normalize_code(normalize)
    step = check_step(step)
    body = getattr(model, "model", None)
    if not callable(body):
        raise ValueError(
            f"the loaded model's architecture ({type(model).__module__}) exposes no hidden "
            "states (no `model.model` decoder stack): it cannot serve embeddings"
        )
    ids = [int(t) for t in token_ids]
    if not ids:
        raise InvalidArgument("EmbeddingTokens is empty: give some tokens to embed")
    vocab = _vocab_size(body)
    if vocab is not None and any(t < 0 or t >= vocab for t in ids):
        bad = [t for t in ids if t < 0 or t >= vocab][:5]
        raise InvalidArgument(f"tokens {bad} are outside the vocabulary [0, {vocab})")
    if context_len is not None and len(ids) > context_len:
        raise InvalidArgument(
            f"the input is {len(ids)} tokens but the context holds {context_len}: shorten it"
        )

    kv = make_prompt_cache(model) if len(ids) > step else None
    total: mx.array | None = None
    rows: list[mx.array] = []
    last: mx.array | None = None
    check = stopper(should_stop, "Embedding")
    for start in range(0, len(ids), step):
        check()
        h = body(mx.array(ids[start : start + step])[None], cache=kv)
        if not isinstance(h, mx.array) or h.ndim != 3:
            raise ValueError(
                f"the loaded model's decoder returned {type(h).__name__} "
                f"{tuple(getattr(h, 'shape', ()))}, not (1, L, dim) hidden states: "
                "it exposes no hidden states this backend can pool"
            )
        h = h[0].astype(mx.float32)
        if pooling == "mean":
            part = h.sum(axis=0)
            total = part if total is None else total + part
        elif pooling == "none":
            rows.append(h)
        last = h[-1]
        mx.eval(total, rows, last, [c.state for c in kv] if kv is not None else [])
    assert last is not None  # ids is not empty: the loop ran
    dim = int(last.shape[-1])
    if pooling == "none":
        flat = mx.concatenate(rows).reshape(-1)
        return EmbeddingOutput(tuple(floats(flat)), dim, len(ids), rows=len(ids), per_token=True)
    # total: set by the loop under "mean".
    vec = total / len(ids) if pooling == "mean" and total is not None else last
    vec = _normalized(vec, norm)
    return EmbeddingOutput(tuple(floats(vec)), dim, len(ids))


def _normalized(vec: mx.array, norm: int) -> mx.array:
    # llama.cpp common_embd_normalize: divide by the norm; a zero norm leaves zeros.
    if norm == -1:
        return vec
    if norm == 0:
        size = mx.abs(vec).max() / 32760.0
    elif norm == 2:
        size = mx.sqrt(mx.sum(vec * vec))
    else:
        size = mx.power(mx.sum(mx.power(mx.abs(vec), norm)), 1.0 / norm)
    return mx.where(size > 0, vec / mx.maximum(size, 1e-30), mx.zeros_like(vec))


def _vocab_size(body: Any) -> int | None:
    emb = getattr(body, "embed_tokens", None)
    weight = getattr(emb, "weight", None)
    # Quantized embeddings pack several values per column; only the row count is the vocab.
    return int(weight.shape[0]) if weight is not None else None
