"""MLX's buffer cache inside the memory budget (`engine.memory`): its limit follows the
budget, admission leaves room for it, and the engine gives it back once idle. The two
budgets' defaults (``memory_budget``, ``cpu_dequantize_budget``) are shares of one reading
of the machine's memory (`loading.host_memory`)."""

from __future__ import annotations

import time
from pathlib import Path

import mlx.core as mx
import pytest

import errors
from engine import memory
from engine.memory import MIB, IdleRelease, MemoryBudget, MemoryProfile, cache_limit
from loading import cpu_fast_path, host_memory


def test_the_cache_limit_is_a_share_of_the_budget_within_bounds() -> None:
    assert cache_limit(2048 * MIB) == 64 * MIB
    assert cache_limit(512 * MIB) == 16 * MIB
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


# -- one reader of the machine's memory (loading/host_memory.py) ---------------------------
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("v2", "v1", "want"),
    [
        ("max\n", None, None),  # v2 without a limit
        (None, "9223372036854771712\n", None),  # v1's "no limit"
        ("1073741824\n", None, 1 << 30),
        (None, "536870912\n", 1 << 29),
    ],
)
def test_the_cgroup_limit_is_read_from_v2_then_v1(tmp_path, monkeypatch, v2, v1, want) -> None:
    paths = []
    for name, text in (("memory.max", v2), ("memory.limit_in_bytes", v1)):
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        paths.append(str(path))
    monkeypatch.setattr(host_memory, "CGROUP_LIMITS", tuple(paths))
    assert host_memory.cgroup_limit() == want
    usable = host_memory.usable_memory()
    assert usable == min(host_memory.physical_memory(), want or usable)


def test_both_budgets_are_shares_of_the_one_reading(monkeypatch) -> None:
    monkeypatch.setattr(host_memory, "usable_memory", lambda: 1000 * MIB)
    monkeypatch.setattr(mx.metal, "is_available", lambda: False)
    assert memory.default_budget() == 750 * MIB  # memory_budget
    assert cpu_fast_path.default_dequantize_budget() == 500 * MIB  # cpu_dequantize_budget


def test_no_other_module_reads_the_machine_memory() -> None:
    readers = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in (".venv", "tests", "bench") or rel == Path("loading/host_memory.py"):
            continue
        text = path.read_text()
        if "SC_PHYS_PAGES" in text or "/sys/fs/cgroup" in text:
            readers.append(str(rel))
    assert readers == []


def _mlx_limits() -> tuple[int, int]:
    """MLX's memory and buffer-cache limits now (MLX reads them back only by setting them)."""
    memory_limit, cache = mx.set_memory_limit(1 << 30), mx.set_cache_limit(1 << 20)
    mx.set_memory_limit(memory_limit)
    mx.set_cache_limit(cache)
    return memory_limit, cache


def test_a_model_without_a_budget_after_one_with_gets_mlx_limits_back(tok) -> None:
    """LoadModel with memory_budget:0 after a budgeted one: MLX's own limits, not the last
    budget's (that budget no longer holds anything, and would cap the new model)."""
    from scripted import ScriptedModel

    import backend_pb2
    from engine.core import Engine
    from params import load_params
    from seam.tokenizer import vocab_size

    def serve(option: str) -> None:
        params = load_params(backend_pb2.ModelOptions(Model="scripted", Options=[option]))
        engine.host.install_built(ScriptedModel(vocab_size(tok), tok.eos_token_id), tok, params)

    before = _mlx_limits()  # an earlier test's budget may have set them
    engine = Engine()  # not started: its host serves what is installed
    try:
        serve("memory_budget:3GiB")
        assert _mlx_limits() == (3 << 30, cache_limit(3 << 30))
        serve("memory_budget:0")
        # MLX's own: as they were before the process's first budget set them
        assert _mlx_limits() == memory._MLX_LIMITS != (3 << 30, cache_limit(3 << 30))
    finally:
        engine.shutdown()
        mx.set_memory_limit(before[0])
        mx.set_cache_limit(before[1])
