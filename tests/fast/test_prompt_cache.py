"""Tests for prompt_cache.PromptCache with real mlx-lm KV caches (no model needed)."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx
import pytest
from helpers import held, token_kv
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import ChunkedKVCache, KVCache, RotatingKVCache

from prompt_cache import CacheLookup, CacheStats, PromptCache, kv_nbytes, materialize

HEADS, HEAD_DIM = 1, 4  # the shape of token_kv's keys per token


def offsets(kv):
    return [c.offset for c in kv]


def token_bytes(n_layers: int = 2) -> int:
    """Bytes one token of ``token_kv`` holds: layers x (keys, values) x float32 values."""
    return n_layers * 2 * HEADS * HEAD_DIM * 4


def distinct_positions(pc) -> int:
    """Token positions the stored entries hold, each prefix shared by several counted
    once (per model): what a cache that stores shared prefixes once holds."""
    return len({(m, t[:i]) for m, t, _ in pc._snapshot() for i in range(1, len(t) + 1)})


def test_miss_then_exact_hit_trims_one_token():
    pc = PromptCache()
    toks = [5, 6, 7, 8]
    miss = pc.fetch("m", toks)
    assert miss == CacheLookup(kv=None, cached_tokens=0, rest=toks)

    pc.insert("m", toks, token_kv(toks))
    hit = pc.fetch("m", toks)
    assert hit.cached_tokens == 3 and hit.rest == [8]
    assert offsets(hit.kv) == [3, 3]
    assert held(hit.kv) == [5, 6, 7] and held(hit.kv, 1) == [5, 6, 7]


def test_shorter_prefix_is_copied_untrimmed():
    pc = PromptCache()
    pc.insert("m", [1, 2, 3], token_kv([1, 2, 3]))
    hit = pc.fetch("m", [1, 2, 3, 4, 5])
    assert (hit.cached_tokens, hit.rest, offsets(hit.kv)) == (3, [4, 5], [3, 3])
    assert held(hit.kv) == [1, 2, 3]


def test_longer_entry_is_trimmed_to_common_prefix():
    pc = PromptCache()
    pc.insert("m", [1, 2, 3, 4, 5], token_kv([1, 2, 3, 4, 5]))
    diverging = pc.fetch("m", [1, 2, 9])
    assert (diverging.cached_tokens, diverging.rest, offsets(diverging.kv)) == (
        2,
        [9],
        [2, 2],
    )
    assert held(diverging.kv) == [1, 2]
    # A prompt that is a prefix of the entry: rest must keep one token.
    prefix = pc.fetch("m", [1, 2, 3])
    assert (prefix.cached_tokens, prefix.rest, offsets(prefix.kv)) == (2, [3], [2, 2])


def test_longer_common_prefix_beats_shorter_prefix():
    pc = PromptCache()
    pc.insert("m", [1, 2, 3, 4, 5], token_kv([1, 2, 3, 4, 5]))
    pc.insert("m", [1, 2], token_kv([1, 2]))  # not dropped: it is the shorter one
    assert len(pc) == 2
    hit = pc.fetch("m", [1, 2, 3, 4, 9])
    assert (hit.cached_tokens, hit.rest, offsets(hit.kv)) == (4, [9], [4, 4])
    # When the shorter prefix reuses as much, the untrimmed copy wins.
    hit = pc.fetch("m", [1, 2, 7])
    assert hit.cached_tokens == 2 and held(hit.kv) == [1, 2]


def test_redundant_shorter_prefixes_are_dropped_on_insert():
    pc = PromptCache()
    pc.insert("m", [1, 2], token_kv([1, 2]))
    pc.insert("m", [1, 3], token_kv([1, 3]))
    pc.insert("m", [1, 2, 3], token_kv([1, 2, 3]))
    assert sorted(t for _, t, _ in pc._snapshot()) == [(1, 2, 3), (1, 3)]
    # The shared first token is held once: 4 positions, not 5.
    assert pc.nbytes == distinct_positions(pc) * token_bytes() == 4 * token_bytes()
    assert pc.stats().evictions == 0


def test_rotated_cache_is_never_trimmed():
    toks = list(range(1, 7))
    kv = token_kv(toks, cls=RotatingKVCache, max_size=4)
    assert not kv[0].is_trimmable()
    pc = PromptCache()
    pc.insert("m", toks, kv)
    # Exact, prefix-of-entry and diverging prompts would all need a trim: misses.
    for prompt in (toks, toks[:3], [1, 2, 99]):
        assert pc.fetch("m", prompt).kv is None
    # A longer prompt uses it as a shorter prefix, untouched.
    hit = pc.fetch("m", [*toks, 7])
    assert (hit.cached_tokens, hit.rest, offsets(hit.kv)) == (6, [7], [6, 6])
    # Redundant-prefix dropping only happens for trimmable caches.
    pc.insert("m", [*toks, 7, 8], token_kv([*toks, 7, 8], cls=RotatingKVCache, max_size=4))
    assert len(pc) == 2


def test_partially_trimmable_cache_is_not_reused():
    toks = list(range(1, 7))
    kv = token_kv(toks, cls=ChunkedKVCache, chunk_size=4)
    for c in kv:
        c.maybe_trim_front()  # keeps only the last 4 tokens: trims at most 4
    pc = PromptCache()
    pc.insert("m", toks, kv)
    assert pc.fetch("m", [1, 99]).kv is None  # would need 5: partial, refused
    hit = pc.fetch("m", [1, 2, 3, 99])  # needs 3: complete
    assert (hit.cached_tokens, offsets(hit.kv)) == (3, [3, 3])
    assert offsets(pc._snapshot()[0][2]) == [6, 6]


class _Untrimmable:
    """A hand-made layer reporting is_trimmable() False."""

    def __init__(self, n):
        self.offset = n
        self.nbytes = 8 * n

    def is_trimmable(self):
        return False

    def trim(self, n):  # pragma: no cover - must never be called
        raise AssertionError("trimmed an untrimmable cache")


def test_untrimmable_layer_in_mixed_cache():
    pc = PromptCache()
    kv = [*token_kv([1, 2, 3], n_layers=1), _Untrimmable(3)]
    pc.insert("m", [1, 2, 3], kv)
    assert pc.fetch("m", [1, 2, 3]).kv is None
    assert pc.fetch("m", [1, 2, 3, 4]).cached_tokens == 3


def test_one_token_prefix_matches_without_trimming():
    # mlx-lm's PromptTrie ignores one-token prefixes; an untrimmable entry has no
    # other path to a hit.
    pc = PromptCache()
    pc.insert("m", [9], [*token_kv([9], n_layers=1), _Untrimmable(1)])
    hit = pc.fetch("m", [9, 4])
    assert (hit.cached_tokens, hit.rest, hit.kv[0].offset) == (1, [4], 1)


def test_model_keys_are_isolated():
    pc = PromptCache()
    pc.insert("a", [1, 2, 3], token_kv([1, 2, 3]))
    pc.insert("b", [1, 2, 3, 4], token_kv([1, 2, 3, 4]))  # does not drop a's prefix
    assert len(pc) == 2
    assert pc.fetch("c", [1, 2, 3, 4]).kv is None
    assert pc.fetch("a", [1, 2, 3, 4]).cached_tokens == 3
    assert pc.fetch("b", [1, 2, 3, 4, 5]).cached_tokens == 4


def test_lru_eviction_by_count_and_fetch_refreshes_recency():
    pc = PromptCache(max_entries=2)
    pc.insert("m", [1, 1], token_kv([1, 1]))
    pc.insert("m", [2, 2], token_kv([2, 2]))
    assert pc.fetch("m", [1, 1, 5]).cached_tokens == 2  # [1, 1] now most recent
    pc.insert("m", [3, 3], token_kv([3, 3]))
    assert [t for _, t, _ in pc._snapshot()] == [(1, 1), (3, 3)]
    assert pc.stats().evictions == 1
    assert pc.fetch("m", [2, 2, 5]).kv is None


def test_byte_bound_evicts_oldest_and_oversize_is_not_stored():
    # An entry costs its tokens only: mlx-lm's 256-token growth tail is cut off.
    one = kv_nbytes(materialize(token_kv([1])))
    assert one == 2 * 2 * HEADS * 1 * HEAD_DIM * 4  # layers * (keys, values) * float32
    assert sum(c.nbytes for c in token_kv([1])) == 256 * one
    pc = PromptCache(max_entries=10, max_bytes=2 * one + one // 2)
    for t in (1, 2, 3):
        pc.insert("m", [t], token_kv([t]))
    assert [t for _, t, _ in pc._snapshot()] == [(2,), (3,)]
    assert pc.nbytes == 2 * one and pc.stats().evictions == 1

    big = token_kv([7], n_layers=6)  # 3 * one > max_bytes alone
    assert kv_nbytes(materialize(big)) > pc.stats().max_bytes
    pc.insert("m", [7], big)
    assert [t for _, t, _ in pc._snapshot()] == [(2,), (3,)]
    assert pc.nbytes == 2 * one and pc.stats().evictions == 1


def test_replacing_an_entry_fixes_bytes():
    pc = PromptCache()
    pc.insert("m", [1, 2], token_kv([1, 2], n_layers=3))
    pc.insert("m", [1, 2], token_kv([1, 2], n_layers=1))
    assert len(pc) == 1
    assert pc.nbytes == kv_nbytes(materialize(token_kv([1, 2], n_layers=1)))


def test_returned_copy_is_private():
    pc = PromptCache()
    pc.insert("m", [1, 2, 3, 4], token_kv([1, 2, 3, 4]))
    first = pc.fetch("m", [1, 2, 3, 4])
    k = mx.full((1, HEADS, 3, HEAD_DIM), -1.0)
    for c in first.kv:
        c.update_and_fetch(k, k)  # writes over positions 3..5 of the copy's buffer
    assert offsets(first.kv) == [6, 6]
    again = pc.fetch("m", [1, 2, 3, 4])
    assert offsets(again.kv) == [3, 3] and held(again.kv) == [1, 2, 3]
    stored = pc._snapshot()[0][2]
    assert offsets(stored) == [4, 4] and held(stored) == [1, 2, 3, 4]
    # Trimmed back, a copy is written in place (its buffer has room): still private.
    second = pc.fetch("m", [1, 2, 3, 4, 5])
    for c in second.kv:
        assert c.trim(2) == 2
        c.update_and_fetch(k[:, :, :2], k[:, :, :2])
    assert held(second.kv) == [1, 2, -1, -1]
    assert held(pc.fetch("m", [1, 2, 3, 4, 5]).kv) == [1, 2, 3, 4]


def test_counters_and_stats():
    pc = PromptCache(max_entries=3, max_bytes=None)
    pc.fetch("m", [1, 2])  # miss
    pc.insert("m", [1, 2, 3], token_kv([1, 2, 3]))
    pc.fetch("m", [1, 2, 3])  # hit, 2 tokens
    pc.fetch("m", [1, 2, 3, 4, 5])  # hit, 3 tokens
    pc.fetch("m", [4])  # miss
    s = pc.stats()
    assert s == CacheStats(
        hits=2,
        misses=2,
        tokens_reused=5,
        entries=1,
        nbytes=pc.nbytes,
        max_entries=3,
        max_bytes=None,
        evictions=0,
    )
    assert len(pc) == 1 and pc.nbytes > 0
    pc.clear()
    assert len(pc) == 0 and pc.nbytes == 0 and pc.stats().hits == 2
    assert pc.fetch("m", [1, 2, 3]).kv is None


def test_trim_to_evicts_lru_first():
    pc = PromptCache()
    for t in (1, 2, 3):
        pc.insert("m", [t], token_kv([t]))
    one = pc.nbytes // 3
    assert pc.trim_to(max_bytes=one) == 2
    assert [t for _, t, _ in pc._snapshot()] == [(3,)]
    assert pc.trim_to(max_entries=0) == 1 and len(pc) == 0
    assert pc.stats().evictions == 3 and pc.stats().max_entries == 10


def test_argument_errors_and_disabled_cache():
    with pytest.raises(ValueError):
        PromptCache(max_entries=0)
    with pytest.raises(ValueError):
        PromptCache(max_bytes=-1)
    pc = PromptCache(max_bytes=0)
    pc.insert("m", [1, 2], token_kv([1, 2]))
    assert len(pc) == 0 and pc.fetch("m", [1, 2, 3]).kv is None
    with pytest.raises(ValueError):
        pc.fetch("m", [])
    with pytest.raises(ValueError, match="holds 2 tokens"):
        pc.insert("m", [1, 2, 3], token_kv([1, 2]))
    with pytest.raises(ValueError):
        pc.insert("m", [1], [])
    PromptCache().insert("m", [], token_kv([]))  # nothing to reuse: ignored


def test_threads_keep_invariants():
    max_entries = 5
    pc = PromptCache(max_entries=max_entries, max_bytes=None)
    # Built on this thread; inserting one kv under several keys is safe because the
    # cache never mutates what it stores (only offsets matter here, not contents).
    shared = {n: token_kv([7] * n) for n in range(1, 7)}
    # Evaluated here: MLX evaluates lazy arrays only on the thread whose stream made them.
    mx.eval([c.state for kv in shared.values() for c in kv])

    def check_invariants() -> None:
        with pc._lock:  # re-entrant: an atomic view of the whole cache
            snap = pc._snapshot()
            assert len(snap) == len(pc) <= max_entries
            # Every stored position once, however many entries share it.
            assert pc.nbytes == distinct_positions(pc) * token_bytes()
            assert all(offsets(kv) == [len(t)] * 2 for _, t, kv in snap)

    def worker(seed: int) -> int:
        rng = random.Random(seed)
        fetches = 0
        for _ in range(150):
            toks = rng.choices([7, 8], k=rng.randint(1, 6))
            model = rng.choice("ab")
            op = rng.random()
            if op < 0.5:
                pc.insert(model, toks, shared[len(toks)])
            elif op < 0.95:
                fetches += 1
                hit = pc.fetch(model, toks)
                assert hit.rest == toks[hit.cached_tokens :]
                if hit.kv is not None:
                    assert offsets(hit.kv) == [hit.cached_tokens] * 2
            else:
                pc.trim_to(max_entries=2)
            check_invariants()
        return fetches

    with ThreadPoolExecutor(max_workers=8) as pool:
        fetches = sum(pool.map(worker, range(8)))  # re-raises worker failures
    check_invariants()
    s = pc.stats()
    assert s.hits + s.misses == fetches and s.hits > 0 and s.evictions > 0


class _FakeLayer:
    """A cheap layer, trimmable while under ``window`` tokens like RotatingKVCache."""

    def __init__(self, n: int, window: int):
        self.offset = n
        self.window = window
        self.nbytes = 8 * n

    def is_trimmable(self) -> bool:
        return self.offset < self.window

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        self.offset -= n
        return n


WINDOWS = {"full": 10**9, "rot": 5}  # per model, as a model fixes its cache type


def _prefix_len(a, b) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _reference(stored: dict, model: str, toks: tuple) -> int:
    """Longest usable common prefix over everything ever inserted, capped at len-1."""
    best = 0
    for (m, e), trimmable in stored.items():
        if m != model:
            continue
        if len(e) < len(toks) and toks[: len(e)] == e:
            best = max(best, len(e))
        elif trimmable:
            best = max(best, min(_prefix_len(e, toks), len(toks) - 1))
    return best


token_lists = st.lists(st.integers(0, 2), min_size=1, max_size=8).map(tuple)
ops = st.lists(
    st.tuples(st.booleans(), st.sampled_from(sorted(WINDOWS)), token_lists),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_matching_rule_against_reference(operations):
    pc = PromptCache(max_entries=1000)
    stored: dict = {}
    inserted = []
    for is_insert, model, toks in operations:
        if is_insert:
            kv = [_FakeLayer(len(toks), WINDOWS[model]) for _ in range(2)]
            pc.insert(model, toks, kv)
            stored[(model, toks)] = len(toks) < WINDOWS[model]
            inserted.append((kv, len(toks)))
        else:
            hit = pc.fetch(model, list(toks))
            expected = _reference(stored, model, toks)
            assert hit.cached_tokens == expected
            assert hit.rest == list(toks[expected:]) and hit.rest
            if expected:
                assert [c.offset for c in hit.kv] == [expected] * 2
            else:
                assert hit.kv is None
    # Nothing handed in was ever mutated.
    assert all(c.offset == n for kv, n in inserted for c in kv)


# --- materialize: exact, private, evaluated copies of every cache type ----------------

D = 64  # head dim: a multiple of the quantization group size


def _fill(layer, n, start=0, one_at_a_time=False):
    """Feed ``n`` tokens of distinct keys/values (token i -> i + start) into ``layer``."""
    col = mx.arange(start, start + n, dtype=mx.float32)
    k = mx.broadcast_to(col[None, None, :, None], (1, 2, n, D))
    if one_at_a_time:
        for i in range(n):
            layer.update_and_fetch(k[:, :, i : i + 1], -k[:, :, i : i + 1])
    else:
        layer.update_and_fetch(k, -k)
    return layer


def _arrays_cache(n):
    from mlx_lm.models.cache import ArraysCache

    c = ArraysCache(2)
    c[0] = mx.arange(n * 3, dtype=mx.float32).reshape(1, n, 3)
    c[1] = mx.ones((1, 4, 5))
    return c


def _cache_list(n):
    from mlx_lm.models.cache import CacheList

    return CacheList(_fill(KVCache(), n), _arrays_cache(n))


def _quantized(n):
    from mlx_lm.models.cache import QuantizedKVCache

    return _fill(QuantizedKVCache(group_size=64, bits=8), n)


LAYERS = {
    "kv": lambda: _fill(KVCache(), 5),
    "quantized": lambda: _quantized(5),
    "rotating": lambda: _fill(RotatingKVCache(max_size=8, keep=2), 5, one_at_a_time=True),
    "rotating-wrapped": lambda: _fill(RotatingKVCache(max_size=8, keep=2), 13, one_at_a_time=True),
    "chunked": lambda: _fill(ChunkedKVCache(chunk_size=16), 5),
    "arrays": lambda: _arrays_cache(5),
    "cache-list": lambda: _cache_list(5),
}


def _state_arrays(layer):
    from mlx.utils import tree_flatten

    return [x for _, x in tree_flatten(layer.state) if isinstance(x, mx.array)]


def _after_update(layer):
    """What the layer returns when two more tokens arrive (KV caches), else its state."""
    if hasattr(layer, "caches"):  # CacheList
        return [x for c in layer.caches for x in _after_update(c)]
    if hasattr(layer, "update_and_fetch"):
        k = mx.full((1, 2, 1, D), 99.0)
        for _ in range(2):
            out = layer.update_and_fetch(k, k)
        return list(out) if not isinstance(out[0], tuple) else [x for t in out for x in t]
    return _state_arrays(layer)


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_materialize_copies_each_cache_type_exactly(kind):
    import copy

    source = LAYERS[kind]()
    mx.eval(_state_arrays(source))
    before = [mx.array(x) for x in _state_arrays(source)]
    (copied,) = materialize([source])
    assert type(copied) is type(source) and copied is not source
    # Same tokens and bookkeeping; no array object shared with the source.
    assert getattr(copied, "offset", None) == getattr(source, "offset", None)
    # (Both lists held at once: `state` may make arrays, e.g. ArraysCache's empty padding on
    # mlx-lm main, and a freed temporary's id can come back.)
    copied_arrays, source_arrays = _state_arrays(copied), _state_arrays(source)
    assert not {id(x) for x in copied_arrays} & {id(x) for x in source_arrays}
    assert kv_nbytes([copied]) == sum(x.nbytes for x in _state_arrays(copied)) > 0
    # Later updates behave exactly as on the source, and leave the source alone.
    twin = copy.deepcopy(source)
    for got, want in zip(_after_update(copied), _after_update(twin), strict=True):
        assert mx.array_equal(got, want).item()
    for got, want in zip(_state_arrays(source), before, strict=True):
        assert mx.array_equal(got, want).item()


def test_materialize_cuts_buffers_to_the_tokens_held():
    kv, quant, rot, chunk = (LAYERS[k]() for k in ("kv", "quantized", "rotating", "chunked"))
    assert kv.keys.shape[2] == quant.keys[0].shape[2] == 256  # mlx-lm's growth step
    copies = materialize([kv, quant, rot, chunk])
    assert [c.keys.shape[2] for c in (copies[0], copies[2], copies[3])] == [5, 5, 5]
    assert [x.shape[2] for x in copies[1].keys] == [5, 5, 5]
    assert kv_nbytes(copies[:1]) == 2 * 2 * 5 * D * 4  # (keys, values) * heads * tokens
    wrapped = LAYERS["rotating-wrapped"]()
    (copied,) = materialize([wrapped])  # circular layout: the whole window is kept
    assert copied.keys.shape == wrapped.keys.shape and copied._idx == wrapped._idx


def _active() -> int:
    import gc

    gc.collect()
    mx.clear_cache()
    return mx.get_active_memory()


def test_entry_cut_from_a_batch_frees_the_batch_buffer():
    from mlx_lm.models.cache import BatchKVCache

    base = _active()
    batch = BatchKVCache.merge([_fill(KVCache(), n, start=n) for n in (3, 200, 300)])
    mx.eval(batch.keys, batch.values)
    view = batch.extract(0)  # what BatchGenerator hands back: a lazy slice of the batch
    del batch
    assert view.nbytes == 2 * 2 * 3 * D * 4
    assert _active() - base >= 2 * 3 * 2 * 300 * D * 4  # the view keeps the whole batch
    pc = PromptCache()
    pc.insert("m", [1, 2, 3], [view])
    del view
    held = _active() - base
    assert pc.nbytes == 2 * 2 * 3 * D * 4
    assert pc.nbytes <= held <= pc.nbytes + 64  # allocator rounding: 16 bytes per buffer
    assert held_keys(pc) == [3, 4, 5]
    pc.clear()
    assert _active() == base


def held_keys(pc):
    (_, _, kv) = pc._snapshot()[0]
    return [int(x) for x in kv[0].keys[0, 0, :, 0].tolist()]


def _session_kv(n: int, n_layers: int = 2) -> list:
    """Evaluated plain KV of ``n`` tokens (head dim 32), in mlx-lm's 256-token buffers."""
    kv = []
    for _ in range(n_layers):
        layer = KVCache()
        x = mx.random.normal((1, 1, n, 32))
        layer.update_and_fetch(x, x + 1)
        kv.append(layer)
    mx.eval([c.state for c in kv])
    return kv


def test_shared_segments_hold_what_mlx_holds_and_eviction_frees_a_leaf():
    # Two sessions on one 200-token system prompt (tests/model/test_prompt_trie.py has
    # them prefilled by a model): the prefix is held once, cut out of session A's entry
    # when B arrives; MLX holds what the cache counts, and evicting A's own tokens frees
    # them while the prefix stays for B.
    system = list(range(1000, 1200))
    a, b = [*system, *range(2000, 2050)], [*system, *range(3000, 3080)]
    per_token = 2 * 2 * 32 * 4  # layers x (keys, values) x head dim x float32
    _session_kv(8)  # warm-up
    base = _active()
    kv_a, kv_b = _session_kv(len(a)), _session_kv(len(b))
    pc = PromptCache(max_entries=None)
    pc.insert("m", a, kv_a)
    pc.insert("m", b, kv_b)
    del kv_a, kv_b
    assert pc.nbytes == (200 + 50 + 80) * per_token
    buffers = 3 * 2 * 2  # segments x layers x (keys, values)
    assert pc.nbytes <= _active() - base <= pc.nbytes + 16 * buffers
    assert pc.fetch("m", [*b, 1]).cached_tokens == len(b)  # B the most recently used
    held_before = _active()
    assert pc.trim_to(max_entries=1) == 1
    assert pc.nbytes == (200 + 80) * per_token
    assert 50 * per_token <= held_before - _active() <= 50 * per_token + 16 * 4
    assert [t for _, t, _ in pc._snapshot()] == [tuple(b)]
    assert pc.fetch("m", [*a, 1]).cached_tokens == 200
    pc.clear()
    assert _active() == base


trie_ops = st.lists(
    st.tuples(st.booleans(), st.sampled_from("ab"), token_lists),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(trie_ops)
def test_shared_segments_against_reference(operations):
    # Plain KV (cut-able layers): every stored position is reusable, and the fetched KV
    # holds exactly the prompt's leading tokens (token_kv writes each token's id into its
    # keys), however the segments were cut; every position is held once per model.
    pc = PromptCache(max_entries=None)
    stored: dict = {}
    for is_insert, model, toks in operations:
        if is_insert:
            pc.insert(model, toks, token_kv(list(toks)))
            stored[(model, toks)] = True
        else:
            hit = pc.fetch(model, list(toks))
            expected = max(
                (min(_prefix_len(e, toks), len(toks) - 1) for m, e in stored if m == model),
                default=0,
            )
            assert hit.cached_tokens == expected and hit.rest == list(toks[expected:])
            if expected:
                assert offsets(hit.kv) == [expected] * 2
                assert held(hit.kv) == list(toks[:expected]) == held(hit.kv, 1)
            else:
                assert hit.kv is None
    positions = {(m, e[:i]) for m, e in stored for i in range(1, len(e) + 1)}
    assert pc.nbytes == len(positions) * token_bytes() == distinct_positions(pc) * token_bytes()
    for _, toks, kv in pc._snapshot():
        assert held(kv) == list(toks)


def test_a_stored_shared_prefix_serves_as_a_checkpoint_until_a_longer_entry_extends_it():
    # engine/sharing.py stores the prefix a burst shares (checkpoint=True) while the
    # leader's row goes on; the waiting requests start from it (a "checkpoint" hit), and
    # the leader's whole entry later takes its place as an entry.
    pc = PromptCache(max_entries=None)
    shared = [1, 2, 3, 4]
    pc.insert("m", shared, token_kv(shared), checkpoint=True)
    s = pc.stats()
    assert (s.entries, s.checkpoints, s.checkpoint_bytes) == (1, 1, 4 * token_bytes())
    hit = pc.fetch("m", [*shared, 7, 8])
    assert (hit.kind, hit.cached_tokens, held(hit.kv)) == ("checkpoint", 4, shared)
    pc.insert("m", [*shared, 5, 6], token_kv([*shared, 5, 6]))
    s = pc.stats()
    assert (s.entries, s.checkpoints, s.hits_checkpoint) == (1, 0, 1)
    assert pc.nbytes == 6 * token_bytes()
    assert pc.fetch("m", [*shared, 7]).kind == "trimmed"


def _trie_bytes(pc) -> int:
    """Bytes of every segment reachable from the tries' roots, each counted once."""
    total = 0
    for trie in pc._segments.tries.values():
        todo = list(trie.root.children.values())
        while todo:
            node = todo.pop()
            total += node.nbytes
            todo.extend(node.children.values())
    return total


bounded_ops = st.lists(
    st.tuples(st.booleans(), st.booleans(), token_lists),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(bounded_ops, st.integers(1, 4), st.integers(0, 12))
def test_bounded_segments_keep_their_bytes_and_fetched_kv_stays_private(
    operations, max_entries, max_tokens
):
    # Under both bounds, after every insert: the counted bytes are what the tries hold,
    # within the byte bound, entries within the entry bound; a fetched KV written over in
    # place (a trim then an update into its buffer, as a row that diverges does) leaves
    # every stored entry holding its own tokens.
    pc = PromptCache(max_entries=max_entries, max_bytes=max_tokens * token_bytes())
    junk = mx.full((1, HEADS, 8, HEAD_DIM), -10.0)
    for is_insert, mutate, toks in operations:
        if is_insert:
            pc.insert("m", toks, token_kv(list(toks)))
            assert pc.nbytes == _trie_bytes(pc) <= max_tokens * token_bytes()
            assert len(pc) <= max_entries
        else:
            hit = pc.fetch("m", list(toks))
            if hit.kv is not None and mutate:
                for c in hit.kv:
                    c.trim(min(c.offset, 2))
                    c.update_and_fetch(junk[:, :, :1], junk[:, :, :1])
                mx.eval([c.state for c in hit.kv])
        for _, stored, kv in pc._snapshot():
            assert held(kv) == list(stored) == held(kv, 1)
