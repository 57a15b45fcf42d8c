"""The scheduler's two budgets, as arithmetic: the per-step time budget of the prefill
chunk (engine/step_budget.py) and admission by memory (engine/memory.py), plus the one
mapping of a ValueError to INVALID_ARGUMENT only where the request is read (errors)."""

from __future__ import annotations

import math

import pytest

import errors
from engine.memory import KV_COPIES, MIN_CHUNK, MemoryBudget, MemoryProfile, copies
from engine.step_budget import FIRST_CHUNK, PrefillBudget

MIB = 1024 * 1024


def test_full_chunks_when_nobody_decodes_or_the_budget_is_off() -> None:
    budget = PrefillBudget(750, 512)
    assert budget.chunk(prefill_rows=1, decoding=False) == 512
    assert PrefillBudget(0, 512).chunk(prefill_rows=1, decoding=True) == 512


def test_the_chunk_fits_the_measured_speed_into_the_budget() -> None:
    budget = PrefillBudget(750, 512)
    assert budget.chunk(1, decoding=True) == FIRST_CHUNK  # nothing measured yet
    budget.observe(0.1, 0, decoding=True)  # a decode-only step: 100 ms
    budget.observe(0.1 + 64 / 200, 64, decoding=True)  # 64 tokens at 200 tok/s beside it
    assert budget.decode_s == pytest.approx(0.1)
    assert budget.rate == pytest.approx(200)
    # (0.75 s - 0.1 s) * 200 tok/s = 130 tokens, rounded down to a multiple of 16
    assert budget.chunk(1, decoding=True) == 128
    assert budget.chunk(2, decoding=True) == 64  # two prompts prefill side by side
    assert budget.chunk(100, decoding=True) == 16  # never below the smallest chunk


def test_a_fast_device_keeps_full_chunks() -> None:
    budget = PrefillBudget(750, 512)
    budget.observe(0.01, 0, decoding=True)
    budget.observe(0.01 + 512 / 50_000, 512, decoding=True)
    assert budget.chunk(1, decoding=True) == 512


def test_the_memory_room_bounds_the_step_over_all_prefilling_rows() -> None:
    """Issue 32: the room holds the whole step's prefill working set, every prefilling
    row's chunk priced beside the context (attention scores are chunk x context)."""
    prof = MemoryProfile(kv_per_token=0, fixed=0, prefill_per_token=1000, prefill_per_pair=10)
    budget = PrefillBudget(0, 512)
    budget.limit(100 * 1000, prof)
    one = budget.chunk(1, decoding=False)
    assert one == 61  # 61 * (1000 + 10 * 61) = 98,210; 62 * (1000 + 10 * 62) = 100,440
    assert prof.prefill(one) <= 100 * 1000 < prof.prefill(one + 1)
    four = budget.chunk(4, decoding=False)
    assert prof.prefill(four, rows=4) <= 100 * 1000 < prof.prefill(four + 1, rows=4)
    long = budget.chunk(1, decoding=False, context=500)
    assert long < one and prof.prefill(long, 500) <= 100 * 1000 < prof.prefill(long + 1, 500)
    assert budget.chunk(1, decoding=False, context=5000) == MIN_CHUNK  # never below it
    # The copies of the batch's KV a step may hold (rows joining or leaving) come out of
    # the room first.
    kv = 40 * 1000
    assert copies(kv) == kv * KV_COPIES
    expected = prof.chunk_within(100 * 1000 - copies(kv), 1, 0, 512)
    assert budget.chunk(1, decoding=False, kv=kv) == expected < one
    budget.limit(10**12, prof)
    assert budget.chunk(4, decoding=False, context=100) == 512


def test_the_profile_prices_chunks_rows_and_context() -> None:
    prof = MemoryProfile(kv_per_token=0, fixed=0, prefill_per_token=1000, prefill_per_pair=10)
    assert prof.prefill(64) == 64 * 1000 + 10 * 64 * 64
    assert prof.prefill(64, context=1000) == 64 * 1000 + 10 * 64 * 1064
    assert prof.prefill(64, context=1000, rows=3) == 3 * prof.prefill(64, context=1000)
    assert prof.chunk_within(10**12, 1, 0, 512) == 512
    assert prof.chunk_within(prof.prefill(MIN_CHUNK) - 1, 1, 0, 512) == 0
    # A prompt's floor: its first chunk, or the smallest chunk beside its whole context.
    assert prof.floor(100, 512) == prof.prefill(100)
    assert prof.floor(100_000, 512) == prof.prefill(MIN_CHUNK, 100_000)


def _budget(budget_mib: int, weights_mib: int = 500) -> MemoryBudget:
    prof = MemoryProfile(kv_per_token=46 * 1024, fixed=0, prefill_per_token=900 * 1024)
    return MemoryBudget(budget_mib * MIB, weights_mib * MIB, prof, 512)


def test_a_sequence_reserves_its_kv_at_its_longest_and_a_batch_its_longest_row() -> None:
    mem = _budget(2000)
    assert mem.profile.sequence(1024) == 1024 * 46 * 1024
    assert mem.profile.sequence(1000) == 1024 * 46 * 1024  # allocated in steps of 256
    assert mem.batch_cost(3, 1000) == 3 * 1024 * 46 * 1024  # rows padded to the longest
    assert mem.batch_cost(0, 1000) == 0


def test_what_can_never_fit_says_so_with_the_numbers() -> None:
    mem = _budget(700)
    assert mem.never_fits(100) is None
    reason = mem.never_fits(10_000)  # 10,240 allocated: 460 MiB of KV beside 500 MiB
    assert reason is not None
    assert "460 MiB" in reason and "memory_budget is 700 MiB" in reason
    assert "lower Tokens" in reason
    assert _budget(0).never_fits(10**9) is None  # off: everything fits


def test_the_chunk_shrinks_to_what_the_room_holds() -> None:
    mem = _budget(2000)
    prof = mem.profile
    assert prof.chunk_within(10**12, 1, 0, mem.chunk) == 512
    assert prof.chunk_within(100 * 900 * 1024, 1, 0, mem.chunk) == 100
    assert prof.chunk_within(MIN_CHUNK * 900 * 1024 - 1, 1, 0, mem.chunk) == 0


def test_a_budget_below_weights_and_one_chunk_fails_the_load() -> None:
    with pytest.raises(errors.ModelLoadError, match="smaller than the weights"):
        _budget(505)
    mem = _budget(600)
    assert mem.status() == {
        "memory_budget": 600 * MIB,
        "memory_reserved": 0,
        "memory_free": 100 * MIB,
        "memory_cache_limit": 0,
        "memory_kv_per_token": 46 * 1024,
        "memory_fixed_per_sequence": 0,
        "memory_prefill_per_token": 900 * 1024,
        "memory_prefill_per_pair": math.ceil(mem.profile.prefill_per_pair),
    }


def test_a_value_error_is_invalid_argument_only_where_the_request_is_read() -> None:
    # Anywhere else (raised inside mlx-lm, say) it is the server's fault: INTERNAL.
    internal = errors.as_backend_error(ValueError("[reshape] cannot reshape"))
    assert internal.status == "INTERNAL" and str(internal) == "ValueError: [reshape] cannot reshape"
    # Where the request is read, its ValueError is turned into InvalidArgument.
    invalid = errors.invalid_argument(ValueError("PredictOptions.TopP must be in [0, 1]"))
    assert invalid.status == "INVALID_ARGUMENT" and str(invalid).startswith("PredictOptions.TopP")
    assert errors.as_backend_error(invalid) is invalid
    assert isinstance(invalid, ValueError)  # still what the request layers are said to raise
    unavailable = errors.Unavailable("retry")
    assert errors.as_backend_error(unavailable) is unavailable
    internal = errors.as_backend_error(RuntimeError("boom"))
    assert internal.status == "INTERNAL" and "RuntimeError: boom" in str(internal)


def test_the_chunk_shrinks_as_the_context_grows() -> None:
    """Issue 32: past 8,192 tokens of context the chunk halves as the context doubles,
    never below 256 (mlx-lm PR #1781: 11.2 GB less peak at 128k with 512 than 2,048)."""
    from engine.step_budget import for_context

    assert [for_context(c, 2048) for c in (0, 8192, 16384, 32768, 65536, 131072)] == [
        2048,
        2048,
        1024,
        512,
        256,
        256,
    ]
    assert for_context(20000, 2048) == 832  # 2048 * 8192 / 20000, a multiple of 16
    assert for_context(100_000, 128) == 128  # never above the configured chunk
    budget = PrefillBudget(0, 2048)
    assert budget.chunk(prefill_rows=1, decoding=False, context=40_000) == 416
    assert budget.chunk(prefill_rows=1, decoding=False, context=100) == 2048
