"""Every request kind decodes inside the batch, with the output it has alone.

A real Engine behind real gRPC (in this process), loaded with each option that used to
send requests out of the batch: n-gram speculation, a draft model, a quantized KV cache,
a rotating cache with NKeep. For each, one request alone, then the same request beside
two plain ones sent at once: the same greedy text, and the batch held all three at once
(its rows counted while they run; no solo sequence). A model whose cache has no batched
quantized form (Mamba 2's recurrent state) still answers, solo; one whose cache mlx-lm
cannot quantize at all (Gemma 3's sliding-window layers) is refused at LoadModel.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import tiny_models
from helpers import greedy
from inprocess import InProcessServer

import backend_pb2
from loading.model_loader import embedded_model_path

GGUF = str(embedded_model_path())
REPEAT = "Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus, Neptune\n" * 3 + "Mercury,"
OTHERS = ["Once upon a time, in a quiet village,", "The three primary colours are"]


def _load(srv: InProcessServer, model: str, *options: str, **fields) -> None:
    res = srv.stub.LoadModel(backend_pb2.ModelOptions(Model=model, Options=list(options), **fields))
    assert res.success, res.message


class Rows:
    """Largest batch and solo row counts seen while the block runs (polled)."""

    def __init__(self, srv: InProcessServer) -> None:
        self.srv, self.batch, self.solo = srv, 0, 0
        self._stop = threading.Event()

    def __enter__(self) -> Rows:
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            sched = self.srv.engine.scheduler
            if sched is not None:
                self.batch = max(self.batch, sched._batch.rows)
                self.solo = max(self.solo, sched._solo.rows)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _alone_and_batched(srv: InProcessServer, prompt: str, n: int, **fields) -> Rows:
    alone = srv.stub.Predict(greedy(prompt, tokens=n, **fields)).message
    reqs = [greedy(prompt, tokens=n, **fields), *(greedy(p, tokens=n) for p in OTHERS)]
    with Rows(srv) as rows, ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(srv.stub.Predict, reqs))
    assert replies[0].message == alone
    # The plain requests also answer as they do alone.
    for req, reply in zip(reqs[1:], replies[1:], strict=True):
        assert reply.message == srv.stub.Predict(req).message
    return rows


@pytest.mark.parametrize(
    ("options", "fields", "request_fields"),
    [
        (("speculative:ngram",), {}, {}),
        ((), {"DraftModel": "tiny"}, {}),
        (("kv_bits:4", "kv_group_size:32"), {}, {}),
        (("max_kv_size:40",), {}, {"NKeep": 8}),
    ],
    ids=["ngram", "draft_model", "kv_bits", "nkeep"],
)
def test_kind_runs_in_the_batch_with_its_alone_output(
    srv, model_root, options, fields, request_fields
):
    # N-gram drafts are accepted only where the model copies REPEAT's lines (the embedded
    # model does); the other kinds need no real text, so a tiny llama serves them quicker
    # (head dim 32: KV quantization groups of 32).
    tiny = str(tiny_models.build("llama", model_root))
    model = GGUF if "speculative:ngram" in options else tiny
    _load(srv, model, *options, **{k: tiny if v == "tiny" else v for k, v in fields.items()})
    n = 16 if "NKeep" not in request_fields else 24  # past the 40-token window
    rows = _alone_and_batched(srv, REPEAT, n, **request_fields)
    assert rows.batch == 3 and rows.solo == 0, (rows.batch, rows.solo)
    metrics = srv.stub.GetMetrics(backend_pb2.MetricsRequest())
    assert metrics.tokens_generated > 0


def test_quantized_tiny_family_and_the_solo_fallback(srv, model_root):
    # A tiny llama (head dim 32: group size 32) quantizes in the batch.
    _load(srv, str(tiny_models.build("llama", model_root)), "kv_bits:8", "kv_group_size:32")
    rows = _alone_and_batched(srv, REPEAT, 16)
    assert rows.batch == 3 and rows.solo == 0
    # Mamba 2's recurrent state has no batched quantized form: solo, same text.
    _load(srv, str(tiny_models.build("mamba2", model_root)), "kv_bits:8", "kv_group_size:32")
    rows = _alone_and_batched(srv, REPEAT, 16)
    assert rows.solo == 3 and rows.batch == 0  # every request of this load
    # Gemma 3's sliding-window layers cannot be quantized at all (mlx-lm): refused at load.
    res = srv.stub.LoadModel(
        backend_pb2.ModelOptions(
            Model=str(tiny_models.build("gemma3_text", model_root)), Options=["kv_bits:8"]
        )
    )
    assert not res.success and "sliding-window" in res.message


def test_logprobs_beside_rows_that_skip_them(srv):
    """Greedy rows without logprobs skip the log-softmax (`batch.decode.DecodeBatch`'s lean
    step); a row that asks for logprobs in the same batch (all three rows at once, no
    solo sequence) still gets them, equal to its alone reply."""
    _load(srv, GGUF)
    req = greedy(REPEAT, tokens=8, Logprobs=2)
    alone = srv.stub.Predict(req)
    assert alone.logprobs
    with Rows(srv) as rows, ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(srv.stub.Predict, r) for r in (greedy(OTHERS[0], tokens=24), req)]
        futures.append(pool.submit(srv.stub.Predict, greedy(OTHERS[1], tokens=24)))
        replies = [f.result() for f in futures]
    assert rows.batch == 3 and rows.solo == 0, (rows.batch, rows.solo)
    assert replies[1].message == alone.message
    # The same tokens and log-probabilities (a batch's matmuls round differently).
    got, want = json.loads(replies[1].logprobs), json.loads(alone.logprobs)
    assert [t["token"] for t in got["content"]] == [t["token"] for t in want["content"]]
    for g, w in zip(got["content"], want["content"], strict=True):
        assert g["logprob"] == pytest.approx(w["logprob"], abs=1e-3)
    assert not replies[0].logprobs
