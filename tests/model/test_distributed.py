"""Distributed mode in one process: a rank loads its part through the one loader (a tiny
qwen2 with SmolLM2's tokenizer, a group of one)."""

from __future__ import annotations

import mlx.core as mx
import tiny_models

import backend_pb2
import params
from distributed import sharding
from distributed.collectives import Collectives


def test_a_rank_loads_its_part_through_the_one_loader(tmp_path):
    """``sharding.load`` is ``loaded_model.load`` with the split step: what the loader
    applies to every model (here cpu_fuse's compiled norms) applies to a rank's part."""
    path = tiny_models.split_model(tmp_path, "qwen2", heads=4, kv_heads=2, layers=4)
    net = Collectives(mx.distributed.init())  # a group of one: collectives pass through
    released = []
    load = params.load_params(
        backend_pb2.ModelOptions(Model=str(path), Options=["cpu_dequantize:true"])
    )
    loaded, weights = sharding.load(net, load, "tensor", lambda: released.append(True))
    assert released == [True]  # the current model goes once the split is agreed on
    assert weights == [loaded.weights_bytes] and loaded.params is load
    kinds = {type(m).__name__ for m in loaded.model.modules()}
    assert "AllToShardedLinear" in kinds  # split by the model's shard()
    if mx.default_device().type == mx.DeviceType.cpu:
        assert loaded.cpu_mode == "dense" and "CompiledRMSNorm" in kinds
