"""Mixed concurrent requests on a quantized KV cache (``kv_bits`` 8 and 4) answer as they
do alone: greedy ones with logprobs, seeded sampled ones, penalties, a logit bias, two that
share a prefix, a stream beside a Predict of the same request, and the first request sent
alone again afterwards (a prompt-cache hit) as its cold run.

A real Engine behind real gRPC, in this process, with the tiny llama of tests/tiny_models.py
(2 layers, head dim 32: group size 32), small enough that its float K/V agree to the last
bit however the batch is shaped. On a larger model the float K/V of a row can differ in
their last bits with the batch's and the chunk's shapes, and quantization turns such a bit
into a whole step (docs/DECODING.md, "Quantized KV and batch invariance",
tests/fast/test_quantized_kv.py); what this test holds is every path of the batch
quantizing the same K/V the same way.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import tiny_models
from helpers import greedy, stream_text

import backend_pb2

PREFIX = "The old lighthouse keeper wrote in his log every evening, " * 3
PROMPTS = [
    PREFIX + "and on the last night he wrote",
    PREFIX + "until the storm came and",
    "Mercury, Venus, Earth, Mars,",
    "Once upon a time, in a quiet village,",
    "The three primary colours are",
]


def _requests() -> list[backend_pb2.PredictOptions]:
    return [
        greedy(PROMPTS[0], tokens=16, Logprobs=2),
        greedy(PROMPTS[1], tokens=16, Logprobs=1),
        backend_pb2.PredictOptions(
            Prompt=PROMPTS[2], Tokens=16, Temperature=0.9, TopP=0.95, Seed=4242
        ),
        greedy(PROMPTS[3], tokens=16, Penalty=1.3, FrequencyPenalty=0.5),
        greedy(PROMPTS[4], tokens=16, LogitBias=json.dumps({"13": 5.0, "198": -100})),
        backend_pb2.PredictOptions(
            Prompt=PROMPTS[3], Tokens=12, Temperature=1.0, Seed=7, IgnoreEOS=True
        ),
    ]


def _same(got: backend_pb2.Reply, want: backend_pb2.Reply) -> None:
    assert got.message == want.message
    if want.logprobs:  # the same tokens; log-probabilities to the batch's float rounding
        g, w = json.loads(got.logprobs)["content"], json.loads(want.logprobs)["content"]
        assert [t["token"] for t in g] == [t["token"] for t in w]
        for a, b in zip(g, w, strict=True):
            assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-3)


@pytest.mark.parametrize("bits", [8, 4])
def test_mixed_requests_on_quantized_kv_equal_their_solo_outputs(srv, model_root, bits):
    tiny = str(tiny_models.build("llama", model_root))
    res = srv.stub.LoadModel(
        backend_pb2.ModelOptions(Model=tiny, Options=[f"kv_bits:{bits}", "kv_group_size:32"])
    )
    assert res.success, res.message
    reqs = _requests()
    cold = srv.stub.Predict(reqs[0])  # the first request, the prompt cache empty
    alone = [cold, *(srv.stub.Predict(r) for r in reqs[1:])]
    assert len({a.message for a in alone}) == len(alone)
    with ThreadPoolExecutor(len(reqs) + 1) as pool:
        stream = pool.submit(stream_text, srv.stub, reqs[0])
        together = list(pool.map(srv.stub.Predict, reqs))
        streamed, _ = stream.result()
    for got, want in zip(together, alone, strict=True):
        _same(got, want)
    assert streamed == cold.message.decode()
    hits = srv.engine.scheduler.cache.stats().hits
    again = srv.stub.Predict(reqs[0])
    assert srv.engine.scheduler.cache.stats().hits == hits + 1  # its prefix from the cache
    _same(again, cold)
