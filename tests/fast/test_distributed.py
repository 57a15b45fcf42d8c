"""Distributed mode without a group: the split checks, call routing on rank 0, the
followers' prompt-cache matching, the vocabulary split and the plans sent to the other
ranks. Groups of processes: tests/distributed/test_distributed.py.
"""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import mlx.nn as nn
import pytest
from helpers import token_kv

import backend_pb2
import params
from distributed import follower, sharding
from distributed import plan as wire
from distributed.coordinator import Coordinator
from engine import core as engine_mod
from errors import FailedPrecondition

RANKS = 3  # the group size these units pretend


# ------------------------------------------------------------------ units (no group)
class _FakeGroup:
    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


class _Args:
    model_type = "llama"
    num_attention_heads = 9
    num_key_value_heads = 3


class _Shardable:
    args = _Args()

    def shard(self, group):  # pragma: no cover - never called by check_split
        raise AssertionError


def test_check_split_names_the_head_counts_and_the_sizes_that_work():
    sharding.check_split(_Shardable(), "tensor", 3)
    with pytest.raises(ValueError) as info:
        sharding.check_split(_Shardable(), "tensor", 2)
    message = str(info.value)
    assert "9 attention heads and 3 KV heads" in message
    assert "over 2 ranks" in message and "group sizes that work: 3" in message


def test_check_split_refuses_architectures_without_shard_or_pipeline():
    class NoSplit:
        args = _Args()
        model = object()

    with pytest.raises(ValueError, match="no tensor-parallel split"):
        sharding.check_split(NoSplit(), "tensor", 3)
    with pytest.raises(ValueError, match="no pipeline split"):
        sharding.check_split(_Shardable(), "pipeline", 3)


def test_rank_0_replicates_model_calls_keeps_tokenizer_calls_and_refuses_the_rest():
    coordinator = Coordinator(_FakeGroup(0, RANKS))
    sent = []
    coordinator._replicate = lambda op, args, local: sent.append(op) or "on every rank"
    assert coordinator.run(engine_mod.TOKENIZE, ("hi",), lambda text: [7]) == [7]
    assert sent == []  # a tokenizer call runs on rank 0 alone
    assert coordinator.run(engine_mod.LOAD, (None,), lambda p: None) == "on every rank"
    assert coordinator.run(engine_mod.FREE, (), lambda: None) == "on every rank"
    assert sent == [engine_mod.LOAD, engine_mod.FREE]
    with pytest.raises(FailedPrecondition, match="install is not supported"):
        coordinator.run(engine_mod.INSTALL, (), lambda: None)
    pinned = coordinator.pin_seed(params.generation_params(backend_pb2.PredictOptions(), None))
    assert pinned.seed is not None  # so every rank's sampler draws the same tokens
    assert coordinator.memory() == {
        "group_size": RANKS,
        **{f"weights_rank_{r}": 0 for r in range(RANKS)},
    }


def test_follower_prompt_cache_reuses_exactly_what_rank_0_reused():
    cache = follower.FollowerPromptCache(max_entries=4, max_bytes=None)
    cache.insert("m", [1, 2, 3, 4, 5], token_kv([1, 2, 3, 4, 5], n_layers=1))
    cache.expect = 3  # rank 0 had only a shorter entry
    hit = cache.fetch("m", [1, 2, 3, 4, 5, 6])
    assert hit.cached_tokens == 3 and hit.rest == [4, 5, 6] and hit.kv[0].offset == 3
    cache.expect = 0  # rank 0 missed
    miss = cache.fetch("m", [1, 2, 3, 9])
    assert miss.kv is None and miss.rest == [1, 2, 3, 9]
    cache.expect = 5
    with pytest.raises(follower.Desync):  # this rank lost an entry rank 0 kept
        cache.fetch("m", [7, 8, 9, 10, 11, 12])


def test_vocab_split_pads_the_last_rank_and_looks_up_exactly():
    full = nn.Embedding(10, 4)
    part = nn.Embedding(10, 4)
    part.weight = full.weight
    sharding._rows(part, 10, _FakeGroup(2, RANKS))  # rows of 4: ids 8, 9 + padding
    assert part.weight.shape == (4, 4)
    assert mx.array_equal(part.weight[:2], full.weight[8:]).item()
    assert not mx.any(part.weight[2:]).item()
    alone = nn.Embedding(10, 4)
    alone.weight = full.weight
    split = sharding.VocabParallelEmbedding(alone, 10, mx.distributed.init())  # 1 rank
    ids = mx.array([[1, 9, 0]])
    assert mx.array_equal(split(ids), full(ids)).item()
    h = mx.ones((1, 2, 4))
    assert mx.allclose(split.as_linear(h), full.as_linear(h)).item()


def test_plans_are_typed_values_that_pickle_to_the_other_ranks():
    sampled = params.generation_params(backend_pb2.PredictOptions(Temperature=0.7, Seed=5), None)
    plan = wire.Plan(
        ops=(wire.Join(7, (1, 2, 3), sampled, 16, 2, "normal"), wire.Leave(6)),
        step=True,
        call=wire.Call(engine_mod.FREE),
    )
    payload, flags = wire.encode(plan)
    assert wire.decode(payload, flags) == plan
    assert wire.encode(wire.Plan(idle=True)) == (b"", wire.IDLE)  # a heartbeat: header only
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.ops[0].uid = 8
