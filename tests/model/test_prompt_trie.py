"""The prompt cache's shared prefixes on real mlx-lm caches of a tiny model (issue 38).

Agents' sessions on one system prompt: each session's entry extends a prefix that is
stored once (`prompt_cache._Trie`). Prefilled by tiny random-weight models
(tests/tiny_models.py: llama's plain and quantized KV, gemma3_text's rotating window),
inserted and fetched as the scheduler does; bytes checked against MLX's own counter,
fetched KV against what was stored and against a cold prefill.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
import tiny_models
from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache, make_prompt_cache

from loading.model_loader import load_model
from prompt_cache import PromptCache, kv_nbytes, materialize

SYSTEM = list(range(1000, 1200))  # a 200-token system prompt and tool list
A = [*SYSTEM, *range(2000, 2050)]  # session A: 50 tokens of its own
B = [*SYSTEM, *range(3000, 3080)]  # session B: 80 tokens of its own


@pytest.fixture(scope="module")
def llama(model_root):
    model, _ = load_model(str(tiny_models.build("llama", model_root)))
    return model


def prefill(model, ids, cache=None):
    """(the cache after prefilling ``ids`` into ``cache`` (a fresh one: None), the last
    position's logits)."""
    cache = make_prompt_cache(model) if cache is None else cache
    logits = model(mx.array([ids]), cache=cache)[0, -1]
    mx.eval(logits, [c.state for c in cache])
    return cache, logits


def quantized(model):
    return [QuantizedKVCache(group_size=32, bits=8) for _ in model.layers]


def arrays(layer):
    """A KV layer's key and value arrays (a quantized one's data, scales and biases)."""
    keys = layer.keys if isinstance(layer.keys, tuple) else (layer.keys,)
    values = layer.values if isinstance(layer.values, tuple) else (layer.values,)
    return [*keys, *values]


def held(layer, start, stop):
    return [x[..., start:stop, :] for x in arrays(layer)]


def same(xs, ys) -> bool:
    return all(mx.array_equal(x, y).item() for x, y in zip(xs, ys, strict=True))


def test_two_sessions_hold_their_shared_system_prompt_once(llama):
    kv_a, kv_b = prefill(llama, A)[0], prefill(llama, B)[0]
    per_token = kv_nbytes(materialize(kv_a)) // len(A)
    pc = PromptCache(max_entries=None)
    pc.insert("m", A, kv_a)
    pc.insert("m", B, kv_b)
    del kv_a, kv_b
    assert len(pc) == 2
    # 200 + 50 + 80 positions, not 250 + 280: the system prompt is held once.
    assert pc.nbytes == per_token * (len(SYSTEM) + 50 + 80)
    assert [len(t) for _, t, _ in pc._snapshot()] == [len(A), len(B)]
    # (That MLX holds what is counted: tests/fast/test_prompt_cache.py.)


def test_a_fetch_is_the_stored_kv_and_continues_as_a_cold_prefill(llama):
    kv_a, kv_b = prefill(llama, A)[0], prefill(llama, B)[0]
    stored_a, stored_b = materialize(kv_a), materialize(kv_b)
    pc = PromptCache(max_entries=None)
    pc.insert("m", A, kv_a)
    pc.insert("m", B, kv_b)
    prompt = [*B, 7, 8, 9]
    hit = pc.fetch("m", prompt)
    assert (hit.kind, hit.cached_tokens, hit.rest) == ("shorter", len(B), [7, 8, 9])
    fresh = prefill(llama, B)[0]
    for got, a, b, want in zip(hit.kv, stored_a, stored_b, fresh, strict=True):
        assert type(got) is KVCache and got.offset == len(B) == got.keys.shape[2]
        # Exactly what was stored: the system prompt's KV from A (stored first), B's own.
        assert same(held(got, 0, len(SYSTEM)), held(a, 0, len(SYSTEM)))
        assert same(held(got, len(SYSTEM), len(B)), held(b, len(SYSTEM), len(B)))
        # And what a fresh prefill of B computes.
        for x, y in zip(arrays(got), held(want, 0, len(B)), strict=True):
            assert mx.allclose(x, y, atol=1e-5).item()
    fetched = [[mx.array(x) for x in arrays(layer)] for layer in hit.kv]
    warm = prefill(llama, hit.rest, cache=hit.kv)[1]
    cold = prefill(llama, prompt)[1]
    assert mx.allclose(warm, cold, atol=1e-4).item()
    assert mx.argmax(warm).item() == mx.argmax(cold).item()
    # A new session on the same system prompt reuses all of it (a trimmed hit).
    new = pc.fetch("m", [*SYSTEM, 4000, 4001])
    assert (new.kind, new.cached_tokens, new.kv[0].offset) == ("trimmed", len(SYSTEM), 200)
    # Writing into fetched copies (above, and here) leaves what is stored alone.
    prefill(llama, [5] * 3, cache=new.kv)
    again = pc.fetch("m", prompt)
    assert all(same(arrays(x), y) for x, y in zip(again.kv, fetched, strict=True))


def test_evicting_one_session_keeps_the_prefix_the_other_extends(llama):
    kv_a, kv_b = prefill(llama, A)[0], prefill(llama, B)[0]
    per_token = kv_nbytes(materialize(kv_a)) // len(A)
    pc = PromptCache(max_entries=None)
    pc.insert("m", A, kv_a)
    pc.insert("m", B, kv_b)
    del kv_a, kv_b
    assert pc.fetch("m", [*B, 1]).cached_tokens == len(B)  # B the most recently used
    before = pc.nbytes
    assert pc.trim_to(max_entries=1) == 1
    # A's own 50 tokens went; the system prompt stays for B.
    assert pc.nbytes == before - 50 * per_token
    assert [t for _, t, _ in pc._snapshot()] == [tuple(B)]
    back = pc.fetch("m", [*A, 1])
    assert (back.cached_tokens, back.rest) == (len(SYSTEM), [*A[len(SYSTEM) :], 1])
    # B's own tokens going too leaves the system prompt, now an entry of its own.
    assert pc.trim_to(max_bytes=len(SYSTEM) * per_token) == 1
    assert [t for _, t, _ in pc._snapshot()] == [tuple(SYSTEM)]
    assert pc.nbytes == len(SYSTEM) * per_token and pc.stats().evictions == 2
    assert pc.fetch("m", [*SYSTEM, 1]).kind == "shorter"


def test_quantized_layers_share_prefixes_but_not_with_plain_ones(llama):
    qa, qb = prefill(llama, A, quantized(llama))[0], prefill(llama, B, quantized(llama))[0]
    stored_a = materialize(qa)
    per_token = kv_nbytes(stored_a) // len(A)
    pc = PromptCache(max_entries=None)
    pc.insert("m", A, qa)
    pc.insert("m", B, qb)
    assert pc.nbytes == per_token * (len(SYSTEM) + 50 + 80)
    prompt = [*B, 7, 8]
    hit = pc.fetch("m", prompt)
    assert hit.cached_tokens == len(B)
    for got, a in zip(hit.kv, stored_a, strict=True):
        assert type(got) is QuantizedKVCache and (got.bits, got.group_size) == (8, 32)
        assert got.offset == len(B) and same(held(got, 0, 200), held(a, 0, 200))
    warm = prefill(llama, hit.rest, cache=hit.kv)[1]
    cold = prefill(llama, prompt, quantized(llama))[1]
    assert mx.allclose(warm, cold, atol=1e-4).item()
    # Plain KV of A is another layout: stored apart, never mixed with quantized segments;
    # it replaces the quantized entry of the same tokens (whose own 50 tokens go).
    plain = prefill(llama, A)[0]
    plain_bytes = kv_nbytes(materialize(plain))
    before = pc.nbytes
    pc.insert("m", A, plain)
    assert len(pc) == 2 and pc.nbytes == before - 50 * per_token + plain_bytes
    again = pc.fetch("m", [*A, 1])
    assert again.cached_tokens == len(A) and all(type(c) is KVCache for c in again.kv)


def test_rotating_layers_are_kept_whole_and_only_extended(model_root):
    model, _ = load_model(str(tiny_models.build("gemma3_text", model_root)))
    kv_a, kv_b = prefill(model, A)[0], prefill(model, B)[0]
    assert any(type(c) is RotatingKVCache for c in kv_a)  # a 32-token window, wrapped
    sizes = kv_nbytes(materialize(kv_a)) + kv_nbytes(materialize(kv_b))
    pc = PromptCache(max_entries=None)
    pc.insert("m", A, kv_a)
    pc.insert("m", B, kv_b)
    assert len(pc) == 2 and pc.nbytes == sizes  # nothing shared: no cut past the window
    # A prompt parting inside the window cannot trim it back: nothing reused.
    assert pc.fetch("m", [*SYSTEM, 4000, 4001]).kv is None
    prompt = [*A, 7, 8]
    hit = pc.fetch("m", prompt)
    assert (hit.kind, hit.cached_tokens) == ("shorter", len(A))
    warm = prefill(model, hit.rest, cache=hit.kv)[1]
    cold = prefill(model, prompt)[1]
    assert mx.allclose(warm, cold, atol=1e-4).item()
