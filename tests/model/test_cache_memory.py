"""The prompt cache's byte count is what MLX holds, with the embedded model and a real
mlx-lm BatchGenerator (issue 12: entries cut from a batch kept the whole batch buffer).

Memory is read with ``mx.get_active_memory()`` after ``gc.collect()`` and
``mx.clear_cache()``, against a baseline taken after a small warm-up round (the weights,
and anything MLX might allocate once on first use, are not counted). Status' breakdown of
a backend process: tests/process/test_cache_memory.py.
"""

from __future__ import annotations

import gc

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from prompt_cache import PromptCache, kv_nbytes, materialize

MODEL_KEY = "smol"


def active() -> int:
    """Bytes MLX holds in arrays now (its buffer cache emptied first)."""
    gc.collect()
    mx.clear_cache()
    return mx.get_active_memory()


PAGE = 4096


def tolerance(nbytes: int, n_arrays: int) -> int:
    """How far MLX's count may exceed the cache's: the allocator rounds each buffer up
    (16 bytes each measured on CPU; GPU allocators round to pages, hence the wider
    bound there), and may hand a new buffer one from its cache of freed buffers up to 2
    pages larger than asked (``BufferCache::reuse_from_cache``,
    mlx/backend/common/buffer_cache.h). ``n_arrays``: the stored buffers (`n_arrays`).
    The cache never counts more than MLX holds."""
    if mx.default_device() == mx.cpu:
        return nbytes // 100 + (64 + 2 * PAGE) * n_arrays
    return nbytes // 10 + 2**20


def prompts(tok, n: int) -> list[list[int]]:
    """``n`` chat-free prompts of different lengths (10 to ~40 tokens)."""
    return [
        tok.encode(f"Write a short note about the number {i}." + " Please be brief." * (i % 4))
        for i in range(n)
    ]


def generate(model, tok, batch, max_tokens, caches=None, history=None, cancel=()):
    """Greedy decoding of ``batch`` with one BatchGenerator.

    Returns ``{index: (generated ids, kv, all_tokens)}``: ``kv`` is the response's
    ``prompt_cache`` for a finished sequence, or, for an index in ``cancel``, what
    ``remove(..., return_prompt_caches=True)`` returned after its third token (the two
    ways the engine gets a KV to store).
    """
    gen = BatchGenerator(
        model,
        stop_tokens=[[t] for t in sorted(tok.eos_token_ids)],
        completion_batch_size=len(batch),
        prefill_batch_size=len(batch),
    )
    try:
        uids = gen.insert(batch, max_tokens=max_tokens, caches=caches, all_tokens=history)
        index = {u: i for i, u in enumerate(uids)}
        out: dict[int, list[int]] = {i: [] for i in range(len(batch))}
        done: dict[int, tuple] = {}
        while len(done) < len(batch):
            _, responses = gen.next()
            for r in responses:
                i = index[r.uid]
                if i in done:
                    continue
                out[i].append(r.token)
                if r.finish_reason:
                    done[i] = (out[i], r.prompt_cache, r.all_tokens)
                elif i in cancel and len(out[i]) == 3:
                    kv, toks = gen.remove([r.uid], return_prompt_caches=True)[r.uid]
                    done[i] = (out[i], kv, toks)
    finally:
        gen.close()
    return done


def n_arrays(pc: PromptCache) -> int:
    """At most how many buffers ``pc`` holds: keys and values per layer of each segment,
    and a trie of E entries has at most 2E - 1 segments (``prompt_cache._Trie``)."""
    return 2 * sum(len(c.state[:2]) for _, _, kv in pc._snapshot() for c in kv)


def test_cached_entries_hold_what_the_cache_counts_and_eviction_frees_it(smol):
    model, tok = smol
    batch = prompts(tok, 8)
    limits = [4 + 2 * i for i in range(8)]
    generate(model, tok, batch[:2], [2, 2])  # warm-up
    base = active()

    # What BatchGenerator hands back are lazy slices of batch buffers: stored as they
    # are, MLX held 424 MB here for 11 MB counted.
    done = generate(model, tok, batch, limits, cancel={1, 4})
    pc = PromptCache(max_entries=100)
    for _, kv, toks in done.values():
        pc.insert(MODEL_KEY, toks, kv)
    del done, kv
    assert len(pc) == 8
    held = active() - base
    assert pc.nbytes <= held <= pc.nbytes + tolerance(pc.nbytes, n_arrays(pc))

    # Evicting one entry frees what it counted: its own segment (the prompts share their
    # first tokens, held once).
    before, counted = active(), pc.nbytes
    assert pc.trim_to(max_entries=7) == 1
    freed = before - active()
    segment = 2 * len(model.layers)  # its buffers: keys and values per layer
    assert counted - pc.nbytes <= freed <= counted - pc.nbytes + tolerance(0, segment)

    pc.trim_to(max_entries=0)
    assert len(pc) == 0 and pc.nbytes == 0
    assert active() == base


def test_byte_bound_holds_against_mlx_counter(smol):
    model, tok = smol
    batch = prompts(tok, 8)
    limits = [6] * 8
    generate(model, tok, batch[:2], [2, 2])  # warm-up
    base = active()

    done = generate(model, tok, batch, limits)
    one = max(kv_nbytes(materialize(kv)) for _, kv, _ in done.values())
    max_bytes = 3 * one
    pc = PromptCache(max_entries=100, max_bytes=max_bytes)
    for i in range(8):
        _, kv, toks = done.pop(i)
        pc.insert(MODEL_KEY, toks, kv)
        del kv
        assert pc.nbytes <= max_bytes
    del done
    # 8 entries of up to a third of the bound each: some went (fewer than without the
    # shared first tokens held once).
    assert pc.stats().evictions >= 1 and len(pc) < 8
    held = active() - base
    assert pc.nbytes <= held <= pc.nbytes + tolerance(pc.nbytes, n_arrays(pc))
    assert held <= max_bytes + tolerance(max_bytes, n_arrays(pc))
    pc.clear()
    assert active() == base


def test_reused_entries_give_the_same_greedy_output_as_cold_runs(smol):
    model, tok = smol
    batch = prompts(tok, 4)
    done = generate(model, tok, batch, [5] * 4)
    pc = PromptCache(max_entries=100)
    for _, kv, toks in done.values():
        pc.insert(MODEL_KEY, toks, kv)
    del done

    # Each follow-up extends a stored conversation (a shorter-prefix hit); the last one
    # repeats a stored sequence exactly (a hit trimmed by one token).
    stored = [toks for _, toks, _ in pc._snapshot()]
    follow_ups = [[*list(t), *tok.encode(" And then?")] for t in stored[:3]] + [list(stored[3])]
    lookups = [pc.fetch(MODEL_KEY, p) for p in follow_ups]
    assert [lk.cached_tokens for lk in lookups] == [len(t) for t in stored[:3]] + [
        len(stored[3]) - 1
    ]
    warm = generate(
        model,
        tok,
        [lk.rest for lk in lookups],
        [8] * 4,
        caches=[lk.kv for lk in lookups],
        history=[p[: lk.cached_tokens] for p, lk in zip(follow_ups, lookups, strict=True)],
    )
    cold = generate(model, tok, follow_ups, [8] * 4)
    for i in range(4):
        assert warm[i][0] == cold[i][0], f"follow-up {i} differs with a reused cache"
        assert len(cold[i][0]) > 0
