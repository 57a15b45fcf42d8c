"""The memory budget: what one sequence costs, what the process may hold, who may start.

MLX users' most reported production failure is running out of memory (the process killed,
or Metal's `Resource limit exceeded` ending the generation thread). Load option
``memory_budget`` bounds the MLX memory of the process: the weights, the KV of running
sequences, the prompt cache's memory tier and the prefill working set.

- `MemoryProfile`, measured once per loaded model (`profile`): KV bytes per token of the
  layers that grow with the sequence, the bytes of layers of fixed size (recurrent
  state, and rotating windows at their full size), and the prefill working set of a
  chunk (activations per chunk token, attention scores per chunk x context pair), by
  running two probe chunks (one beside held KV) and reading MLX's peak memory. A step
  prices every prefilling row's chunk beside its context (`MemoryProfile.prefill`,
  `engine.step_budget`) and the copies of the running KV that rows joining or leaving
  the batch make (`copies`); bench/bench_memory_model.py and
  tests/process/test_memory_model.py check the sum against MLX's real peak.
- `MemoryBudget`: what admission (`engine.preemption`) asks. A sequence the batch can
  preempt counts at the KV it holds after its next step; any other reserves its longest
  (prompt plus every token it may generate) when it starts. The batch pads every row to
  the longest (`batch.decode.DecodeBatch`, as mlx-lm's), so ``n`` rows cost ``n`` times
  the longest row. The prompt cache gives memory back first (least recently used
  entries), then the newest preemptible sequences leave for the prompt cache and resume
  later; a request that does not fit waits, in order; one that can never fit, even
  alone, is refused with the numbers. While the budget is tight the prefill chunk
  shrinks to what fits.

- MLX's buffer cache (freed buffers MLX keeps for reuse) is part of the budget: limited
  to `cache_limit` (``mx.set_cache_limit``), which admission leaves room for, and given
  back by `IdleRelease` once the engine has been idle for IDLE_RELEASE_S; on Linux
  (glibc) the C heap is trimmed then too (`trim_heap`).

Defaults (`default_budget`): Metal, the device's recommended working set minus 10%; CPU
and CUDA, 75% of the physical memory (the cgroup limit when lower: `loading.host_memory`,
which ``cpu_dequantize_budget`` reads too). ``0`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from batch.release import release_cache
from errors import ModelLoadError
from loading import host_memory

logger = logging.getLogger("localai.mlx." + __name__)

MIB = 1024 * 1024
RAM_SHARE = 0.75  # default budget on CPU and CUDA: this share of `host_memory.usable_memory`
METAL_MARGIN = 0.10  # default budget on Metal: the recommended working set minus this share
PROBE_TOKENS = 64  # prompt tokens of each probe chunk that measures the prefill working set
PROBE_CONTEXT = 1024  # context (tokens already held) of the second probe
WORKING_SET_MARGIN = 1.25  # measured working set, times this (what the probes do not see)
MIN_CHUNK = 16  # the smallest prefill chunk the budget may shrink to
# A step may hold the running KV twice: the batch copies it when rows join or leave
# (`batch.decode.DecodeBatch`: the prefill cache is deep-copied and filtered when some rows
# start decoding, the decoding rows' cache concatenated or filtered, a leaving row's KV
# extracted, then copied again into the prompt cache). Measured (bench/bench_memory_model.py,
# 8 x 1,061 tokens): counting only weights, KV and the prefill working set, the peak was
# 951 MiB against an 835 MiB budget, about one copy of the 4 rows' KV above the model.
KV_COPIES = 1.0
KV_STEP = 256  # mlx-lm's KVCache.step: KV buffers grow by this many tokens
# MLX's buffer cache: this share of the budget, at most CACHE_MAX. MLX's CPU allocator
# keeps at most 32 MiB by default (mlx/backend/no_gpu/allocator.cpp), its Metal allocator
# up to its memory limit; mlx-lm sets no limit and clears the cache after each prefill
# chunk and every 256 tokens (mlx_lm/generate.py), as `batch.decode` does.
CACHE_SHARE = 32  # the limit is budget // CACHE_SHARE
CACHE_MAX = 1024 * MIB
IDLE_RELEASE_S = 0.5  # idle this long, the engine gives MLX's buffer cache back


@dataclass(frozen=True)
class MemoryProfile:
    """What sequences of one loaded model cost, in bytes.

    ``kv_per_token``: KV bytes per token of the layers that grow with the sequence;
    ``fixed``: bytes per sequence of layers that do not (recurrent state; rotating windows
    counted at their full size); the prefill working set of a chunk (transient:
    activations, attention scores) is ``prefill_per_token`` per chunk token plus
    ``prefill_per_pair`` per (chunk token, attended token) pair: a chunk's attention
    scores are chunk x context per head.
    """

    kv_per_token: int
    fixed: int
    prefill_per_token: int
    prefill_per_pair: float = 0.0

    def sequence(self, tokens: int) -> int:
        """KV bytes of one sequence of ``tokens`` tokens at its longest, as allocated
        (mlx-lm's caches grow in steps of KV_STEP tokens)."""
        allocated = -(-max(tokens, 0) // KV_STEP) * KV_STEP
        return self.fixed + self.kv_per_token * allocated

    def prefill(self, chunk: int, context: int = 0, rows: int = 1) -> int:
        """The working set of one step in which ``rows`` rows each prefill ``chunk``
        tokens beside ``context`` tokens their KV already holds (the batch pads rows to
        the longest chunk and the longest context)."""
        chunk = max(chunk, 0)
        pairs = chunk * (max(context, 0) + chunk)
        return int(rows * (self.prefill_per_token * chunk + self.prefill_per_pair * pairs))

    def chunk_within(self, room: int, rows: int, context: int, largest: int) -> int:
        """The largest chunk (tokens per row, at most ``largest``) whose step working set
        (`prefill`) fits ``room`` bytes; 0 when not even MIN_CHUNK does."""
        lo, hi = 0, max(largest, 0)
        while lo < hi:  # the working set grows with the chunk: bisect
            mid = (lo + hi + 1) // 2
            if self.prefill(mid, context, rows) <= room:
                lo = mid
            else:
                hi = mid - 1
        return lo if lo >= MIN_CHUNK or lo == largest else 0

    def floor(self, tokens: int, chunk: int) -> int:
        """The least prefill working set a prompt of ``tokens`` tokens needs alone: its
        first chunk (at most ``chunk``) and the smallest chunk at its full context."""
        first = min(chunk, max(tokens, 1))
        return max(self.prefill(first), self.prefill(min(MIN_CHUNK, first), tokens))


def copies(kv: int) -> int:
    """Bytes a step may hold beside ``kv`` bytes of running KV for its copies (KV_COPIES)."""
    return int(max(kv, 0) * KV_COPIES)


def _layer_bytes(layer: Any) -> tuple[int, int]:
    """(bytes per token, fixed bytes) of one cache layer that has seen some tokens."""
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    if keys is not None and values is not None and hasattr(layer, "offset"):
        buffers = _arrays(keys) + _arrays(values)  # quantized: (data, scales, biases) each
        allocated = buffers[0].shape[2]  # (batch, kv heads, tokens allocated, head dim)
        per_token = sum(a.nbytes for a in buffers) // max(allocated, 1)
        max_size = getattr(layer, "max_size", None)
        if max_size is not None:  # a rotating window: bounded, so count it at its full size
            return 0, per_token * max_size
        return per_token, 0
    return 0, sum(a.nbytes for a in _arrays(getattr(layer, "state", None)))


def _arrays(state: Any) -> list[mx.array]:
    """The arrays in a cache layer's state (nested: quantized caches hold tuples)."""
    if isinstance(state, mx.array):
        return [state]
    if isinstance(state, (list, tuple)):
        return [a for part in state for a in _arrays(part)]
    return []


def profile(model: Any, chunk: int) -> MemoryProfile:
    """Measure `MemoryProfile` with two probe chunks of PROBE_TOKENS tokens (at most
    ``chunk``) through ``model``: one on a fresh cache (the KV per token, the working set
    per chunk token), one beside PROBE_CONTEXT tokens of KV already held (the attention
    term: scores are chunk x context). The held KV is written as zeros, not computed, so
    the second probe costs one more chunk. Only the cache is evaluated, as the batch's
    prefill does (no logits). Engine thread only."""
    n = max(2, min(PROBE_TOKENS, chunk))
    cache = make_prompt_cache(model)
    alone = _working_set(model, cache, n)
    per_token = fixed = 0
    for layer in cache:
        t, f = _layer_bytes(layer)
        per_token += t
        fixed += f
    pair = 0.0
    held = _held(cache, PROBE_CONTEXT, n, make_prompt_cache(model))
    if held is not None:  # a model with attention layers that grow with the sequence
        beside = _working_set(model, held, n)
        pair = max(beside - alone, 0) / (n * PROBE_CONTEXT)
    token = max(alone / n - pair * n, 0.0)
    del cache, held
    return MemoryProfile(
        per_token, fixed, int(token * WORKING_SET_MARGIN), pair * WORKING_SET_MARGIN
    )


def _working_set(model: Any, cache: list, n: int) -> int:
    """Bytes MLX held above the cache while ``n`` tokens ran through ``model`` into
    ``cache`` (the KV they add not counted)."""
    mx.eval([c.state for c in cache if getattr(c, "state", None) is not None] or [mx.array(0)])
    mx.reset_peak_memory()
    logits = model(mx.zeros((1, n), dtype=mx.uint32), cache=cache)  # never evaluated
    mx.eval([c.state for c in cache])
    del logits
    return max(mx.get_peak_memory() - mx.get_active_memory(), 0)


def _zeros(like: mx.array, tokens: int) -> mx.array:
    """Zeros shaped as KV buffer ``like`` (batch, kv heads, tokens, head dim), ``tokens`` long."""
    return mx.zeros((like.shape[0], like.shape[1], tokens, like.shape[3]), like.dtype)


def _held(probed: list, context: int, n: int, fresh: list) -> list | None:
    """``fresh`` (a new cache of the model) holding ``context`` tokens of zeros in the
    layers that grow with the sequence (shaped as ``probed``'s after the first probe,
    with room for ``n`` more tokens); None when no layer grows so."""
    allocated = -(-(context + n) // KV_STEP) * KV_STEP
    filled = False
    for old, new in zip(probed, fresh, strict=True):
        keys, values = getattr(old, "keys", None), getattr(old, "values", None)
        if not isinstance(keys, mx.array) or not isinstance(values, mx.array):
            continue  # recurrent state, quantized KV
        if getattr(old, "max_size", None) is not None or not old.is_trimmable():
            continue  # a rotating window: bounded
        new.update_and_fetch(*(_zeros(a, allocated) for a in (keys, values)))
        new.trim(allocated - context)
        filled = True
    return fresh if filled else None


def default_budget() -> int:
    """The default ``memory_budget`` of this machine, bytes (see the module docstring)."""
    if mx.metal.is_available():
        info = mx.device_info()
        recommended = int(info.get("max_recommended_working_set_size", 0))
        if recommended:
            return int(recommended * (1 - METAL_MARGIN))
    return int(host_memory.usable_memory() * RAM_SHARE)


def cache_limit(budget: int) -> int:
    """Bytes MLX's buffer cache may keep under ``budget`` (module constants CACHE_*)."""
    return min(budget // CACHE_SHARE, CACHE_MAX)


def budget_for(need: int) -> int:
    """The smallest ``memory_budget`` (bytes) that leaves ``need`` bytes beside the buffer
    cache's share of it (`cache_limit`): what to ask for to hold ``need`` of weights, KV
    and prefill."""
    small = -(-need * CACHE_SHARE // (CACHE_SHARE - 1))
    return small if small // CACHE_SHARE <= CACHE_MAX else need + CACHE_MAX


# MLX's own memory and buffer-cache limits, as they were before the first budget set them.
_MLX_LIMITS: tuple[int, int] | None = None


def apply_limits(budget: int) -> None:
    """Set MLX's own limits from the budget: the memory limit, the buffer cache (what MLX
    keeps of freed buffers: `cache_limit`) and, on Metal, the wired limit (as
    `mlx_lm.server` does at start). `reset_limits` puts MLX's own back."""
    global _MLX_LIMITS
    limits = (mx.set_memory_limit(budget), mx.set_cache_limit(cache_limit(budget)))
    if _MLX_LIMITS is None:
        _MLX_LIMITS = limits
    if mx.metal.is_available():
        mx.set_wired_limit(
            min(budget, int(mx.device_info().get("max_recommended_working_set_size", budget)))
        )


def reset_limits() -> None:
    """MLX's own limits again, for a model served without a budget after one with (else
    the earlier model's budget would still cap it); nothing where no budget set them."""
    if _MLX_LIMITS is None:
        return
    mx.set_memory_limit(_MLX_LIMITS[0])
    mx.set_cache_limit(_MLX_LIMITS[1])
    if mx.metal.is_available():
        mx.set_wired_limit(0)  # MLX's default: nothing wired


def _mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB"


class MemoryBudget:
    """Admission by memory for one loaded model (engine thread only).

    ``budget``: bytes (0: off, everything fits); ``weights``: the model's weight bytes;
    ``chunk``: the full prefill chunk (``prefill_step_size``); ``cache``: the bytes MLX's
    buffer cache may keep (`cache_limit`), which the budget holds beside everything else.
    Raises ModelLoadError at construction when the budget cannot hold the weights, the
    buffer cache and one prefill chunk.
    """

    def __init__(
        self, budget: int, weights: int, prof: MemoryProfile, chunk: int, cache: int = 0
    ) -> None:
        self.budget = budget
        self.weights = weights
        self.profile = prof
        self.chunk = chunk
        self.cache_limit = cache if budget else 0
        self.reserved = 0  # KV bytes reserved by the running sequences
        fixed = weights + self.cache_limit
        if budget and budget < fixed + prof.prefill(MIN_CHUNK) + prof.sequence(1):
            raise ModelLoadError(
                f"memory_budget {_mib(budget)} is smaller than the weights ({_mib(weights)}) "
                f"and MLX's buffer cache ({_mib(self.cache_limit)}) plus one prefill chunk "
                f"({_mib(prof.prefill(MIN_CHUNK))}): raise memory_budget (or 0 to turn it off)"
            )

    @classmethod
    def off(cls, loaded: Any) -> MemoryBudget:
        """No budget: everything fits."""
        return cls(0, loaded.weights_bytes, MemoryProfile(0, 0, 0), loaded.params.prefill_step_size)

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def batch_cost(self, rows: int, longest: int) -> int:
        """KV bytes of a batch of ``rows`` rows padded to ``longest`` tokens."""
        return rows * self.profile.sequence(longest) if rows else 0

    def never_fits(self, tokens: int) -> str | None:
        """Why a sequence of ``tokens`` tokens at its longest can never run, even alone
        with an empty prompt cache and the smallest prefill chunk; None when it can."""
        if not self.enabled:
            return None
        need = self.profile.sequence(tokens)
        floor = self.weights + self.cache_limit + self.profile.prefill(MIN_CHUNK)
        if floor + need <= self.budget:
            return None
        return (
            f"the request needs {_mib(need)} of KV cache ({tokens} tokens with the "
            f"generation budget) beside {_mib(floor)} of weights, buffer cache and prefill, but "
            f"memory_budget is {_mib(self.budget)}: lower Tokens (max_tokens), shorten the "
            "prompt, or raise memory_budget"
        )

    def room(self, kv_after: int, cache_bytes: int) -> int:
        """Bytes left for the prefill working set if the running KV became ``kv_after``
        with ``cache_bytes`` in the prompt cache (negative: does not fit); MLX's buffer
        cache is held at its limit."""
        return self.budget - self.weights - self.cache_limit - kv_after - cache_bytes

    def status(self) -> dict[str, int]:
        """Status entries: the budget, what the running sequences reserve, and what is
        free of it after weights and reservations (0 when off)."""
        if not self.enabled:
            return {"memory_budget": 0, "memory_reserved": 0, "memory_free": 0}
        return {
            "memory_budget": self.budget,
            "memory_reserved": self.reserved,
            "memory_free": max(self.budget - self.weights - self.cache_limit - self.reserved, 0),
            "memory_cache_limit": self.cache_limit,
            "memory_kv_per_token": self.profile.kv_per_token,
            "memory_fixed_per_sequence": self.profile.fixed,
            "memory_prefill_per_token": self.profile.prefill_per_token,
            "memory_prefill_per_pair": math.ceil(self.profile.prefill_per_pair),
        }


def _glibc() -> ctypes.CDLL | None:
    """The C library on Linux when it is glibc (``malloc_trim``), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def trim_heap() -> None:
    """Linux (glibc): give the C heap's free pages back to the system (``malloc_trim``).

    MLX's CPU allocator returns buffers with ``std::free`` (mlx/backend/no_gpu/allocator.cpp)
    and glibc keeps freed buffers below its mmap threshold (which rises to 32 MiB as large
    buffers come and go) in its heap: measured on the embedded model after mixed requests,
    the RSS stayed at 1,262 MiB once MLX's cache was emptied, and fell to 791 MiB with
    this call. Neither MLX nor Python offers it, hence ctypes; a no-op elsewhere (macOS's
    allocator returns pages by itself)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


class IdleRelease:
    """Gives MLX's buffer cache back when the engine goes idle (engine thread only).

    While requests run, MLX keeps freed buffers (up to `cache_limit`) to reuse them the
    next step; once nothing has run for IDLE_RELEASE_S they go back to the system
    (`batch.release.release_cache`: after the work in flight, never in the step in which the
    last sequence ended), then ``released`` is called (the engine reads MLX's memory again).
    The engine loop asks `wait` how long it may block for its next item and calls `tick`
    after each step.
    """

    def __init__(self, released: Callable[[], None] = lambda: None) -> None:
        self._released = released
        self._idle_since: float | None = None  # when the engine was last seen busy

    def wait(self, busy: bool, timeout: float | None) -> float | None:
        """How long an idle engine may block (``timeout``: its own limit, e.g. a distributed
        heartbeat; None: none) so that the release comes on time."""
        if busy or self._idle_since is None:
            return timeout
        left = max(self._idle_since + IDLE_RELEASE_S - time.monotonic(), 0.0)
        return left if timeout is None else min(timeout, left)

    def tick(self, busy: bool) -> bool:
        """After a step: ``busy`` (requests ran or wait) starts the idle clock again; idle
        long enough, the cache is released once (True then)."""
        now = time.monotonic()
        if busy or (self._idle_since is None and mx.get_cache_memory() > 0):
            self._idle_since = now
        elif self._idle_since is not None and now - self._idle_since >= IDLE_RELEASE_S:
            self._idle_since = None
            release_cache()
            trim_heap()
            self._released()
            return True
        return False
