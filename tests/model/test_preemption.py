"""Preemption under the memory budget (engine/preemption.py) over real gRPC, in this
process, on a tiny llama and on a family with recurrent state beside its KV
(qwen3_5: gated delta layers; both tests/tiny_models.py): a budget set from the figures Status
reports (weights, KV per token, prefill working set per token), so that every request is
admitted on the KV it holds now and the newest give way when the running rows cross into
their next 256-token KV step. Every output equals the request's solo output (greedy, and
seeded sampling), Status counts the preemptions and the resumes, and the KV moved.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import tiny_models
from helpers import greedy, status, wait_idle
from inprocess import InProcessServer

import backend_pb2
from engine.memory import budget_for

CHUNK = 16  # prefill_step_size: admission and the step check leave the same working set
NEW = 24  # tokens each request generates (IgnoreEOS): the rows cross 256 tokens
SENT = 3
OPTIONS = ("warmup:false", f"prefill_step_size:{CHUNK}", "max_batch_size:16")
KV_STEP = 256


def _prompts(n: int) -> list[str]:
    # ~245 tokens each: the KV of prompt + the first few tokens is one 256-token step.
    words = ["river", "stone", "lamp", "orchard", "violet", "harbor", "copper", "meadow"]
    return [
        f"Story {i}: " + " ".join(words[(i * 3 + k) % len(words)] for k in range(236))
        for i in range(n)
    ]


def _request(prompt: str, seeded: bool) -> backend_pb2.PredictOptions:
    extra = {"Temperature": 0.9, "Seed": 1234, "TopP": 0.95} if seeded else {}
    return greedy(prompt, NEW, IgnoreEOS=True, **extra)


@pytest.fixture(scope="module")
def served():
    s = InProcessServer()
    try:
        yield s
    finally:
        s.stop()


def _load(srv, path: str, budget: int) -> None:
    res = srv.stub.LoadModel(
        backend_pb2.ModelOptions(Model=path, Options=[f"memory_budget:{budget}", *OPTIONS])
    )
    assert res.success, res.message


def _in_order(srv, reqs) -> list[bytes]:
    """Send ``reqs`` at once, each 20 ms after the one before (admitted in this order)."""

    def send(i: int) -> bytes:
        time.sleep(0.02 * i)
        return srv.stub.Predict(reqs[i]).message

    with ThreadPoolExecutor(len(reqs)) as pool:
        return list(pool.map(send, range(len(reqs))))


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_preempted_requests_resume_with_their_solo_output(served, model_root, family) -> None:
    # Tiny random-weight models: the same path as the embedded model's, in a tenth of the
    # time (tests/process/test_memory_budget.py runs the embedded model under a budget).
    path = str(tiny_models.build(family, model_root))
    prompts = _prompts(SENT)
    # Sent in this order (greedy, seeded, greedy): the newest two give way, one of each.
    reqs = [_request(p, seeded=i % 2 == 1) for i, p in enumerate(prompts)]
    _load(served, path, 64 * 1024**3)  # a budget that never binds: the solo outputs
    s = status(served.stub)
    lengths = [len(served.stub.TokenizeString(greedy(p, 1)).tokens) for p in prompts]
    assert all(n + 3 < KV_STEP < n + NEW for n in lengths), lengths
    solo = [served.stub.Predict(r).message for r in reqs]
    step = s["memory_fixed_per_sequence"] + s["memory_kv_per_token"] * KV_STEP
    # A step leaves room for one copy of the running KV (engine.memory.copies): all three
    # are admitted at one KV step each (3 steps and their copy: 6); once they cross into
    # their second step only one fits (2 rows: 8 > 6.5): the newest two give way (a
    # victim's KV goes to the prompt cache's memory tier where the room left holds it)
    # and resume as the first ends. The prefill floor: a chunk beside a full KV step.
    prefill = CHUNK * s["memory_prefill_per_token"]
    prefill += CHUNK * (KV_STEP + CHUNK) * s["memory_prefill_per_pair"]
    # The buffer cache's share of the budget comes on top (engine.memory.budget_for).
    budget = budget_for(s["weights"] + prefill + int(6.5 * step))
    _load(served, path, budget)
    together = _in_order(served, reqs)
    after = wait_idle(served.stub)
    assert together == solo
    assert after["preemptions"] >= 2, after
    assert after["preemption_resumes"] == after["preemptions"]
    moved = {k: v for k, v in after.items() if k.startswith("preempt")}
    assert after["preemption_bytes_to_cache"] > 0, moved
    assert after["preemption_bytes_from_cache"] > 0, moved
    assert after["memory_reserved"] == 0
