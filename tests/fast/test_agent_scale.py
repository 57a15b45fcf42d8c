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
from hypothesis import given, settings
from hypothesis import strategies as st
from inprocess import InProcessServer
from mlx_lm.models.cache import KVCache
from scripted import ScriptedModel

import backend_pb2
from batch.decode import DecodeBatch
from caches.prompt_tiers import entry_bound
from engine.step_budget import FIRST_CHUNK, PrefillBudget
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


def _naive_common_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=300, deadline=None)
@given(
    shared=st.integers(0, 5000),
    tails=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    kind=st.sampled_from([tuple, list]),
)
def test_common_prefix_at_every_length_and_chunk_boundary(shared, tails, kind) -> None:
    # Agent prompts share thousands of tokens: the chunked scan must find the first
    # difference wherever it falls (inside a chunk, on a chunk's first or last token, at
    # the end of the shorter sequence).
    base = [i % 97 + 1 for i in range(shared)]
    a = kind(base + [1000 + i for i in range(tails[0])])
    b = kind(base + [2000 + i for i in range(tails[1])])
    assert (
        common_prefix(a, b)
        == _naive_common_prefix(a, b)
        == (shared if tails[0] and tails[1] else min(len(a), len(b)))
    )
    assert common_prefix(tuple(a), list(b)) == _naive_common_prefix(a, b)


def _measured(decode_s: float, rate: float) -> PrefillBudget:
    budget = PrefillBudget(750, 512)
    budget.observe(decode_s, 0, decoding=True)
    budget.observe(decode_s + 512 / rate, 512, decoding=True)
    return budget


def test_the_step_prefill_is_one_budget_for_all_its_rows() -> None:
    # (0.75 s - 0.05 s) * 400 tok/s = 280 tokens beside the decode: 272 in quanta of 16.
    assert _measured(0.05, 400).plan(decoding=True) == 272
    assert _measured(0.05, 4000).plan(decoding=True) == 512  # at most the full chunk
    assert _measured(0.05, 400).plan(decoding=False) == 512  # nobody decodes: full
    assert PrefillBudget(0, 512).plan(decoding=True) == 512  # time budget off
    assert PrefillBudget(750, 512).plan(decoding=True) == FIRST_CHUNK  # nothing measured


def _joined_order(tok, prompts: list[tuple[int, int]], budget: int) -> list[list[int]]:
    """Per step, the uids whose first token came, for prompts (step inserted, length) and
    ``budget`` prompt tokens a step."""
    model = ScriptedModel(vocab_size(tok), tok.eos_token_id)
    batch = DecodeBatch(model, eos=[tok.eos_token_id], max_rows=64, prefill_step_size=budget)
    batch.prefill_tokens = budget
    out: list[list[int]] = []
    seen: set[int] = set()
    for step in range(200):
        for at, n in prompts:
            if at == step:
                batch.insert([list(range(1, n + 1))], max_tokens=2, stops=False)
        _, generated = batch.next()
        out.append(sorted(g.uid for g in generated if g.uid not in seen))
        seen |= {g.uid for g in generated}
    return [x for x in out if x]


def test_the_turns_with_the_fewest_tokens_left_prefill_first_within_the_budget(tok) -> None:
    # A long prompt first, then three short turns: the short ones (9+9 fit in 20 tokens,
    # one step; 17 the next) decode before the long one, which prefills 20 a step after.
    order = _joined_order(tok, [(0, 100), (0, 10), (0, 18), (0, 10)], budget=20)
    assert order[:3] == [[1, 3], [2], [0]]
    # What fits in the budget prefills together.
    assert _joined_order(tok, [(0, 10), (0, 10), (0, 10)], budget=512) == [[0, 1, 2]]


def test_a_long_prompt_is_not_starved_by_a_stream_of_shorter_ones(tok) -> None:
    # A 60-token prompt, then a 5-token one every step (4 tokens fed a step, budget 8):
    # shortest first alone would keep the long one waiting as long as they come. Aged by
    # half the 4 tokens fed each step, its 59 tokens left rank below a fresh 4 after
    # (59 - 4) / 2 -> 28 steps: it then takes the budget (8 a step) and decodes before
    # the shorter prompts stop coming.
    order = _joined_order(tok, [(0, 60)] + [(k, 5) for k in range(60)], budget=8)
    flat = [u for step in order for u in step]
    assert 25 <= flat.index(0) <= 32
    assert sorted(flat) == list(range(61))


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


def test_rows_in_the_prefill_group_keep_within_the_step_budget(tok) -> None:
    # Two turns whose first segment (a checkpoint 4 tokens in) is short both join a
    # 16-token step (4 + 4); in the steps after, their rows together still feed at most
    # the step's budget, not a full chunk each.
    model = ScriptedModel(vocab_size(tok), tok.eos_token_id)
    batch = DecodeBatch(model, eos=[tok.eos_token_id], max_rows=8, prefill_step_size=16)
    batch.prefill_tokens = 16
    for base in (100, 200):
        head = list(range(base, base + 4))
        batch.insert([head, list(range(base + 4, base + 60))], max_tokens=2, stops=False)
    fed = []
    for _ in range(12):
        before = batch._fed
        batch.next()
        fed.append(batch._fed - before)
    assert fed[0] == 8
    assert max(fed) <= 16, fed
    assert sum(fed) == 2 * 59


def test_a_step_runs_at_most_its_budget_of_positions_through_the_model(tok) -> None:
    # The budget bounds what the forward pass computes (time and working set), and the
    # batch pads each prefilling row's chunk to the longest one of the step.
    class Counting(ScriptedModel):
        def __call__(self, inputs, cache=None, **kwargs):
            self.positions.append(inputs.shape[0] * inputs.shape[1])
            return super().__call__(inputs, cache=cache, **kwargs)

    model = Counting(vocab_size(tok), tok.eos_token_id)
    batch = DecodeBatch(model, eos=[tok.eos_token_id], max_rows=8, prefill_step_size=64)
    batch.prefill_tokens = 64
    for n in (41, 3, 3, 3, 3):
        batch.insert([list(range(1, n + 1))], max_tokens=2, stops=False)
    model.positions = []
    batch.next()
    assert model.positions[0] <= 64, model.positions
