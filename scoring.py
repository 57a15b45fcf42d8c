"""Scoring and embeddings: the math behind the Score and Embedding RPCs.

Owns two pure functions the engine thread calls with the loaded mlx-lm model and tokenizer:

- :func:`score`: the joint natural-log probability of each candidate continuation given a
  prompt (teacher-forced), with the prompt's KV computed once, shared through the
  ``PromptCache`` when one is given, and forked for every candidate.
- :func:`embed` / :func:`embed_tokens`: mean- or last-token-pooled final hidden states of
  a decoder model (or the raw per-token states), optionally normalized the way llama.cpp's
  ``embd_normalize`` does.

Never imports grpc or touches the engine's batch; raises ``ValueError`` (naming the field
or option) for bad input, which the engine turns into INVALID_ARGUMENT.

Bounded and cancellable, because both run on the engine thread and every other request
waits for them: Score takes at most ``MAX_SCORE_CANDIDATES`` candidates of at most
``MAX_SCORE_TOKENS`` tokens in all, and both functions take ``should_stop``, a cheap
callable checked before every forward call (each candidate, each ``step``-token chunk) and
between candidate tokenizations; when it returns True they raise ``errors.Cancelled``
within one forward call. Measured before: 600 candidates kept the engine busy ~56 s after
the client's 5 s deadline.

Tokenization rule for Score: ``P = encode(prompt)`` and ``F = encode(prompt + candidate)``;
the candidate's tokens are ``F[k:]`` where ``k`` is the length of the longest common prefix
of ``P`` and ``F``, and the first of them is conditioned on ``F[:k]``. BPE may merge the end
of the prompt with the start of the candidate (prompt "is " + candidate "Paris" ends in the
token " Paris"); the merged token then counts as the candidate's, conditioned on the prompt
without its last piece, which is the probability of the text actually written. When ``k`` is
0 (empty prompt, or the prompt's first token merges into the candidate) the sequence is
conditioned on the tokenizer's BOS token instead; without one that is a ``ValueError``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

import prompt as prompt_mod
from errors import Cancelled
from output import OutputPipeline
from prompt_cache import PromptCache

__all__ = [
    "MAX_SCORE_CANDIDATES",
    "MAX_SCORE_TOKENS",
    "POOLINGS",
    "CandidateResult",
    "EmbeddingOutput",
    "check_candidates",
    "embed",
    "embed_tokens",
    "embedding_settings",
    "score",
]

DEFAULT_STEP = 512  # tokens per forward chunk: bounds attention and logits memory
POOLINGS = ("mean", "last", "none")
# Most candidates in one Score request: each costs a KV copy and a forward call on the
# engine thread (600 of them measured ~56 s on this 2-core CPU with SmolLM2-135M).
MAX_SCORE_CANDIDATES = 256
# Most candidate tokens in one Score request, summed over candidates (the tokens fed
# beyond the shared prompt).
MAX_SCORE_TOKENS = 16384

ShouldStop = Callable[[], bool]


def _stopper(should_stop: ShouldStop | None, what: str) -> Callable[[], None]:
    """A check that raises Cancelled naming `what` once `should_stop()` is True."""

    def check() -> None:
        if should_stop is not None and should_stop():
            raise Cancelled(f"{what} cancelled: the client went away or its deadline passed")

    return check


def check_candidates(
    candidates: Sequence[str], *, max_candidates: int = MAX_SCORE_CANDIDATES
) -> None:
    """Cheap checks of a Score request's candidates, safe on the event loop.

    No tokenizing: at least one candidate, at most ``max_candidates``, none empty. Raises
    ValueError naming ``candidates`` (or ``candidates[i]``) and the limit.
    """
    if not candidates:
        raise ValueError("candidates is empty: give at least one continuation to score")
    if len(candidates) > max_candidates:
        raise ValueError(
            f"candidates has {len(candidates)} entries; the limit is {max_candidates} "
            "(MAX_SCORE_CANDIDATES): split them over several requests"
        )
    for i, cand in enumerate(candidates):
        if not cand:
            raise ValueError(f"candidates[{i}] is empty: every candidate needs some text")


@dataclass(frozen=True)
class CandidateResult:
    """The score of one candidate.

    ``log_prob``: sum over the candidate's tokens of the natural-log probability the model
    gives each (<= 0). ``length_normalized_log_prob``: ``log_prob / num_tokens``.
    ``num_tokens``: the candidate's tokens (see the module doc for the boundary rule).
    ``tokens``: ``(token text, natural-log prob)`` per candidate token when asked, else
    ``()``; a token that holds part of a UTF-8 character shows U+FFFD, as Predict's logprobs.
    """

    log_prob: float
    length_normalized_log_prob: float
    num_tokens: int
    tokens: tuple[tuple[str, float], ...] = ()


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


# --------------------------------------------------------------------------- scoring
def score(
    model: Any,
    tokenizer: Any,
    prompt: str,
    candidates: Sequence[str],
    *,
    include_token_logprobs: bool = False,
    cache: PromptCache | None = None,
    model_key: str = "",
    context_len: int | None = None,
    prefill_step: int = DEFAULT_STEP,
    max_kv_size: int | None = None,
    should_stop: ShouldStop | None = None,
    max_candidates: int = MAX_SCORE_CANDIDATES,
    max_candidate_tokens: int = MAX_SCORE_TOKENS,
) -> list[CandidateResult]:
    """Joint log-probability of each candidate continuation of ``prompt``.

    Teacher-forced: the model reads prompt + candidate once, and each candidate token
    contributes ``log_softmax(logits)[token]`` (float32) at the position before it. The
    shared prefix's KV is computed once (or fetched from ``cache`` under ``model_key``,
    and stored there afterwards), then deep-copied for each candidate, which feeds only
    its own tokens. Runs on the caller's thread: call it on the engine thread.

    Args:
        model: an mlx-lm model; ``model(ids (1, L), cache=kv)`` gives logits (1, L, V).
        tokenizer: mlx-lm ``TokenizerWrapper`` (``encode``, ``bos_token_id``).
        prompt: the conditioning text; may be empty if the tokenizer has a BOS token.
        candidates: the continuations, in order; each non-empty.
        include_token_logprobs: also return each token's text and log-probability.
        cache: the engine's prompt cache, or None to compute the prefix every call.
        model_key: the cache key of ``model``.
        context_len: the model's context in tokens; a longer prompt + candidate is refused.
        prefill_step: most tokens per forward call.
        max_kv_size: as the engine's option: a rotating KV cache of that many tokens,
            so prompt-cache entries have the type generation makes; None: unbounded.
        should_stop: called (cheaply, from this thread) between candidate tokenizations
            and before every forward call; True cancels the request.
        max_candidates: most candidates (default MAX_SCORE_CANDIDATES).
        max_candidate_tokens: most candidate tokens summed over candidates (default
            MAX_SCORE_TOKENS); checked while tokenizing, before any forward call.

    Returns:
        One :class:`CandidateResult` per candidate, in order.

    Raises:
        ValueError: no candidates, or more than ``max_candidates`` (names ``candidates``);
            an empty candidate (names ``candidates[i]``); a candidate that adds no
            tokens; more than ``max_candidate_tokens`` candidate tokens; an empty prompt
            (or one whose first token merges into a candidate) with a tokenizer that has
            no BOS token; a sequence longer than ``context_len``.
        errors.Cancelled: ``should_stop()`` returned True; nothing is returned (a prompt
            prefix already computed may stay in ``cache``).
    """
    check_candidates(candidates, max_candidates=max_candidates)
    check = _stopper(should_stop, "Score")
    step = _check_step(prefill_step)
    check()
    prompt_ids = prompt_mod.encode(tokenizer, prompt)
    # Per candidate: its whole sequence and how many leading tokens are context.
    seqs: list[list[int]] = []
    ctx: list[int] = []
    total_tokens = 0
    for i, cand in enumerate(candidates):
        check()
        full = prompt_mod.encode(tokenizer, prompt + cand)
        k = _shared_prefix(prompt_ids, full)
        if k == len(full):
            raise ValueError(f"candidates[{i}] adds no tokens to the prompt")
        if k == 0:
            full = [_bos(tokenizer, prompt, i), *full]
            k = 1
        if context_len is not None and len(full) > context_len:
            raise ValueError(
                f"prompt + candidates[{i}] is {len(full)} tokens but the context holds "
                f"{context_len}: shorten the prompt or the candidate"
            )
        total_tokens += len(full) - k
        if total_tokens > max_candidate_tokens:
            raise ValueError(
                f"candidates add {total_tokens} tokens to the prompt by candidates[{i}]; "
                f"the limit is {max_candidate_tokens} candidate tokens per request "
                "(MAX_SCORE_TOKENS): "
                "send fewer or shorter candidates"
            )
        seqs.append(full)
        ctx.append(k)

    # The shared base: a prefix of every sequence, ending before every candidate's last
    # context token (that token must be fed to produce the first candidate logits).
    base_len = min(ctx) - 1
    for s in seqs[1:]:
        base_len = min(base_len, _shared_prefix(seqs[0][:base_len], s))

    def new_kv() -> list:
        return make_prompt_cache(model, max_kv_size)

    base_kv = _prefix_kv(model, new_kv, seqs[0][: base_len + 1], cache, model_key, step, check)

    token_texts = _TokenTexts(tokenizer) if include_token_logprobs else None
    results = []
    for seq, k in zip(seqs, ctx, strict=True):
        kv = copy.deepcopy(base_kv) if base_kv is not None else new_kv()
        check()
        lps = _target_logprobs(model, kv, seq, base_len, k, step, check)
        total = math.fsum(lps)
        targets = seq[k:]
        tokens = ()
        if token_texts is not None:
            tokens = tuple(zip(token_texts(targets), lps, strict=True))
        results.append(CandidateResult(total, total / len(targets), len(targets), tokens))
    return results


def _shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length (tokens) of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])


def _bos(tokenizer: Any, prompt: str, index: int) -> int:
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        if not prompt:
            raise ValueError(
                "prompt is empty and the tokenizer has no BOS token to condition on: give a prompt"
            )
        raise ValueError(
            f"candidates[{index}] merges with the prompt's first token and the tokenizer "
            "has no BOS token to condition on: give a longer prompt"
        )
    return int(bos)


def _prefix_kv(
    model: Any,
    new_kv: Callable[[], list],
    probe: list[int],
    cache: PromptCache | None,
    model_key: str,
    step: int,
    check: Callable[[], None],
) -> list | None:
    """KV of ``probe[:-1]`` (None when that is empty), via ``cache`` when given.

    ``probe`` carries one token more than the base so that the cache's "at least one
    token left to feed" rule still lets a stored base be reused whole.
    """
    if len(probe) < 2:
        return None
    if cache is None:
        kv = new_kv()
        _prefill(model, kv, probe[:-1], step, check)
        return kv
    lookup = cache.fetch(model_key, probe)
    kv = lookup.kv if lookup.kv is not None else new_kv()
    todo = lookup.rest[:-1]
    if todo:
        _prefill(model, kv, todo, step, check)
        # The cache owns what it stores; the forks copy from our own reference.
        cache.insert(model_key, probe[:-1], copy.deepcopy(kv))
    return kv


def _prefill(model: Any, kv: list, tokens: list[int], step: int, check: Callable[[], None]) -> None:
    for start in range(0, len(tokens), step):
        check()
        model(mx.array(tokens[start : start + step])[None], cache=kv)
        mx.eval([c.state for c in kv])


def _target_logprobs(
    model: Any,
    kv: list,
    seq: list[int],
    fed: int,
    ctx: int,
    step: int,
    check: Callable[[], None],
) -> list[float]:
    """Log-probs (natural log, float32 softmax) of ``seq[ctx:]``, teacher-forced.

    ``kv`` holds ``seq[:fed]``; feeds ``seq[fed:-1]``, whose row ``p`` predicts
    ``seq[fed + 1 + p]``, and keeps the rows that predict candidate tokens.
    """
    inputs = seq[fed:-1]
    first = ctx - 1 - fed  # the first row that predicts a candidate token
    out: list[mx.array] = []
    for start in range(0, len(inputs), step):
        if start:
            check()  # the caller checked before the first chunk
        chunk = inputs[start : start + step]
        logits = model(mx.array(chunk)[None], cache=kv)[0]
        lo = max(first - start, 0)
        if lo >= len(chunk):
            mx.eval([c.state for c in kv])
            continue
        rows = logits[lo:].astype(mx.float32)
        targets = mx.array(seq[fed + 1 + start + lo : fed + 1 + start + len(chunk)])
        picked = mx.take_along_axis(rows, targets[:, None], axis=-1)[:, 0]
        lp = picked - mx.logsumexp(rows, axis=-1)
        mx.eval(lp, [c.state for c in kv])
        out.append(lp)
    return mx.concatenate(out).tolist()


class _TokenTexts:
    """Per-token text exactly as Predict's logprobs show it (output.OutputPipeline)."""

    def __init__(self, tokenizer: Any) -> None:
        # The pipeline owns the tokenizer-family rules (byte-level, SPM, added tokens).
        self._pipeline = OutputPipeline(tokenizer, top_logprobs=0)

    def __call__(self, ids: Sequence[int]) -> list[str]:
        return [self._pipeline._token_text(int(t))[0] for t in ids]


# --------------------------------------------------------------------------- embeddings
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
    ids = prompt_mod.encode(tokenizer, text)
    if not ids:
        raise ValueError("the text to embed is empty: give some text (Embeddings)")
    return embed_tokens(
        model,
        ids,
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
    norm = _norm_kind(normalize)
    step = _check_step(step)
    body = getattr(model, "model", None)
    if not callable(body):
        raise ValueError(
            f"the loaded model's architecture ({type(model).__module__}) exposes no hidden "
            "states (no `model.model` decoder stack): it cannot serve embeddings"
        )
    ids = [int(t) for t in token_ids]
    if not ids:
        raise ValueError("EmbeddingTokens is empty: give some tokens to embed")
    vocab = _vocab_size(body)
    if vocab is not None and any(t < 0 or t >= vocab for t in ids):
        bad = [t for t in ids if t < 0 or t >= vocab][:5]
        raise ValueError(f"tokens {bad} are outside the vocabulary [0, {vocab})")
    if context_len is not None and len(ids) > context_len:
        raise ValueError(
            f"the input is {len(ids)} tokens but the context holds {context_len}: shorten it"
        )

    kv = make_prompt_cache(model) if len(ids) > step else None
    total: mx.array | None = None
    rows: list[mx.array] = []
    last: mx.array | None = None
    check = _stopper(should_stop, "Embedding")
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
    dim = int(last.shape[-1])
    if pooling == "none":
        flat = mx.concatenate(rows).reshape(-1)
        return EmbeddingOutput(tuple(flat.tolist()), dim, len(ids), rows=len(ids), per_token=True)
    vec = total / len(ids) if pooling == "mean" else last
    vec = _normalized(vec, norm)
    return EmbeddingOutput(tuple(vec.tolist()), dim, len(ids))


def embedding_settings(options: Mapping[str, Any]) -> tuple[str, bool | int]:
    """``(pooling, normalize)`` for :func:`embed` from parsed load ``Options``.

    Keys: ``embedding_pooling`` (default "mean") and ``embedding_normalize`` (default
    true; llama.cpp's alias ``embd_normalize`` is read too, as LocalAI does). Raises
    ValueError naming the option when a value is invalid, so LoadModel can refuse it.
    """
    pooling = options.get("embedding_pooling", "mean")
    if pooling not in POOLINGS:
        raise ValueError(
            f"option embedding_pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}"
        )
    normalize = options.get("embedding_normalize", options.get("embd_normalize", True))
    _norm_kind(normalize)
    return pooling, normalize


def _norm_kind(normalize: bool | int) -> int:
    """llama.cpp's ``embd_normalize`` code for ``normalize``."""
    if isinstance(normalize, bool):
        return 2 if normalize else -1
    if isinstance(normalize, int) and normalize >= -1:
        return normalize
    raise ValueError(
        "option embedding_normalize must be true/false or an integer >= -1 (-1 none, "
        f"0 max-abs, 1 taxicab, 2 L2, p > 2 p-norm), got {normalize!r}"
    )


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


def _check_step(step: int) -> int:
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise ValueError(f"the forward step must be a positive integer, got {step!r}")
    return step
