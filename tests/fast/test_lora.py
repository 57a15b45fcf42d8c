"""LoRA fields of LoadModel: read and validated by params.load_params (no model)."""

from __future__ import annotations

import math

import pytest

import backend_pb2
from params import load_params


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
