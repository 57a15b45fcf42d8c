"""In-flight prefix sharing's decisions (`engine.sharing`) and the batch's segment cut
(`batch.decode._cut`), without a model. The end-to-end behaviour (outputs, prompt tokens
computed) is tested over gRPC in tests/model/test_prefix_sharing.py."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from batch.decode import _cut
from engine.sharing import MIN_SHARED_PREFIX, SharedPrefixes
from parsing.tokens import common_prefix


def test_cut_splits_a_segment_or_keeps_an_existing_end() -> None:
    segs = [[1, 2, 3, 4], [5, 6], [7]]
    assert _cut(segs, 2) and segs == [[1, 2], [3, 4], [5, 6], [7]]
    assert _cut(segs, 4) and segs == [[1, 2], [3, 4], [5, 6], [7]]  # already an end
    assert _cut(segs, 5) and segs == [[1, 2], [3, 4], [5], [6], [7]]
    assert not _cut(segs, 0) and not _cut(segs, -3)  # already fed
    assert not _cut(segs, 8)  # past the prompt
    assert segs == [[1, 2], [3, 4], [5], [6], [7]]


class FakeBatch:
    """The two `Batch` calls sharing makes, recorded."""

    def __init__(self, answer: str = "later") -> None:
        self.answer = answer
        self.shares: list[tuple[int, int]] = []
        self.stored: list[tuple[int, int | None]] = []

    def holds(self, params) -> bool:
        return True

    def share(self, job, position: int) -> str:
        self.shares.append((job.uid, position))
        return self.answer

    def take_shared(self):
        out, self.stored = self.stored, []
        return out


class FakeCache:
    def __init__(self, cached: int = 0) -> None:
        self.cached = cached

    def longest_common_prefix(self, key, ids) -> int:
        return self.cached


def job(ids, uid=None, runner=None, cache_write=True, vision=None):
    return SimpleNamespace(
        prompt_ids=tuple(ids),
        uid=uid,
        runner=runner,
        params=SimpleNamespace(cache_write=cache_write),
        vision=vision,
        cancelled=False,
    )


SYSTEM = list(range(100, 100 + 3 * MIN_SHARED_PREFIX))


def test_parks_on_the_running_row_sharing_most_and_starts_when_stored() -> None:
    batch = FakeBatch()
    sharing = SharedPrefixes(batch, FakeCache(), "m", enabled=True)
    short = job([*SYSTEM[:40], 1, 2], uid=7, runner=batch)
    long = job([*SYSTEM, 3, 4, 5], uid=8, runner=batch)
    other_kind = job([*SYSTEM, 9, 9], uid=9, runner=object())  # an image row's runner
    new = job([*SYSTEM, 6])
    assert sharing.park(new, [short, long, other_kind], batch.share)
    assert batch.shares == [(8, len(SYSTEM))]
    assert sharing.ready() == [] and len(sharing) == 1
    batch.stored = [(8, len(SYSTEM) - 5)]  # another position of that row: not this one
    assert sharing.ready() == []
    batch.stored = [(8, len(SYSTEM))]
    assert sharing.ready() == [new] and len(sharing) == 0


def test_a_leader_that_leaves_lets_its_followers_go() -> None:
    batch = FakeBatch()
    sharing = SharedPrefixes(batch, FakeCache(), "m", enabled=True)
    leader = job([*SYSTEM, 1], uid=3, runner=batch)
    a, b = job([*SYSTEM, 2]), job([*SYSTEM, 3])
    assert sharing.park(a, [leader], batch.share) and sharing.park(b, [leader], batch.share)
    b.cancelled = True
    assert sharing.ready() == [b]  # cancelled: handed back to be ended
    batch.stored = [(3, None)]
    assert sharing.ready() == [a]
    sharing.park(job([*SYSTEM, 4]), [leader], batch.share)
    assert len(sharing.drain()) == 1 and len(sharing) == 0


def test_no_parking_when_it_saves_too_little_or_cannot() -> None:
    batch = FakeBatch()
    leader = job([*SYSTEM, 1], uid=3, runner=batch)
    new = job([*SYSTEM, 2])
    # The prompt cache already holds all but a few shared tokens.
    cached = SharedPrefixes(batch, FakeCache(len(SYSTEM) - MIN_SHARED_PREFIX + 1), "m", True)
    assert not cached.park(new, [leader], batch.share)
    assert not SharedPrefixes(batch, FakeCache(), "m", enabled=False).park(
        new, [leader], batch.share
    )
    sharing = SharedPrefixes(batch, FakeCache(), "m", enabled=True)
    assert not sharing.park(job([*SYSTEM, 2], vision=object()), [leader], batch.share)
    assert not sharing.park(
        new, [job([*SYSTEM, 1], uid=3, runner=batch, cache_write=False)], batch.share
    )
    batch.answer = "stored"  # the leader is past it: the copy is in the cache already
    assert not sharing.park(new, [leader], batch.share) and len(sharing) == 0
    batch.answer = ""
    assert not sharing.park(new, [leader], batch.share) and len(sharing) == 0


def _decision(new, running, batch, cached: int) -> tuple[int, int] | None:
    """The decision as first written: the exact common prefix with every running prompt,
    then the cache: (leader uid, position) to park on, or None."""
    best, leader = 0, None
    for other in running:
        if other.runner is not batch or not other.params.cache_write:
            continue
        a, b = other.prompt_ids, new.prompt_ids
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        n = min(n, len(a) - 1, len(b) - 1)
        if n > best:
            best, leader = n, other
    if leader is None or leader.uid is None or best < MIN_SHARED_PREFIX:
        return None
    if best - cached < MIN_SHARED_PREFIX:
        return None
    return leader.uid, best


class CountingCache(FakeCache):
    def __init__(self, cached: int = 0) -> None:
        super().__init__(cached)
        self.scans = 0

    def longest_common_prefix(self, key, ids) -> int:
        self.scans += 1
        return self.cached


@settings(max_examples=300, deadline=None)
@given(
    prompts=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 4 * MIN_SHARED_PREFIX), st.integers(0, 3)),
        min_size=1,
        max_size=6,
    ),
    new=st.tuples(st.integers(0, 3), st.integers(0, 4 * MIN_SHARED_PREFIX)),
    cached=st.integers(0, 5 * MIN_SHARED_PREFIX),
)
def test_the_bounded_check_parks_as_the_exact_comparison_with_every_row(
    prompts, new, cached
) -> None:
    # Sessions share a system prompt, then each has its own history: the check on the 32
    # tokens before each bound must reach the same leader and position as comparing the
    # whole prompts, and scan the cache only when some row shares 32 tokens.
    system = list(range(100, 100 + 5 * MIN_SHARED_PREFIX))

    def prompt(kind: int, shared: int, tail: int) -> list[int]:
        # kind 0: the system prompt; 1: its first token only; 2: another; 3: a duplicate
        # of another row's start (ties).
        head = {0: system, 1: system[:1], 2: [7] * len(system), 3: system}[kind]
        return [*head[:shared], *[5000 + 31 * kind + i for i in range(tail + 1)]]

    batch = FakeBatch()
    rows = [
        job(prompt(k, s, t), uid=i if i % 5 else None, runner=batch, cache_write=i % 4 != 3)
        for i, (k, s, t) in enumerate(prompts)
    ]
    incoming = job(prompt(new[0], new[1], 2))
    cache = CountingCache(cached)
    sharing = SharedPrefixes(batch, cache, "m", enabled=True)
    expected = _decision(incoming, rows, batch, cached)
    assert sharing.park(incoming, rows, batch.share) == (expected is not None)
    assert batch.shares == ([] if expected is None else [expected])
    some = any(
        r.params.cache_write
        and common_prefix(r.prompt_ids, incoming.prompt_ids) >= 32
        and min(len(r.prompt_ids), len(incoming.prompt_ids)) > 32
        for r in rows
    )
    assert cache.scans == int(some)
