"""Attention on the CPU with a vectorized softmax: mlx-lm's models, MLX's math, numpy's exp.

MLX's CPU backend runs ``mx.fast.scaled_dot_product_attention`` as its composed fallback
(mlx/fast.cpp: ``q * scale @ k^T``, the mask, a precise softmax, ``@ v``), and the x86
wheels compute its ``exp`` one element at a time: mlx/backend/cpu/simd/type.h takes a SIMD
type only when the build defines ``__SSE4_2__`` or ``__AVX2__``, which the PyPI wheels do
not. That ``exp`` costs ~9 ns a score on this project's CPU hosts, where numpy's vectorized
one costs ~0.6 ns, and a prefill chunk's attention is mostly that ``exp``: 450 new tokens
over 5,000 cached ones, one layer of the tiny test llama, 51 ms in MLX and 7 ms here
(BENCHMARKS V). A decode step's attention over a few thousand tokens halves.

``install(model)`` routes the attention of ``model`` (an mlx-lm model on the CPU) through
`attention` while ``model`` is being called: the mlx-lm modules its layers come from look
up ``scaled_dot_product_attention`` at call time (``from .base import ...`` binds a module
global), which `install` points at `_dispatch`. `_dispatch` takes this path only inside a
call of an installed model (other models in the process, such as a test's reference built
with ``mlx_lm.load``, keep MLX's kernel), for float32 inputs without a quantized KV
cache, with enough scores (`MIN_SCORES`); everything else goes to mlx-lm's own function.

The math is the fallback's (scale the queries, ``q @ k^T``, mask with float32's lowest
value or add a float mask, attention sinks in the softmax, subtract the row maximum,
``exp``, ``@ v``, divided by the row sum) with numpy's BLAS and ``exp``: outputs agree with
MLX's to ~1e-6. Keys past a causal block's last query are not multiplied at all (their
weights are exactly 0 in the fallback too). The scores are computed in blocks of at most
`BLOCK` floats, which stay in a core's cache through the six passes over them and bound the
memory a layer needs beside its KV (MLX's fallback materializes all of them at once); the
blocks of a large call run on one thread a core (numpy releases the GIL). Each call
evaluates its inputs first, so the step's graph up to this layer runs then: on the CPU
nothing is lost, as MLX's ``async_eval`` itself waits once more than 10 tasks are queued
(mlx/transforms.cpp, ``MAX_ACTIVE_TASKS``), which a layer's forward pass exceeds.

Own code: neither MLX nor mlx-lm has a vectorized CPU softmax on x86; the right fix is in
MLX's build, and this module goes when it lands (`applies` is the one switch: option
``cpu_attention``).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models import base

#: Most scores (float32) one block of queries computes at once: 4 MB, within a core's
#: L2 cache (the block's six passes over its scores stay there).
BLOCK = 1 << 20
#: Fewest scores (B x H x L x S) a call takes this path with: below, evaluating the
#: layer's inputs mid-graph costs about what MLX's exp does (a decode step of one or two
#: rows of the tiny llama over ~5,000 tokens: within noise either way); a prefill chunk or
#: a decode step of 16 such rows is 2-10x faster here (BENCHMARKS U5).
MIN_SCORES = 1 << 16
#: Most scores a call computes on one thread: above, its blocks are split over the cores.
PARALLEL_SCORES = 1 << 17

_LOWEST = np.finfo(np.float32).min
_state = threading.local()
_executor: ThreadPoolExecutor | None = None
_WORKERS = min(8, os.cpu_count() or 1)  # one a core


def _one_blas_thread() -> None:
    """Run numpy's matmuls on this thread alone (once per thread): MLX's BLAS (MKL on the
    fast path) keeps its worker threads spinning between its own calls, and numpy's
    OpenBLAS threads beside them halve the speed on a 2-core host (a 2,048-token prefill
    of the embedded model: 11.4 s with them, 6.0 s without). OpenBLAS's per-thread
    setting (``openblas_set_num_threads_local``, OpenBLAS 0.3.27+) leaves other threads'
    numpy alone; numpy's bundled OpenBLAS exports it unprefixed."""
    if getattr(_state, "blas", False):
        return
    _state.blas = True
    libs = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in glob.glob(os.path.join(libs, "*openblas*")):
        try:
            ctypes.CDLL(path).openblas_set_num_threads_local(1)
        except (OSError, AttributeError):
            continue
        return


def applies(enabled: bool) -> bool:
    """Whether ``loaded_model.load`` should install: option on and the default device the CPU."""
    return enabled and mx.default_device().type == mx.DeviceType.cpu


def attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    scale: float,
    mask: Any,
    sinks: mx.array | None = None,
) -> mx.array:
    """Scaled dot-product attention as ``mx.fast.scaled_dot_product_attention`` computes it.

    Args:
        queries: (B, H, L, D) float32.
        keys: (B, Hk, S, D) float32, Hk dividing H (grouped-query attention: query head
            ``j`` reads key head ``j // (H // Hk)``, as MLX's fallback unflattens them).
        values: (B, Hk, S, Dv) float32.
        scale: the factor on ``queries``.
        mask: None; ``"causal"`` (query i, of L, sees keys up to S - L + i); or an array
            broadcastable to (B, H, L, S), bool (True: attend) or float (added).
        sinks: None, or (H,) attention sinks (gpt-oss): a logit per head that joins
            every row's softmax without a value, as MLX's fallback concatenates it.

    Returns:
        (B, H, L, Dv) float32, evaluated. The blocks (rows and queries of at most `BLOCK`
        scores, every head) of a call with `PARALLEL_SCORES` or more run on `_pool`'s
        threads (numpy releases the GIL).
    """
    B, H, L, D = queries.shape
    Hk, S, Dv = keys.shape[1], keys.shape[2], values.shape[3]
    rep = H // Hk
    arrays = [queries, keys, values] + ([mask] if isinstance(mask, mx.array) else [])
    if sinks is not None:
        sinks = sinks.astype(mx.float32)
        arrays.append(sinks)
    mx.eval(*arrays)
    q = np.asarray(queries).reshape(B, Hk, rep, L, D)
    k, v = np.asarray(keys), np.asarray(values)
    m = _mask5(np.asarray(mask), Hk, rep) if isinstance(mask, mx.array) else None
    sink = None if sinks is None else np.asarray(sinks).reshape(1, Hk, rep, 1, 1)
    causal = isinstance(mask, str)
    out = np.empty((B, Hk, rep, L, Dv), np.float32)
    n = max(1, min(L, BLOCK // (H * S)))  # queries a block
    rows = max(1, min(B, BLOCK // (H * S * n))) if n == L else 1  # batch rows a block
    if B * H * L * S >= PARALLEL_SCORES:  # at least a block per worker
        while rows > 1 and -(-B // rows) * -(-L // n) < _WORKERS:
            rows = -(-rows // 2)
        while n > 1 and -(-B // rows) * -(-L // n) < _WORKERS:
            n = -(-n // 2)
    off = S - L
    factor = np.float32(scale)

    def block(item: tuple[int, int]) -> None:
        i, a = item
        _one_blas_thread()
        j, b = min(B, i + rows), min(L, a + n)
        r, w, end = j - i, b - a, (off + b if causal else S)  # later keys: weight 0
        qb = (q[i:j, :, :, a:b] * factor).reshape(r, Hk, rep * w, D)
        s = np.matmul(qb, k[i:j, :, :end].swapaxes(-1, -2))  # (r, Hk, rep * w, end)
        s5 = s.reshape(r, Hk, rep, w, end)
        if causal and w > 1:
            later = np.triu(np.ones((w, w), np.bool_), 1)  # key after the query
            np.copyto(s5[..., off + a : end], _LOWEST, where=later)
        elif m is not None:
            mb = m[i:j] if m.shape[0] > 1 else m
            mb = mb[..., a:b, :] if mb.shape[3] > 1 else mb
            mb = mb[..., :end] if mb.shape[4] > 1 else mb
            if mb.dtype == np.bool_:
                np.copyto(s5, _LOWEST, where=np.logical_not(mb))
            else:
                s5 += mb
        if sink is None:
            s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            total = s.sum(axis=-1, keepdims=True)
        else:  # the sink's logit is in each row's maximum and sum, with no value
            top = np.maximum(s5.max(axis=-1, keepdims=True), sink)
            s5 -= top
            np.exp(s, out=s)
            total = (s5.sum(axis=-1, keepdims=True) + np.exp(sink - top)).reshape(r, Hk, rep * w, 1)
        o = np.matmul(s, v[i:j, :, :end])
        o /= total
        out[i:j, :, :, a:b] = o.reshape(r, Hk, rep, w, Dv)

    items = [(i, a) for i in range(0, B, rows) for a in range(0, L, n)]
    if len(items) == 1:
        block(items[0])
    else:
        for _ in _pool().map(block, items):
            pass
    return mx.array(out.reshape(B, H, L, Dv))


def _pool() -> ThreadPoolExecutor:
    """Threads for `attention`'s blocks: one a core (at most 8), made once."""
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(_WORKERS, thread_name_prefix="cpu-attention")
    return _executor


def _mask5(m: np.ndarray, kv_heads: int, rep: int) -> np.ndarray:
    """A mask broadcastable to (B, H, L, S) as one broadcastable to (B, Hk, rep, L, S)."""
    shape: tuple[int, ...] = (1,) * (4 - m.ndim) + tuple(m.shape)
    m = m.reshape(shape)
    if shape[1] == 1:
        return m[:, :, None]
    return m.reshape(shape[0], kv_heads, rep, *shape[2:])


def _dispatch(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    cache: Any,
    scale: float,
    mask: Any,
    sinks: mx.array | None = None,
) -> mx.array:
    """mlx-lm's ``scaled_dot_product_attention`` signature: `attention` inside a call of an
    installed model where it applies, else mlx-lm's own function."""
    if (
        getattr(_state, "depth", 0)
        and not hasattr(cache, "bits")
        and queries.ndim == 4
        and queries.size // queries.shape[-1] * keys.shape[-2] >= MIN_SCORES
        and queries.dtype == keys.dtype == values.dtype == mx.float32
        and (
            mask is None
            or isinstance(mask, mx.array)
            or (isinstance(mask, str) and mask == "causal")
        )
    ):
        return attention(queries, keys, values, scale, mask, sinks)
    return base.scaled_dot_product_attention(
        queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks
    )


def install(model: Any) -> int:
    """Route ``model``'s attention through `attention` while it is called (module doc).

    Points ``scaled_dot_product_attention`` of every mlx-lm model module ``model``'s layers
    come from at `_dispatch` (once per module, for the whole process: other models keep
    MLX's kernel, `_dispatch` telling them apart), and gives ``model`` a subclass of its
    class whose ``__call__`` marks the call. Returns the number of modules patched now
    (0: already patched, or no layer of ``model`` looks the function up)."""
    patched = 0
    for name in sorted({type(m).__module__ for _, m in model.named_modules()}):
        module = sys.modules.get(name)
        if module is None or name == base.__name__:
            continue
        if (
            getattr(module, "scaled_dot_product_attention", None)
            is base.scaled_dot_product_attention
        ):
            setattr(module, "scaled_dot_product_attention", _dispatch)  # noqa: B010
            patched += 1
    cls = type(model)
    if not getattr(cls, "_cpu_attention", False):
        model.__class__ = type(
            cls.__name__,
            (cls,),
            {"__call__": _marked_call, "_cpu_attention": True, "__module__": cls.__module__},
        )
    return patched


def _marked_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        return super(type(self), self).__call__(*args, **kwargs)
    finally:
        _state.depth -= 1


def installed(model: Any) -> bool:
    """Whether `install` ran on ``model``."""
    return bool(getattr(type(model), "_cpu_attention", False))
