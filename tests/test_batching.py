"""Continuous batching, cancellation and backpressure, over real gRPC.

The real SmolLM2 server (session fixture) checks that batching changes no output and that
cancelled streams leave nothing behind; a scripted in-process server checks the queue
bounds and Status counts without waiting on a real model.
"""

from __future__ import annotations

import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from mlx_lm import tokenizer_utils
from scripted import InProcessServer, ScriptedModel
from test_output import PIECES, build_hf

import backend_pb2

PROMPTS = [
    "Water boils at",
    "My favourite fruit is",
    "The tallest mountain on Earth is",
    "In 1969, astronauts",
    "Python is a programming language that",
    "The best way to learn is",
    "Cats and dogs are",
    "Once upon a time in a faraway land",
]


def greedy(prompt: str, tokens: int = 16, **fields) -> backend_pb2.PredictOptions:
    return backend_pb2.PredictOptions(Prompt=prompt, Tokens=tokens, Temperature=0.0, **fields)


def status(stub):
    s = stub.Status(backend_pb2.HealthMessage())
    return s.state, s.memory.breakdown["requests_running"], s.memory.breakdown["requests_waiting"]


def wait_idle(stub, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if status(stub) == (backend_pb2.StatusResponse.READY, 0, 0):
            return
        time.sleep(0.05)
    raise AssertionError(f"server never went idle: {status(stub)}")


def test_eight_concurrent_greedy_requests_match_their_solo_output(stub):
    alone = [stub.Predict(greedy(p)).message for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: stub.Predict(greedy(p)).message, PROMPTS))
    assert together == alone
    assert all(len(m) > 10 for m in alone)


def test_seeded_request_is_the_same_alone_and_with_three_others(stub):
    seeded = backend_pb2.PredictOptions(
        Prompt="The weather today is", Tokens=16, Temperature=0.9, TopP=0.95, Seed=4242
    )
    alone = stub.Predict(seeded).message
    # Unseeded at temperature 1: IgnoreEOS, so each runs its 20 tokens beside the seeded one.
    others = [
        backend_pb2.PredictOptions(Prompt=p, Tokens=20, Temperature=1.0, IgnoreEOS=True)
        for p in PROMPTS[:3]
    ]
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(stub.Predict, r) for r in others]
        mine = pool.submit(stub.Predict, seeded)
        assert mine.result().message == alone
        assert all(f.result().tokens == 20 for f in futures)


def test_cancelling_twenty_streams_leaves_server_clean(stub):
    wait_idle(stub)
    before = stub.Status(backend_pb2.HealthMessage()).memory.breakdown
    calls = [stub.PredictStream(greedy(f"Story number {i}: the", tokens=400)) for i in range(20)]
    next(calls[0])  # generation is under way
    state, running, waiting = status(stub)
    assert state == backend_pb2.StatusResponse.BUSY and running == 8 and waiting == 12
    for call in calls:
        call.cancel()
    for call in calls:
        with pytest.raises(grpc.RpcError) as err:
            list(call)
        assert err.value.code() == grpc.StatusCode.CANCELLED
    wait_idle(stub)
    after = stub.Status(backend_pb2.HealthMessage()).memory.breakdown
    assert after["kv_active"] == 0
    # Active memory is back to idle, apart from KV kept on purpose in the prompt cache.
    kept = after["prompt_cache"] - before["prompt_cache"]
    assert after["mlx_active"] <= before["mlx_active"] + kept + 64 * 2**20
    # The next request is served correctly.
    assert stub.Predict(greedy(PROMPTS[0])).message == stub.Predict(greedy(PROMPTS[0])).message
    assert stub.Health(backend_pb2.HealthMessage()).message == b"OK"


@pytest.fixture(scope="module")
def small_server():
    with tempfile.TemporaryDirectory() as tmp:
        build_hf(PIECES).save_pretrained(tmp)
        tok = tokenizer_utils.load(Path(tmp))
    model = ScriptedModel(len(tok), tok.eos_token_id, step_seconds=0.005)
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
    deadline = time.monotonic() + 10
    while status(srv.stub)[1:] != (2, 1) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert status(srv.stub) == (backend_pb2.StatusResponse.BUSY, 2, 1)
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
