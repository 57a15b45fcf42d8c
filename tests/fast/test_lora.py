"""LoRA fields of LoadModel: read and validated by params.load_params, and a bad adapter
refused before the base model loads (no model: its name is never reached). Adapters on
a real model: tests/model/test_lora.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import mlx.core as mx
import pytest

import backend_pb2
from loading.model_loader import ModelLoadError, load_model
from params import load_params

NO_MODEL = "/nonexistent/base-model"  # reached only if the adapter check let it through
LORA = {"rank": 4, "scale": 10.0, "dropout": 0.0, "keys": ["self_attn.q_proj"]}


def _opts(**fields) -> backend_pb2.ModelOptions:
    return backend_pb2.ModelOptions(Model="m", **fields)


def test_load_params_reads_and_validates_lora_fields() -> None:
    assert (load_params(_opts()).lora_adapter, load_params(_opts()).lora_scale) == ("", 0.0)
    got = load_params(_opts(LoraAdapter="a", LoraScale=0.9))
    assert (got.lora_adapter, got.lora_scale) == ("a", 0.9)
    got = load_params(_opts(LoraAdapters=["a"], LoraScales=[2.0], LoraAdapter="a"))
    assert (got.lora_adapter, got.lora_scale) == ("a", 2.0)
    assert load_params(_opts(LoraScale=3.0)).lora_scale == 0.0  # no adapter: unused
    for scale in (-0.5, math.nan):
        with pytest.raises(ValueError, match=r"ModelOptions\.LoraScale must be"):
            load_params(_opts(LoraAdapter="a", LoraScale=scale))
    with pytest.raises(ValueError, match="only one LoRA adapter is supported"):
        load_params(_opts(LoraAdapter="a", LoraAdapters=["b"]))
    with pytest.raises(ValueError, match=r"LoraBase is not supported on MLX"):
        load_params(_opts(LoraAdapter="a", LoraBase="base.bin"))


def _adapter(directory: Path, lora: dict) -> str:
    """An adapter directory in mlx-lm's format (adapters.safetensors + adapter_config.json)."""
    directory = directory / "adapter"
    directory.mkdir()
    mx.save_safetensors(str(directory / "adapters.safetensors"), {"w": mx.zeros(1)})
    config = {"fine_tune_type": "lora", "num_layers": 2, "lora_parameters": lora}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return str(directory)


def _peft(directory: Path) -> str:
    directory = directory / "peft"
    directory.mkdir()
    (directory / "adapter_config.json").write_text("{}")
    (directory / "adapter_model.safetensors").write_bytes(b"")
    return str(directory)


def _gguf(directory: Path) -> str:
    (directory / "x.gguf").write_bytes(b"GGUF")
    return "x.gguf"  # relative: under ModelPath


@pytest.mark.parametrize(
    ("make", "scale", "words"),
    [
        (lambda d: "nope", 1.0, r"LoRA adapter .*/nope does not"),  # under ModelPath
        (_peft, 1.0, r"peft lacks adapters\.safetensors.*PEFT"),
        (_gguf, 1.0, r"x\.gguf is a GGUF \(llama\.cpp\) adapter"),
        (lambda d: _adapter(d, {"rank": 4}), 1.0, r"adapter_config\.json lacks lora_parameters\.s"),
        (lambda d: _adapter(d, LORA), -1.0, "LoRA scale must be"),
    ],
    ids=["missing", "peft", "gguf", "no-scale", "negative-scale"],
)
def test_a_bad_adapter_fails_before_the_model_loads(tmp_path, make, scale, words) -> None:
    adapter = make(tmp_path)
    with pytest.raises(ModelLoadError, match=words):
        load_model(NO_MODEL, adapter_path=adapter, model_path=str(tmp_path), lora_scale=scale)
