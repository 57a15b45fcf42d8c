"""Agent sessions at scale (issue 38), without a model: many concurrent requests start
together under the default options, and the prompt cache keeps what a memory budget
holds rather than a count of entries. Measured side by side with the peers in
bench/bench_agents.py."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import mlx.core as mx
import pytest
from helpers import counts, wait_idle
from inprocess import InProcessServer
from mlx_lm.models.cache import KVCache
from scripted import ScriptedModel

import backend_pb2
from batch.decode import DecodeBatch
from caches.prompt_tiers import entry_bound
from engine.step_budget import PrefillBudget
from parsing.options import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_CACHE_ENTRIES
from parsing.tokens import common_prefix
from prompt_cache import PromptCache, _Entry, _ids, _Prefixes
from seam.tokenizer import vocab_size


def test_32_concurrent_requests_all_decode_together_with_the_default_options(tok) -> None:
    # Before: max_batch_size defaulted to 8, so 24 of 32 waited for a whole generation.
    assert DEFAULT_MAX_BATCH_SIZE >= 32
    model = ScriptedModel(vocab_size(tok), tok.eos_token_id, step_seconds=0.002)
    srv = InProcessServer(model, tok)
    try:
        req = backend_pb2.PredictOptions(Prompt="Hello", Tokens=100000, IgnoreEOS=True)
        calls = [srv.stub.PredictStream(req) for _ in range(32)]
        first = threading.Barrier(33)
        ended: list[object] = []

        def read(call) -> None:
            started = False
            try:
                for reply in call:
                    if reply.message and not started:
                        started = True
                        first.wait(60)
            except Exception as exc:  # cancelled at the end
                ended.append(exc)

        readers = [threading.Thread(target=read, args=(c,)) for c in calls]
        for t in readers:
            t.start()
        first.wait(60)  # every stream has its first token while all 32 still run
        assert counts(srv.stub)[1:] == (32, 0)
        for call in calls:
            call.cancel()
        for t in readers:
            t.join(30)
        assert len(ended) == 32
        wait_idle(srv.stub)
    finally:
        srv.stop()


def test_the_entry_bound_is_the_memory_budgets_unless_there_is_none() -> None:
    params = SimpleNamespace(max_cache_entries=None)
    assert entry_bound(params, budgeted=True) is None
    # No memory budget (memory_budget:0) or a distributed group: the original's count.
    assert entry_bound(params, budgeted=False) == DEFAULT_MAX_CACHE_ENTRIES
    assert entry_bound(SimpleNamespace(max_cache_entries=3), budgeted=True) == 3


def _kv(n: int) -> list:
    layer = KVCache()
    x = mx.zeros((1, 1, n, 4))
    layer.update_and_fetch(x, x)
    return [layer]


def test_unbounded_by_count_forty_sessions_keep_entries_and_share_the_system_prompt() -> None:
    # The replay: 40 sessions on one system prompt; a count of 10 evicted an entry on
    # nearly every insert while a 19 GB budget held 40 MB.
    system = list(range(1000, 1300))
    cache = PromptCache(max_entries=None)
    sessions = [[*system, 5000 + s, *range(s * 10, s * 10 + 40)] for s in range(40)]
    for tokens in sessions:
        cache.insert("m", tokens, _kv(len(tokens)))
    stats = cache.stats()
    assert (stats.entries, stats.evictions, stats.max_entries) == (40, 0, None)
    # A session's next turn extends its own history; a new session reuses the system prompt.
    turn = [*sessions[3], 7, 8, 9]
    hit = cache.fetch("m", turn)
    assert (hit.cached_tokens, hit.kind, hit.rest) == (len(sessions[3]), "shorter", [7, 8, 9])
    fresh = cache.fetch("m", [*system, 9999, 1, 2])
    assert (fresh.cached_tokens, fresh.kind) == (len(system), "trimmed")
    assert fresh.kv is not None and fresh.kv[0].offset == len(system)


@pytest.mark.parametrize(
    ("stored", "prompt"),
    [
        ([1, 2, 3], [1, 2, 3, 4]),
        ([1, 2, 3, 4], [1, 2, 3]),
        ([1, 2, 9, 4], [1, 2, 3, 4]),
        ([7], [1]),
        ([], [1]),
        ([1, 2, 3], [1, 2, 3]),
        ([1, 2**70, 3], [1, 2**70, 4]),  # image key ids past int64: the tuple comparison
        ([1, 2, 3], [1, 2**70]),
    ],
)
def test_the_vectorised_common_prefix_equals_the_tuple_one(stored, prompt) -> None:
    entry = _Entry(kv=[], nbytes=0, trimmable=True, ids=_ids(stored))
    got = _Prefixes(tuple(prompt)).common(tuple(stored), entry)
    assert got == common_prefix(tuple(stored), tuple(prompt))


def _measured(decode_s: float, rate: float) -> PrefillBudget:
    budget = PrefillBudget(750, 512)
    budget.observe(decode_s, 0, decoding=True)
    budget.observe(decode_s + 512 / rate, 512, decoding=True)
    return budget


def test_the_step_prefill_goes_to_the_oldest_rows_in_full_chunks() -> None:
    # (0.75 s - 0.05 s) * 4,000 tok/s = 2,800 tokens a step: five full 512-token chunks.
    budget = _measured(0.05, 4000)
    assert budget.plan(waiting=16, grouped=0, decoding=True) == (512, 5)
    # Equal slices (before) would have given every one of 16 rows 2,800 / 16 -> 160 tokens.
    assert budget.chunk(16, decoding=True) == 160
    # Rows already prefilling stay; none joins until some leave.
    assert budget.plan(waiting=4, grouped=7, decoding=True) == (budget.chunk(7, True), 7)
    # What fits joins at once; nobody decoding, or nothing measured: every row, full chunks.
    assert budget.plan(waiting=3, grouped=1, decoding=True) == (512, None)
    assert budget.plan(waiting=16, grouped=0, decoding=False) == (512, None)
    assert PrefillBudget(750, 512).plan(16, 0, decoding=True)[1] is None
    assert PrefillBudget(0, 512).plan(16, 0, decoding=True) == (512, None)  # budget off


def test_rows_beyond_the_prefill_group_wait_and_join_in_order(tok) -> None:
    model = ScriptedModel(vocab_size(tok), tok.eos_token_id)
    batch = DecodeBatch(model, eos=[tok.eos_token_id], max_rows=8, prefill_step_size=4)
    uids = [batch.insert([list(range(1, 10))], max_tokens=3, stops=False) for _ in range(3)]
    batch.prefill_rows = 1
    order: list[int] = []
    for _ in range(20):
        prefilled, _ = batch.next()
        order += [p.uid for p in prefilled if p.end_of_prompt]
        stages = [(batch.held(u) or (0, -1))[1] for u in uids]
        assert stages.count(1) <= 1  # one row prefills at a time
    assert order == uids  # each prefilled in turn, in arrival order
