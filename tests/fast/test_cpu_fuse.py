"""cpu_fuse on tiny random-weight models of every family it applies to: fused Q/K/V and
gate/up projections give the same output; other families and quantized layers are left
alone; parameter memory is not doubled. On the embedded model: tests/model/test_cpu_fuse.py.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from helpers import batch_tokens, param_bytes
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.generate import generate_step
from mlx_lm.utils import _get_classes

import backend_pb2 as pb
from loading import cpu_fuse
from params import load_params

# --- family matrix: tiny random-weight models ----------------------------------------

_BASE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 128,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "max_position_embeddings": 512,
}

FAMILIES = {
    "llama": {},
    "mistral": {},
    "qwen2": {},  # q/k/v with bias
    "qwen3": {"head_dim": 16},  # q_norm / k_norm after the projections
}


def _tiny_pair(model_type: str, extra: dict):
    config = {**_BASE, **extra, "model_type": model_type}
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(0)
    a = model_cls(args_cls.from_dict(config))
    a.set_dtype(mx.float32)
    b = model_cls(args_cls.from_dict(config))
    b.set_dtype(mx.float32)
    b.update(tree_unflatten(tree_flatten(a.parameters())))
    mx.eval(a.parameters(), b.parameters())
    return a, b


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_family_matrix_identical(model_type):
    plain, fused = _tiny_pair(model_type, FAMILIES[model_type])
    before = param_bytes(plain)[0]
    counts = cpu_fuse.transform(fused)
    assert counts["projections"] == 2 and counts["compiled"] >= 5
    assert cpu_fuse.fuse_projections(fused, mlp=True) == 2  # gate/up too (off by default)
    assert param_bytes(fused)[0] == before
    x = mx.array([[1, 5, 9, 33, 2, 77, 4]])
    a, b = plain(x), fused(x)
    assert mx.abs(a - b).max().item() < 1e-4
    ids = mx.array([3, 8, 21, 5])
    want = [t for t, _ in generate_step(ids, plain, max_tokens=12)]
    got = [t for t, _ in generate_step(ids, fused, max_tokens=12)]
    assert got == want
    prompts = [[3, 8, 21, 5], [7, 1, 2, 90, 11, 6, 40], [12, 13]]
    assert batch_tokens(fused, prompts, 8) == batch_tokens(plain, prompts, 8)


def test_unknown_architecture_skipped():
    config = {**_BASE, "model_type": "phi3"}
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    before = [n for n, _ in tree_flatten(model.parameters())]
    assert cpu_fuse.transform(model) == {"projections": 0, "compiled": 0}
    assert [n for n, _ in tree_flatten(model.parameters())] == before


def test_quantized_layers_skipped():
    plain, _ = _tiny_pair("llama", {})
    nn.quantize(plain, group_size=32, bits=4)
    before = [n for n, _ in tree_flatten(plain.parameters())]
    assert cpu_fuse.fuse_projections(plain) == 0
    assert [n for n, _ in tree_flatten(plain.parameters())] == before


def test_applies_only_dense_enabled_cpu():
    on_cpu = mx.default_device().type == mx.DeviceType.cpu
    assert cpu_fuse.applies("dense", True) is on_cpu
    assert cpu_fuse.applies("dense", False) is False
    assert cpu_fuse.applies("quantized", True) is False


def test_option_parsed():
    assert load_params(pb.ModelOptions(Model="m")).cpu_fuse is True
    assert load_params(pb.ModelOptions(Model="m", Options=["cpu_fuse:false"])).cpu_fuse is False
    with pytest.raises(ValueError, match="cpu_fuse"):
        load_params(pb.ModelOptions(Model="m", Options=["cpu_fuse:maybe"]))
