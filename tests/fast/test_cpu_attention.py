"""loading.cpu_attention: attention with numpy's softmax gives MLX's attention.

`attention` against ``mx.fast.scaled_dot_product_attention`` (MLX's own CPU fallback, the
reference) over the masks mlx-lm passes (none, "causal", a batch's left-padded bool mask,
a float mask per head, a sliding window), grouped-query heads, blocks of queries and of
rows, and the threaded path; `_dispatch` takes it only inside an installed model's call;
installed tiny models of every family give the greedy tokens they give without it.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import tiny_models
from helpers import batch_tokens
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.generate import generate_step
from mlx_lm.models.base import create_causal_mask

import backend_pb2 as pb
from loading import cpu_attention
from params import load_params

pytestmark = pytest.mark.skipif(
    mx.default_device().type != mx.DeviceType.cpu, reason="the CPU path"
)


def _arrays(rng, B, H, Hk, L, S, D, Dv=None):
    def normal(*shape):
        return mx.array(rng.standard_normal(shape).astype(np.float32))

    return normal(B, H, L, D), normal(B, Hk, S, D), normal(B, Hk, S, Dv or D)


def _mask(kind: str, rng, B, H, L, S):
    if kind == "none":
        return None
    if kind == "causal":
        return "causal"
    if kind == "padded":  # a batch's: causal over each row's own tokens (BatchKVCache)
        pad = mx.array(rng.integers(0, S - L + 1, B).tolist())
        return create_causal_mask(L, S - L, left_padding=pad)
    if kind == "window":  # a sliding window (RotatingKVCache's array mask)
        return create_causal_mask(L, S - L, window_size=max(1, S // 3))
    if kind == "float":  # added, one per head
        return mx.array(rng.standard_normal((B, H, L, S)).astype(np.float32))
    raise AssertionError(kind)


def _close(got: mx.array, want: mx.array) -> None:
    assert got.shape == want.shape and got.dtype == mx.float32
    assert mx.allclose(got, want, atol=2e-5, rtol=1e-4).item(), mx.abs(got - want).max()


@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 4),
    Hk=st.integers(1, 3),
    rep=st.sampled_from([1, 2, 4]),
    L=st.integers(1, 40),
    extra=st.integers(0, 90),
    D=st.sampled_from([8, 16, 32]),
    kind=st.sampled_from(["none", "causal", "padded", "window", "float"]),
    block=st.sampled_from([1 << 20, 5000, 300, 1]),
    threads=st.booleans(),
    sinks=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_attention_equals_mlx(B, Hk, rep, L, extra, D, kind, block, threads, sinks, seed):
    rng = np.random.default_rng(seed)
    H, S = Hk * rep, L + extra
    q, k, v = _arrays(rng, B, H, Hk, L, S, D)
    mask = _mask(kind, rng, B, H, L, S)
    sink = mx.array(rng.standard_normal(H).astype(np.float32) * 3) if sinks else None
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask=mask, sinks=sink)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_attention, "BLOCK", block)
        mp.setattr(cpu_attention, "PARALLEL_SCORES", 0 if threads else 1 << 40)
        _close(cpu_attention.attention(q, k, v, 0.3, mask, sink), want)


def test_value_width_and_fully_masked_rows():
    rng = np.random.default_rng(1)
    q, k, v = _arrays(rng, 2, 4, 2, 3, 20, 16, Dv=24)
    mask = mx.array(rng.random((2, 1, 3, 20)) > 0.5)
    mask[0, 0, 1] = False  # nothing to attend to: MLX's fallback averages every value
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    _close(cpu_attention.attention(q, k, v, 0.25, mask), want)


def test_causal_skips_later_keys_in_blocks(monkeypatch):
    """Blocks of 2 queries: each multiplies only the keys up to its last query."""
    seen: list[int] = []
    real = np.matmul

    def matmul(a, b, *args, **kwargs):
        seen.append(b.shape[-1])
        return real(a, b, *args, **kwargs)

    rng = np.random.default_rng(2)
    q, k, v = _arrays(rng, 1, 2, 1, 6, 10, 8)
    monkeypatch.setattr(cpu_attention, "BLOCK", 2 * 2 * 10)  # H x S x 2 queries
    monkeypatch.setattr(cpu_attention, "PARALLEL_SCORES", 1 << 40)
    monkeypatch.setattr(cpu_attention.np, "matmul", matmul)
    got = cpu_attention.attention(q, k, v, 0.5, "causal")
    _close(got, mx.fast.scaled_dot_product_attention(q, k, v, scale=0.5, mask="causal"))
    # query blocks [0, 2), [2, 4), [4, 6) at positions 4.. of 10: keys up to 6, 8, 10,
    # each block's q @ k^T (keys as columns) then its weights @ v (keys as rows)
    assert seen[0::2] == [6, 8, 10]


# --- dispatch and install ---------------------------------------------------------------


@pytest.fixture
def counted(monkeypatch):
    """The number of calls that took `attention` (list of one int)."""
    calls = [0]
    real = cpu_attention.attention

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(cpu_attention, "attention", counting)
    return calls


def test_dispatch_only_inside_installed_calls(counted):
    rng = np.random.default_rng(3)
    q, k, v = _arrays(rng, 1, 2, 1, 200, 400, 16)  # 160k scores: above MIN_SCORES
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask="causal")
    _close(cpu_attention._dispatch(q, k, v, None, 0.2, "causal"), want)
    assert counted[0] == 0  # no installed model is running
    cpu_attention._state.depth = 1
    try:
        _close(cpu_attention._dispatch(q, k, v, None, 0.2, "causal"), want)
        assert counted[0] == 1
        small = [x[:, :, :8] for x in (q, k, v)]
        cpu_attention._dispatch(*small, None, 0.2, "causal")  # few scores: MLX's kernel
        half = [x.astype(mx.float16) for x in (q, k, v)]
        cpu_attention._dispatch(*half, None, 0.2, "causal")  # not float32: MLX's
        assert counted[0] == 1
    finally:
        cpu_attention._state.depth = 0


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3_5", "gpt_oss"])
def test_installed_model_gives_the_same_tokens(family, counted):
    """Greedy tokens of a 300-token prompt, one sequence and a batch of 3 (left padding),
    with and without `install`; the plain twin keeps MLX's kernel (no call counted).
    gpt_oss: attention sinks and sliding-window layers."""
    plain, fast = tiny_models.make(family), tiny_models.make(family)
    cpu_attention.install(fast)
    assert cpu_attention.installed(fast) and not cpu_attention.installed(plain)
    assert isinstance(fast, type(plain)) and type(fast).__name__ == type(plain).__name__
    rng = np.random.default_rng(4)
    prompt = rng.integers(100, 40000, 300).tolist()
    want = [t for t, _ in generate_step(mx.array(prompt), plain, max_tokens=12)]
    assert counted[0] == 0
    got = [t for t, _ in generate_step(mx.array(prompt), fast, max_tokens=12)]
    assert got == want
    assert counted[0] > 0  # the prompt's chunks took this path
    prompts = [prompt, prompt[:180], prompt[40:290]]
    assert batch_tokens(fast, prompts, 8) == batch_tokens(plain, prompts, 8)


@pytest.mark.parametrize("option", ["cpu_attention:true", "cpu_attention:false"])
def test_load_installs_on_the_cpu(option, tmp_path):
    from loading import loaded_model

    path = tiny_models.build("llama", tmp_path)
    loaded = loaded_model.load(load_params(pb.ModelOptions(Model=str(path), Options=[option])))
    assert cpu_attention.installed(loaded.model) is (option == "cpu_attention:true")
