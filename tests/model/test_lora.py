"""LoRA adapters at load: a tiny mlx-lm adapter made here on the embedded SmolLM2 GGUF
changes the logits, LoraScale multiplies its effect, it survives the CPU dense mode, and
bad adapters fail with messages naming the path (the LoRA fields: tests/fast/test_lora.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from loading import cpu_fast_path
from loading.model_loader import (
    ModelLoadError,
    apply_adapter,
    fuse_adapters,
    load_model,
)

PROMPT = "The sky is"  # 3 tokens: short keeps the forward passes cheap
LORA = {
    "rank": 4,
    "scale": 10.0,
    "dropout": 0.0,
    "keys": ["self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"],
}


def _embedded() -> str:
    from loading import model_loader

    return str(model_loader.embedded_model_path())


def _logits(model, ids: mx.array) -> mx.array:
    out = model(ids)[0, -1].astype(mx.float32)
    mx.eval(out)
    return out


def _write_adapter(directory: Path, weights: dict[str, mx.array], lora: dict) -> Path:
    """Save in mlx-lm's format: adapters.safetensors + adapter_config.json."""
    directory.mkdir(parents=True)
    mx.save_safetensors(str(directory / "adapters.safetensors"), weights)
    config = {"fine_tune_type": "lora", "num_layers": 2, "lora_parameters": lora}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The embedded model (loaded once: loads are slow on a busy CPU), its logits for
    PROMPT, and an adapter made by hand on it in mlx-lm's format."""
    from mlx_lm.tuner.utils import linear_to_lora_layers, remove_lora_layers

    model, tokenizer = load_model(_embedded())
    ids = mx.array([tokenizer.encode(PROMPT)])
    logits = _logits(model, ids)
    # As mlx_lm.lora does: freeze, wrap the last 2 layers, save the trainable tensors.
    model.freeze()
    linear_to_lora_layers(model, 2, LORA)
    trainable = dict(tree_flatten(model.trainable_parameters()))
    key = mx.random.key(0)
    weights = {  # lora_b starts at zero: give it small random values
        name: mx.random.normal(value.shape, key=key) * 0.01 if name.endswith("lora_b") else value
        for name, value in trainable.items()
    }
    assert len(weights) == 12  # 2 layers x 3 linears x (lora_a, lora_b)
    remove_lora_layers(model)
    model.unfreeze()
    root = tmp_path_factory.mktemp("lora")
    return {
        "model": model,
        "ids": ids,
        "logits": logits,
        "root": root,
        "adapter": _write_adapter(root / "adapter", weights, LORA),
        "weights": weights,
    }


def _shift(base: dict, logits: mx.array) -> float:
    return mx.abs(logits - base["logits"]).max().item()


def test_load_model_applies_a_relative_adapter_that_survives_cpu_dense_mode(
    base: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Named relative to ModelPath, as LocalAI sends it; dequantized, then fused."""
    model, _ = load_model(_embedded(), "", str(base["root"]), adapter_path="adapter")
    layer = model.model.layers[-1].self_attn.q_proj
    # The GGUF base is quantized: the adapter stays beside it, at the trained scale.
    assert type(layer).__name__ == "LoRALinear" and layer.scale == LORA["scale"]
    assert type(layer.linear).__name__ == "QuantizedLinear"
    assert type(model.model.layers[0].self_attn.q_proj).__name__ == "QuantizedLinear"
    quantized = _logits(model, base["ids"])
    assert _shift(base, quantized) > 1e-3

    # The BLAS speed check only informs "auto"; skip its timing runs.
    report = cpu_fast_path.BlasReport("test", 100.0, True)
    monkeypatch.setattr(cpu_fast_path, "_blas_report_for_load", lambda: report)
    assert cpu_fast_path.prepare_for_cpu(model, "true", device=mx.Device(mx.cpu)) == "dense"
    layer = model.model.layers[-1].self_attn.q_proj
    assert type(layer).__name__ == "LoRALinear" and type(layer.linear).__name__ == "Linear"
    dense = _logits(model, base["ids"])
    assert mx.abs(dense - quantized).max().item() < 5e-2
    assert _shift(base, dense) > 1e-3

    assert fuse_adapters(model) == 6
    assert type(model.model.layers[-1].self_attn.q_proj).__name__ == "Linear"
    assert mx.abs(_logits(model, base["ids"]) - dense).max().item() < 1e-3


def test_lora_scale_multiplies_the_effect(base: dict) -> None:
    """apply_adapter is what load_model(lora_scale=...) calls; the shared base is reused."""
    from mlx_lm.tuner.utils import remove_lora_layers

    model, shift = base["model"], {}
    for scale in (0.5, 2.0):
        apply_adapter(model, base["adapter"], scale)
        assert model.model.layers[-1].self_attn.q_proj.scale == LORA["scale"] * scale
        shift[scale] = _shift(base, _logits(model, base["ids"]))
        remove_lora_layers(model)
    assert shift[0.5] > 1e-3
    # A small update: the logit shift grows about linearly with the scale (x4 here).
    assert 3.0 < shift[2.0] / shift[0.5] < 5.0
    assert _shift(base, _logits(model, base["ids"])) == 0.0  # the base is restored


def test_adapter_for_another_model_is_a_load_error(base: dict, tmp_path: Path) -> None:
    """Rank 2 in the config, rank 4 in the tensors: every shape differs."""
    from mlx_lm.tuner.utils import remove_lora_layers

    wrong = _write_adapter(tmp_path / "wrong", base["weights"], {**LORA, "rank": 2})
    try:
        with pytest.raises(ModelLoadError, match=r"(?s)cannot apply LoRA adapter .*wrong.*shape"):
            apply_adapter(base["model"], wrong)
    finally:
        remove_lora_layers(base["model"])
