"""In-flight prefix sharing (issue 30): requests sent together that share a new long
prefix prefill it once (`engine.sharing`), over real gRPC on tiny random-weight models
(a trimmable llama and a gemma3 whose sliding window needs prefill checkpoints; the
embedded model's burst is bench/bench_burst.py). Every output equals mlx-lm's own cold
greedy generation of its prompt; the prompt tokens computed (Prometheus
``prompt_tokens{source="prefill"}`` through GetMetrics) are one prefill of the shared
part plus each request's own tail.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import tiny_models
from helpers import chat_request, cold_greedy, greedy, request_ids
from inprocess import InProcessServer

import backend_pb2
from engine import sharing
from engine.core import Engine
from engine.metrics import Metrics
from parsing.tokens import common_prefix

MAX_TOKENS = 5
SYSTEM = (
    "You are the build agent of a monorepo. Tools: read_file(path), write_file(path, text), "
    "run(command), search(query). Always read a file before changing it, run the tests after "
    "every change, and report what you changed in one sentence. Never touch vendored code. "
) * 5  # about 290 tokens
QUESTIONS = [
    "Fix the failing test in parser.",
    "Rename the config loader.",
    "Why is the build slow?",
    "Add a CHANGELOG entry.",
    "Remove the dead code in utils.",
    "Bump the version.",
]


@pytest.fixture(scope="module")
def served():
    engine = Engine(metrics=Metrics())
    engine.start()
    s = InProcessServer(engine=engine)
    try:
        yield s
    finally:
        s.stop()
        engine.stop()


def _load(srv, path, options=()) -> None:
    res = srv.stub.LoadModel(backend_pb2.ModelOptions(Model=str(path), Options=list(options)))
    assert res.success, res.message


def _ids(srv, req) -> list[int]:
    return request_ids(srv.engine.loaded.tokenizer, req)


def _reference(srv, ids: list[int]) -> str:
    """mlx-lm's own greedy generation, cold (the engine is idle)."""
    return cold_greedy(srv.engine.loaded, ids, MAX_TOKENS)


def _computed(srv) -> int:
    """Prompt tokens prefilled so far (not served by the prompt cache)."""
    info = json.loads(srv.stub.GetMetrics(backend_pb2.MetricsRequest()).prompt_json_for_slot)
    return int(info["metrics"]["prompt_tokens"]["prefill"])


def _together(srv, reqs) -> list[str]:
    with ThreadPoolExecutor(len(reqs)) as pool:
        return list(pool.map(lambda r: srv.stub.Predict(r).message.decode("utf-8"), reqs))


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_a_burst_prefills_its_shared_prefix_once(served, model_root, family) -> None:
    _load(served, tiny_models.build(family, model_root), ("max_batch_size:8",))
    reqs = [chat_request(q, SYSTEM, Tokens=MAX_TOKENS, Temperature=0) for q in QUESTIONS]
    ids = [_ids(served, r) for r in reqs]
    refs = [_reference(served, i) for i in ids]
    shared = min(common_prefix(ids[0], i) for i in ids[1:])
    assert shared > 250

    before = _computed(served)
    assert _together(served, reqs) == refs
    computed = _computed(served) - before
    tails = sum(len(i) - shared for i in ids)
    # One prefill of the shared part and each request's own tail, plus a few tokens a
    # request may prefill again: one that arrives after the leader's prefill passed the
    # shared part starts from the leader's chat-boundary checkpoint when the cache cannot
    # be trimmed (the user turn's header, ~4 tokens, is computed again). Without sharing:
    # shared * len(reqs) + tails.
    assert computed <= shared + tails + 8 * len(reqs), (computed, shared, tails)
    # Sent one by one (the prefix is cached now), the same outputs.
    assert [served.stub.Predict(r).message.decode("utf-8") for r in reqs[:2]] == refs[:2]


def test_sharing_waits_only_for_a_prefix_worth_it(served, model_root) -> None:
    """Prompts sharing fewer than MIN_SHARED_PREFIX new tokens prefill on their own; a
    request cancelled while parked ends without touching the others."""
    _load(served, tiny_models.build("llama", model_root), ("max_batch_size:8",))
    short = [greedy(f"{n} apples and {n + 1} pears.", MAX_TOKENS) for n in range(4)]
    ids = [_ids(served, r) for r in short]
    assert max(common_prefix(ids[0], i) for i in ids[1:]) < sharing.MIN_SHARED_PREFIX
    refs = [_reference(served, i) for i in ids]
    before = _computed(served)
    assert _together(served, short) == refs
    assert _computed(served) - before == sum(len(i) for i in ids)
