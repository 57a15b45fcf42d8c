"""The kinds of running sequence, behind one interface the scheduler steps.

A `Runner` holds sequences of one kind and decodes one token for each per `step`:

- `BatchRunner`: the continuous batch, `batch.decode.DecodeBatch` (newcomers join between
  steps, prefill chunks interleave with decoding, finished sequences leave).
  With ``speculative:ngram`` or a draft model it is `batch.speculation`'s
  `SpeculativeBatch` (per-row drafts verified for all rows in one pass).
  Its rows' caches are `batch.rows`'s quantized (``kv_bits``) or rotating-with-
  NKeep (``max_kv_size``) classes when the model is loaded so (`row_kind`).
- `SoloRunner`: sequences the batch cannot hold (`BatchRunner.holds`: ``kv_bits`` or NKeep on
  a model whose cache layers are not all plain attention (sliding windows, recurrent
  state), or ``quantized_kv_start`` > 0), each one of mlx-lm's step generators,
  stepped in turn with the batch.

Both answer the same calls (`start`, `step`, `release`, `drop`, `mirror_step`, `rows`,
`nbytes`), so the scheduler never asks which kind a job is (TGI's `Batch` interface over
its batch kinds is the model).
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from enum import Enum
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

from batch.decode import DecodeBatch, pending
from batch.rows import row_cache
from batch.speculation import DraftedModel, SpeculativeBatch
from decoding.finish import FinishReason, finish_of
from decoding.ngram_spec import NgramStats
from engine.checkpoints import Checkpoints, split
from engine.sequence import Sequence
from engine.step_budget import PrefillBudget
from loading.loaded_model import LoadedModel
from params import GenerationParams
from prompt_cache import CacheLookup, trim_exactly


@dataclass(frozen=True)
class Token:
    """One decoded token of one sequence (``token`` None: the generator ended without
    one). ``finish``: the runner ended the sequence (STOP, LENGTH); ``kv``:
    (cache, tokens) when it handed the sequence's KV over as it ended; ``drafted``: the
    token came from an accepted draft; ``error``: the runner failed this sequence alone
    (a `BackendError` its request ends with; ``token`` is None); ``delivered``: a queued
    token (`pending`) already returned as its row left prefill."""

    uid: int
    token: int | None
    logprobs: Any = None
    finish: FinishReason | None = None
    kv: tuple | None = None
    drafted: bool = False
    error: Any = None
    delivered: bool = False


def stops_at_eos(params: GenerationParams) -> bool:
    """Whether EOS ends the sequence: unless IgnoreEOS, and always under a grammar (a
    finished grammar allows only EOS; without stopping it would emit EOS to max_tokens)."""
    return not params.ignore_eos or params.constraint is not None


def next_finish(token: int, job: Sequence, eos_ids: frozenset[int]) -> FinishReason | None:
    """How ``token``, ``job``'s next, ends it (`decoding.finish.finish_of`)."""
    return finish_of(
        token, job.tokens + 1, job.max_tokens, stops=stops_at_eos(job.params), eos=eos_ids
    )


class RowKind(Enum):
    """How the batch makes its rows' caches (`row_kind` decides it once per load)."""

    DEFAULT = "default"  # mlx-lm's own: no kv_bits, no max_kv_size
    OWN = "own"  # `batch.rows`'s quantized or rotating rows
    NONE = "none"  # the batch holds no row for such a sequence: it runs solo


def row_kind(loaded: LoadedModel) -> RowKind:
    """How the batch makes ``loaded``'s rows' caches: DEFAULT without ``kv_bits`` and
    ``max_kv_size``; NONE with them on a model whose cache layers cannot be quantized or
    rotated in a batch, or with ``quantized_kv_start`` > 0 (mlx-lm converts a sequence's
    whole cache once it holds that many tokens, one representation per sequence, while a
    batch layer holds one for all its rows); else OWN."""
    p = loaded.params
    if p.kv_bits is None and p.max_kv_size is None:
        return RowKind.DEFAULT
    if p.kv_bits is not None and p.quantized_kv_start > 0:
        return RowKind.NONE
    try:
        _rows(loaded, keep=0)
    except ValueError:
        return RowKind.NONE
    return RowKind.OWN


def _rows(loaded: LoadedModel, keep: int) -> list:
    """One sequence's empty `batch.rows` rows (target layers, then the draft's)."""
    p = loaded.params
    if p.max_kv_size is not None:  # mlx-lm's default keep; at least one rotating slot
        keep = min(keep or 4, p.max_kv_size - 1)

    def rows(model: Any) -> list:
        return row_cache(
            model,
            kv_bits=p.kv_bits,
            kv_group_size=p.kv_group_size,
            max_kv_size=p.max_kv_size,
            keep=keep,
        )

    return rows(loaded.model) + (rows(loaded.draft) if loaded.draft is not None else [])


def new_cache(loaded: LoadedModel, keep: int = 4) -> list:
    """A solo sequence's empty KV cache, plus the draft model's layers. With
    ``max_kv_size``: rotating layers of that many tokens keeping the first ``keep`` (NKeep;
    own code because mlx-lm's `make_prompt_cache` ignores ``max_kv_size`` for models that
    make their own cache); else the model's own cache (`make_prompt_cache`)."""
    p = loaded.params
    if p.max_kv_size is not None:
        kv = [RotatingKVCache(max_size=p.max_kv_size, keep=keep) for _ in loaded.model.layers]
    else:
        kv = make_prompt_cache(loaded.model)
    if loaded.draft is not None:
        kv = kv + make_prompt_cache(loaded.draft)
    return kv


class BatchRunner:
    """The continuous batch of one loaded model (`batch.decode.DecodeBatch`), speculating
    per row with n-gram drafts (``speculative:ngram``) or a draft model's
    (`batch.speculation.SpeculativeBatch`)."""

    def proposed(self, job: Sequence) -> int:
        """Draft tokens ``job`` sent to verification."""
        return job.spec_stats.drafted if job.spec_stats is not None else 0

    def __init__(self, loaded: LoadedModel, eos_ids: frozenset[int], ckpt: Checkpoints) -> None:
        self.loaded = loaded
        self.checkpoints = ckpt
        self.drafts = loaded.params.speculative == "ngram" or loaded.draft is not None
        self._eos_ids = eos_ids
        self.row_kind = row_kind(loaded)  # decided once per load
        self._own_rows = self.row_kind is RowKind.OWN
        # Its rows' sequences, by uid; each row's state (prefill progress, decoding, the
        # prefixes it stores for others) is its Sequence's.
        self._rows: dict[int, Sequence] = {}
        # In-flight prefix sharing: the copies made since last asked (`take_shared`).
        self._shared: list[tuple[int, int | None]] = []
        self.budget = PrefillBudget(loaded.params.step_budget_ms, loaded.params.prefill_step_size)
        self._decode_next = True  # the part of a split step that comes next (`step`)
        self._batch = self._new_batch()

    def reset(self) -> None:
        """A fresh, empty batch (after a failed step)."""
        self._batch.close()
        self._batch = self._new_batch()
        self._forget_all()

    def _new_batch(self) -> DecodeBatch:
        p = self.loaded.params
        model: nn.Module | DraftedModel = self.loaded.model
        if self.loaded.draft is not None:
            model = DraftedModel(model, self.loaded.draft, p.max_kv_size)
        common: dict[str, Any] = dict(
            eos=sorted(self._eos_ids),
            max_rows=p.max_batch_size,
            prefill_step_size=p.prefill_step_size,
            max_kv_size=p.max_kv_size,
            own_layers=self._own_rows,
            settle=not self.checkpoints.single_process,
        )
        if self.drafts:  # distributed ranks must take the same steps: no timing there
            return SpeculativeBatch(
                model, ngram_max=p.ngram_size, timed=self.checkpoints.single_process, **common
            )
        return DecodeBatch(model, **common)

    def close(self) -> None:
        """Drop every row (and its KV)."""
        self._batch.remove(list(self._rows))
        self._batch.close()
        self._forget_all()

    def _forget_all(self) -> None:
        self._rows.clear()
        self._shared.clear()

    def _forget(self, uid: int) -> None:
        seq = self._rows.pop(uid, None)
        if seq is not None:
            self._unshare(uid, seq)

    def _unshare(self, uid: int, seq: Sequence) -> None:
        if seq.stop_sharing():
            self._shared.append((uid, None))

    # ------------------------------------------------------------------ sharing
    def share(self, job: Sequence, position: int) -> str:
        """Put the KV of ``job``'s first ``position`` prompt tokens in the prompt cache for
        requests that share them: "stored" (copied now: the row is past it and its cache
        trims), "later" (its prefill now stops there; `take_shared` says when it is
        stored), or "" (not possible: then the other request prefills on its own)."""
        uid = job.uid
        row = self._batch.held(uid) if uid is not None and uid in self._rows else None
        if uid is None or row is None:
            return ""
        held, stage = row
        if self._batch.cut(uid, position):
            job.will_share(position)
            return "later"
        if held < position or stage == 0:  # a waiting row's cache is its own, not a copy
            return ""
        kv, tokens = self._batch.extract_cache([uid])[uid]  # a copy
        if not trim_exactly(kv, held - position):
            return ""
        self.checkpoints.store(job, list(tokens[:position]), kv)
        return "stored"

    def take_shared(self) -> list[tuple[int, int | None]]:
        """(uid, position) of the prefixes stored since the last call (`share`), and
        (uid, None) for rows that will store no more (they left or finished prefill)."""
        out, self._shared = self._shared, []
        return out

    @property
    def rows(self) -> int:
        return len(self._rows)

    @property
    def nbytes(self) -> int:
        """KV bytes of the running batch."""
        return self._batch.nbytes if self._rows else 0

    def holds(self, params: GenerationParams) -> bool:
        """Whether a request decodes in this batch; if not, it runs solo: quantized KV or
        NKeep where the batch has no rows for them (`RowKind.NONE`). Without NKeep a
        ``max_kv_size`` request there runs in the batch on mlx-lm's own cache."""
        if self.row_kind is not RowKind.NONE:
            return True
        return self.loaded.params.kv_bits is None and not params.keep

    def row_cache(self, params: GenerationParams) -> list | None:
        """A new sequence's empty KV cache for this batch: `batch.rows`'s quantized rows
        (``kv_bits``) or rotating rows keeping ``params.keep`` tokens (``max_kv_size``;
        mlx-lm's 4 when 0), the draft model's after the target's; None: the model's own."""
        return _rows(self.loaded, params.keep) if self._own_rows else None

    def start(
        self,
        job: Sequence,
        ids: list[int],
        lookup: CacheLookup,
        sampler: Any,
        processors: list,
        diverges: int,
    ) -> int:
        kv = lookup.kv
        if self._own_rows and kv is None:
            kv = self.row_cache(job.params)
        segments = [lookup.rest]
        # Checkpoints: the model's batch cache needs them, or this row's own layers do (a
        # rotating row cannot be trimmed once past its window).
        p = self.loaded.params
        takes = self.checkpoints.batched or (
            kv is not None
            and self._own_rows
            and self.checkpoints.takes(kv, draft=self.loaded.draft, kv_bits=p.kv_bits)
        )
        snapshots: frozenset[int] = frozenset()
        if takes and job.params.cache_write:
            snapshots = self.checkpoints.positions(job, len(ids), diverges)
            segments = split(ids, lookup.cached_tokens, snapshots)
        draft = None
        stats = NgramStats() if self.drafts else None
        if stats is not None:
            width = job.params.num_draft_tokens or self.loaded.params.num_draft_tokens
            draft = (width, stats)
        job.planned(snapshots, stats)
        # Segments: the batch's prefill stops exactly at each boundary (one chunk of at
        # most prefill_step_size tokens per step, interleaved with decoding).
        uid = self._batch.insert(
            segments,
            max_tokens=job.max_tokens - job.tokens,  # a resumed job: what it has left
            cache=kv,
            tokens=ids[: lookup.cached_tokens],
            sampler=sampler,
            processors=processors,
            stops=stops_at_eos(job.params),
            logprobs=bool(job.params.logprobs),
            draft=draft,
        )
        job.joined_batch()
        self._rows[uid] = job
        return uid

    def adopt(
        self, job: Sequence, kv: list, tokens: list[int], last: int, sampler: Any, processors: list
    ) -> int:
        """Add a sequence prefilled elsewhere (an image prompt, `engine.vision`): ``kv``
        holds ``tokens``; the batch decodes from ``last``, the prompt's last token.
        Returns its uid."""
        uid = self._batch.insert(
            [[last]],
            max_tokens=job.max_tokens,
            cache=kv,
            tokens=tokens,
            sampler=sampler,
            processors=processors,
            stops=stops_at_eos(job.params),
            logprobs=bool(job.params.logprobs),
        )
        job.joined_batch()
        self._rows[uid] = job
        return uid

    def step(self, jobs: dict[int, Sequence]) -> list[Token]:
        """One batch step: a prefill chunk and/or one token for every decoding row;
        prefill snapshots taken where a row stopped at one of its checkpoints."""
        if not self._rows:
            return []
        decoding = any(s.decoding for s in self._rows.values())
        # While rows decode and others prefill, a step is two: the decode, whose tokens
        # the engine hands over (and whose new requests it admits) before the prefill
        # chunk runs, then the chunk; alone, a step is both (`DecodeBatch.next`). A
        # distributed group's ranks take whole steps.
        decode = prefill = True
        if decoding and self._batch.prefills and self.checkpoints.single_process:
            decode = self._decode_next
            prefill = not decode
            self._decode_next = not decode
        else:
            self._decode_next = True  # a whole step: a split one starts with its decode
        # The budget's chunk for this step; the batch reads it on every step.
        self._plan_chunk(decoding)
        start = time.perf_counter()
        prompt_responses, responses = self._batch.next(decode, prefill)
        prefilled = 0
        for r in prompt_responses:
            seq = self._rows.get(r.uid)
            if seq is not None:
                prefilled += seq.prefill_progress(r.progress[0], r.end_of_prompt)
        self.budget.observe(time.perf_counter() - start, prefilled, decoding and decode)
        self._at_boundaries(prompt_responses, jobs)
        out = []
        for g in responses:
            kv = None
            if g.finish_reason:
                kv = (g.prompt_cache, g.all_tokens)
                self._forget(g.uid)
            out.append(Token(g.uid, g.token, g.logprobs, g.finish_reason, kv, g.drafted))
        return out

    def _plan_chunk(self, decoding: bool) -> None:
        """The step's prompt tokens (`PrefillBudget.plan`): each row's chunk and the
        step's budget over its rows; the batch reads them every step. A distributed
        follower plans the same (its budget has no time part there)."""
        held = [self._batch.held(u) for u, s in self._rows.items() if not s.decoding]
        context = max((h[0] for h in held if h is not None), default=0)
        tokens = self.budget.plan(decoding, context, self.nbytes)
        self._batch.prefill_step_size = self._batch.prefill_tokens = tokens

    def _at_boundaries(self, prompt_responses: list, jobs: dict[int, Sequence]) -> None:
        """Store the KV of rows whose prefill just stopped at one of their checkpoints
        (``jobs``: by uid) or `share` positions."""
        started = {r.uid for r in prompt_responses if r.end_of_prompt}
        boundaries = [
            r.uid
            for r in prompt_responses
            if r.end_of_segment
            and not r.end_of_prompt
            and r.uid not in started  # it decodes now: no KV of its prompt alone wanted
            and r.uid in self._rows
            and (self._rows[r.uid].snapshots or self._rows[r.uid].shares)
        ]
        if boundaries:
            extracted = self._batch.extract_cache(boundaries)
            self.checkpoints.store_extracted(extracted, self._rows)
            for uid, (kv, tokens) in extracted.items():
                n, job = len(tokens), self._rows[uid]
                if job.shared(n):
                    if n not in job.snapshots:  # else the checkpoint stored it
                        self.checkpoints.store(job, list(tokens), kv)
                    self._shared.append((uid, n))
        for r in prompt_responses:
            seq = self._rows.get(r.uid)
            if r.end_of_prompt and seq is not None:
                self._unshare(r.uid, seq)

    def mirror_step(self) -> dict[int, tuple]:
        """A distributed follower's step: the same decode, no output; {uid: (kv, tokens)}
        of the rows the batch ended itself."""
        if not self._rows:
            return {}
        self._plan_chunk(any(s.decoding for s in self._rows.values()))
        prompt_responses, responses = self._batch.next()
        for r in prompt_responses:
            seq = self._rows.get(r.uid)
            if seq is not None:
                seq.prefill_progress(r.progress[0], r.end_of_prompt)
        self._at_boundaries(prompt_responses, {})  # rank 0's `share` cuts, repeated here
        finished = {}
        for g in responses:
            if g.finish_reason is not None:
                finished[g.uid] = (g.prompt_cache, g.all_tokens)
                self._forget(g.uid)
        return finished

    def release(self, job: Sequence) -> tuple | None:
        """Take ``job``'s row out of the batch: (kv, tokens) for the prompt cache."""
        if job.uid not in self._rows:
            return None
        self._forget(job.uid)
        return self._batch.remove([job.uid], return_prompt_caches=True).get(job.uid)

    def pending(self, job: Sequence) -> Token | None:
        """``job``'s next token, sampled and queued but not returned yet
        (`DecodeBatch.pending`), with the finish it makes (STOP at EOS, LENGTH at
        ``job.max_tokens``); None while its row prefills."""
        uid = job.uid
        got = pending(self._batch, uid) if uid is not None and uid in self._rows else None
        if uid is None or got is None:
            return None
        token, logprobs, delivered = got
        finish = None if delivered else next_finish(token, job, self._eos_ids)
        return Token(uid, token, logprobs, finish, delivered=delivered)

    def drop(self, job: Sequence) -> None:
        """Take ``job``'s row out, discarding its KV."""
        if job.uid in self._rows:
            self._forget(job.uid)
            self._batch.remove([job.uid])


class SoloRun:
    """A sequence decoded outside the batch: its step generator, KV cache and token ids."""

    def __init__(self, steps: Generator[Any, None, None], kv: list, tokens: list[int]) -> None:
        self.steps = steps
        self.kv = kv
        self.tokens = tokens  # prompt + generated ids; the KV holds exactly these at the end
        self.exhausted = False  # a follower's generator ended before rank 0 retired it

    def finish(self) -> tuple[list, list[int]] | None:
        """Close the generator; return (kv, tokens) when the KV holds exactly ``tokens``.

        mlx-lm's step generators have fed every yielded token into the KV; the speculative
        one rewinds rejected draft tokens when closed. Any surplus is trimmed; a cache
        that cannot be made to match is not returned (and so never stored).
        """
        self.steps.close()
        n = len(self.tokens)
        for c in self.kv:
            offset = getattr(c, "offset", None)
            if not isinstance(offset, int):
                return None
            if offset > n and c.is_trimmable():
                c.trim(offset - n)
            if c.offset != n:
                return None
        return self.kv, self.tokens  # PromptCache.insert stores an exact private copy


class SoloRunner:
    """Sequences decoded one by one with mlx-lm's `generate_step`, or its speculative step
    with a draft model (n-gram speculation is the batch's only: a solo request of a
    ``speculative:ngram`` load decodes plainly).

    mlx-lm's server runs such requests one at a time; here each is a generator stepped
    once per engine iteration, interleaved with the batch. Uids are negative, apart from
    the batch's.
    """

    def __init__(self, loaded: LoadedModel, eos_ids: frozenset[int], ckpt: Checkpoints) -> None:
        self.loaded = loaded
        self.checkpoints = ckpt
        self._eos_ids = eos_ids
        self.runs: dict[int, SoloRun] = {}
        self._last_uid = 0
        self.drafts = loaded.draft is not None

    def proposed(self, job: Sequence) -> int:
        """Draft tokens ``job`` sent to verification: for a draft model (mlx-lm does not
        count them) an upper bound, NDraft per target token; 0 without one."""
        if not self.drafts:
            return 0
        n = job.params.num_draft_tokens or self.loaded.params.num_draft_tokens
        return (job.tokens - job.drafted) * n

    def reset(self) -> None:
        for run in self.runs.values():
            run.steps.close()
        self.runs.clear()

    def holds(self, params: GenerationParams) -> bool:
        """Every request can decode solo."""
        return True

    def adopt(
        self, job: Sequence, kv: list, tokens: list[int], last: int, sampler: Any, processors: list
    ) -> int:
        """Sequences prefilled elsewhere (image prompts) join the batch only.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("prefilled sequences are adopted by the BatchRunner")

    close = reset

    @property
    def rows(self) -> int:
        return len(self.runs)

    @property
    def nbytes(self) -> int:
        """KV bytes of the solo sequences."""
        return sum(getattr(c, "nbytes", 0) for run in self.runs.values() for c in run.kv)

    def start(
        self,
        job: Sequence,
        ids: list[int],
        lookup: CacheLookup,
        sampler: Any,
        processors: list,
        diverges: int,
    ) -> int:
        loaded, p, params = self.loaded, self.loaded.params, job.params
        kv = lookup.kv
        if kv is None:
            kv = new_cache(loaded, keep=params.keep or 4)  # mlx-lm's default keep
        done = lookup.cached_tokens
        if params.cache_write and self.checkpoints.takes(kv, draft=loaded.draft, kv_bits=p.kv_bits):
            done = self.checkpoints.prefill(job, ids, kv, done, diverges)
        prompt = mx.array(ids[done:], dtype=mx.uint32)
        common = dict(
            max_tokens=job.max_tokens,
            sampler=sampler,
            logits_processors=processors or None,
            prompt_cache=kv,
            prefill_step_size=p.prefill_step_size,
            kv_bits=p.kv_bits,
            kv_group_size=p.kv_group_size,
            quantized_kv_start=p.quantized_kv_start,
        )
        drafts = params.num_draft_tokens or p.num_draft_tokens
        steps: Generator[Any, None, None]
        if loaded.draft is not None:
            steps = speculative_generate_step(
                prompt, loaded.model, loaded.draft, num_draft_tokens=drafts, **common
            )
        else:
            steps = generate_step(prompt, loaded.model, **common)
        self._last_uid -= 1
        self.runs[self._last_uid] = SoloRun(steps, kv, list(ids))
        return self._last_uid

    def step(self, jobs: dict[int, Sequence]) -> list[Token]:
        out = []
        for uid, run in list(self.runs.items()):
            job = jobs.get(uid)
            if job is None:
                continue
            try:
                token, logprobs, *drafted = next(run.steps)
            except StopIteration:
                out.append(Token(uid, None, finish=FinishReason.LENGTH))
                continue
            token = int(token)
            run.tokens.append(token)
            finish = next_finish(token, job, self._eos_ids)
            out.append(Token(uid, token, logprobs, finish, drafted=bool(drafted and drafted[0])))
        return out

    def mirror_step(self) -> dict[int, tuple]:
        """A distributed follower's step; a generator that ends is marked exhausted."""
        for run in self.runs.values():
            if run.exhausted:
                continue
            try:
                token, *_ = next(run.steps)
                run.tokens.append(int(token))
            except StopIteration:
                run.exhausted = True
        return {}

    def release(self, job: Sequence) -> tuple | None:
        run = self.runs.pop(job.uid, None) if job.uid is not None else None
        return run.finish() if run is not None else None

    def drop(self, job: Sequence) -> None:
        run = self.runs.pop(job.uid, None) if job.uid is not None else None
        if run is not None:
            run.steps.close()
