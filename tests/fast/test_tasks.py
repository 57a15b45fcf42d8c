"""Score, Rerank and Embedding as the engine runs them (`engine.core.TASKS`): prepared for
the model serving when they arrive, refused when that model was replaced before they ran.
A real engine thread with a scripted model (tests/scripted.py) and the toy tokenizer."""

from __future__ import annotations

import asyncio

import pytest
from scripted import ScriptedModel

import backend_pb2
from engine.core import EMBED, RERANK, SCORE, TASKS, Engine
from engine.memory import KV_STEP, MemoryBudget, MemoryProfile
from errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from loading.loaded_model import LoadedModel
from params import load_params
from seam.tokenizer import vocab_size
from tasks import scoring

LOAD = load_params(backend_pb2.ModelOptions(Model="scripted"))
# Each task's request, as the engine's method passes it to the task's prepare_on.
REQUESTS = {
    SCORE: ("The capital of France is", [" Paris", " Berlin"], False, 0),
    RERANK: ("Which city is the capital of France?", ["Paris is.", "Bananas."], 0),
    EMBED: ("", [5, 6, 7]),
}


@pytest.fixture
def engine(tok):
    eng = Engine()
    eng.start()
    asyncio.run(eng.install(ScriptedModel(vocab_size(tok), tok.eos_token_id), tok, LOAD))
    yield eng
    eng.stop()


@pytest.mark.parametrize("op", [SCORE, RERANK, EMBED])
def test_a_task_prepared_for_a_replaced_model_is_refused(engine, tok, op):
    """Its token ids were made for the previous model: FAILED_PRECONDITION, retry."""
    prepared = TASKS[op].prepare_on(engine.loaded, *REQUESTS[op])
    asyncio.run(engine.install(ScriptedModel(vocab_size(tok), tok.eos_token_id), tok, LOAD))
    rpc = TASKS[op].rpc
    with pytest.raises(FailedPrecondition, match=f"replaced while the {rpc} request was prepared"):
        asyncio.run(engine.call(op, prepared))


@pytest.mark.parametrize("op", [SCORE, RERANK])
def test_a_follower_runs_a_replicated_task_made_for_rank_0s_model(tok, op):
    """A distributed follower runs what rank 0 replicates (distributed/follower.py calls
    `Engine.local_op`) on the model rank 0 had it load; its own ``cache_key`` counts its
    own loads, so only rank 0 checks that the model was not replaced (`Task.check`)."""
    follower = Engine()  # not started: the follower's loop drives it
    follower.host.install_built(ScriptedModel(vocab_size(tok), tok.eos_token_id), tok, LOAD)
    rank_0 = LoadedModel.build(ScriptedModel(vocab_size(tok), tok.eos_token_id), tok, LOAD)
    prepared = TASKS[op].prepare_on(rank_0, *REQUESTS[op])
    assert prepared.model_key != follower.loaded.cache_key
    out = follower.local_op(op)(prepared)
    assert len(out if op == SCORE else out.results) == 2
    follower.shutdown()


@pytest.mark.parametrize("op", [SCORE, RERANK])
def test_a_task_prepared_for_the_serving_model_runs(engine, op):
    prepared = TASKS[op].prepare_on(engine.loaded, *REQUESTS[op])
    out = asyncio.run(engine.call(op, prepared))
    results = out if op == SCORE else out.results
    assert len(results) == 2


def test_check_candidates_holds_at_most_max_score_candidates():
    assert scoring.MAX_SCORE_CANDIDATES == 256
    scoring.check_candidates([" a"] * 256)
    with pytest.raises(InvalidArgument, match=r"^candidates has 257 entries; the limit is 256"):
        scoring.check_candidates([" x"] * 257)


def test_check_candidates_refuses_an_empty_one_by_its_index():
    with pytest.raises(InvalidArgument, match=r"candidates\[1\] is empty"):
        scoring.check_candidates([" a", ""])


# A budget whose KV holds one KV_STEP of tokens per sequence and no more (1 KB a token).
SMALL = MemoryBudget(
    int(KV_STEP * 1000 * 1.5),
    0,
    MemoryProfile(kv_per_token=1000, fixed=0, prefill_per_token=0),
    512,
)
LONG = " ".join(["word"] * (2 * KV_STEP))  # more than KV_STEP tokens of the toy tokenizer
# Each task's request with one sequence longer than SMALL holds.
LONG_REQUESTS = {
    SCORE: ("The capital of France is", [" Paris", LONG], False, 0),
    RERANK: ("Which city is the capital of France?", ["Paris is.", LONG], 0),
    EMBED: ("", [5] * (2 * KV_STEP)),
}


@pytest.mark.parametrize("op", [SCORE, RERANK, EMBED])
def test_a_task_the_memory_budget_can_never_hold_is_refused(engine, op):
    """The decision a generation request takes (`prompting.fit.check_memory`): made on
    the longest sequence, before the task reaches the engine thread."""
    assert TASKS[op].prepare(engine.loaded, SMALL, *REQUESTS[op]).tokens <= KV_STEP
    with pytest.raises(ResourceExhausted, match="memory_budget"):
        TASKS[op].prepare(engine.loaded, SMALL, *LONG_REQUESTS[op])
