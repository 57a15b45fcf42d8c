"""The embedded model by name over real gRPC: ``LoadModel(Model="embedded")`` loads the
bundled SmolLM2 as ``--model embedded`` does (docs/LOCALAI.md 1a: a server started
without a model)."""

from __future__ import annotations

from helpers import greedy

import backend_pb2
from loading import model_loader

OPTIONS = ["warmup:false"]


def test_load_model_embedded_serves_the_bundled_model(srv) -> None:
    path = model_loader.embedded_model_path()
    res = srv.stub.LoadModel(backend_pb2.ModelOptions(Model="embedded", Options=OPTIONS))
    assert res.success, res.message
    by_name = srv.stub.Predict(greedy("The capital of France is", 8)).message
    res = srv.stub.LoadModel(backend_pb2.ModelOptions(Model=str(path), Options=OPTIONS))
    assert res.success, res.message
    assert by_name == srv.stub.Predict(greedy("The capital of France is", 8)).message
    assert by_name.strip()
