"""Backpressure over real gRPC without a model: a scripted in-process server
(tests/scripted.py, the toy tokenizer) checks the queue bounds, Status counts and deadline
cancellation. Batching a real model: tests/process/test_batching.py.
"""

from __future__ import annotations

import threading

import grpc
import pytest
from helpers import counts, wait_idle, wait_until
from inprocess import InProcessServer
from scripted import ScriptedModel

import backend_pb2
from seam.tokenizer import vocab_size


@pytest.fixture(scope="module")
def small_server(tok):
    model = ScriptedModel(vocab_size(tok), tok.eos_token_id, step_seconds=0.005)
    model.set_script(0, [])  # EOS straight away unless a test scripts more
    srv = InProcessServer(model, tok, options=["max_batch_size:2", "max_queue:1"])
    yield srv, model
    srv.stop()


def test_queue_overflow_is_resource_exhausted_and_status_counts(small_server):
    srv, _ = small_server
    req = backend_pb2.PredictOptions(Prompt="Hello", Tokens=30000, IgnoreEOS=True)
    calls = [srv.stub.PredictStream(req) for _ in range(3)]
    outcomes = []

    def drain(call):  # read promptly, as LocalAI does, so HTTP/2 flow control never stalls
        try:
            for _ in call:
                pass
            outcomes.append("finished")
        except grpc.RpcError as err:
            outcomes.append(err.code())

    readers = [threading.Thread(target=drain, args=(c,)) for c in calls]
    for t in readers:
        t.start()
    wait_until(lambda: counts(srv.stub)[1:] == (2, 1), 10, interval=0.02)
    assert counts(srv.stub) == (backend_pb2.StatusResponse.BUSY, 2, 1)
    with pytest.raises(grpc.RpcError) as err:
        srv.stub.Predict(req)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_batch_size=2" in err.value.details()
    for call in calls:
        call.cancel()
    for t in readers:
        t.join(30)
    assert outcomes == [grpc.StatusCode.CANCELLED] * 3
    wait_idle(srv.stub)
    # Capacity is back.
    assert srv.stub.Predict(backend_pb2.PredictOptions(Prompt="Hello", Tokens=3)).tokens >= 1


def test_unary_deadline_cancels_the_sequence(small_server):
    srv, _ = small_server
    req = backend_pb2.PredictOptions(Prompt="Hello", Tokens=30000, IgnoreEOS=True)
    with pytest.raises(grpc.RpcError) as err:
        srv.stub.Predict(req, timeout=0.5)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_idle(srv.stub)
