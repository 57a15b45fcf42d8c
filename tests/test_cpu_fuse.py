"""cpu_fuse: fused Q/K/V and gate/up projections give the same output, on the embedded
model (dense float32, greedy token for token, batch 1 and a batch of 4 through
BatchGenerator) and on tiny random-weight models of every family it applies to; other
families and quantized layers are left alone; parameter memory is not doubled."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.generate import BatchGenerator, generate_step
from mlx_lm.utils import _get_classes

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
def smol():
    """(plain dense model, fused dense model, tokenizer) of the embedded SmolLM2."""
    plain, tok = _load_dense()
    fused, _ = _load_dense()
    # 30 layers: 30 Q/K/V groups; 61 norms + 30 rotary modules compiled
    assert cpu_fuse.transform(fused) == {"projections": 30, "compiled": 91}
    return plain, fused, tok


def _param_bytes(model) -> tuple[int, int]:
    flat = tree_flatten(model.parameters())
    return sum(v.nbytes for _, v in flat), len(flat)


def test_weights_replaced_not_doubled(smol):
    plain, fused, _ = smol
    plain_bytes, plain_count = _param_bytes(plain)
    fused_bytes, fused_count = _param_bytes(fused)
    assert fused_bytes == plain_bytes
    # 30 layers: 3 projection matrices become 1 fused one per layer
    assert plain_count - fused_count == 2 * len(plain.layers)
    names = dict(tree_flatten(fused.parameters()))
    assert names["model.layers.0.self_attn.q_proj.fused.weight"].shape == (960, 576)
    assert names["model.layers.0.mlp.gate_proj.weight"].shape == (1536, 576)
    assert not any(n.endswith("k_proj.weight") or n.endswith("v_proj.weight") for n in names)


def test_logits_close_on_prompt_and_step(smol):
    plain, fused, tok = smol
    worst = 0.0
    for prompt in PROMPTS:
        x = mx.array([tok.encode(prompt)])
        a, b = plain(x), fused(x)
        diff = mx.abs(a - b).max().item()
        worst = max(worst, diff)
        assert mx.array_equal(a.argmax(-1), b.argmax(-1)).item()
    print(f"max abs logit difference fused vs plain: {worst:.3g}")
    assert worst < 1e-3


def test_greedy_identical_batch_1(smol):
    plain, fused, tok = smol
    for prompt in PROMPTS[:3]:
        ids = mx.array(tok.encode(prompt))
        want = [t for t, _ in generate_step(ids, plain, max_tokens=32)]
        got = [t for t, _ in generate_step(ids, fused, max_tokens=32)]
        assert got == want, prompt


def _batch_tokens(model, prompts: list[list[int]], n: int = 24) -> dict[int, list[int]]:
    """Greedy tokens of ``prompts`` decoded together by BatchGenerator (different prompt
    lengths: left padding, per-sequence rotary offsets)."""
    k = len(prompts)
    gen = BatchGenerator(model, stop_tokens=[], completion_batch_size=k, prefill_batch_size=k)
    uids = gen.insert(prompts, max_tokens=[n] * k)
    out: dict[int, list[int]] = {u: [] for u in uids}
    for _ in range(200):
        _, responses = gen.next()
        for r in responses:
            out[r.uid].append(r.token)
        if all(len(v) == n for v in out.values()):
            break
    gen.close()
    return {i: out[u] for i, u in enumerate(uids)}


def test_greedy_identical_batch_of_4(smol):
    plain, fused, tok = smol
    prompts = [tok.encode(p) for p in PROMPTS]
    want, got = _batch_tokens(plain, prompts), _batch_tokens(fused, prompts)
    assert all(len(v) == 24 for v in want.values())
    assert got == want


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
    before = _param_bytes(plain)[0]
    counts = cpu_fuse.transform(fused)
    assert counts["projections"] == 2 and counts["compiled"] >= 5
    assert cpu_fuse.fuse_projections(fused, mlp=True) == 2  # gate/up too (off by default)
    assert _param_bytes(fused)[0] == before
    x = mx.array([[1, 5, 9, 33, 2, 77, 4]])
    a, b = plain(x), fused(x)
    assert mx.abs(a - b).max().item() < 1e-4
    ids = mx.array([3, 8, 21, 5])
    want = [t for t, _ in generate_step(ids, plain, max_tokens=12)]
    got = [t for t, _ in generate_step(ids, fused, max_tokens=12)]
    assert got == want
    prompts = [[3, 8, 21, 5], [7, 1, 2, 90, 11, 6, 40], [12, 13]]
    assert _batch_tokens(fused, prompts, 8) == _batch_tokens(plain, prompts, 8)


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


@pytest.mark.model
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


def test_option_parsed():
    assert load_params(pb.ModelOptions(Model="m")).cpu_fuse is True
    assert load_params(pb.ModelOptions(Model="m", Options=["cpu_fuse:false"])).cpu_fuse is False
    with pytest.raises(ValueError, match="cpu_fuse"):
        load_params(pb.ModelOptions(Model="m", Options=["cpu_fuse:maybe"]))
