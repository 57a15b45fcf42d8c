"""decoding.batch_speculation without a model: the per-row KV holes (masking, extract,
filter, extend, compaction), the step cost model's choice of draft width, and the
drafting gate's rules. Against real models: tests/model/test_ngram.py."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache, KVCache

from batch.speculation import StepCosts
from decoding.ngram_spec import FIRST_BACKOFF, START_WIDTH, DraftGate
from seam.holes import HoleyBatchKVCache

H, D = 2, 4


def entries(n: int, start: int) -> mx.array:
    """(1, H, n, D) keys whose every element encodes its row position (start + i)."""
    pos = mx.arange(start, start + n, dtype=mx.float32)
    return mx.broadcast_to(pos[None, None, :, None], (1, H, n, D))


def batch_of(lengths: list[int]) -> HoleyBatchKVCache:
    """A holey batch cache merged from per-row caches whose entries are 0..len-1."""
    rows = []
    for n in lengths:
        c = KVCache()
        c.update_and_fetch(entries(n, 0), entries(n, 0))
        rows.append(c)
    return HoleyBatchKVCache.adopt(BatchKVCache.merge(rows))


def feed(cache: HoleyBatchKVCache, starts: list[int], n: int) -> None:
    """Write n entries per row, row b's numbered from starts[b]."""
    k = mx.concatenate([entries(n, s) for s in starts], axis=0)
    cache.update_and_fetch(k, k)


def live_positions(cache: HoleyBatchKVCache, row: int) -> list[int]:
    kv = cache.extract(row)
    return kv.keys[0, 0, :, 0].astype(mx.int32).tolist()


def test_rejected_entries_are_masked_and_left_out_of_extract():
    cache = batch_of([3, 5])
    feed(cache, [3, 5], 4)  # a verify pass: 4 entries per row
    cache.reject([3, 1])  # row 0 kept 1 of them, row 1 kept 3
    assert cache.offset.tolist() == [4, 8]  # logical lengths (RoPE positions)
    assert live_positions(cache, 0) == [0, 1, 2, 3]
    assert live_positions(cache, 1) == list(range(8))
    mask = cache.make_mask(1)  # a one-token step: (B, 1, 1, columns + 1)
    alive = mask[:, 0, 0].tolist()
    assert sum(alive[0]) == 4 + 1 and sum(alive[1]) == 8 + 1
    # The next token of row 0 goes after its live entries, numbered on from them.
    feed(cache, [4, 8], 1)
    assert live_positions(cache, 0) == [0, 1, 2, 3, 4]
    assert live_positions(cache, 1) == list(range(9))


def test_equal_rejections_just_trim():
    cache = batch_of([2, 2])
    feed(cache, [2, 2], 3)
    cache.reject([2, 2])
    assert cache.dead is None and cache.size() == 3


def test_filter_extend_and_compact_keep_each_rows_entries():
    cache = batch_of([2, 6])
    feed(cache, [2, 6], 3)
    cache.reject([2, 0])  # row 0: holes
    other = batch_of([4])
    cache.extend(other)  # a row joins a batch with holes
    assert [live_positions(cache, b) for b in range(3)] == [
        [0, 1, 2],
        list(range(9)),
        [0, 1, 2, 3],
    ]
    cache.filter([0, 2])  # the long row leaves
    assert [live_positions(cache, b) for b in range(2)] == [[0, 1, 2], [0, 1, 2, 3]]
    cache.compact()
    assert cache.dead is None
    assert [live_positions(cache, b) for b in range(2)] == [[0, 1, 2], [0, 1, 2, 3]]
    assert cache.offset.tolist() == [3, 4]


def test_cost_model_chooses_the_width_that_pays():
    costs = StepCosts()
    assert costs.width(4, [8, 3, 0, 0], [1.0] * 4) == 0  # no plain step measured yet
    costs.observe_plain(4, 0.100)
    # Prior: a verify pass of k drafts costs 1 + 0.2k plain steps. Rows 0-1 keep all:
    # k=3: (4 + 6) / 0.16 = 62.5 tok/s; k=8: (4 + 11) / 0.26 = 57.7; plain: 40.
    assert costs.width(4, [8, 3, 0, 0], [1.0, 1.0, 0, 0]) == 3
    costs.observe_verify(4, 9, 0.15)  # measured: k=8 is cheaper than assumed
    assert costs.width(4, [8, 3, 0, 0], [1.0, 1.0, 0, 0]) == 8
    # Drafts that are rarely kept do not pay: plain steps, but an unmeasured width is
    # tried once every EXPLORE_EVERY declines.
    choices = [costs.width(4, [3, 0, 0, 0], [0.05, 0, 0, 0]) for _ in range(64)]
    assert choices.count(0) == 62 and choices.count(3) == 2
    assert StepCosts(timed=False).width(4, [2, 5, 0, 0], [0.0] * 4) == 5  # ranks agree


def test_cost_model_survives_a_zero_measurement():
    # A verify pass right after a plain step is timed minus that step's own estimate,
    # which a noisy host can make 0 or less: the choice must still be made.
    costs = StepCosts()
    costs.observe_plain(2, 0.05)
    costs.observe_verify(2, 4, 0.0)
    costs.observe_verify(2, 4, -0.01)
    assert costs.width(2, [3, 3], [0.9, 0.9]) == 3


def test_gate_backs_off_after_misses_and_widens_after_hits():
    tokens = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    gate = DraftGate(8, 3, tokens)
    # The pending token is unknown: the lookup predicts it (3) and drafts what follows.
    draft = gate.propose(tokens, left=100)
    assert draft == [4, 1, 2] and START_WIDTH == 3
    gate.observe(len(draft), len(draft))  # all kept: the next draft may be twice as wide
    assert len(gate.propose(tokens, left=100)) == 2 * START_WIDTH
    assert len(gate.propose(tokens, left=4)) == 3  # at most left - 1
    gate.observe(3, 0)  # nothing kept: drafting pauses
    assert [gate.propose(tokens, left=100) for _ in range(FIRST_BACKOFF)] == [[]] * FIRST_BACKOFF
    assert gate.propose(tokens, left=100) != []
    assert 0 < gate.rate < 1
    assert (gate.stats.drafted, gate.stats.accepted, gate.stats.verify_steps) == (6, 3, 2)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (dict(width=-1), "num_draft_tokens"),
        (dict(ngram_min=0), "ngram_min"),
        (dict(ngram_max=1, ngram_min=2), "ngram_size"),
    ],
)
def test_bad_options_name_the_option(options, field):
    args = dict(width=3, ngram_max=3, tokens=[1, 2]) | options
    with pytest.raises(ValueError, match=field):
        DraftGate(**args)
