"""``ModelOptions.EngineArgs`` over real gRPC with a model: the options it names take effect
(and win over ``Options``), read back from GetMetrics' engine facts; a LoadModel whose
EngineArgs has an unknown key fails before anything is loaded, and the model already loaded
serves on. Parsing alone: tests/fast/test_engine_args.py."""

from __future__ import annotations

import json

import pytest
import tiny_models
from helpers import greedy
from inprocess import InProcessServer

import backend_pb2


@pytest.fixture(scope="module")
def srv():
    server = InProcessServer()
    yield server
    server.stop()


def facts(srv: InProcessServer) -> dict:
    return json.loads(srv.stub.GetMetrics(backend_pb2.MetricsRequest()).prompt_json_for_slot)


def test_engine_args_take_effect_and_unknown_keys_fail_the_load(srv, model_root):
    model = str(tiny_models.build("llama", model_root))
    res = srv.stub.LoadModel(
        backend_pb2.ModelOptions(
            Model=model,
            Options=["max_batch_size:5", "warmup:false"],
            EngineArgs=json.dumps({"max_batch_size": 3, "max_queue": 7}),
        )
    )
    assert res.success, res.message
    info = facts(srv)
    assert (info["max_batch_size"], info["max_queue"]) == (3, 7)
    assert srv.stub.Predict(greedy("Hello", 3)).tokens == 3

    res = srv.stub.LoadModel(
        backend_pb2.ModelOptions(
            Model=model, EngineArgs=json.dumps({"max_batch_size": 2, "tensor_parallel_size": 2})
        )
    )
    assert not res.success
    assert "'tensor_parallel_size'" in res.message and "max_batch_size" in res.message
    # Nothing was loaded: the model and its options serve on.
    assert (facts(srv)["max_batch_size"], facts(srv)["max_queue"]) == (3, 7)
    assert srv.stub.Predict(greedy("Hello", 3)).tokens == 3
