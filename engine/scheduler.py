"""The scheduler: the running set of one loaded model, stepped by the engine thread.

Owns admission (waiting jobs join when a batch slot is free), the continuous batch
(mlx-lm's `BatchGenerator`: newcomers join between steps, finished or cancelled
sequences leave), the solo sequences that the batch cannot hold (a draft model, a
quantized KV cache, a rotating cache with NKeep: each a step generator, stepped in turn
with the batch), the prompt cache (fetch at start, insert at retirement, and prefill
snapshots: see below), retirement, failure, and the per-request log line.

Checkpoints: a model whose cache cannot be trimmed back to an arbitrary position
(sliding-window layers past their window, recurrent/SSM state) can only reuse a stored
entry that is a strict prefix of the new prompt. For those, a newcomer's prompt is
inserted into the batch as segments cut at its checkpoint positions (the chat boundary
before the last user message, the prompt minus one token, where it diverges from a
stored prompt, every `prompt_checkpoint_interval` tokens); mlx-lm's prefill stops at
each segment end, where the sequence's cache is extracted and stored in the prompt
cache under exactly the tokens it holds. Solo runs prefill to their checkpoints before
their generator starts. Off in distributed mode (ranks must run identical steps).

Knows nothing about gRPC or threads: the engine calls it from its one thread.

Distributed mode plugs in through `GroupHooks` (rank 0 shares joins and leaves with the
other ranks; they call `start`/`retire`/`mirror_step` to follow); the null hooks of a
single process do nothing.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.generate import (
    BatchGenerator,
    StopSequences,
    generate_step,
    speculative_generate_step,
)
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

from caches.prompt_tiers import TieredPromptCache
from decoding import sampling
from decoding.ngram_spec import ngram_generate_step
from decoding.output import Delta, OutputPipeline
from decoding.reasoning_budget import make_budget_processor
from engine.jobs import Job
from errors import BackendError, Cancelled, FailedPrecondition, InvalidArgument, ResourceExhausted
from loading.loaded_model import LoadedModel
from params import MAX_TOKENS_CAP, GenerationParams
from prompt_cache import PromptCache, needs_checkpoints

logger = logging.getLogger("localai.mlx." + __name__)

# A new prompt sharing at least this many leading tokens with a stored entry gets a
# snapshot where it diverges (a third prompt with that start reuses it); shorter shared
# starts are not worth a snapshot's memory.
MIN_DIVERGENCE_CHECKPOINT = 32


class GroupHooks:
    """What a distributed group does at the scheduler's and engine's seams.

    This null implementation is a single process: nothing is shared, nothing can be
    lost. `distributed.Coordinator` overrides every method.
    """

    failed: str | None = None  # why the group broke; None while healthy
    heartbeat: float | None = None  # rank 0's idle sync interval in seconds; None = none

    def check(self) -> None:
        """Raise `errors.Unavailable` once the group is lost."""

    def pin_seed(self, params: GenerationParams) -> GenerationParams:
        """`params`, with a concrete seed when every rank must draw the same tokens."""
        return params

    def joined(self, job: Job, ids: list[int]) -> None:
        """Rank 0 started `job` on prompt `ids`."""

    def left(self, job: Job) -> None:
        """Rank 0 retired `job`."""

    def sync(self, step: bool, idle: bool) -> None:
        """Once per engine iteration, before stepping (rank 0 sends the plan)."""

    def run(self, op: str, args: tuple, local: Callable[..., Any]) -> Any:
        """Run engine operation `op` (see `engine.OPS`): here, `local(*args)`."""
        return local(*args)

    def close(self) -> None:
        """At shutdown: tell the other ranks to stop."""

    def abort(self, exc: BaseException) -> BackendError | None:
        """A step failed: return the error that ends every request and the engine
        thread (distributed: the group cannot be resynchronized), or None to fail only
        the batch and keep serving."""
        return None

    def memory(self) -> dict[str, int]:
        """Extra Status memory entries."""
        return {}

    def info(self) -> dict | None:
        """Facts for GetMetrics' JSON."""
        return None


NO_GROUP = GroupHooks()


@dataclass(frozen=True)
class RequestMetrics:
    """Metrics of the last finished request, for GetMetrics."""

    tokens_per_second: float = 0.0
    tokens_generated: int = 0
    prompt_tokens_processed: int = 0
    draft_tokens_accepted: int = 0


def _split(ids: list[int], start: int, cuts: frozenset[int]) -> list[list[int]]:
    """``ids[start:]`` cut at the positions ``cuts`` (absolute; those in (start, len))."""
    bounds = [start, *sorted(c for c in cuts if start < c < len(ids)), len(ids)]
    return [ids[a:b] for a, b in itertools.pairwise(bounds)]


class SoloRun:
    """A sequence decoded outside the batch: its step generator, KV cache and token ids."""

    def __init__(self, steps: Iterator, kv: list, tokens: list[int], cache_key: str) -> None:
        self.steps = steps
        self.kv = kv
        self.tokens = tokens  # prompt + generated ids; the KV holds exactly these at the end
        self.cache_key = cache_key

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


class Scheduler:
    """The running set of one `LoadedModel`: waiting jobs, the batch, the solo runs.

    Call from one thread only. `enqueue` takes a job; `tick` reaps cancelled jobs and
    admits waiting ones; `step` decodes one token for every active sequence;
    `fail_all` ends everything with an error. `kv_bytes` is the KV memory of the
    running batch in bytes.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        cache: PromptCache | None = None,
        group: GroupHooks = NO_GROUP,
        on_metrics: Callable[[RequestMetrics], None] = lambda m: None,
        on_idle: Callable[[], None] = lambda: None,
    ) -> None:
        self.loaded = loaded
        self.params = loaded.params
        # "is None": an empty cache is falsy (it has a length), and a follower's own must stay.
        self.cache = (
            cache
            if cache is not None
            else PromptCache(loaded.params.max_cache_entries, loaded.params.max_cache_bytes)
        )
        self.group = group
        self._on_metrics = on_metrics
        self._on_idle = on_idle  # the last running job ended (before its final event)
        tokenizer = loaded.tokenizer
        self._eos_ids = frozenset(tokenizer.eos_token_ids)
        self._eos_stops = StopSequences([(t,) for t in sorted(self._eos_ids)])
        self.active: dict[int, Job] = {}
        self.waiting: deque[Job] = deque()
        self.kv_bytes = 0
        self._solo_uid = 0  # solo sequences get negative ids, apart from BatchGenerator's
        self._gen: BatchGenerator | None = None
        # Prefill snapshots ("checkpoints") for models whose cache cannot be trimmed back
        # to a shared prefix. Not in distributed mode: every rank must run identical
        # prefill chunks, and the followers do not know the leader's cache contents.
        self.checkpointing = group is NO_GROUP and needs_checkpoints(
            make_prompt_cache(loaded.model, self.params.max_kv_size)
        )
        # Whether jobs should come with their chat boundary (Engine.submit): also for a
        # rotating cache with NKeep, which solo runs make for any model.
        self.wants_boundaries = self.checkpointing or (
            group is NO_GROUP and self.params.max_kv_size is not None
        )
        self.reset_batch()

    # ------------------------------------------------------------------ batch lifecycle
    def reset_batch(self) -> None:
        """A fresh, empty BatchGenerator (after a failed step, or at start)."""
        if self._gen is not None:
            self._gen.close()
        p = self.params
        self._gen = BatchGenerator(
            self.loaded.model,
            stop_tokens=[[t] for t in sorted(self._eos_ids)],
            completion_batch_size=p.max_batch_size,
            prefill_batch_size=p.max_batch_size,
            prefill_step_size=p.prefill_step_size,
            max_kv_size=p.max_kv_size,
        )
        self.kv_bytes = 0

    def close(self) -> None:
        """Drop the batch and the prompt cache (the model is being unloaded)."""
        if self._gen is not None:
            self._gen.close()
        self._gen = None
        self.cache.clear()
        self.kv_bytes = 0

    @property
    def busy(self) -> bool:
        return bool(self.active or self.waiting)

    # ------------------------------------------------------------------ admission
    def enqueue(self, job: Job) -> None:
        self.waiting.append(job)

    def tick(self) -> None:
        """Reap cancelled and stalled jobs, then admit waiting jobs into free slots."""
        for job in [j for j in self.waiting if j.cancelled]:
            self.waiting.remove(job)
            self.end(job, error=Cancelled("cancelled before it started"))
        for job in list(self.active.values()):
            if job.cancelled:
                self.retire(job, "cancelled")
            elif job.backlog > job.max_pending:
                self.retire(
                    job,
                    "cancelled",
                    error=ResourceExhausted(
                        f"the client stopped reading: {job.backlog} replies were waiting "
                        "undelivered; read the stream as it arrives"
                    ),
                )
        while self.waiting and len(self.active) < self.params.max_batch_size:
            job = self.waiting.popleft()
            if job.cancelled:
                self.end(job, error=Cancelled("cancelled before it started"))
                continue
            try:
                self._admit(job)
            except BackendError as exc:
                self.end(job, error=exc)
            except ValueError as exc:
                self.end(job, error=InvalidArgument(str(exc)))

    def _admit(self, job: Job) -> None:
        if job.model_serial != self.loaded.serial:
            raise FailedPrecondition("the model was replaced while the request waited; retry")
        job.t_admit = time.perf_counter()
        ids = list(job.prompt_ids)
        context = self.loaded.context_len
        rotating = self.params.max_kv_size is not None
        max_tokens = job.params.max_tokens
        if context and not rotating:
            if len(ids) >= context:
                raise InvalidArgument(
                    f"the prompt is {len(ids)} tokens but the context holds {context}: "
                    "shorten the prompt or raise ContextSize"
                )
            max_tokens = min(max_tokens, context - len(ids))
        else:  # a rotating cache never fills: Tokens -1 still ends somewhere
            max_tokens = min(max_tokens, MAX_TOKENS_CAP)
        job.max_tokens = max_tokens
        params = job.params
        job.pipeline = OutputPipeline(
            self.loaded.tokenizer,
            stop=params.stop,
            top_logprobs=params.top_logprobs if params.logprobs else None,
            temperature=params.temperature,
            initial_state=job.initial_state,
            tools=job.request.prompt.tools,
        )
        # Distributed: every rank samples this sequence, so its seed is picked once, here.
        job.params = self.group.pin_seed(job.params)
        self.start(job, ids)

    def start(self, job: Job, ids: list[int]) -> None:
        """Put an admitted job's prompt ``ids`` into the batch (or a solo run).

        Fetches the prompt cache and builds the sampler from ``job.params``; uses
        ``job.max_tokens``. In distributed mode every rank runs this for every job.
        """
        loaded, params = self.loaded, job.params
        tokenizer = loaded.tokenizer
        rotating = self.params.max_kv_size is not None
        solo = (
            loaded.draft is not None
            or self.params.speculative == "ngram"
            or self.params.kv_bits is not None
            or (rotating and bool(params.keep))
        )
        # Sampler and processors first: a request they refuse (e.g. a bad grammar) must
        # not have touched the prompt cache, whose order every rank keeps the same.
        sampler = sampling.make_sampler(params, tokenizer)
        processors = sampling.make_logits_processors(params, tokenizer)
        budget = make_budget_processor(tokenizer, params.reasoning_budget, job.initial_state)
        processors += [budget] if budget is not None else []
        diverges = (
            self.cache.longest_common_prefix(loaded.cache_key, ids) if self.wants_boundaries else 0
        )
        lookup = self.cache.fetch(loaded.cache_key, ids, *self._disk_dir(job))
        job.disk_hit = getattr(lookup, "disk_hit", False)  # disk tier: for the log line
        job.prompt_tokens, job.cached_tokens = len(ids), lookup.cached_tokens
        if solo:
            self._solo_uid -= 1
            job.uid = self._solo_uid
            job.solo = self._solo_run(job, ids, lookup, sampler, processors, diverges)
        else:
            segments = [lookup.rest]
            if self.checkpointing and job.params.cache_write:
                job.snapshots = self.checkpoint_positions(job, len(ids), diverges)
                segments = _split(ids, lookup.cached_tokens, job.snapshots)
            # Segments: mlx-lm's batch prefill stops exactly at each boundary (one chunk
            # of at most prefill_step_size tokens per step, interleaved with decoding).
            (job.uid,) = self._gen.insert_segments(
                [segments],
                max_tokens=[job.max_tokens],
                caches=[lookup.kv] if lookup.kv is not None else None,
                all_tokens=[ids[: lookup.cached_tokens]],
                samplers=[sampler],
                logits_processors=[processors],
                stop_sequences=[
                    self._eos_stops if self._stops_at_eos(params) else StopSequences(None)
                ],
            )
        self.active[job.uid] = job
        self.group.joined(job, ids)

    def _disk_dir(self, job: Job) -> tuple[str, ...]:
        """The request's disk-tier directory, as extra cache arguments (prompt_tiers)."""
        d = job.params.prompt_cache_dir
        return (d,) if d and isinstance(self.cache, TieredPromptCache) else ()

    def checkpoint_positions(self, job: Job, n: int, diverges: int = 0) -> frozenset[int]:
        """Token positions where ``job``'s prefill (of an ``n``-token prompt) is snapshot:
        the job's own (the chat boundary), ``n - 1`` (an exact repeat then prefills one
        token), every ``prompt_checkpoint_interval`` tokens, and ``diverges`` (where it
        leaves a stored prompt) when at least MIN_DIVERGENCE_CHECKPOINT. Only positions
        after the cache hit and before the last token are kept."""
        positions = {*job.checkpoints, n - 1}
        interval = self.params.prompt_checkpoint_interval
        if interval > 0:
            positions.update(range(interval, n - 1, interval))
        if diverges >= MIN_DIVERGENCE_CHECKPOINT:
            positions.add(diverges)
        return frozenset(p for p in positions if job.cached_tokens < p < n)

    def _prefill_checkpoints(
        self, job: Job, ids: list[int], kv: list, done: int, diverges: int
    ) -> int:
        """A solo sequence's prefill up to its last checkpoint, in chunks of at most
        prefill_step_size tokens stopping at each checkpoint, where ``kv`` (holding
        ``ids[:done]``) is snapshot into the prompt cache. Returns the tokens ``kv``
        then holds. Runs at once, as the solo generator's own prefill would."""
        step = self.params.prefill_step_size
        for pos in sorted(self.checkpoint_positions(job, len(ids), diverges)):
            while done < pos:
                end = min(pos, done + step)
                self.loaded.model(mx.array([ids[done:end]], dtype=mx.uint32), cache=kv)
                mx.eval([c.state for c in kv])
                done = end
            try:
                self.cache.insert(
                    self.loaded.cache_key, ids[:pos], kv, *self._disk_dir(job), checkpoint=True
                )
            except ValueError as exc:  # never serve a snapshot that is not exact
                logger.warning("prefill snapshot of request %s dropped: %s", job.uid, exc)
        return done

    def _snapshot(self, uids: list[int]) -> None:
        """Store the prefill state of the batch sequences ``uids``, each just stopped at a
        segment boundary, when that boundary is one of its checkpoints. A snapshot whose
        token count is not the boundary's, or whose layers disagree with it, is dropped."""
        key = self.loaded.cache_key
        for uid, (kv, tokens) in self._gen.extract_cache(uids).items():
            job = self.active.get(uid)
            tokens = list(tokens)  # the batch keeps appending to its own list
            if job is None or len(tokens) not in job.snapshots:
                continue
            try:
                self.cache.insert(key, tokens, kv, *self._disk_dir(job), checkpoint=True)
            except ValueError as exc:  # never serve a snapshot that is not exact
                logger.warning("prefill snapshot of request %s dropped: %s", uid, exc)

    def _solo_run(self, job: Job, ids, lookup, sampler, processors, diverges=0) -> SoloRun:
        """A sequence decoded on its own with mlx-lm's generate_step / speculative step.

        For what BatchGenerator cannot batch (a draft model, n-gram speculation, a
        quantized KV cache, a rotating cache with NKeep): it verifies one token per
        sequence and step, so several drafted tokens cannot be checked inside it. mlx-lm's
        server runs such requests one at a time; here
        each is a generator stepped once per engine iteration, interleaved with the batch.
        """
        p, params, loaded = self.params, job.params, self.loaded
        kv = lookup.kv
        if kv is None:
            if p.max_kv_size is not None:
                keep = params.keep or 4  # mlx-lm's default
                kv = [
                    RotatingKVCache(max_size=p.max_kv_size, keep=keep)
                    for _ in range(len(loaded.model.layers))
                ]
            else:
                kv = make_prompt_cache(loaded.model)
            if loaded.draft is not None:
                kv = kv + make_prompt_cache(loaded.draft)
        done = lookup.cached_tokens
        # A draft model's layers, or a KV quantized while prefilling, would make a
        # snapshot that differs from what a cold run computes: no checkpoints there.
        if (
            self.group is NO_GROUP
            and needs_checkpoints(kv)
            and job.params.cache_write
            and loaded.draft is None
            and p.kv_bits is None
        ):
            done = self._prefill_checkpoints(job, ids, kv, done, diverges)
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
        if loaded.draft is not None:
            steps = speculative_generate_step(
                prompt,
                loaded.model,
                loaded.draft,
                num_draft_tokens=params.num_draft_tokens or p.num_draft_tokens,
                **common,
            )
        elif p.speculative == "ngram":
            steps = ngram_generate_step(
                prompt,
                loaded.model,
                num_draft_tokens=params.num_draft_tokens or p.num_draft_tokens,
                ngram_max=p.ngram_size,
                context_tokens=ids[:done],
                **common,
            )
        else:
            steps = generate_step(prompt, loaded.model, **common)
        return SoloRun(steps, kv, list(ids), loaded.cache_key)

    # ------------------------------------------------------------------ decoding
    def step(self) -> None:
        """Decode one token for every active sequence (batch first, then solo runs)."""
        if any(job.solo is None for job in self.active.values()):
            prompt_responses, responses = self._gen.next()
            boundaries = [
                r.uid
                for r in prompt_responses
                if r.end_of_segment
                and not r.end_of_prompt
                and r.uid in self.active
                and self.active[r.uid].snapshots
            ]
            if boundaries:
                self._snapshot(boundaries)
            for r in responses:
                job = self.active.get(r.uid)
                if job is not None:
                    kv = (r.prompt_cache, r.all_tokens) if r.finish_reason else None
                    self._on_token(job, r.token, r.logprobs, r.finish_reason, kv)
        for job in [j for j in self.active.values() if j.solo is not None]:
            self._solo_step(job)
        self.kv_bytes = self._gen.prompt_cache_nbytes if self.active else 0

    def mirror_step(self) -> dict[int, tuple]:
        """A distributed follower's `step`: the same decode, no output.

        Returns {uid: (kv, tokens)} of the sequences the batch ended itself (EOS, max
        tokens), kept until rank 0 says when they leave; solo runs whose generator ended
        are marked ``exhausted``.
        """
        finished: dict[int, tuple] = {}
        if any(job.solo is None for job in self.active.values()):
            _, responses = self._gen.next()
            for r in responses:
                if r.finish_reason is not None:
                    finished[r.uid] = (r.prompt_cache, r.all_tokens)
        for job in [j for j in self.active.values() if j.solo is not None]:
            if getattr(job, "exhausted", False):
                continue
            try:
                token, *_ = next(job.solo.steps)
                job.solo.tokens.append(int(token))
            except StopIteration:
                job.exhausted = True
        return finished

    @staticmethod
    def _stops_at_eos(params: GenerationParams) -> bool:
        # A finished grammar allows only EOS, so a constrained request stops there even
        # with IgnoreEOS (else it would emit EOS until max_tokens).
        return not params.ignore_eos or params.constraint is not None

    def _solo_step(self, job: Job) -> None:
        try:
            token, logprobs, *drafted = next(job.solo.steps)
        except StopIteration:
            self.retire(job, "length")
            return
        token = int(token)
        job.solo.tokens.append(token)
        if drafted and drafted[0]:
            job.drafted += 1
        finish = None
        if token in self._eos_ids and self._stops_at_eos(job.params):
            finish = "stop"
        elif job.tokens + 1 >= job.max_tokens:
            finish = "length"
        self._on_token(job, token, logprobs, finish)

    def _on_token(self, job: Job, token: int, logprobs, finish: str | None, kv=None) -> None:
        """One generated token of an active job: output deltas, stop handling, retiring."""
        if job.t_first is None:
            job.t_first = time.perf_counter()
        job.tokens += 1
        delta = job.pipeline.feed(token, logprobs if job.params.logprobs else None)
        if finish is not None:
            self.retire(job, finish, delta, kv)
        elif job.pipeline.stopped:
            self.retire(job, "stop", delta)
        elif delta:
            job.emit(job.event(delta))

    # ------------------------------------------------------------------ leaving
    def retire(
        self,
        job: Job,
        reason: str,
        delta: Delta | None = None,
        kv: tuple | None = None,
        error: BackendError | None = None,
    ) -> None:
        """End an active job: keep its KV in the prompt cache, flush its output.

        ``kv``: (cache, tokens) when the batch already handed the sequence's KV over.
        ``error``: end the job with this error instead of a finish reason.
        """
        self.group.left(job)  # rank 0: the other ranks retire it too
        key = self.loaded.cache_key
        if job.solo is not None:
            key, kv = job.solo.cache_key, job.solo.finish()
        elif kv is None:
            kv = self._gen.remove([job.uid], return_prompt_caches=True).get(job.uid)
        if kv is not None and kv[0] and kv[1] and job.params.cache_write:
            try:
                self.cache.insert(key, list(kv[1]), kv[0], *self._disk_dir(job))
            except ValueError:  # a KV/token mismatch must not leave the client hanging
                logger.exception("prompt cache refused the KV of request %s", job.uid)
        # The cache keeps its own copy: drop ours now, so memory read at `end` is real.
        kv = None
        if job.solo is not None:
            job.solo.kv = []
        if error is not None:
            self.end(job, error=error)
            return
        final = job.pipeline.finish(reason) if job.pipeline is not None else Delta()
        if delta:
            job.emit(job.event(delta))
        # Flushing held text can complete a stop sequence: the pipeline has the last word.
        finish = (job.pipeline.finish_reason if job.pipeline is not None else None) or reason
        self.end(job, final=final, reason=finish)

    def end(
        self,
        job: Job,
        *,
        final: Delta | None = None,
        reason: str | None = None,
        error: BackendError | None = None,
    ) -> None:
        """Send a job's final event (idempotent) and forget it."""
        if job.done:
            return
        job.done = True
        if job.uid is not None:
            self.active.pop(job.uid, None)
        if not self.active:
            self.kv_bytes = 0  # Status right after the last reply must not show stale KV
            self._on_idle()
        # Metrics first: a client may ask GetMetrics as soon as it has the final event.
        self._log(job, reason or (error.status if error else "?"))
        job.emit(job.event(final or Delta(), finish_reason=reason, error=error))

    def _log(self, job: Job, outcome: str) -> None:
        now = time.perf_counter()
        _, gen_ms = job.timings(now)
        tps = (job.tokens - 1) / (gen_ms / 1000.0) if gen_ms > 0 and job.tokens > 1 else 0.0
        ttft = ((job.t_first or now) - job.submitted) * 1000.0
        if job.tokens:
            self._on_metrics(
                RequestMetrics(tps, job.tokens, job.prompt_tokens - job.cached_tokens, job.drafted)
            )
        drafting = job.solo is not None and (
            self.loaded.draft is not None or self.params.speculative == "ngram"
        )
        logger.info(
            "request %s: prompt=%d cached=%d generated=%d ttft=%.1fms tok/s=%.1f finish=%s%s%s",
            job.params.correlation_id or "-",
            job.prompt_tokens,
            job.cached_tokens,
            job.tokens,
            ttft,
            tps,
            outcome,
            f" drafted={job.drafted}" if drafting else "",
            " disk_hit=1" if getattr(job, "disk_hit", False) else "",
        )

    def fail_all(self, error: BackendError) -> None:
        """End every active and waiting job with ``error``."""
        for job in list(self.active.values()):
            if job.solo is not None:
                job.solo.steps.close()
            elif self._gen is not None and job.uid is not None:
                self._gen.remove([job.uid])
            self.end(job, error=error)
        while self.waiting:
            self.end(self.waiting.popleft(), error=error)
        self.kv_bytes = 0

    def jobs(self) -> list[Job]:
        """Every active and waiting job (a copy)."""
        return [*self.active.values(), *self.waiting]
