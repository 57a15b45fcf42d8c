"""One request's engine-side record: `Sequence`, owned by the engine thread.

The scheduler makes one for every `Job` it is handed (`Scheduler.enqueue`) and works on it
from then on: the prepared request (ids, limits, image prompt), its counters and timings,
the runner and row decoding it, its sampler and processors, its speculation counts,
prefill snapshots, the preemption state it resumes from, and the events it sends
back through its job. The `Job` is the event-loop handle alone (events, cancel,
backlog); vLLM keeps the same split (an engine-side ``Request`` and an output collector).

Fields are written here only, by the methods named for what happened (`admitted`,
`looked_up`, `running`, `decoded`, `preempted`...); other modules read them
(tests/fast/test_structure.py holds it).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from decoding.output import Delta
from engine.jobs import Event, Handover, Job
from errors import BackendError
from params import GenerationParams

if TYPE_CHECKING:
    from decoding.output import OutputPipeline
    from engine.vision_prompt import VisionPrompt
    from prompt_cache import CacheLookup


class SequenceRunner(Protocol):
    """What a sequence knows of the runner decoding it: the part of `engine.runner.Runner`
    that retiring, failing and logging it use (here, so that runner imports this module
    and not the other way round)."""

    # Whether its sequences speculate (draft tokens); `proposed` counts them.
    drafts: bool

    def release(self, job: Sequence) -> Handover | None:
        """Take ``job``'s sequence out: its KV and tokens for the prompt cache."""
        ...

    def drop(self, job: Sequence) -> None:
        """Take ``job``'s sequence out, discarding its KV."""
        ...

    def proposed(self, job: Sequence) -> int:
        """Draft tokens ``job`` sent to verification."""
        ...


class DraftStats(Protocol):
    """Counts of a speculating sequence (the n-gram drafts' `NgramStats`)."""

    @property
    def drafted(self) -> int:
        """Draft tokens sent to verification."""
        ...


class Sequence:
    """The engine's record of ``job``'s request (module doc).

    ``pipeline``: the output pipeline, set at admission (a distributed follower's shadow
    brings its own). ``max_tokens``: what it may generate (the prepare step's cap,
    `prompting.fit.max_tokens`; default: the request's Tokens).
    """

    def __init__(self, job: Job, pipeline: OutputPipeline | Any = None) -> None:
        self.job = job
        # The prepared request (set on the event loop, never changed).
        self.request = job.request
        self.prompt_ids = job.prompt_ids
        self.initial_state = job.initial_state
        self.checkpoints = job.checkpoints  # positions (ascending) where prefill may snapshot
        self.model_serial = job.model_serial
        self.vision: VisionPrompt | None = job.vision
        self.max_tokens = job.max_tokens
        self.submitted = job.submitted
        self.params: GenerationParams = job.request.params  # a group pins its seed
        # Admission and the prompt cache.
        self.pipeline: OutputPipeline | Any = pipeline
        self.t_admit = 0.0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.disk_hit = False  # its prompt came from the prompt cache's disk tier
        # Decoding.
        self.uid: int | None = None
        self.runner: SequenceRunner | None = None  # the runner decoding it, once started
        self.sampler: Any = None  # kept with the processors across a preemption
        self.processors: list = []  # its logits processors (a grammar's reports a failure)
        self.snapshots: frozenset[int] = frozenset()  # positions its prefill is snapshot at
        self.spec_stats: DraftStats | None = None  # of a speculative run
        self.tokens = 0
        self.drafted = 0  # tokens accepted from a draft
        self.t_first: float | None = None
        self.t_last = 0.0  # when the latest token was decoded (inter-token latency)
        # The memory budget and preemption (`engine.preemption`).
        self.kv_tokens = 0  # tokens its KV may reach; what the memory budget reserved
        # Once preempted: the tokens it resumes from, prompt and generated, the last one
        # its next input; None before.
        self.resume_ids: list[int] | None = None
        self.preemptions = 0  # times it was preempted (> 0 in the queue: it resumes)
        self.fetched: tuple[list[int], CacheLookup] | None = None  # its resume's lookup
        # Its row in the continuous batch (`engine.sequences.BatchRunner`).
        self.prefilled = 0  # prompt tokens the row has prefilled
        self.decoding = False  # the row is past its prefill
        self.shares: set[int] = set()  # prompt positions the row stores for waiting requests

    # -- the handle's side, read from the engine thread --------------------------------
    @property
    def cancelled(self) -> bool:
        return self.job.cancelled

    @property
    def backlog(self) -> int:
        return self.job.backlog

    @property
    def max_pending(self) -> int:
        return self.job.max_pending

    @property
    def done(self) -> bool:
        return self.job.done

    def emit(self, delta: Delta, **kw: Any) -> None:
        """Hand the reader an event: ``delta`` with this sequence's counters and timings
        (``kw``: the end, ``finish_reason`` or ``error``)."""
        self.job.emit(self.event(delta, **kw))

    def mark_done(self) -> bool:
        return self.job.mark_done()

    def fail(self, error: BackendError) -> None:
        """End it with ``error`` unless it has ended (any thread; idempotent)."""
        if self.job.mark_done():
            self.job.emit(self.event(Delta(), error=error))

    def timings(self, now: float) -> tuple[float, float]:
        """Milliseconds from admission to the first token, and since the first token."""
        if self.t_first is None:
            return (now - self.t_admit) * 1000.0 if self.t_admit else 0.0, 0.0
        return (self.t_first - self.t_admit) * 1000.0, (now - self.t_first) * 1000.0

    def event(self, delta: Delta, **kw: Any) -> Event:
        prompt_ms, gen_ms = self.timings(time.perf_counter())
        return Event(
            delta=delta,
            prompt_tokens=self.prompt_tokens,
            tokens=self.tokens,
            prompt_ms=prompt_ms,
            generation_ms=gen_ms,
            cached_tokens=self.cached_tokens,
            **kw,
        )

    # -- what happens to it (the only writers of its fields) ---------------------------
    def admitted(self, now: float, pipeline: OutputPipeline, params: GenerationParams) -> None:
        """The scheduler admitted it at ``now``: its output pipeline, its parameters (a
        group's pinned seed)."""
        self.t_admit, self.pipeline, self.params = now, pipeline, params

    def looked_up(self, prompt_tokens: int, cached_tokens: int, disk_hit: bool = False) -> None:
        """Its prompt's length and what the prompt cache gave of it (``disk_hit``: from the
        disk tier)."""
        self.prompt_tokens, self.cached_tokens, self.disk_hit = (
            prompt_tokens,
            cached_tokens,
            disk_hit,
        )

    def uncached(self) -> None:
        """The prompt cache's KV was not used after all (an image prompt's never resumes
        inside an image): it prefills from the start."""
        self.cached_tokens = 0

    def planned(self, snapshots: frozenset[int], spec_stats: DraftStats | None) -> None:
        """Its runner's plan: the positions its prefill is snapshot at, its speculation's
        counts."""
        self.snapshots, self.spec_stats = snapshots, spec_stats

    def running(self, runner: SequenceRunner, uid: int) -> None:
        """It decodes in ``runner`` as row ``uid`` (started, resumed, or handed over)."""
        self.runner, self.uid = runner, uid

    def sampling(self, sampler: Any, processors: list) -> None:
        """Its sampler and logits processors, kept for a resume after a preemption."""
        self.sampler, self.processors = sampler, processors

    def decoded(self, now: float, drafted: bool) -> float | None:
        """One more token at ``now`` (``drafted``: from an accepted draft); the seconds
        since the previous one, None for the first."""
        gap = None if self.t_first is None else now - self.t_last
        if self.t_first is None:
            self.t_first = now
        self.t_last = now
        self.tokens += 1
        self.drafted += drafted
        return gap

    def reserved(self, kv_tokens: int) -> None:
        """The memory budget counts its KV at up to ``kv_tokens`` tokens."""
        self.kv_tokens = kv_tokens

    def preempted(self, resume_ids: list[int]) -> None:
        """Taken out to make room: it resumes from ``resume_ids``."""
        self.resume_ids = resume_ids
        self.preemptions += 1

    def joined_batch(self) -> None:
        """A new row in the continuous batch (started, resumed or handed over)."""
        self.prefilled, self.decoding, self.shares = 0, False, set()

    def prefill_progress(self, done: int, end_of_prompt: bool) -> int:
        """Its row has prefilled ``done`` prompt tokens (``end_of_prompt``: all, it now
        decodes); the tokens new since the last report."""
        new = max(done - self.prefilled, 0)
        self.prefilled = done
        self.decoding = self.decoding or end_of_prompt
        return new

    def will_share(self, position: int) -> None:
        """Its row's prefill stops at ``position`` to store that prefix for others."""
        self.shares.add(position)

    def shared(self, position: int) -> bool:
        """Its row stored the prefix up to ``position``: whether it was one it promised."""
        if position not in self.shares:
            return False
        self.shares.discard(position)
        return True

    def stop_sharing(self) -> bool:
        """Its row stores no more prefixes (it left, or finished its prefill): whether it
        still had some to store (their waiters start on their own)."""
        pending = bool(self.shares)
        self.shares = set()
        return pending

    def keep_fetched(self, fetched: tuple[list[int], CacheLookup] | None) -> None:
        """Its resume's prompt-cache lookup, taken before room was made (or None: taken)."""
        self.fetched = fetched
