"""Distributed mode in one process: a rank loads its part through the one loader (a tiny
qwen2 with SmolLM2's tokenizer, a group of one)."""

from __future__ import annotations

import mlx.core as mx
import pytest
import tiny_models

import backend_pb2
import params
from distributed import sharding
from distributed.collectives import Collectives


@pytest.fixture(scope="module")
def rank_part(tmp_path_factory):
    """(loaded, weights, load params, released) of a rank's part, loaded once."""
    path = tiny_models.split_model(
        tmp_path_factory.mktemp("split"), "qwen2", heads=4, kv_heads=2, layers=4
    )
    net = Collectives(mx.distributed.init())  # a group of one: collectives pass through
    released: list[bool] = []
    load = params.load_params(
        backend_pb2.ModelOptions(Model=str(path), Options=["cpu_dequantize:true"])
    )
    loaded, weights = sharding.load(net, load, "tensor", lambda: released.append(True))
    return loaded, weights, load, released


def test_a_rank_loads_its_part_through_the_one_loader(rank_part):
    """``sharding.load`` is ``loaded_model.load`` with the split step."""
    loaded, weights, load, released = rank_part
    assert released == [True]  # the current model goes once the split is agreed on
    assert weights == [loaded.weights_bytes] and loaded.params is load
    kinds = {type(m).__name__ for m in loaded.model.modules()}
    assert "AllToShardedLinear" in kinds  # split by the model's shard()


@pytest.mark.skipif(
    mx.default_device() != mx.cpu, reason="cpu_dequantize and cpu_fuse act on the CPU only"
)
def test_what_the_loader_does_on_cpu_applies_to_a_rank_part(rank_part):
    """What the loader applies to every model on the CPU (dense weights, cpu_fuse's
    compiled norms) applies to a rank's part too."""
    loaded = rank_part[0]
    kinds = {type(m).__name__ for m in loaded.model.modules()}
    assert loaded.cpu_mode == "dense" and "CompiledRMSNorm" in kinds
