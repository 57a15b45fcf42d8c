"""MLX's buffer cache inside the memory budget (`engine.memory`): its limit follows the
budget, admission leaves room for it, and the engine gives it back once idle."""

from __future__ import annotations

import time

import mlx.core as mx
import pytest

import errors
from engine import memory
from engine.memory import MIB, IdleRelease, MemoryBudget, MemoryProfile, cache_limit


def test_the_cache_limit_is_a_share_of_the_budget_within_bounds() -> None:
    assert cache_limit(2048 * MIB) == 64 * MIB
    assert cache_limit(512 * MIB) == 32 * MIB  # at least MLX's own CPU default
    assert cache_limit(64 * 1024 * MIB) == 1024 * MIB  # at most 1 GiB


def test_admission_leaves_room_for_the_cache() -> None:
    prof = MemoryProfile(kv_per_token=1024, fixed=0, prefill_per_token=1024)
    plain = MemoryBudget(2048 * MIB, 500 * MIB, prof, 512)
    held = MemoryBudget(2048 * MIB, 500 * MIB, prof, 512, cache=64 * MIB)
    assert plain.room(100 * MIB, 10 * MIB) - held.room(100 * MIB, 10 * MIB) == 64 * MIB
    assert held.status()["memory_cache_limit"] == 64 * MIB
    assert held.status()["memory_free"] == (2048 - 500 - 64) * MIB
    with pytest.raises(errors.ModelLoadError, match="buffer cache"):
        MemoryBudget(540 * MIB, 500 * MIB, prof, 512, cache=40 * MIB)
    assert MemoryBudget(0, 500 * MIB, prof, 512, cache=64 * MIB).cache_limit == 0  # off


def _fill_cache() -> int:
    """Arrays computed and dropped: MLX keeps their buffers; the bytes it keeps."""
    x = mx.ones((256, 1024)) + 1
    mx.eval(x)
    del x
    return mx.get_cache_memory()


def test_the_cache_goes_back_once_idle_long_enough(monkeypatch) -> None:
    monkeypatch.setattr(memory, "IDLE_RELEASE_S", 0.05)
    old = mx.set_cache_limit(64 * MIB)
    try:
        released: list[int] = []
        idle = IdleRelease(lambda: released.append(mx.get_cache_memory()))
        assert _fill_cache() > 0
        assert idle.wait(busy=False, timeout=None) is None  # nothing ran: block freely
        idle.tick(busy=True)
        assert idle.wait(busy=True, timeout=None) is None
        assert not idle.tick(busy=False)  # the step the last request ended in: kept
        assert 0 < idle.wait(busy=False, timeout=None) <= 0.05
        assert idle.wait(busy=False, timeout=0.01) == 0.01  # a heartbeat comes first
        assert mx.get_cache_memory() > 0
        time.sleep(0.06)
        assert idle.wait(busy=False, timeout=None) == 0.0
        assert idle.tick(busy=False)
        assert mx.get_cache_memory() == 0 and released == [0]
        assert not idle.tick(busy=False)  # once
        # Work outside requests (a Score call) leaves buffers: released after it too.
        assert _fill_cache() > 0
        assert not idle.tick(busy=False)
        time.sleep(0.06)
        assert idle.tick(busy=False) and mx.get_cache_memory() == 0
    finally:
        mx.set_cache_limit(old)
