"""Prefill checkpoints in the prompt cache's bookkeeping without a model: a trimmable
prefix entry is still dropped for the longer entry (tests/model/test_checkpoints.py has
the cache families)."""

from __future__ import annotations

from helpers import token_kv

from prompt_cache import PromptCache


def test_trimmable_prefixes_are_still_dropped() -> None:
    cache = PromptCache(max_entries=10)
    cache.insert("m", [1, 2], token_kv([1, 2], n_layers=1), checkpoint=True)
    cache.insert("m", [1, 2, 3, 4], token_kv([1, 2, 3, 4], n_layers=1))
    assert [t for _, t, _ in cache._snapshot()] == [(1, 2, 3, 4)]
    assert cache.stats().checkpoints == 0
