"""Scoring: the math behind the Score RPC (embeddings are `embedding.py`).

:func:`score`, called by the engine thread with the loaded mlx-lm model and tokenizer,
gives the joint natural-log probability of each candidate continuation given a prompt
(teacher-forced), with the prompt's KV computed once, shared through the ``PromptCache``
when one is given, and forked for every candidate.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models.cache import make_prompt_cache

from caches.prompt_tiers import PromptTiers
from decoding.output import OutputPipeline
from errors import Cancelled, InvalidArgument
from loading.loaded_model import LoadedModel
from parsing import bounds as bounds_mod
from parsing.bounds import Bounds
from parsing.tokens import common_prefix
from prompt_cache import needs_checkpoints
from prompting import fit
from prompting import render as prompt_mod
from seam.arrays import floats

__all__ = [
    "MAX_SCORE_CANDIDATES",
    "MAX_SCORE_TOKENS",
    "CandidateResult",
    "batched_logprobs",
    "check_candidates",
    "prepare_on",
    "run_on",
    "score",
    "shared_base",
]

DEFAULT_STEP = 512  # tokens per forward chunk: bounds attention and logits memory
# Most candidates in one Score request: each costs a KV copy and a forward call on the
# engine thread (600 of them measured ~56 s on this 2-core CPU with SmolLM2-135M).
MAX_SCORE_CANDIDATES = 256
# Most candidate tokens in one Score request, summed over candidates (the tokens fed
# beyond the shared prompt).
MAX_SCORE_TOKENS = 16384

ShouldStop = Callable[[], bool]


def stopper(should_stop: ShouldStop | None, what: str) -> Callable[[], None]:
    """A check that raises Cancelled naming `what` once `should_stop()` is True."""

    def check() -> None:
        if should_stop is not None and should_stop():
            raise Cancelled(f"{what} cancelled: the client went away or its deadline passed")

    return check


def check_candidates(
    candidates: Sequence[str],
    *,
    max_candidates: int = MAX_SCORE_CANDIDATES,
    prompt: str = "",
    bounds: Bounds | None = None,
) -> None:
    """Cheap checks of a Score request's candidates, safe on the event loop.

    No tokenizing: at least one candidate, at most ``max_candidates``, none empty; with
    ``bounds`` (the model's context and longest token, `parsing.bounds`) the prompt and
    each candidate no longer than the context can hold and the candidates together no
    longer than MAX_SCORE_TOKENS tokens can, in characters. Raises InvalidArgument
    naming ``prompt``, ``candidates`` (or ``candidates[i]``) and the limit.
    """
    if bounds is not None:
        try:
            bounds_mod.check_text("prompt", prompt, bounds)
            bounds_mod.check_texts("candidates", candidates, bounds, MAX_SCORE_TOKENS)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
    if not candidates:
        raise InvalidArgument("candidates is empty: give at least one continuation to score")
    if len(candidates) > max_candidates:
        raise InvalidArgument(
            f"candidates has {len(candidates)} entries; the limit is {max_candidates} "
            "(MAX_SCORE_CANDIDATES): split them over several requests"
        )
    for i, cand in enumerate(candidates):
        if not cand:
            raise InvalidArgument(f"candidates[{i}] is empty: every candidate needs some text")


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


def score(
    model: Any,
    tokenizer: Any,
    prompt: str,
    candidates: Sequence[str],
    *,
    include_token_logprobs: bool = False,
    cache: PromptTiers | None = None,
    model_key: str = "",
    context_len: int | None = None,
    prefill_step: int = DEFAULT_STEP,
    max_kv_size: int | None = None,
    should_stop: ShouldStop | None = None,
    max_candidates: int = MAX_SCORE_CANDIDATES,
    max_candidate_tokens: int = MAX_SCORE_TOKENS,
    stable_prefix_len: int = 0,
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
        stable_prefix_len: ScoreRequest.stable_prefix_len, a hint: the first that many
            characters of ``prompt`` recur in later requests. On a model whose cache
            cannot be trimmed (``prompt_cache.needs_checkpoints``), with ``cache``, the
            prefill is snapshot where those characters' tokens end, so a later prompt
            sharing only them reuses it. 0 (or not shorter than the prompt): no hint.

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
    prepared = prepare(
        tokenizer,
        prompt,
        candidates,
        include_token_logprobs=include_token_logprobs,
        context_len=context_len,
        max_candidates=max_candidates,
        max_candidate_tokens=max_candidate_tokens,
        stable_prefix_len=stable_prefix_len,
        model_key=model_key,
        should_stop=should_stop,
    )
    return run(
        model,
        tokenizer,
        prepared,
        cache=cache,
        prefill_step=prefill_step,
        max_kv_size=max_kv_size,
        should_stop=should_stop,
    )


@dataclass(frozen=True)
class ScoreInput:
    """A Score request tokenized and checked (`prepare`, off the engine thread): each
    candidate's whole sequence (``seqs``) and where its scored tokens start (``ctx``);
    ``stable``: the tokens of the prompt's stable prefix (0: no hint); ``model_key``: the
    model the ids are for."""

    seqs: tuple[tuple[int, ...], ...]
    ctx: tuple[int, ...]
    include_token_logprobs: bool = False
    stable: int = 0
    model_key: str = ""

    @property
    def tokens(self) -> int:
        """The longest candidate's sequence: what one fork's KV holds at most."""
        return max(map(len, self.seqs))


def prepare(
    tokenizer: Any,
    prompt: str,
    candidates: Sequence[str],
    *,
    include_token_logprobs: bool = False,
    context_len: int | None = None,
    per_token: int = 0,
    max_candidates: int = MAX_SCORE_CANDIDATES,
    max_candidate_tokens: int = MAX_SCORE_TOKENS,
    stable_prefix_len: int = 0,
    model_key: str = "",
    should_stop: ShouldStop | None = None,
) -> ScoreInput:
    """Tokenize and check a Score request (`score`'s arguments; ``per_token``: characters
    of the longest vocabulary entry, for `check_candidates`' bounds); no MLX, so any
    thread: the engine runs it on the prepare pool. Raises InvalidArgument as `score`."""
    bounds = Bounds(context_len, per_token) if per_token > 0 else None
    check_candidates(candidates, max_candidates=max_candidates, prompt=prompt, bounds=bounds)
    check = stopper(should_stop, "Score")
    check()
    prompt_ids = prompt_mod.encode(tokenizer, prompt)
    # Per candidate: its whole sequence and how many leading tokens are context.
    seqs: list[tuple[int, ...]] = []
    ctx: list[int] = []
    total_tokens = 0
    for i, cand in enumerate(candidates):
        check()
        full = prompt_mod.encode(tokenizer, prompt + cand)
        k = common_prefix(prompt_ids, full)
        if k == len(full):
            raise InvalidArgument(f"candidates[{i}] adds no tokens to the prompt")
        if k == 0:
            full = [_bos(tokenizer, prompt, i), *full]
            k = 1
        if context_len is not None and len(full) > context_len:
            raise InvalidArgument(
                f"prompt + candidates[{i}] is {len(full)} tokens but the context holds "
                f"{context_len}: shorten the prompt or the candidate"
            )
        total_tokens += len(full) - k
        if total_tokens > max_candidate_tokens:
            raise InvalidArgument(
                f"candidates add {total_tokens} tokens to the prompt by candidates[{i}]; "
                f"the limit is {max_candidate_tokens} candidate tokens per request "
                "(MAX_SCORE_TOKENS): "
                "send fewer or shorter candidates"
            )
        seqs.append(tuple(full))
        ctx.append(k)
    stable = 0
    if 0 < stable_prefix_len < len(prompt):
        stable = common_prefix(prompt_mod.encode(tokenizer, prompt[:stable_prefix_len]), prompt_ids)
    return ScoreInput(tuple(seqs), tuple(ctx), include_token_logprobs, stable, model_key)


def prepare_on(
    loaded: LoadedModel,
    prompt: str,
    candidates: Sequence[str],
    include_token_logprobs: bool,
    stable_prefix_len: int = 0,
) -> ScoreInput:
    """`prepare` for the loaded model, within its task bounds (`prompting.fit.task_bounds`):
    what the engine runs on the prepare pool, off its thread, for a Score request."""
    bounds = fit.task_bounds(loaded)
    return prepare(
        loaded.tokenizer,
        prompt,
        candidates,
        include_token_logprobs=include_token_logprobs,
        context_len=bounds.context,
        per_token=bounds.per_token,
        stable_prefix_len=stable_prefix_len,
        model_key=loaded.cache_key,
    )


def run_on(
    loaded: LoadedModel,
    cache: PromptTiers | None,
    prepared: ScoreInput,
    should_stop: ShouldStop | None = None,
) -> list[CandidateResult]:
    """`run` of a `prepare_on`'d request on the loaded model, with its load options
    (engine thread; ``cache``: the prompt cache the prompt's KV is shared through)."""
    p = loaded.params
    return run(
        loaded.model,
        loaded.tokenizer,
        prepared,
        cache=cache,
        prefill_step=p.prefill_step_size,
        max_kv_size=p.max_kv_size,
        should_stop=should_stop,
    )


def run(
    model: Any,
    tokenizer: Any,
    prepared: ScoreInput,
    *,
    cache: PromptTiers | None = None,
    prefill_step: int = DEFAULT_STEP,
    max_kv_size: int | None = None,
    should_stop: ShouldStop | None = None,
) -> list[CandidateResult]:
    """The forward calls of a `prepare`d Score request: engine thread (``cache`` under
    ``prepared.model_key``; the others as `score`)."""
    check = stopper(should_stop, "Score")
    step = check_step(prefill_step)
    seqs = [list(s) for s in prepared.seqs]
    ctx = list(prepared.ctx)
    stable = prepared.stable if cache is not None else 0
    base_kv, base_len, new_kv = shared_base(
        model, seqs, ctx, cache, prepared.model_key, step, check, max_kv_size, stable
    )

    token_texts = _TokenTexts(tokenizer) if prepared.include_token_logprobs else None
    results = []
    for seq, k in zip(seqs, ctx, strict=True):
        kv = copy.deepcopy(base_kv) if base_kv is not None else new_kv()
        check()
        lps = _target_logprobs(model, kv, seq, base_len, k, step, check)
        total = math.fsum(lps)
        targets = seq[k:]
        tokens: tuple[tuple[str, float], ...] = ()
        if token_texts is not None:
            tokens = tuple(zip(token_texts(targets), lps, strict=True))
        results.append(CandidateResult(total, total / len(targets), len(targets), tokens))
    return results


def shared_base(
    model: Any,
    seqs: Sequence[list[int]],
    ctx: Sequence[int],
    cache: PromptTiers | None,
    model_key: str,
    step: int,
    check: Callable[[], None],
    max_kv_size: int | None = None,
    stable: int = 0,
) -> tuple[list | None, int, Callable[[], list]]:
    """The prefill done once for a set of forks: ``(kv, base_len, new_kv)``.

    ``seqs[i]``: a fork's whole token sequence, whose tokens from ``ctx[i]`` on are scored.
    The base is the longest prefix of every sequence that ends before every fork's last
    context token (that token must be fed to produce its first scored row); ``kv`` holds
    it (None when it is empty), from ``cache`` under ``model_key`` when given (and stored
    there). ``new_kv()`` makes an empty KV cache of the model's type. ``stable``: a token
    position where a cache that cannot be trimmed is also snapshot (`_prefix_kv`).
    """
    base_len = min(ctx) - 1
    for s in seqs[1:]:
        base_len = min(base_len, common_prefix(seqs[0][:base_len], s))

    def new_kv() -> list:
        return make_prompt_cache(model, max_kv_size)

    kv = _prefix_kv(model, new_kv, seqs[0][: base_len + 1], cache, model_key, step, check, stable)
    return kv, base_len, new_kv


def batched_logprobs(
    model: Any,
    base_kv: list | None,
    base_len: int,
    new_kv: Callable[[], list],
    seqs: Sequence[list[int]],
    ctx: Sequence[int],
    step: int,
    check: Callable[[], None],
    extra_ids: Sequence[int] = (),
) -> list[tuple[list[float], list[float]]]:
    """Teacher-forced log-probs of every fork's scored tokens, several forks per forward.

    Each fork ``i`` feeds ``seqs[i][base_len:-1]`` on a copy of ``base_kv`` (which holds
    ``seqs[i][:base_len]``); forks of similar length run together, right-padded, as one
    ``(B, L)`` batch whose ``B * min(L, step)`` stays within ``step`` tokens (a longer
    fork runs alone, ``step`` columns per call). Causal attention keeps a row's logits
    blind to the padding after it. Returns per fork, in order: the natural-log
    probabilities (float32 softmax) of ``seqs[i][ctx[i]:]``, and those of ``extra_ids``
    at the row that predicts its first scored token. ``check`` runs before every call.
    """
    widths = [len(s) - 1 - base_len for s in seqs]
    out: list[tuple[list[float], list[float]]] = [([], [])] * len(seqs)
    batch: list[int] = []
    for i in [*sorted(range(len(seqs)), key=widths.__getitem__), None]:
        if batch and (i is None or (len(batch) + 1) * min(widths[i], step) > step):
            for j, result in zip(batch, _run_batch(model, base_kv, base_len, new_kv,
                                                   [seqs[b] for b in batch],
                                                   [ctx[b] for b in batch], step, check,
                                                   extra_ids), strict=True):  # fmt: skip
                out[j] = result
            batch = []
        if i is not None:
            batch.append(i)
    return out


def _run_batch(
    model: Any,
    base_kv: list | None,
    base_len: int,
    new_kv: Callable[[], list],
    seqs: list[list[int]],
    ctx: list[int],
    step: int,
    check: Callable[[], None],
    extra_ids: Sequence[int],
) -> list[tuple[list[float], list[float]]]:
    rows = len(seqs)
    kv = _tiled(base_kv, rows) if base_kv is not None else new_kv()
    inputs = [s[base_len:-1] for s in seqs]
    width = max(len(x) for x in inputs)
    padded = mx.array([x + [0] * (width - len(x)) for x in inputs])
    extra = mx.array(list(extra_ids)) if extra_ids else None
    picked: list[list[mx.array]] = [[] for _ in seqs]
    extras: list[mx.array | None] = [None] * rows
    for start in range(0, width, step):
        check()
        logits = model(padded[:, start : start + step], cache=kv)
        for r, (seq, k) in enumerate(zip(seqs, ctx, strict=True)):
            first = k - 1 - base_len  # the row that predicts the first scored token
            lo = max(first - start, 0)
            hi = min(len(inputs[r]) - start, logits.shape[1])
            if lo >= hi:
                continue
            part = logits[r, lo:hi].astype(mx.float32)
            norm = mx.logsumexp(part, axis=-1)
            targets = mx.array(seq[base_len + 1 + start + lo : base_len + 1 + start + hi])
            picked[r].append(mx.take_along_axis(part, targets[:, None], axis=-1)[:, 0] - norm)
            if extra is not None and lo == first - start:
                extras[r] = part[0, extra] - norm[0]
        mx.eval(picked, [e for e in extras if e is not None], [c.state for c in kv])
    return [
        (floats(mx.concatenate(p)), floats(e) if e is not None else [])
        for p, e in zip(picked, extras, strict=True)
    ]


def _tiled(base_kv: list, rows: int) -> list:
    """A copy of a batch-1 KV cache with its state repeated ``rows`` times (batch axis 0)."""
    kv = copy.deepcopy(base_kv)
    if rows > 1:
        for c in kv:
            c.state = tree_map(
                lambda a: mx.repeat(a, rows, axis=0) if isinstance(a, mx.array) else a, c.state
            )
    return kv


def _bos(tokenizer: Any, prompt: str, index: int) -> int:
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        if not prompt:
            raise InvalidArgument(
                "prompt is empty and the tokenizer has no BOS token to condition on: give a prompt"
            )
        raise InvalidArgument(
            f"candidates[{index}] merges with the prompt's first token and the tokenizer "
            "has no BOS token to condition on: give a longer prompt"
        )
    return int(bos)


def _prefix_kv(
    model: Any,
    new_kv: Callable[[], list],
    probe: list[int],
    cache: PromptTiers | None,
    model_key: str,
    step: int,
    check: Callable[[], None],
    stable: int = 0,
) -> list | None:
    """KV of ``probe[:-1]`` (None when that is empty), via ``cache`` when given.

    ``probe`` carries one token more than the base so that the cache's "at least one
    token left to feed" rule still lets a stored base be reused whole. ``stable``: a
    token position where a cache that cannot be trimmed is also stored (a checkpoint).
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
    done = lookup.cached_tokens
    if done < stable < len(probe) - 1 and needs_checkpoints(kv):
        _prefill(model, kv, probe[done:stable], step, check)
        cache.insert(model_key, probe[:stable], kv, checkpoint=True)  # stores a copy
        todo = probe[stable:-1]
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
    return floats(mx.concatenate(out))


class _TokenTexts:
    """Per-token text exactly as Predict's logprobs show it (output.OutputPipeline)."""

    def __init__(self, tokenizer: Any) -> None:
        # The pipeline owns the tokenizer-family rules (byte-level, SPM, added tokens).
        self._pipeline = OutputPipeline(tokenizer, top_logprobs=0)

    def __call__(self, ids: Sequence[int]) -> list[str]:
        return [self._pipeline._token_text(int(t))[0] for t in ids]


# --------------------------------------------------------------------------- embeddings
def check_step(step: int) -> int:
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise ValueError(f"the forward step must be a positive integer, got {step!r}")
    return step
