"""Who holds the memory budget's KV: admission on what sequences hold, preemption when the
running set outgrows the budget, and resumption.

Reserving each request's KV at its longest (prompt + Tokens) lets a budget run only as
many requests as their worst case allows, while agents send Tokens of 4k-32k and use a
fraction. As vLLM does (vllm/v1/core/sched/scheduler.py, `Scheduler.schedule`: when a
running request's next KV blocks cannot be allocated, the lowest-priority request, under
FCFS the last one admitted (``self.running.pop()``), is preempted by `_preempt_request`,
which frees its blocks and puts it back at the head of the waiting queue with
``prepend_request``), a sequence is admitted here on the KV it holds now plus its next
step (`tokens`), and before every step, when the running set's KV after the step, the
step's working set and the prompt cache (which gives memory back first) would exceed the
budget, the newest admitted sequences give way (`make_room`). For each (`take`):

- its queued next token (sampled, not yet returned: the batch is pipelined) is delivered
  as any token first (the scheduler does it), so its sampler, processors and output have
  seen exactly the tokens returned, and the token is its next input;
- its KV goes to the prompt cache: the memory tier when the budget has room for it beside
  the sequences that stay (it is then the most recently used entry, evicted last), else
  the disk tier of its PromptCacheDir when there is one, else nowhere (it is recomputed at
  resume, as vLLM's default);
- the job waits at the head of the queue with its output state (pipeline, counters,
  sampler, processors, timings) and, admitted again, resumes (`resume`) from the prompt
  cache's KV of its prompt and generated tokens: the tokens it then samples are those it
  would have sampled (its sampler's key sequence and its grammar's state go on).

The client sees a longer pause, never an error. What cannot be resumed keeps the
reservation at its longest: distributed groups (every rank would have to preempt alike:
not mirrored), speculative decoding (a step returns several tokens and rewinds drafts),
batch rows of `batch.rows` (``kv_bits``, ``max_kv_size``: untested here), solo runs, image
prompts (their ids are cache keys). What can never fit, even alone at its longest, is
refused before it is queued (`fit.check_memory`).

Engine thread only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from engine.jobs import Handover
from engine.memory import MIN_CHUNK, MemoryBudget, copies
from engine.metrics import NULL, Recorder
from engine.sequence import Sequence
from engine.sequences import RowKind
from prompting import fit

if TYPE_CHECKING:
    from caches.prompt_tiers import PromptTiers
    from engine.step_budget import PrefillBudget
    from loading.loaded_model import LoadedModel
    from params import GenerationParams
    from prompt_cache import CacheLookup


class Rows(Protocol):
    """What this module asks of the continuous batch (`engine.sequences.BatchRunner`)."""

    drafts: bool
    row_kind: RowKind
    budget: PrefillBudget

    def holds(self, params: GenerationParams) -> bool: ...

    def release(self, job: Sequence) -> Handover | None: ...


class Preemption:
    """Memory admission of one scheduler's running set (module doc).

    ``single_process``: False in a distributed group (then every sequence is reserved at
    its longest, as without preemption).
    """

    def __init__(
        self,
        loaded: LoadedModel,
        memory: MemoryBudget,
        rows: Rows,
        cache: PromptTiers,
        single_process: bool = True,
        metrics: Recorder = NULL,
    ) -> None:
        self.loaded = loaded
        self.memory = memory
        self.rows = rows
        self.cache = cache
        self.metrics = metrics
        self.on = (
            memory.enabled
            and single_process
            and not rows.drafts
            and rows.row_kind is RowKind.DEFAULT
        )
        self.preempted = 0  # sequences preempted
        self.resumed = 0  # sequences resumed
        self.bytes_out = 0  # KV bytes preemption put in the prompt cache
        self.bytes_in = 0  # KV bytes resumed sequences took back from it

    # ------------------------------------------------------------------ counting
    def preemptible(self, job: Sequence) -> bool:
        """Whether ``job`` may be preempted (module doc): it decodes in the batch."""
        return self.on and job.vision is None and self.rows.holds(job.params)

    def tokens(self, job: Sequence) -> int:
        """Tokens ``job``'s KV is counted at: after its next step when it can be
        preempted (its prompt, then one more per generated token), else at its longest
        (``job.kv_tokens``, `fit.kv_tokens`)."""
        if not self.preemptible(job):
            return job.kv_tokens
        now = fit.kv_tokens(self.loaded, len(job.prompt_ids), job.tokens + 1)
        return min(now, job.kv_tokens)

    def kv_cost(self, jobs: list[Sequence]) -> int:
        """KV bytes ``jobs`` hold after the next step: mlx-lm pads a batch's rows to its
        longest."""
        longest = max((self.tokens(j) for j in jobs), default=0)
        return self.memory.batch_cost(len(jobs), longest)

    def floor(self, rows: int, kv: int) -> int:
        """The working set of a step of ``rows`` sequences holding ``kv`` KV bytes: one
        token each, or the smallest prefill chunk, beside the copy of the KV a step that
        rows join or leave makes (`engine.memory.copies`)."""
        return self.memory.profile.prefill(max(rows, MIN_CHUNK)) + copies(kv)

    def _shrink(self, kv: int, floor: int) -> None:
        """Evict prompt-cache entries (least recently used first) until ``kv`` bytes of
        running KV and a working set of ``floor`` bytes fit beside it."""
        self.cache.trim_to(max_bytes=max(self.memory.room(kv, 0) - floor, 0))

    # ------------------------------------------------------------------ admission
    def reserve(self, job: Sequence, admitted: list[Sequence], running: bool) -> bool:
        """Whether ``job`` fits beside the ``admitted`` ones now, evicting prompt-cache
        entries to make room only when it then fits; ``running``: some sequence runs
        (else it starts anyway: what never fits alone was refused before). Sets
        ``job.kv_tokens`` (its longest) and, when it fits, the reservation."""
        mem = self.memory
        job.reserved(fit.kv_tokens(self.loaded, len(job.prompt_ids), job.max_tokens))
        if not mem.enabled:
            return True
        jobs = [*admitted, job]
        after = self.kv_cost(jobs)
        prompt = len(job.resume_ids or job.prompt_ids)
        floor = max(
            mem.profile.floor(prompt, mem.chunk) + copies(after), self.floor(len(jobs), after)
        )
        if mem.room(after, self.cache.nbytes) < floor:
            if running and mem.room(after, 0) < floor:
                return False  # waits for running sequences to end; the cache stays
            if job.preemptions:  # its KV out of the cache before it makes room
                job.keep_fetched(self._fetch(job))
            self._shrink(after, floor)
        mem.reserved = after
        return True

    def settle(self, admitted: list[Sequence]) -> None:
        """The reservation and the prefill chunk the budget allows, for who runs now."""
        mem = self.memory
        if not mem.enabled:
            return
        mem.reserved = self.kv_cost(admitted)
        self.rows.budget.limit(mem.room(mem.reserved, self.cache.nbytes), mem.profile)

    def shrink_for(self, admitted: list[Sequence]) -> None:
        """After a prompt-cache insert: evict what the ``admitted`` ones need."""
        if self.memory.enabled:
            kv = self.kv_cost(admitted)
            self._shrink(kv, self.memory.profile.prefill(self.memory.chunk) + copies(kv))

    # ------------------------------------------------------------------ preemption
    def make_room(self, admitted: list[Sequence]) -> list[Sequence]:
        """Before a step: evict prompt-cache entries if the ``admitted`` ones' KV after
        the step and its working set need them; the newest preemptible jobs (newest
        first) that must give way when that is not enough. One job always stays."""
        mem = self.memory
        if not self.on:
            return []
        kv = self.kv_cost(admitted)
        if mem.room(kv, self.cache.nbytes) >= self.floor(len(admitted), kv):
            return []
        keep, out = list(admitted), []
        while len(keep) > 1 and mem.room(kv := self.kv_cost(keep), 0) < self.floor(len(keep), kv):
            newest = next((j for j in reversed(keep) if self._running(j)), None)
            if newest is None:
                break
            keep.remove(newest)
            out.append(newest)
        kv = self.kv_cost(keep)
        self._shrink(kv, self.floor(len(keep), kv))
        return out

    def _running(self, job: Sequence) -> bool:
        return self.preemptible(job) and job.runner is self.rows and not job.done

    def take(self, job: Sequence, pending: int | None, staying: list[Sequence]) -> None:
        """Take preempted ``job``'s row out of the batch and store its KV (module doc)
        where the budget has room beside the ``staying`` jobs; ``pending``: its next
        input, the token it sampled last (None: it was still prefilling: it resumes from
        what it started from, its prompt or an earlier resume's ids). Sets
        ``job.resume_ids``."""
        held = self.rows.release(job)
        kv, tokens = (held[0], list(held[1])) if held is not None else (None, [])
        if pending is not None:
            job.preempted([*tokens, pending])
        else:
            job.preempted(job.resume_ids or list(job.prompt_ids))
        self.preempted += 1
        moved = 0
        if kv and tokens and job.params.cache_write:
            moved = self._store(job, kv, tokens, staying)
        self.bytes_out += moved
        self.metrics.preempted(moved)

    def _store(self, job: Sequence, kv: Any, tokens: list[int], staying: list[Sequence]) -> int:
        """Put ``kv`` (holding ``tokens``) in the prompt cache's memory tier if the budget
        has room beside ``staying``, else in its disk tier; the bytes stored (0: none)."""
        mem, directory = self.memory, job.params.prompt_cache_dir
        size = self._bytes(len(tokens))
        kv_after = self.kv_cost(staying)
        floor = self.floor(len(staying), kv_after)
        if size <= mem.room(kv_after, 0) - floor:
            try:
                self.cache.insert(self.loaded.cache_key, tokens, kv, directory)
            except ValueError:  # a KV/token mismatch: recomputed at resume instead
                return 0
            self._shrink(kv_after, floor)
            return size
        opener = getattr(self.cache, "disk", None)  # caches.prompt_tiers.TieredPromptCache
        disk = opener(directory) if callable(opener) else None
        if disk is not None and disk.put(tokens, kv):
            return size
        return 0

    def _bytes(self, tokens: int) -> int:
        """KV bytes a prompt-cache entry of ``tokens`` tokens holds."""
        prof = self.memory.profile
        return prof.fixed + prof.kv_per_token * tokens

    def _fetch(self, job: Sequence) -> tuple[list[int], CacheLookup]:
        ids = job.resume_ids or list(job.prompt_ids)
        return ids, self.cache.fetch(self.loaded.cache_key, ids, job.params.prompt_cache_dir)

    def resume(self, job: Sequence) -> tuple[list[int], CacheLookup]:
        """(the ids preempted ``job`` resumes from, the prompt cache's KV for them: taken
        before `reserve` made room, or now)."""
        fetched = job.fetched
        job.keep_fetched(None)
        ids, lookup = fetched or self._fetch(job)
        moved = self._bytes(lookup.cached_tokens) if lookup.cached_tokens else 0
        self.resumed += 1
        self.bytes_in += moved
        self.metrics.resumed(moved)
        return ids, lookup

    def status(self) -> dict[str, int]:
        """Status entries: preemptions, resumed sequences, KV bytes moved to and from the
        prompt cache by preemption (since load)."""
        return {
            "preemptions": self.preempted,
            "preemption_resumes": self.resumed,
            "preemption_bytes_to_cache": self.bytes_out,
            "preemption_bytes_from_cache": self.bytes_in,
        }
