"""Admission on the KV sequences hold now, and preemption (engine/preemption.py), on a
stand-in batch: who is counted at what, who gives way, where its KV goes, what it resumes
from. The model tier (tests/model/test_preemption.py) runs it on a real model."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import pytest
from helpers import gen_params
from mlx_lm.models.cache import KVCache

from engine import memory
from engine.jobs import Job
from engine.memory import MIB, MemoryBudget, MemoryProfile
from engine.metrics import Metrics
from engine.preemption import Preemption
from engine.sequence import Sequence
from engine.sequences import RowKind
from engine.step_budget import PrefillBudget
from params import GenerationRequest, PromptSpec
from prompt_cache import PromptCache

PER_TOKEN = 4096  # KV bytes per token: one 256-token step is 1 MiB
PREFILL = 1024  # working set per prompt token: the 16-token floor is 16 KiB


@pytest.fixture(autouse=True)
def _no_copies(request, monkeypatch):
    """The cases below count KV in whole MiB without the copy a step may hold
    (`engine.memory.copies`); the test that prices the copy keeps it."""
    if "copy" not in request.node.name:
        monkeypatch.setattr(memory, "KV_COPIES", 0.0)


class Rows:
    """The batch as preemption sees it: every request decodes here; `release` hands
    over a KV holding ``held[uid]`` tokens."""

    drafts = False
    row_kind = RowKind.DEFAULT

    def __init__(self) -> None:
        self.budget = PrefillBudget(0, 512)
        self.held: dict[int, list[int]] = {}

    def holds(self, params) -> bool:
        return True

    def release(self, job: Sequence):
        tokens = self.held.pop(job.uid, None) if job.uid is not None else None
        if tokens is None:
            return None
        layer = KVCache()
        layer.update_and_fetch(mx.zeros((1, 1, len(tokens), 4)), mx.zeros((1, 1, len(tokens), 4)))
        return [layer], tokens


def _setup(budget_mib: float, weights_mib: int = 10, single_process: bool = True):
    prof = MemoryProfile(kv_per_token=PER_TOKEN, fixed=0, prefill_per_token=PREFILL)
    memory = MemoryBudget(int(budget_mib * MIB), weights_mib * MIB, prof, 512)
    loaded = SimpleNamespace(params=SimpleNamespace(max_kv_size=None), cache_key="m")
    rows, cache, metrics = Rows(), PromptCache(100), Metrics()
    pre = Preemption(loaded, memory, rows, cache, single_process, metrics)  # type: ignore[arg-type]
    return pre, rows, cache, metrics


def _job(
    uid: int, prompt: int = 200, max_tokens: int = 2048, tokens: int = 0, runner=None, **params
) -> Sequence:
    request = GenerationRequest(gen_params(**params), PromptSpec())
    job = Sequence(Job(request, tuple(range(prompt)), max_tokens=max_tokens))
    job.running(runner, uid)
    for _ in range(tokens):
        job.decoded(0.0, drafted=False)
    job.reserved(prompt + max_tokens)  # as admission sets it
    return job


def test_a_sequence_counts_what_it_holds_after_its_next_step() -> None:
    pre, _, _, _ = _setup(100)
    job = _job(1, prompt=200, tokens=55)
    assert pre.reserve(job, [], running=False)
    assert job.kv_tokens == 200 + 2048  # its longest, still known
    assert pre.tokens(job) == 200 + 55 + 1
    assert pre.kv_cost([job]) == 1 * MIB  # 256 tokens, as allocated
    job.decoded(0.0, drafted=False)  # its 56th token
    assert pre.kv_cost([job]) == 2 * MIB  # the next step crosses into a second KV step


def test_a_distributed_group_keeps_the_reservation_at_the_longest() -> None:
    pre, _, _, _ = _setup(100, single_process=False)
    job = _job(1, prompt=200)
    pre.reserve(job, [], running=False)
    assert not pre.on and pre.tokens(job) == 2248


def test_admission_on_what_is_held_runs_four_times_what_reservation_did() -> None:
    # Weights 10 MiB; 2 rows at their longest (2248 tokens: 9 MiB each) fit a 30 MiB budget.
    pre, rows, _, _ = _setup(30)
    admitted: list[Job] = []
    for uid in range(10):
        job = _job(uid, runner=rows)
        if not pre.reserve(job, admitted, running=bool(admitted)):
            break
        admitted.append(job)
    reservation = (30 * MIB - 10 * MIB) // (9 * MIB)
    assert reservation == 2 and len(admitted) >= 4 * reservation


def test_the_newest_give_way_and_the_prompt_cache_first() -> None:
    pre, rows, cache, _ = _setup(14.5)  # 4.5 MiB beside the weights
    jobs = [_job(uid, prompt=200, tokens=50, runner=rows) for uid in range(4)]  # 1 MiB each
    layer = KVCache()
    layer.update_and_fetch(mx.zeros((1, 8, 256, 64)), mx.zeros((1, 8, 256, 64)))  # 1 MiB
    cache.insert("m", list(range(1000, 1256)), [layer])
    assert pre.make_room(jobs) == []  # 4 x 1 MiB fit once the cache gives its 1 MiB back
    assert cache.nbytes == 0
    for j in jobs:
        j.tokens = 56  # each crosses into its second KV step: 4 x 2 MiB do not fit
    assert pre.make_room(jobs) == [jobs[3], jobs[2]]  # newest first, until 2 x 2 MiB fit


def test_one_sequence_always_stays() -> None:
    pre, rows, _, _ = _setup(12)
    jobs = [_job(uid, tokens=2000, runner=rows) for uid in range(2)]
    assert pre.make_room(jobs) == [jobs[1]]


def test_only_batch_rows_that_run_are_preempted() -> None:
    pre, rows, _, _ = _setup(14.1)
    jobs = [_job(0, tokens=56, runner=rows), _job(1, tokens=56, runner=rows), _job(2, tokens=56)]
    # jobs[2] waits for a shared prefix (no runner): the newest that runs gives way.
    assert pre.make_room(jobs) == [jobs[1]]


def test_a_preempted_sequence_resumes_from_its_kv_and_its_next_token() -> None:
    pre, rows, cache, metrics = _setup(100)
    job = _job(3, prompt=200, tokens=40, runner=rows)
    held = [*range(200), *range(5000, 5039)]  # prompt + 39 fed; the 40th is queued
    rows.held[3] = held
    pre.take(job, 7777, staying=[])
    assert job.resume_ids == [*held, 7777] and job.preemptions == 1
    assert cache.nbytes == len(held) * 2 * 4 * 4  # the KV is in the memory tier
    ids, lookup = pre.resume(job)
    assert ids == [*held, 7777] and lookup.cached_tokens == len(held)
    assert lookup.rest == [7777]  # its next input: the token it sampled last
    moved = len(held) * PER_TOKEN
    assert pre.status() == {
        "preemptions": 1,
        "preemption_resumes": 1,
        "preemption_bytes_to_cache": moved,
        "preemption_bytes_from_cache": moved,
    }
    snap = metrics.snapshot()
    assert snap["preemptions"] == 1 and snap["preemption_resumes"] == 1
    assert snap["preemption_kv_bytes"] == {"to_cache": moved, "from_cache": moved}


def test_without_room_in_memory_the_kv_is_recomputed_at_resume() -> None:
    pre, rows, cache, _ = _setup(12.2)  # 2 MiB beside the weights: the staying row's
    stay = _job(1, prompt=300, tokens=100, runner=rows)  # 401 tokens: 2 MiB as allocated
    job = _job(2, prompt=200, tokens=40, runner=rows)
    rows.held[2] = list(range(239))
    pre.take(job, 9, staying=[stay])
    assert cache.nbytes == 0 and pre.status()["preemption_bytes_to_cache"] == 0
    ids, lookup = pre.resume(job)
    assert ids == [*range(239), 9] and lookup.cached_tokens == 0


def test_a_sequence_preempted_while_it_prefills_resumes_from_its_prompt() -> None:
    pre, rows, _, _ = _setup(100)
    job = _job(4, prompt=300, runner=rows)
    rows.held[4] = list(range(128))  # one chunk prefilled
    pre.take(job, None, staying=[])
    assert job.resume_ids == list(range(300))
    _, lookup = pre.resume(job)
    assert lookup.cached_tokens == 128


class _Disk:
    def __init__(self) -> None:
        self.puts: list[list[int]] = []

    def put(self, tokens, kv) -> bool:
        self.puts.append(list(tokens))
        return True


class _Tiers(PromptCache):
    """A memory tier with a disk tier per directory (`caches.prompt_tiers` has the real)."""

    def __init__(self) -> None:
        super().__init__(100)
        self.disks: dict[str, _Disk] = {}

    def disk(self, directory: str) -> _Disk | None:
        return self.disks.setdefault(directory, _Disk()) if directory else None


def test_when_memory_is_the_problem_the_kv_goes_to_the_disk_tier() -> None:
    pre, rows, _, _ = _setup(12.2)
    tiers = _Tiers()
    pre.cache = tiers
    stay = _job(1, prompt=300, tokens=100, runner=rows)
    job = _job(2, prompt=200, tokens=40, runner=rows, prompt_cache_dir="/models/cache")
    rows.held[2] = list(range(239))
    pre.take(job, 9, staying=[stay])
    assert tiers.nbytes == 0  # no room in memory
    assert tiers.disks["/models/cache"].puts == [list(range(239))]
    assert pre.status()["preemption_bytes_to_cache"] == 239 * PER_TOKEN


def test_preempted_again_before_it_decodes_it_resumes_from_the_same_tokens() -> None:
    pre, rows, _, _ = _setup(100)
    job = _job(5, prompt=200, tokens=30, runner=rows)
    rows.held[5] = list(range(229))
    pre.take(job, 4242, staying=[])
    first = job.resume_ids
    ids, _ = pre.resume(job)
    job.running(rows, 6)
    rows.held[6] = ids[:-1]  # resumed: its KV restored, its next input not fed yet
    pre.take(job, None, staying=[])
    assert job.resume_ids == first == [*range(229), 4242] and job.preemptions == 2


def test_a_step_keeps_room_for_one_copy_of_the_running_kv() -> None:
    # 4.5 MiB beside the weights: 2 rows of 1 MiB and their copy (2 MiB) fit, 3 do not.
    pre, rows, _, _ = _setup(14.5)
    jobs = [_job(uid, prompt=200, tokens=50, runner=rows) for uid in range(3)]
    assert pre.make_room(jobs) == [jobs[2]]
    assert pre.make_room(jobs[:2]) == []
