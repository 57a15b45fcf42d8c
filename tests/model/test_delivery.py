"""Delivery in steps over real gRPC on the embedded SmolLM2 (engine/delivery.py): a stream
whose reader lags gets several tokens in one reply with exactly the text a prompt reader
gets, and concurrent streams keep their solo texts. Units: tests/fast/test_delivery.py."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from helpers import greedy, stream_text, wait_idle

import backend_pb2
import backend_pb2_grpc
from loading.model_loader import embedded_model_path

PROMPTS = [
    "Once upon a time, in a quiet village,",
    "The three primary colours are",
    "def fibonacci(n):",
    "The capital of France is",
    "Write a haiku about the sea:",
    "Mercury, Venus, Earth,",
    "Zoë says 🙂 and",
    "1, 2, 3, 4,",
]


@pytest.fixture(scope="module")
def served(srv):
    res = srv.stub.LoadModel(backend_pb2.ModelOptions(Model=str(embedded_model_path())))
    assert res.success, res.message
    return srv


def test_a_stream_read_late_gets_fewer_replies_with_the_same_text(served):
    req = greedy("Tell me a long story.", tokens=64, IgnoreEOS=True)
    text, prompt_replies = stream_text(served.stub, req)
    # A small receive window, so the transport holds few replies for the lagging reader
    # and the server's writes wait for it (as in tests/process/test_isolation.py).
    late = grpc.insecure_channel(
        served.address,
        options=[("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)],
    )
    try:
        stream = backend_pb2_grpc.BackendStub(late).PredictStream(req, timeout=300)
        replies = [next(stream)]
        wait_idle(served.stub, timeout=120)  # generated to the end, the reader still away
        replies.extend(stream)
    finally:
        late.close()
    assert "".join(r.message.decode("utf-8") for r in replies) == text
    assert replies[-1].tokens == prompt_replies[-1].tokens == 64
    assert len(replies) < len(prompt_replies) and len(replies) < 64, len(replies)
    # Usage and timings of a merged reply are its latest step's: running totals.
    assert [r.tokens for r in replies] == sorted({r.tokens for r in replies})
    for r in replies:  # each reply's structured delta agrees with its message bytes
        assert "".join(d.content for d in r.chat_deltas) == r.message.decode("utf-8")
    print(f"late reader: {len(replies)} replies, prompt reader: {len(prompt_replies)}")


def test_eight_concurrent_streams_keep_their_solo_texts(served):
    reqs = [greedy(p, tokens=16) for p in PROMPTS]
    solo = [served.stub.Predict(r) for r in reqs]
    with ThreadPoolExecutor(len(reqs)) as pool:
        streamed = list(pool.map(lambda r: stream_text(served.stub, r), reqs))
    assert [text for text, _ in streamed] == [s.message.decode("utf-8") for s in solo]
    assert [replies[-1].tokens for _, replies in streamed] == [s.tokens for s in solo]
