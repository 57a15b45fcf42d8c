"""The servicer alone, over real gRPC on a free port (tests/inprocess.py), with a fake
engine (no model).

Checks what belongs to the edge: parsing (the first part of the engine's prepare step,
`engine.prepare.parse`) before anything is queued, one mapping from
domain errors to gRPC status codes, Predict == the joined stream, LocalAI's reply texts,
and that a caller who leaves cancels its job.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest
from helpers import code_of, wait_until
from inprocess import InProcessServer

import backend_pb2
from decoding.output import Delta
from edge.servicer import LOAD_SUCCESS_MESSAGE
from engine import prepare
from engine.jobs import Event
from engine.metrics import Metrics
from engine.scheduler import RequestMetrics
from engine.status import StatusSnapshot
from errors import (
    FailedPrecondition,
    InvalidArgument,
    ModelLoadError,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from params import GenerationRequest, LoadParams


class FakeJob:
    def __init__(self, events: list[Event], hold: asyncio.Event | None = None) -> None:
        self._events = events
        self._hold = hold
        self.cancelled = False

    async def events(self):
        for event in self._events:
            yield event
        if self._hold is not None:
            await self._hold.wait()

    def cancel(self) -> None:
        self.cancelled = True


def event(content: str = "", *, tokens: int, final: str | None = None, error=None) -> Event:
    return Event(Delta(content=content), 3, tokens, 1.0, 2.0, finish_reason=final, error=error)


class FakeEngine:
    """Records what the servicer hands over; answers from a script."""

    def __init__(self) -> None:
        self.submitted: list[GenerationRequest] = []
        self.loaded_params: list[LoadParams] = []
        self.jobs: list[FakeJob] = []
        self.submit_error: Exception | None = None
        self.load_error: Exception | None = None
        self.events = [
            event("Hel", tokens=1),
            event("lo", tokens=2),
            event("", tokens=3, final="stop"),
        ]
        self.hold: asyncio.Event | None = None
        self.loaded = None
        self.alive = True
        self.last_metrics = RequestMetrics(12.5, 3, 4, 0)
        self.metrics = Metrics()  # the real recorder, its endpoint not started
        self.served = SimpleNamespace(params=None, tokenizer=None)  # "the loaded model"

    def check_identity(self, identity: str) -> None:
        if identity and identity != "served":
            raise NotFound(f"model identity mismatch: request is for '{identity}'")

    def serving(self, identity: str = ""):
        self.check_identity(identity)
        return self.served

    async def submit(self, message: backend_pb2.PredictOptions, loaded) -> FakeJob:
        assert loaded is self.served  # the model the servicer read once
        # The engine's prepare step begins with the real parse (InvalidArgument on a bad field).
        self.submitted.append(prepare.parse(message, loaded.params))
        if self.submit_error is not None:
            raise self.submit_error
        job = FakeJob(list(self.events), self.hold)
        self.jobs.append(job)
        return job

    async def load(self, params: LoadParams) -> None:
        self.loaded_params.append(params)
        if self.load_error is not None:
            raise self.load_error
        self.loaded = object()

    async def free(self) -> None:
        self.loaded = None

    async def tokenize(self, text: str, identity: str = "") -> list[int]:
        self.check_identity(identity)
        if text == "raise":  # a ValueError from inside a library: the server's fault
            raise ValueError("[broadcast_shapes] Shapes (1,2) and (3,) cannot be broadcast")
        return [ord(c) for c in text]

    async def detokenize(self, ids: list[int]) -> str:
        raise Unavailable("lost the distributed group")

    def status(self) -> StatusSnapshot:
        return StatusSnapshot("BUSY", 2, 5, {"weights": 10, "mlx_active": 99})

    def info(self) -> dict:
        return {"model": "fake"}


@pytest.fixture
def served():
    """(stub, fake engine, event loop) of the real servicer on 127.0.0.1:<free port>."""
    srv = InProcessServer(engine=FakeEngine())
    try:
        yield srv.stub, srv.engine, srv.loop
    finally:
        srv.stop()


def test_predict_equals_the_joined_stream_and_carries_usage(served):
    stub, engine, _ = served
    req = backend_pb2.PredictOptions(Prompt="Hi", Tokens=5)
    whole = stub.Predict(req)
    streamed = list(stub.PredictStream(req))
    assert whole.message == b"Hello"
    assert [r.message for r in streamed] == [b"Hel", b"lo", b""]
    assert (whole.tokens, whole.prompt_tokens) == (3, 3)
    assert [r.tokens for r in streamed] == [1, 2, 3]
    # The engine got parsed values, never the protobuf message.
    assert all(isinstance(r, GenerationRequest) for r in engine.submitted)
    assert engine.submitted[0].params.max_tokens == 5
    assert engine.submitted[0].prompt.prompt == "Hi"


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"TopP": 2.0}, "PredictOptions.TopP"),
        ({"Tools": "[" * 1000 + "]" * 1000}, "PredictOptions.Tools nests arrays/objects deeper"),
        ({"LogitBias": "{bad"}, "PredictOptions.LogitBias"),
        ({"Mirostat": 2}, "PredictOptions.Mirostat is not supported"),
    ],
)
def test_bad_fields_are_refused_before_anything_is_queued(served, fields, needle):
    stub, engine, _ = served
    with pytest.raises(grpc.RpcError) as err:
        stub.Predict(backend_pb2.PredictOptions(Prompt="x", **fields))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in err.value.details()
    assert engine.submitted == []


def test_a_bad_message_is_refused_at_the_edge(served):
    stub, engine, _ = served
    req = backend_pb2.PredictOptions(UseTokenizerTemplate=True)
    req.Messages.add(role="", content="x")
    assert code_of(lambda: stub.Predict(req)) == grpc.StatusCode.INVALID_ARGUMENT
    req = backend_pb2.PredictOptions(UseTokenizerTemplate=True)
    req.Messages.add(role="assistant", content="", tool_calls="[" * 100000 + "]" * 100000)
    assert code_of(lambda: list(stub.PredictStream(req))) == grpc.StatusCode.INVALID_ARGUMENT
    assert engine.submitted == []


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (FailedPrecondition("no model loaded: call LoadModel first"), "FAILED_PRECONDITION"),
        (ResourceExhausted("server busy"), "RESOURCE_EXHAUSTED"),
        (Unavailable("lost the distributed group"), "UNAVAILABLE"),
        (InvalidArgument("the prompt is too long"), "INVALID_ARGUMENT"),
    ],
)
def test_domain_errors_map_to_their_status(served, error, code):
    stub, engine, _ = served
    engine.submit_error = error
    req = backend_pb2.PredictOptions(Prompt="x")
    with pytest.raises(grpc.RpcError) as err:
        stub.Predict(req)
    assert err.value.code() == getattr(grpc.StatusCode, code)
    assert err.value.details() == str(error)
    assert engine.metrics.snapshot()["request_errors"] == {code: 1}  # counted by code


def test_a_value_error_is_invalid_argument_only_from_the_request(served):
    stub, engine, _ = served
    # From the request's parsing (the prepare step): INVALID_ARGUMENT, its message as is.
    bad = backend_pb2.PredictOptions(Prompt="x", TopP=2.0)
    with pytest.raises(grpc.RpcError) as err:
        stub.Predict(bad)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("PredictOptions.TopP")
    # From anywhere else (inside the engine, a library): INTERNAL, with the message.
    engine.submit_error = ValueError("[rope] cannot broadcast")
    with pytest.raises(grpc.RpcError) as err:
        stub.Predict(backend_pb2.PredictOptions(Prompt="x"))
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert err.value.details() == "ValueError: [rope] cannot broadcast"
    odd = backend_pb2.PredictOptions(Prompt="raise")
    with pytest.raises(grpc.RpcError) as err:
        stub.TokenizeString(odd)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "cannot be broadcast" in err.value.details()
    counted = engine.metrics.snapshot()["request_errors"]
    assert counted == {"INVALID_ARGUMENT": 1, "INTERNAL": 2}


def test_an_error_event_ends_the_stream_with_its_status(served):
    stub, engine, _ = served
    engine.events = [event("a", tokens=1), event(tokens=1, error=Unavailable("rank 2 lost"))]
    replies = []
    with pytest.raises(grpc.RpcError) as err:
        for reply in stub.PredictStream(backend_pb2.PredictOptions(Prompt="x")):
            replies.append(reply)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "rank 2" in err.value.details()
    assert [r.message for r in replies] == [b"a"]


def test_identity_mismatch_is_not_found_everywhere(served):
    stub, engine, _ = served
    req = backend_pb2.PredictOptions(Prompt="x", ModelIdentity="other")
    assert code_of(lambda: stub.Predict(req)) == grpc.StatusCode.NOT_FOUND
    tok = backend_pb2.PredictOptions(Prompt="x", ModelIdentity="other")
    assert code_of(lambda: stub.TokenizeString(tok)) == grpc.StatusCode.NOT_FOUND
    assert stub.TokenizeString(backend_pb2.PredictOptions(Prompt="ab")).tokens == [97, 98]
    assert engine.submitted == []


def test_a_caller_that_leaves_cancels_its_job(served):
    stub, engine, loop = served
    engine.hold = asyncio.Event()  # the job never finishes by itself
    engine.events = [event("a", tokens=1)]
    call = stub.PredictStream(backend_pb2.PredictOptions(Prompt="x"))
    assert next(call).message == b"a"
    call.cancel()
    wait_until(lambda: engine.jobs and engine.jobs[0].cancelled, 2, interval=0.01)
    assert engine.jobs[0].cancelled
    loop.call_soon_threadsafe(engine.hold.set)


def test_load_model_replies_as_localai_expects(served):
    stub, engine, _ = served
    ok = stub.LoadModel(backend_pb2.ModelOptions(Model="m", Options=["max_batch_size:3"]))
    assert (ok.success, ok.message) == (True, LOAD_SUCCESS_MESSAGE)
    assert engine.loaded_params[-1].max_batch_size == 3  # options parsed at the edge
    bad = stub.LoadModel(backend_pb2.ModelOptions(Model="m", Options=["max_batch_size:0"]))
    assert not bad.success and "option max_batch_size" in bad.message
    engine.load_error = ModelLoadError("no such model 'x'")
    failed = stub.LoadModel(backend_pb2.ModelOptions(Model="x"))
    assert (failed.success, failed.message) == (False, "failed to load model: no such model 'x'")
    engine.load_error = RuntimeError("boom")  # unexpected: still an answer, never a traceback
    odd = stub.LoadModel(backend_pb2.ModelOptions(Model="x"))
    assert (odd.success, odd.message) == (False, "failed to load model: RuntimeError: boom")


def test_status_metrics_and_errors_of_plain_calls(served):
    stub, _, _ = served
    status = stub.Status(backend_pb2.HealthMessage())
    assert status.state == backend_pb2.StatusResponse.BUSY
    assert status.memory.total == 99
    assert status.memory.breakdown["requests_running"] == 2
    assert status.memory.breakdown["requests_waiting"] == 5
    metrics = stub.GetMetrics(backend_pb2.MetricsRequest())
    assert (metrics.tokens_per_second, metrics.tokens_generated) == (12.5, 3)
    assert (
        metrics.prompt_tokens_processed == 4 and '"model": "fake"' in metrics.prompt_json_for_slot
    )
    detok = backend_pb2.DetokenizeRequest(tokens=[1])
    assert code_of(lambda: stub.Detokenize(detok)) == grpc.StatusCode.UNAVAILABLE
    assert stub.Health(backend_pb2.HealthMessage()).message == b"OK"
