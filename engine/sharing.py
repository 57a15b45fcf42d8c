"""In-flight prefix sharing: requests that arrive together and share a prefix prefill it once.

Agents fan out: several requests arrive at once with the same long system prompt and
tool list and differ in the last turn. Without sharing each one prefills the shared part
(8 requests, 8 prefills). Here a newly admitted request whose prompt shares at least
`MIN_SHARED_PREFIX` tokens more with a running batch row than the prompt cache holds is
*parked*: the row's prefill is made to stop at the end of the shared part
(`BatchRunner.share`, a segment end of `batch.decode.DecodeBatch`), its KV there goes into
the prompt cache, and the parked requests start from that entry in the same step (each
takes its own copy, then prefills only its own tail). A row already past the shared
part gives a trimmed copy at once. vLLM's automatic prefix caching and SGLang's
RadixAttention share KV blocks in flight; the prompt cache is this server's way to share.

Outputs are unchanged: a request resumed from a prompt-cache entry computes what its
cold prefill would (the cache's exactness is tested on its own).

In a distributed group rank 0 decides alone and its followers repeat each `share` call
(`distributed.plan.Share`), so every rank cuts the same prefill and stores the same
entry; the waiting requests then join everywhere with the same cache hit. Image
prompts are not parked (their token ids are cache keys, prefilled from embeddings
elsewhere).

Runs on the engine thread (the scheduler's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass

from caches.prompt_tiers import PromptTiers
from engine.runner import Batch
from engine.sequence import Sequence
from parsing.tokens import common_prefix

# Tokens a shared prefix must save over the prompt cache for a request to wait for it.
MIN_SHARED_PREFIX = 32


@dataclass
class Parked:
    """An admitted job waiting for batch row ``leader`` to store the KV of the first
    ``position`` tokens of its prompt; ``leader`` None: it may start."""

    job: Sequence
    leader: int | None
    position: int


def _reaches(a: SequenceOf[int], b: SequenceOf[int], n: int) -> bool:
    """Whether ``a`` and ``b`` may share a prefix of ``n`` tokens with a token of each
    left after it: both are long enough and their ``MIN_SHARED_PREFIX`` tokens before
    position ``n`` are equal (False is exact; True is checked by `common_prefix`)."""
    if min(len(a), len(b)) <= n:
        return False
    start = max(0, n - MIN_SHARED_PREFIX)
    return tuple(a[start:n]) == tuple(b[start:n])


class SharedPrefixes:
    """The parked jobs of one scheduler and the decision to park.

    Args:
        batch: the scheduler's batch runner (it stores the prefixes).
        cache: the prompt cache the prefixes go through.
        cache_key: the loaded model's prompt-cache key.
        enabled: False where the prompt cache stores nothing (``max_cache_bytes`` 0).
    """

    def __init__(self, batch: Batch, cache: PromptTiers, cache_key: str, enabled: bool) -> None:
        self.batch = batch
        self.cache = cache
        self.cache_key = cache_key
        self.enabled = enabled
        self.parked: list[Parked] = []

    def __len__(self) -> int:
        return len(self.parked)

    def jobs(self) -> list[Sequence]:
        return [p.job for p in self.parked]

    def park(
        self, job: Sequence, running: Iterable[Sequence], share: Callable[[Sequence, int], str]
    ) -> bool:
        """Whether ``job`` (admitted, not started) waits for one of the ``running`` jobs'
        batch rows to store the prefix they share; if so it is parked. ``share(leader,
        position)`` asks the row (`Scheduler.share`: the batch's answer)."""
        if not self.enabled or job.vision is not None or not self.batch.holds(job.params):
            return False
        ids = job.prompt_ids
        # Only the rows sharing at least MIN_SHARED_PREFIX tokens could be worth waiting
        # for; then only those sharing MIN_SHARED_PREFIX more than the prompt cache holds.
        # Each bound is checked first on the MIN_SHARED_PREFIX tokens before it (a slice
        # each): sessions of one application share a system prompt with every running
        # row, but a running row of another session differs right after it, and the cache
        # holds the session's own history, so the exact common prefix (`common_prefix`,
        # ~25 us for a 5k-token prompt) is computed for few rows if any, instead of every
        # running prompt at every admission.
        rows = [
            other
            for other in running
            # image rows (another runner), or a request that keeps its KV, are not asked
            if other.runner is self.batch
            and other.params.cache_write
            and _reaches(other.prompt_ids, ids, MIN_SHARED_PREFIX)
        ]
        if not rows:
            return False  # then the cache scan below could not make it worth waiting
        need = self.cache.longest_common_prefix(self.cache_key, ids) + MIN_SHARED_PREFIX
        best, leader = 0, None
        for other in rows:
            if not _reaches(other.prompt_ids, ids, need):
                continue
            n = min(common_prefix(other.prompt_ids, ids), len(other.prompt_ids) - 1, len(ids) - 1)
            if n > best:
                best, leader = n, other
        if leader is None or leader.uid is None or best < need:
            return False
        if share(leader, best) != "later":
            return False  # stored now (its lookup hits) or not possible: it starts
        self.parked.append(Parked(job, leader.uid, best))
        return True

    def ready(self) -> list[Sequence]:
        """The parked jobs to start now, taken off the list: their prefix was stored,
        their leader stores no more (it left, or finished its prefill), or they were
        cancelled (the caller ends those)."""
        for uid, position in self.batch.take_shared():
            for p in self.parked:
                if p.leader == uid and (position is None or p.position == position):
                    p.leader = None
        go = [p for p in self.parked if p.leader is None or p.job.cancelled]
        if go:
            self.parked = [p for p in self.parked if p not in go]
        return [p.job for p in go]

    def drain(self) -> list[Sequence]:
        """Every parked job, taken off the list (they are being failed)."""
        jobs, self.parked = self.jobs(), []
        return jobs
