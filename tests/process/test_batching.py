"""Continuous batching and cancellation over real gRPC: the real SmolLM2 server (session
fixture) checks that batching changes no output and that cancelled streams leave nothing
behind. Outputs are compared with the same request decoded alone and, for the reference
prompt, with its pinned greedy continuation (tests/data/smollm2-reference.json), so a
batch and a solo run that were wrong alike still fail."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from helpers import REFERENCE, counts, greedy, wait_idle, wait_until

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
PLAIN = next(c for c in REFERENCE["cases"] if c["name"] == "plain")
BUSY = backend_pb2.StatusResponse.BUSY


def reference_text(stub) -> str:
    """The pinned 40-token greedy continuation of ``PLAIN``'s prompt, as text."""
    return stub.Detokenize(backend_pb2.DetokenizeRequest(tokens=PLAIN["greedy_40"])).content


def test_eight_concurrent_greedy_requests_match_their_solo_output(stub):
    requests = [greedy(PLAIN["prompt"], tokens=40)] + [greedy(p, tokens=16) for p in PROMPTS[:7]]
    alone = [stub.Predict(r).message for r in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda r: stub.Predict(r).message, requests))
    assert together == alone
    assert together[0].decode("utf-8") == reference_text(stub)  # batched, still the reference
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
    next(calls[0])  # generation is under way; the other streams may still be arriving
    # No fixed cap by default (max_batch_size 256): the memory budget admits all twenty.
    wait_until(
        lambda: counts(stub) == (BUSY, 20, 0),
        timeout=60,
        explain=lambda: f"expected 20 running, got {counts(stub)}",
    )
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
    # The next request is served correctly: its pinned greedy continuation.
    reply = stub.Predict(greedy(PLAIN["prompt"], tokens=40))
    assert reply.message.decode("utf-8") == reference_text(stub) and reply.tokens == 40
    assert stub.Health(backend_pb2.HealthMessage()).message == b"OK"
