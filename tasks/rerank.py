"""Reranking: the math behind the Rerank RPC (LocalAI's ``/v1/rerank``).

:func:`rerank`, called on the engine thread with the loaded mlx-lm model and tokenizer,
scores every document against the query and returns them sorted by relevance, highest
first, cut to ``top_n`` (> 0), as LocalAI's own rerank backends answer
(``backend/cpp/llama-cpp/grpc-server.cpp`` sorts by score descending and crops to
``top_n``; ``backend/python/rerankers/backend.py`` returns the ``rerankers`` library's
ranked results, ``top_k(top_n)`` when ``top_n`` > 0). Two ways to score, option ``rerank``:

- ``yes_no`` (generative rerankers, Qwen3-Reranker's model card): the query and the
  document go into the model's own chat template as a system turn (``JUDGE``) and a user
  turn ``<Instruct>: {instruction}\\n<Query>: {query}\\n<Document>: {doc}``, rendered with
  the generation prompt and thinking off (for Qwen3 this is exactly the card's prefix and
  suffix, the empty think block included); the relevance is the probability of "yes"
  against "no" as the next token: ``softmax([logit(no), logit(yes)])[yes]``, in (0, 1).
- ``likelihood`` (any causal LM): how well the document predicts the query,
  ``log P(query | "Passage: {doc}\\nPlease write a question based on this passage.\\n
  Question:")``, the query likelihood of UPR (Sachan et al., 2022, "Improving Passage
  Retrieval with Zero-Shot Question Generation"); every document is judged on the same
  query tokens, so no length bias. The relevance is ``exp`` of the mean log-probability
  per query token (the geometric-mean token probability), in (0, 1]. (The other
  direction, ``log P(doc | query)``, favours short, generic documents: on the embedded
  SmolLM2 and LocalAI's documentation example it ranked "Biodegradable cleaning supplies"
  first for "Organic skincare products for sensitive skin"; this one ranks the skincare
  range first.)

Both run through Score's path (`tasks.scoring`): the tokens every document's sequence
shares (the judge prompt, instruction and query in ``yes_no``) are prefilled once, via the
prompt cache, and forked per document; the forks run several to a forward call
(`scoring.batched_logprobs`). Bounded and cancellable like Score: at most
``MAX_RERANK_DOCUMENTS`` documents and ``MAX_RERANK_TOKENS`` tokens beyond the shared
prefix; ``should_stop`` is checked before every forward call. The texts are measured in
characters before they are tokenized (`parsing.bounds`), and the engine tokenizes them
off its thread (`prepare`), running only the forward calls there (`run`).

Never imports grpc; bad input raises ``InvalidArgument`` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2

from caches.prompt_tiers import PromptTiers
from errors import InvalidArgument
from loading.loaded_model import LoadedModel
from parsing import bounds as bounds_mod
from parsing.bounds import Bounds
from parsing.options import DEFAULT_RERANK_INSTRUCTION
from parsing.tokens import common_prefix
from prompting import fit
from prompting import render as prompt_mod
from tasks import scoring

__all__ = [
    "MAX_RERANK_DOCUMENTS",
    "MAX_RERANK_TOKENS",
    "Ranked",
    "RerankInput",
    "RerankOutput",
    "check_request",
    "choose_mode",
    "prepare",
    "prepare_on",
    "rerank",
    "run",
    "run_on",
]

YES_NO, LIKELIHOOD, AUTO = "yes_no", "likelihood", "auto"
# Qwen3-Reranker's system prompt (its model card), word for word.
JUDGE = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".'
)
# UPR's question-generation prompt: the document, then the query as the target.
PASSAGE = "Passage: {doc}\nPlease write a question based on this passage.\nQuestion:"
MAX_RERANK_DOCUMENTS = 256  # as Score's MAX_SCORE_CANDIDATES: each is a fork on the engine
# Tokens fed beyond the shared prefix, summed over documents: RAG reranks of ~50 chunks of
# ~1,000 tokens fit; the engine keeps decoding between forward calls meanwhile.
MAX_RERANK_TOKENS = 65536


@dataclass(frozen=True)
class Ranked:
    """One document of the answer: its position in the request, its text, its score."""

    index: int
    text: str
    relevance_score: float


@dataclass(frozen=True)
class RerankOutput:
    """The ranked documents (highest score first, cut to top_n) and the tokens the model
    read: every document's whole sequence, counted as if each ran alone (as llama.cpp's
    Rerank counts ``tokens_evaluated`` per document)."""

    results: tuple[Ranked, ...]
    prompt_tokens: int
    mode: str


def check_request(
    query: str,
    documents: Sequence[str],
    top_n: int,
    bounds: Bounds | None = None,
    max_tokens: int = MAX_RERANK_TOKENS,
) -> None:
    """Cheap checks, safe on the event loop: a query, 1..MAX_RERANK_DOCUMENTS documents,
    top_n >= 0 (0 = all); with ``bounds`` (the model's context and longest token), the
    query and each document no longer than the context can hold and the documents together
    no longer than ``max_tokens`` tokens can hold, measured in characters before anything
    is tokenized (`parsing.bounds`). Raises InvalidArgument naming the field."""
    if not query.strip():
        raise InvalidArgument("query is empty: give the text to rank the documents against")
    if not documents:
        raise InvalidArgument("documents is empty: give at least one document to rank")
    if len(documents) > MAX_RERANK_DOCUMENTS:
        raise InvalidArgument(
            f"documents has {len(documents)} entries; the limit is {MAX_RERANK_DOCUMENTS} "
            "(MAX_RERANK_DOCUMENTS): split them over several requests"
        )
    if top_n < 0:
        raise InvalidArgument(
            f"top_n is {top_n}: give 0 (every document) or how many of the best to return"
        )
    if bounds is not None:
        try:
            bounds_mod.check_text("query", query, bounds)
            bounds_mod.check_texts("documents", documents, bounds, max_tokens)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None


def yes_no_ids(tokenizer: Any) -> tuple[int, int] | None:
    """The token ids of "yes" and "no" (as Qwen3-Reranker's card reads them, with
    ``convert_tokens_to_ids``, else a one-token encoding); None when either is no one
    token."""
    ids = []
    for word in ("yes", "no"):
        tid = None
        convert = getattr(tokenizer, "convert_tokens_to_ids", None)
        if convert is not None:
            tid = convert(word)
            if tid is not None and tid == getattr(tokenizer, "unk_token_id", None):
                tid = None
        if tid is None:
            encoded = tokenizer.encode(word, add_special_tokens=False)
            tid = encoded[0] if len(encoded) == 1 else None
        if tid is None:
            return None
        ids.append(int(tid))
    return ids[0], ids[1]


def choose_mode(option: str, model_name: str, tokenizer: Any) -> str:
    """``yes_no`` or ``likelihood`` for option ``rerank``: ``auto`` is ``yes_no`` when the
    model's name (repo id or path) contains "rerank" and the tokenizer has a chat template
    and one-token "yes" and "no", else ``likelihood``. An explicit ``yes_no`` the model
    cannot do raises InvalidArgument saying what is missing."""
    template = getattr(tokenizer, "has_chat_template", None)
    if template is None:
        template = getattr(tokenizer, "chat_template", None) is not None
    usable = bool(template) and yes_no_ids(tokenizer) is not None
    if option == AUTO:
        return YES_NO if usable and "rerank" in model_name.lower() else LIKELIHOOD
    if option == YES_NO and not usable:
        raise InvalidArgument(
            'option rerank:yes_no needs a chat template and one-token "yes" and "no" '
            "in the tokenizer, which this model lacks: load it with rerank:likelihood"
        )
    return option


def yes_no_prompt(tokenizer: Any, instruction: str, query: str, doc: str) -> str:
    """The judge conversation rendered by the model's chat template (module doc)."""
    messages = [
        {"role": "system", "content": JUDGE},
        {
            "role": "user",
            "content": f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}",
        },
    ]
    try:
        rendered: str = tokenizer.apply_chat_template(  # a string: tokenize=False
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
        return rendered
    except jinja2.TemplateError as err:
        raise InvalidArgument(
            f"the chat template refused the rerank judge prompt ({err}): load the model "
            "with rerank:likelihood"
        ) from None


@dataclass(frozen=True)
class RerankInput:
    """A Rerank request tokenized and checked (`prepare`, off the engine thread): what the
    engine thread then runs (`run`). ``seqs``: each document's token sequence, ``ctx``:
    where its scored tokens start; ``model_key``: the model the ids are for."""

    documents: tuple[str, ...]
    top_n: int
    mode: str
    seqs: tuple[tuple[int, ...], ...]
    ctx: tuple[int, ...]
    yes_no: tuple[int, int] | None
    model_key: str = ""

    @property
    def tokens(self) -> int:
        """The longest document's sequence: what one fork's KV holds at most."""
        return max(map(len, self.seqs))


def prepare(
    tokenizer: Any,
    query: str,
    documents: Sequence[str],
    top_n: int = 0,
    *,
    mode: str = LIKELIHOOD,
    instruction: str = DEFAULT_RERANK_INSTRUCTION,
    context_len: int | None = None,
    max_tokens: int = MAX_RERANK_TOKENS,
    per_token: int = 0,
    model_key: str = "",
    should_stop: Callable[[], bool] | None = None,
) -> RerankInput:
    """Tokenize and check a Rerank request; no MLX, so any thread (the engine calls it on
    the prepare pool: tokenizing long documents must not hold the engine thread).

    The texts are measured first (``per_token``: characters of the longest vocabulary
    entry; `parsing.bounds`), so a document that cannot fit ``context_len`` is refused
    before it is tokenized. Raises InvalidArgument naming ``query`` or ``documents[i]``.
    """
    check_request(query, documents, top_n, Bounds(context_len, per_token), max_tokens)
    check = scoring.stopper(should_stop, "Rerank")
    yes_no = yes_no_ids(tokenizer) if mode == YES_NO else None
    if mode == YES_NO and yes_no is None:
        raise InvalidArgument('rerank:yes_no needs one-token "yes" and "no"')
    seqs, ctx = _sequences(tokenizer, query, documents, yes_no, instruction, check)
    shared = min(common_prefix(seqs[0], s) for s in seqs)
    fed = 0
    for i, seq in enumerate(seqs):
        if context_len is not None and len(seq) > context_len:
            raise InvalidArgument(
                f"documents[{i}] makes a sequence of {len(seq)} tokens but the context holds "
                f"{context_len}: shorten the document or the query"
            )
        fed += len(seq) - shared
        if fed > max_tokens:
            raise InvalidArgument(
                f"documents add {fed} tokens to the shared prompt by documents[{i}]; the "
                f"limit is {max_tokens} (MAX_RERANK_TOKENS): send fewer or shorter documents"
            )
    return RerankInput(
        tuple(documents),
        top_n,
        mode,
        tuple(tuple(s) for s in seqs),
        tuple(ctx),
        yes_no,
        model_key,
    )


def prepare_on(
    loaded: LoadedModel, query: str, documents: Sequence[str], top_n: int
) -> RerankInput:
    """`prepare` for the loaded model: its mode (option ``rerank``, ``auto`` resolved from
    its name and tokenizer), ``rerank_instruction`` and task bounds
    (`prompting.fit.task_bounds`). The engine runs it on the prepare pool, off its thread."""
    p = loaded.params
    bounds = fit.task_bounds(loaded)
    return prepare(
        loaded.tokenizer,
        query,
        documents,
        top_n,
        mode=choose_mode(p.rerank, loaded.name, loaded.tokenizer),
        instruction=p.rerank_instruction,
        context_len=bounds.context,
        per_token=bounds.per_token,
        model_key=loaded.cache_key,
    )


def run_on(
    loaded: LoadedModel,
    cache: PromptTiers | None,
    prepared: RerankInput,
    should_stop: Callable[[], bool] | None = None,
) -> RerankOutput:
    """`run` of a `prepare_on`'d request on the loaded model, with its load options
    (engine thread; ``cache``: the prompt cache the shared prefix's KV goes through)."""
    p = loaded.params
    return run(
        loaded.model,
        prepared,
        cache=cache,
        prefill_step=p.prefill_step_size,
        max_kv_size=p.max_kv_size,
        should_stop=should_stop,
    )


def run(
    model: Any,
    prepared: RerankInput,
    *,
    cache: PromptTiers | None = None,
    prefill_step: int = scoring.DEFAULT_STEP,
    max_kv_size: int | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> RerankOutput:
    """Score a `prepare`d request on the engine thread (``cache``: the prompt cache, under
    ``prepared.model_key``; the others as `scoring.score`)."""
    check = scoring.stopper(should_stop, "Rerank")
    step = scoring.check_step(prefill_step)
    seqs = [list(s) for s in prepared.seqs]
    ctx = list(prepared.ctx)
    kv, base_len, new_kv = scoring.shared_base(
        model, seqs, ctx, cache, prepared.model_key, step, check, max_kv_size
    )
    scored = scoring.batched_logprobs(
        model, kv, base_len, new_kv, seqs, ctx, step, check, prepared.yes_no or ()
    )
    mode = prepared.mode
    scores = [_relevance(mode, lps, alt) for lps, alt in scored]
    documents = prepared.documents
    order = sorted(range(len(documents)), key=lambda i: (-scores[i], i))
    if prepared.top_n > 0:
        order = order[: prepared.top_n]
    results = tuple(Ranked(i, documents[i], scores[i]) for i in order)
    # The sequences minus the appended "yes" of yes_no: what the model read.
    read = sum(len(s) - (1 if mode == YES_NO else 0) for s in seqs)
    return RerankOutput(results, read, mode)


def rerank(
    model: Any,
    tokenizer: Any,
    query: str,
    documents: Sequence[str],
    top_n: int = 0,
    *,
    mode: str = LIKELIHOOD,
    instruction: str = DEFAULT_RERANK_INSTRUCTION,
    cache: PromptTiers | None = None,
    model_key: str = "",
    context_len: int | None = None,
    prefill_step: int = scoring.DEFAULT_STEP,
    max_kv_size: int | None = None,
    should_stop: Callable[[], bool] | None = None,
    max_tokens: int = MAX_RERANK_TOKENS,
) -> RerankOutput:
    """Rank ``documents`` by relevance to ``query`` in one call: `prepare` then `run` on
    the caller's thread (the engine splits them: `prepare_on`, `run_on`).

    Args:
        model, tokenizer: the loaded mlx-lm model and ``TokenizerWrapper``.
        query, documents, top_n: as RerankRequest (``check_request``); top_n 0, or more
            than there are documents, returns them all.
        mode: ``yes_no`` or ``likelihood`` (``choose_mode`` resolves ``auto``).
        instruction: the ``<Instruct>`` line of ``yes_no``.
        cache, model_key, context_len, prefill_step, max_kv_size, should_stop: as
            `scoring.score`.
        max_tokens: most tokens beyond the shared prefix, summed over documents.

    Returns:
        RerankOutput: ``results`` sorted by ``relevance_score`` descending (ties: lower
        index first), at most ``top_n`` of them when top_n > 0.

    Raises:
        InvalidArgument: a bad request (``check_request``), a document whose sequence is
            longer than ``context_len`` or past ``max_tokens`` (names ``documents[i]``),
            ``yes_no`` on a model without what it needs.
        errors.Cancelled: ``should_stop()`` returned True.
    """
    prepared = prepare(
        tokenizer,
        query,
        documents,
        top_n,
        mode=mode,
        instruction=instruction,
        context_len=context_len,
        max_tokens=max_tokens,
        model_key=model_key,
        should_stop=should_stop,
    )
    return run(
        model,
        prepared,
        cache=cache,
        prefill_step=prefill_step,
        max_kv_size=max_kv_size,
        should_stop=should_stop,
    )


def _sequences(
    tokenizer: Any,
    query: str,
    documents: Sequence[str],
    yes_no: tuple[int, int] | None,
    instruction: str,
    check: Callable[[], None],
) -> tuple[list[list[int]], list[int]]:
    """Each document's token sequence and where its scored tokens start.

    With ``yes_no`` ids: the rendered judge prompt plus the "yes" token (scored: that one token;
    "no" is read at the same row). ``likelihood``: the passage prompt plus " {query}",
    whose tokens are scored (Score's boundary rule: the tokens after the longest common
    prefix of the context's and the whole text's encodings).
    """
    seqs: list[list[int]] = []
    ctx: list[int] = []
    for doc in documents:
        check()
        if yes_no is not None:
            context = prompt_mod.encode(
                tokenizer, yes_no_prompt(tokenizer, instruction, query, doc)
            )
            seqs.append([*context, yes_no[0]])
            ctx.append(len(context))
        else:
            head = PASSAGE.format(doc=doc)
            context = prompt_mod.encode(tokenizer, head)
            full = prompt_mod.encode(tokenizer, f"{head} {query.strip()}")
            k = common_prefix(context, full)
            seqs.append(full)
            ctx.append(max(k, 1))
    return seqs, ctx


def _relevance(mode: str, lps: list[float], alt: list[float]) -> float:
    if mode == YES_NO:
        yes, no = alt
        return 1.0 / (1.0 + math.exp(no - yes))  # softmax([no, yes])[yes]
    return math.exp(math.fsum(lps) / len(lps))
