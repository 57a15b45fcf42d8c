"""The scheduler: the running set of one loaded model, stepped by the engine thread.

Owns admission (waiting jobs join when a batch slot is free and the memory budget holds
them; preemption when it no longer does: `engine.preemption`), the running sequences of
every kind behind one interface (`engine.sequences`: the continuous batch, and the solo
runs the batch cannot hold), the prompt cache (fetch at start, insert at retirement;
prefill checkpoints for caches that cannot be trimmed: `engine.checkpoints`),
retirement, failure, and the per-request log line.

Knows nothing about gRPC or threads: the engine calls it from its one thread.

Distributed mode plugs in through `GroupHooks` (rank 0 shares joins and leaves with the
other ranks; they call `start`/`retire`/`mirror_step` to follow); the null hooks of a
single process do nothing.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from caches.prompt_tiers import PromptTiers, entry_bound
from decoding import grammar, sampling
from decoding.finish import FinishReason
from decoding.output import Delta, OutputPipeline
from decoding.reasoning_budget import make_budget_processor
from engine import divergence, request_log
from engine.checkpoints import Checkpoints
from engine.jobs import Job
from engine.memory import MemoryBudget
from engine.metrics import NULL, Recorder
from engine.preemption import Preemption
from engine.request_log import RequestMetrics
from engine.runner import Batch, Handover, Runner, Token
from engine.sequence import Sequence
from engine.sequences import BatchRunner, SoloRunner
from engine.sharing import SharedPrefixes
from engine.vision import VisionRunner, cache_tokens
from errors import (
    BackendError,
    Cancelled,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
    as_backend_error,
)
from loading.loaded_model import LoadedModel
from params import GenerationParams
from prompt_cache import PromptCache

logger = logging.getLogger("localai.mlx." + __name__)


class GroupHooks:
    """What a distributed group does at the scheduler's and engine's seams.

    This null implementation is a single process: nothing is shared, nothing can be
    lost. `distributed.coordinator.Coordinator` overrides every method.
    """

    failed: str | None = None  # why the group broke; None while healthy
    heartbeat: float | None = None  # rank 0's idle sync interval in seconds; None = none
    # Whether this process decides alone. A group's ranks must run the same steps, so
    # there no call stops midway, no prefill checkpoints are taken, no disk tier is used.
    single_process: bool = True

    def check(self) -> None:
        """Raise `errors.Unavailable` once the group is lost."""

    def pin_seed(self, params: GenerationParams) -> GenerationParams:
        """`params`, with a concrete seed when every rank must draw the same tokens."""
        return params

    def joined(self, job: Sequence, ids: list[int]) -> None:
        """Rank 0 started `job` on prompt `ids`."""

    def shared(self, job: Sequence, position: int) -> None:
        """Rank 0 asked `job`'s batch row for its first `position` prompt tokens."""

    def left(self, job: Sequence) -> None:
        """Rank 0 retired `job`."""

    def sync(self, step: bool, idle: bool) -> None:
        """Once per engine iteration, before stepping (rank 0 sends the plan)."""

    def run(self, op: str, args: tuple, local: Callable[..., Any]) -> Any:
        """Run engine operation `op` (`engine.core`'s LOAD, FREE, ...): here, `local(*args)`."""
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


class Scheduler:
    """The running set of one `LoadedModel`: waiting jobs and the running sequences.

    Call from one thread only. `enqueue` takes a job; `tick` reaps cancelled jobs and
    admits waiting ones; `step` decodes one token for every active sequence;
    `fail_all` ends everything with an error. `kv_bytes` is the KV memory of the
    running sequences in bytes.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        cache: PromptTiers | None = None,
        group: GroupHooks = NO_GROUP,
        on_metrics: Callable[[RequestMetrics], None] = lambda m: None,
        on_idle: Callable[[], None] = lambda: None,
        metrics: Recorder = NULL,
        memory: MemoryBudget | None = None,
    ) -> None:
        self.loaded = loaded
        self.metrics = metrics
        self.memory = memory if memory is not None else MemoryBudget.off(loaded)
        self.params = loaded.params
        # "is None": an empty cache is falsy (it has a length), and a follower's own must stay.
        self.cache: PromptTiers = (
            cache
            if cache is not None
            else PromptCache(
                entry_bound(loaded.params, self.memory.enabled and group.single_process),
                loaded.params.max_cache_bytes,
            )
        )
        self.group = group
        self._on_metrics = on_metrics
        self._on_idle = on_idle  # the last running job ended (before its final event)
        self.active: dict[int, Sequence] = {}
        self.waiting: deque[Sequence] = deque()
        self.kv_bytes = 0
        self.checkpoints = Checkpoints(loaded, self.cache, group.single_process)
        eos_ids = frozenset(loaded.tokenizer.eos_token_ids)
        batch = BatchRunner(loaded, eos_ids, self.checkpoints)
        self._batch: Batch = batch
        # Admission by memory, preemption and resumption (engine/preemption.py).
        self.preemption = Preemption(
            loaded, self.memory, batch, self.cache, group.single_process, metrics
        )
        self._solo: Runner = SoloRunner(loaded, eos_ids, self.checkpoints)
        # Image prompts (vision models): prefilled from embeddings, then handed to the batch
        # (first in the step, so a prompt joins the batch in the step it finishes).
        self._vision: Runner | None = (
            VisionRunner(loaded, self._batch, self.checkpoints) if loaded.vision else None
        )
        # Admitted jobs waiting for a running row's prefill of the prefix they share.
        self.sharing = SharedPrefixes(
            self._batch, self.cache, loaded.cache_key, loaded.params.max_cache_bytes != 0
        )
        self._runners: tuple[Runner, ...] = (
            *([self._vision] if self._vision else []),
            self._batch,
            self._solo,
        )

    @property
    def checkpointing(self) -> bool:
        """Whether batched sequences take prefill checkpoints (`Checkpoints.batched`)."""
        return self.checkpoints.batched

    @property
    def wants_boundaries(self) -> bool:
        """Whether jobs should come with their chat boundary (`Engine.submit`)."""
        return self.checkpoints.wants_boundaries

    # ------------------------------------------------------------------ lifecycle
    def reset_batch(self) -> None:
        """Fresh, empty runners (after a failed step)."""
        for runner in self._runners:
            runner.reset()
        self.kv_bytes = 0

    def close(self) -> None:
        """Drop the running sequences and the prompt cache (the model is being unloaded)."""
        for runner in self._runners:
            runner.close()
        self.cache.clear()
        self.kv_bytes = 0

    @property
    def busy(self) -> bool:
        return bool(self.active or self.waiting or self.sharing)

    @property
    def running(self) -> int:
        """Admitted jobs: running, or waiting for a prefix a running one prefills."""
        return len(self.active) + len(self.sharing)

    # ------------------------------------------------------------------ admission
    def enqueue(self, job: Job) -> Sequence:
        """Queue ``job``: the scheduler's record of it from now on (returned)."""
        seq = Sequence(job)
        self.waiting.append(seq)
        return seq

    def tick(self) -> None:
        """Reap cancelled and stalled jobs, then admit waiting jobs into free slots."""
        for job in [j for j in self.waiting if j.cancelled]:
            self.waiting.remove(job)
            self._reap(job)
        self._unpark()
        for job in list(self.active.values()):
            if job.cancelled:
                self.retire(job, FinishReason.CANCELLED)
            elif job.backlog > job.max_pending:
                self.retire(
                    job,
                    ResourceExhausted(
                        f"the client stopped reading: the output of {job.backlog} steps "
                        "waited undelivered; read the stream as it arrives"
                    ),
                )
        while self.waiting and self.running < self.params.max_batch_size:
            job = self.waiting[0]
            if job.cancelled:
                self.waiting.popleft()
                self._reap(job)
                continue
            try:
                if job.model_serial != self.loaded.serial:
                    raise Unavailable("the model was replaced while the request waited; retry")
                # The memory budget (engine/preemption.py): it fits now, or it waits, and
                # those behind it too: admission is in order.
                if not self.preemption.reserve(job, self._admitted(), bool(self.active)):
                    break
                self.waiting.popleft()
                if job.preemptions:
                    self._resume(job)
                else:
                    self._admit(job)
            except (BackendError, ValueError) as exc:
                if self.waiting and self.waiting[0] is job:
                    self.waiting.popleft()
                self.end(job, error=as_backend_error(exc))
        self.preemption.settle(self._admitted())

    def _reap(self, job: Sequence) -> None:
        """End a waiting job cancelled by its client (a preempted one with its output)."""
        if job.preemptions:
            self.retire(job, FinishReason.CANCELLED)
        else:
            self.end(job, error=Cancelled("cancelled before it started"))

    def _admit(self, job: Sequence) -> None:
        now = time.perf_counter()
        self.metrics.request_started(now - job.submitted)
        ids = list(job.prompt_ids)
        params = job.params
        pipeline = OutputPipeline(
            self.loaded.tokenizer,
            stop=params.stop,
            top_logprobs=params.top_logprobs if params.logprobs else None,
            temperature=params.temperature,
            initial_state=job.initial_state,
            tools=job.request.prompt.tools,
            schema_field=tool_grammar_field(params),
        )
        # Distributed: every rank samples this sequence, so its seed is picked once, here.
        job.admitted(now, pipeline, self.group.pin_seed(job.params))
        if not self._park(job):
            self.start(job, ids)

    def _admitted(self) -> list[Sequence]:
        return [*self.active.values(), *self.sharing.jobs()]

    def _park(self, job: Sequence) -> bool:
        """Whether ``job`` waits for a running row's prefill of a prefix they share."""
        return self.sharing.park(job, self.active.values(), self.share)

    def share(self, job: Sequence, position: int) -> str:
        """Ask ``job``'s batch row for the KV of its first ``position`` prompt tokens
        (`BatchRunner.share`); every rank of a group asks alike."""
        self.group.shared(job, position)
        return self._batch.share(job, position)

    def _unpark(self) -> None:
        """Start the parked jobs whose shared prefix is stored (or will not be); end the
        cancelled ones."""
        for job in self.sharing.ready():
            try:
                if job.cancelled:
                    raise Cancelled("cancelled before it started")
                if not self._park(job):
                    self.start(job, list(job.prompt_ids))
            except (BackendError, ValueError) as exc:
                self.end(job, error=as_backend_error(exc))

    def start(self, job: Sequence, ids: list[int]) -> None:
        """Start an admitted job's prompt ``ids`` in the runner of its kind.

        Fetches the prompt cache and builds the sampler from ``job.params``; uses
        ``job.max_tokens``. In distributed mode every rank runs this for every job.
        """
        loaded, params = self.loaded, job.params
        tokenizer = loaded.tokenizer
        # Sampler and processors first: a request they refuse (e.g. a bad grammar) must
        # not have touched the prompt cache, whose order every rank keeps the same.
        sampler = sampling.make_sampler(params, tokenizer)
        processors = sampling.make_logits_processors(params, tokenizer, job.initial_state)
        budget = make_budget_processor(tokenizer, params.reasoning_budget, job.initial_state)
        processors += [budget] if budget is not None else []
        near = self.cache.nearest(loaded.cache_key, ids)  # engine/divergence.py
        diverges = near.common if self.wants_boundaries else 0
        lookup = self.cache.fetch(loaded.cache_key, ids, params.prompt_cache_dir)
        divergence.record(near, ids, lookup, tokenizer, self.metrics)
        self.metrics.cache_event(
            "hit" if lookup.cached_tokens else "miss", "disk" if lookup.disk_hit else "memory"
        )
        job.looked_up(len(ids), lookup.cached_tokens, lookup.disk_hit)  # disk: for the log
        runner: Runner
        if job.vision is not None:
            # Prepared for this model (its serial), which has a vision part (`fit.check_images`).
            if self._vision is None:  # the ids are cache keys: never feed them as tokens
                raise BackendError("an image prompt reached a model without a vision part")
            runner = self._vision
        else:
            runner = self._batch if self._batch.holds(params) else self._solo
        uid = runner.start(job, ids, lookup, sampler, processors, diverges)
        job.running(runner, uid)
        # Kept for a preemption's resume; a grammar failing mid-generation: see _on_token.
        job.sampling(sampler, processors)
        self.active[uid] = job
        self.group.joined(job, ids)

    # ------------------------------------------------------------------ decoding
    def step(self) -> None:
        """Decode one token for every active sequence (image prompts' prefill first, then
        the batch, then solo runs)."""
        self._make_room()
        self.metrics.step(len(self.active))
        for runner in self._runners:
            if runner.rows:
                for token in runner.step(self.active):
                    self._on_token(token)
        self._unpark()  # followers start in the step it was stored
        self.kv_bytes = sum(runner.nbytes for runner in self._runners) if self.active else 0

    def _make_room(self) -> None:
        """Preempt the newest sequences whose KV the budget cannot hold after this step
        (`Preemption.make_room`): each one's queued token is delivered first (it may end
        it; not again when it was returned as its prefill ended), then it waits at the
        head of the queue to resume."""
        victims = self.preemption.make_room(self._admitted())
        for job in victims:
            token = self._batch.pending(job)
            if token is not None and not token.delivered:
                self._on_token(token)
            uid = job.uid
            if job.done or uid is None or self.active.get(uid) is not job:
                continue  # that token ended it
            del self.active[uid]
            pending = token.token if token is not None else None
            self.preemption.take(job, pending, [j for j in self._admitted() if j not in victims])
            self.waiting.appendleft(job)  # the older one preempted after it goes first
        self.preemption.settle(self._admitted())

    def _resume(self, job: Sequence) -> None:
        """Start a preempted job again from its prompt and generated tokens, with its
        sampler, processors and output state (`Preemption.resume`)."""
        ids, lookup = self.preemption.resume(job)
        uid = self._batch.start(job, ids, lookup, job.sampler, job.processors, 0)
        job.running(self._batch, uid)
        self.active[uid] = job

    def mirror_step(self) -> dict[int, Handover]:
        """A distributed follower's `step`: the same decode, no output.

        Returns {uid: (kv, tokens)} of the sequences the batch ended itself (EOS, max
        tokens), kept until rank 0 says when they leave.
        """
        finished: dict[int, Handover] = {}
        for runner in self._runners:
            if runner.rows:
                finished.update(runner.mirror_step())
        self._batch.take_shared()  # a follower parks nothing: rank 0 starts its waiters
        return finished

    def _on_token(self, t: Token) -> None:
        """One decoded token of an active job: output deltas, stop handling, retiring."""
        job = self.active.get(t.uid)
        if job is None:
            return
        if t.error is not None:  # this sequence alone failed (e.g. its vision tower)
            self.retire(job, t.error)
            return
        failure = grammar.failure_of(job.processors)
        if failure is not None:  # its grammar failed: no reply that breaks it
            self.retire(job, InvalidArgument(failure))
            return
        if t.token is None:  # the generator ended without a token
            self.retire(job, t.finish or FinishReason.LENGTH)
            return
        now = time.perf_counter()
        gap = job.decoded(now, t.drafted)
        if gap is None:
            self.metrics.first_token(now - job.submitted)
        else:
            self.metrics.token_gap(gap)
        pipeline = job.pipeline
        if pipeline is None:  # set at admission: a job without one was never admitted here
            raise BackendError(f"request {job.uid} decoded before it was admitted")
        delta = pipeline.feed(t.token, t.logprobs if job.params.logprobs else None)
        if pipeline.failure is not None:  # a call its tool-call grammar let break its schema
            self.retire(job, InvalidArgument(pipeline.failure))
        elif t.finish is not None:
            unmet = grammar.unmet_of(job.processors, t.finish, t.token, job.tokens)
            self.retire(job, unmet or t.finish, delta, t.kv)
        elif pipeline.stopped:
            unmet = grammar.unmet_of(job.processors, FinishReason.STOP, t.token, job.tokens)
            self.retire(job, unmet or FinishReason.STOP, delta)
        elif delta:
            job.emit(delta)

    # ------------------------------------------------------------------ leaving
    def retire(
        self,
        job: Sequence,
        ending: FinishReason | BackendError,
        delta: Delta | None = None,
        kv: Handover | None = None,
    ) -> None:
        """End an active job: keep its KV in the prompt cache, flush its output.

        ``ending``: how its sequence ended, or the error the job ends with instead of a
        finish reason. ``kv``: (cache, tokens) when its runner already handed the
        sequence's KV over.
        """
        self.group.left(job)  # rank 0: the other ranks retire it too
        if kv is None and job.runner is not None:
            kv = job.runner.release(job)
        # Image prompts are stored under their key ids (None: not at all, see engine.vision).
        tokens = cache_tokens(job, kv[1]) if kv is not None and kv[1] else None
        if kv is not None and kv[0] and tokens and job.params.cache_write:
            try:
                self.cache.insert(self.loaded.cache_key, tokens, kv[0], job.params.prompt_cache_dir)
            except ValueError:  # a KV/token mismatch must not leave the client hanging
                logger.exception("prompt cache refused the KV of request %s", job.uid)
            # The new entry must not take what the others hold.
            self.preemption.shrink_for([j for j in self._admitted() if j is not job])
        # The cache keeps its own copy: drop ours now, so memory read at `end` is real.
        kv = None
        if isinstance(ending, BackendError):
            self.end(job, error=ending)
            return
        reason = ending
        final = job.pipeline.finish(reason) if job.pipeline is not None else Delta()
        if job.pipeline is not None and job.pipeline.failure is not None:
            self.end(job, error=InvalidArgument(job.pipeline.failure))
            return
        if delta:
            job.emit(delta)
        # Flushing held text can complete a stop sequence: the pipeline has the last word.
        finish = (job.pipeline.finish_reason if job.pipeline is not None else None) or reason
        self.end(job, final=final, reason=finish)

    def end(
        self,
        job: Sequence,
        *,
        final: Delta | None = None,
        reason: FinishReason | None = None,
        error: BackendError | None = None,
    ) -> None:
        """Send a job's final event (once, whichever thread ends it first) and forget it."""
        if not job.mark_done():
            return
        if job.uid is not None:
            self.active.pop(job.uid, None)
        self.preemption.settle(self._admitted())  # Status's memory_reserved is current
        if not self.active:
            self.kv_bytes = 0  # Status right after the last reply must not show stale KV
            self._on_idle()
        # Metrics first: a client may ask GetMetrics as soon as it has the final event.
        request_log.finished(
            job, reason or (error.status if error else "?"), self.metrics, self._on_metrics
        )
        job.emit(final or Delta(), finish_reason=reason, error=error)

    def fail_all(self, error: BackendError) -> None:
        """End every active and waiting job with ``error``."""
        for job in list(self.active.values()):
            if job.runner is not None:
                job.runner.drop(job)
            self.end(job, error=error)
        for job in self.sharing.drain():
            self.end(job, error=error)
        while self.waiting:
            self.end(self.waiting.popleft(), error=error)
        self.kv_bytes = 0

    def jobs(self) -> list[Sequence]:
        """Every active and waiting job (a copy)."""
        return [*self._admitted(), *self.waiting]


def tool_grammar_field(params: GenerationParams) -> str | None:
    """The field of the tool-call grammar applied to a request (None without one): a final
    call its schema rejects then fails the request (`OutputPipeline.failure`, issue 41)."""
    field = params.constraint.field if params.constraint is not None else None
    return field if field == grammar.TOOLS_FIELD else None
