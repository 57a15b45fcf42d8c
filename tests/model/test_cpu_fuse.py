"""cpu_fuse on the embedded model: fused Q/K/V and gate/up projections give the same
output (dense float32, greedy token for token, batch 1 and a batch of 4 through
BatchGenerator), parameter memory is not doubled, and LoadModel applies it on dense CPU.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from helpers import batch_tokens, param_bytes
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step

import backend_pb2 as pb
from loading import cpu_fast_path, cpu_fuse, model_loader
from params import load_params

PROMPTS = (
    "Write a short poem about the sea.",
    "What is the capital of France?",
    "List three prime numbers and explain why they are prime.",
    "Translate 'good morning' into Spanish.",
)


def _load_dense():
    model, tok = model_loader.load_model(str(model_loader.embedded_model_path()))
    assert cpu_fast_path.prepare_for_cpu(model, True) == "dense"
    return model, tok


@pytest.fixture(scope="module")
def dense_pair():
    """(plain dense model, fused dense model, tokenizer) of the embedded SmolLM2."""
    plain, tok = _load_dense()
    fused, _ = _load_dense()
    # 30 layers: 30 Q/K/V groups; 61 norms + 30 rotary modules compiled
    assert cpu_fuse.transform(fused) == {"projections": 30, "compiled": 91}
    return plain, fused, tok


def test_weights_replaced_not_doubled(dense_pair):
    plain, fused, _ = dense_pair
    plain_bytes, plain_count = param_bytes(plain)
    fused_bytes, fused_count = param_bytes(fused)
    assert fused_bytes == plain_bytes
    # 30 layers: 3 projection matrices become 1 fused one per layer
    assert plain_count - fused_count == 2 * len(plain.layers)
    names = dict(tree_flatten(fused.parameters()))
    assert names["model.layers.0.self_attn.q_proj.fused.weight"].shape == (960, 576)
    assert names["model.layers.0.mlp.gate_proj.weight"].shape == (1536, 576)
    assert not any(n.endswith("k_proj.weight") or n.endswith("v_proj.weight") for n in names)


def test_logits_close_on_prompt_and_step(dense_pair):
    plain, fused, tok = dense_pair
    worst = 0.0
    for prompt in PROMPTS:
        x = mx.array([tok.encode(prompt)])
        a, b = plain(x), fused(x)
        diff = mx.abs(a - b).max().item()
        worst = max(worst, diff)
        assert mx.array_equal(a.argmax(-1), b.argmax(-1)).item()
    print(f"max abs logit difference fused vs plain: {worst:.3g}")
    assert worst < 1e-3


def test_greedy_identical_batch_1(dense_pair):
    plain, fused, tok = dense_pair
    for prompt in PROMPTS[:2]:
        ids = mx.array(tok.encode(prompt))
        want = [t for t, _ in generate_step(ids, plain, max_tokens=24)]
        got = [t for t, _ in generate_step(ids, fused, max_tokens=24)]
        assert got == want, prompt


def test_greedy_identical_batch_of_4(dense_pair):
    plain, fused, tok = dense_pair
    prompts = [tok.encode(p) for p in PROMPTS]
    want, got = batch_tokens(plain, prompts), batch_tokens(fused, prompts)
    assert all(len(v) == 24 for v in want.values())
    assert got == want


@pytest.mark.parametrize("option", ["cpu_fuse:true", "cpu_fuse:false"])
def test_load_applies_transform_on_dense_cpu(option):
    from loading import loaded_model

    path = str(model_loader.embedded_model_path())
    lp = load_params(pb.ModelOptions(Model=path, Options=["cpu_dequantize:true", option]))
    loaded = loaded_model.load(lp)
    names = dict(tree_flatten(loaded.model.parameters()))
    fused = "model.layers.0.self_attn.q_proj.fused.weight" in names
    assert fused is (option == "cpu_fuse:true" and cpu_fuse.applies("dense", True))
    assert loaded.weights_bytes == sum(v.nbytes for v in names.values())
