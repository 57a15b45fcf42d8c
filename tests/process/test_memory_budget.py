"""The memory budget over real gRPC (engine/memory.py): a budget set from what this test
measures first (the weights, the KV per token, the prefill working set per token, as the
server reports them in Status), on the embedded model and on a family whose cache is
recurrent state (mamba2).

More requests than the budget holds at once all finish with their solo greedy output,
fewer run at once than were sent, MLX's peak stays within the budget (+10%); a request
that can never fit is refused at once (RESOURCE_EXHAUSTED, with the numbers) while the
others stream on; a budget below the weights fails LoadModel. Requests with a large
Tokens and short outputs are admitted on the KV they hold (more at once than reserving
at the longest allowed).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import tiny_models
from helpers import greedy, status, wait_until

import backend_pb2
from engine.memory import budget_for
from loading import model_loader

PROMPT_WORDS = 60  # ~130-token prompts
NEW_TOKENS = 8
SENT = 4  # concurrent requests; the budget holds 2
OPTIONS = ("warmup:false",)  # the kernels are warm after the first load anyway
AGENTS = 8  # requests with a large Tokens and a short output, sent at once
AGENT_TOKENS = 2048


def _prompts(n: int) -> list[str]:
    words = ["river", "stone", "lamp", "orchard", "violet", "harbor", "copper", "meadow"]
    return [
        f"Story {i}: " + " ".join(words[(i + k) % len(words)] for k in range(PROMPT_WORDS))
        for i in range(n)
    ]


def _predict_all(stub, prompts: list[str]) -> list[bytes]:
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: stub.Predict(greedy(p, NEW_TOKENS)).message, prompts))


def _watch_running(stub, stop: threading.Event) -> list[int]:
    seen: list[int] = []

    def poll() -> None:
        while not stop.is_set():
            seen.append(status(stub)["requests_running"])
            stop.wait(0.02)

    threading.Thread(target=poll, daemon=True).start()
    return seen


class Measured:
    """One model as this test measured it: loaded with a budget that never binds, its
    weights and memory profile (Status), and the solo greedy output of each prompt."""

    def __init__(self, srv, model: str, prompts: list[str]) -> None:
        self.srv, self.model = srv, model
        srv.load(model, [f"memory_budget:{64 * 1024**3}", *OPTIONS])
        s = status(srv.stub)
        self.weights = s["weights"]
        self.per_token = s["memory_kv_per_token"]
        self.fixed = s["memory_fixed_per_sequence"]
        self.prefill = s["memory_prefill_per_token"]
        stub = srv.stub
        self.ids = [len(stub.TokenizeString(greedy(p, 1)).tokens) for p in prompts]
        self.solo = [stub.Predict(greedy(p, NEW_TOKENS)).message for p in prompts]

    def budget(self, rows: float) -> int:
        """The weights, the prefill of one prompt and ``rows`` sequences, at their longest,
        beside MLX's buffer cache at its limit (a share of the budget)."""
        longest = max(self.ids) + NEW_TOKENS
        seq = self.fixed + self.per_token * -(-longest // 256) * 256  # allocated per 256
        need = self.weights + self.prefill * max(self.ids) + int(rows * seq)
        return budget_for(need)

    def load(self, budget: int) -> None:
        self.srv.load(self.model, [f"memory_budget:{budget}", *OPTIONS])


@pytest.fixture(scope="module")
def smol(srv) -> Measured:
    return Measured(srv, str(model_loader.embedded_model_path()), _prompts(AGENTS))


def test_more_requests_than_fit_all_finish_with_their_solo_output(srv, smol) -> None:
    budget = smol.budget(2.5)
    smol.load(budget)
    s = status(srv.stub)
    assert s["memory_budget"] == budget and s["memory_reserved"] == 0
    stop = threading.Event()
    running = _watch_running(srv.stub, stop)
    together = _predict_all(srv.stub, _prompts(SENT))
    stop.set()
    assert together == smol.solo[:SENT]
    assert 1 <= max(running) < SENT, running  # the budget held some back
    after = status(srv.stub)
    assert after["mlx_peak"] <= budget * 1.1, (after["mlx_peak"], budget)
    assert after["memory_reserved"] == 0


def test_large_tokens_with_short_outputs_run_more_at_once_than_reservation(srv, smol) -> None:
    """Agents send Tokens of thousands and use a fraction: admitted on the KV they hold
    (engine/preemption.py), eight such requests run at once under a budget in which
    reserving each at its longest (prompt + Tokens) ran two, with their solo outputs."""
    prompts = _prompts(AGENTS)
    smol.load(64 * 1024**3)
    # Each request stops where its own greedy text reaches the end of its first
    # NEW_TOKENS tokens (a stop string: its output is the same alone or batched).
    stops = [text.decode()[-8:] for text in smol.solo]
    assert all(s.strip() for s in stops), stops
    reqs = [greedy(p, AGENT_TOKENS, StopPrompts=[s]) for p, s in zip(prompts, stops, strict=True)]
    solo = [srv.stub.Predict(r).message for r in reqs]
    assert all(len(t) < 200 for t in solo), solo
    longest = max(smol.ids) + AGENT_TOKENS
    seq = smol.fixed + smol.per_token * -(-longest // 256) * 256
    budget = smol.weights + smol.prefill * max(smol.ids) + int(2.5 * seq)
    reserved_at_once = 2  # what the budget holds at the longest: 2.5 sequences
    smol.load(budget)
    stop = threading.Event()
    running = _watch_running(srv.stub, stop)
    with ThreadPoolExecutor(len(reqs)) as pool:
        together = list(pool.map(lambda r: srv.stub.Predict(r).message, reqs))
    stop.set()
    assert together == solo
    assert max(running) >= 2 * reserved_at_once, running
    after = status(srv.stub)
    assert after["mlx_peak"] <= budget * 1.1, (after["mlx_peak"], budget)


def test_what_can_never_fit_is_refused_at_once_while_others_stream(srv, smol) -> None:
    smol.load(smol.budget(1.5))
    innocent = greedy(_prompts(1)[0], NEW_TOKENS)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(lambda: srv.stub.Predict(innocent).message)
        assert wait_until(lambda: status(srv.stub)["requests_running"], 30)
        with pytest.raises(grpc.RpcError) as err:
            srv.stub.Predict(greedy("Tell me everything.", 8000), timeout=10)
        assert running.result() == smol.solo[0]
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "memory_budget is" in err.value.details() and "MiB" in err.value.details()


def test_a_budget_below_the_weights_fails_the_load_and_the_model_serves_on(srv, smol) -> None:
    """Refused before anything is unloaded, as every other bad option: the model loaded
    before keeps serving (Status READY, the same output)."""
    smol.load(64 * 1024**3)
    res = srv.stub.LoadModel(
        backend_pb2.ModelOptions(Model=smol.model, Options=["memory_budget:200MiB", *OPTIONS])
    )
    assert not res.success
    assert "smaller than the weights" in res.message and "memory_budget" in res.message
    assert status(srv.stub)["state"] == backend_pb2.StatusResponse.READY
    prompt = _prompts(1)[0]
    assert srv.stub.Predict(greedy(prompt, NEW_TOKENS)).message == smol.solo[0]


def test_a_recurrent_state_model_is_bounded_too(srv, tmp_path) -> None:
    """mamba2: no per-token KV, a fixed state per sequence; outputs stay solo outputs."""
    prompts = _prompts(3)
    mamba = Measured(srv, str(tiny_models.build("mamba2", tmp_path)), prompts)
    assert mamba.per_token == 0 and mamba.fixed > 0
    mamba.load(mamba.budget(1.5))
    stop = threading.Event()
    running = _watch_running(srv.stub, stop)
    together = _predict_all(srv.stub, prompts)
    stop.set()
    assert together == mamba.solo
    assert 1 <= max(running) < 3, running
