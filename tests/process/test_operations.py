"""Production operation against real backend processes: auth, model identity, parent
watch, health, reflection, shutdown, limits, logging.

The shared session ``server`` where a test only reads, and processes of this module's own
(started through ``run.sh`` where the test is about the process: signals, parent watch,
auth environment). The units without a server: tests/fast/test_operations.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import grpc
import pytest
import tiny_models
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from helpers import AUTH_TOKEN, REFERENCE, ROOT, code_of, never, wait_until

import backend_pb2
from clients.server_process import ServerProcess
from edge import interceptors, lifecycle
from loading import model_loader

PLAIN = next(c for c in REFERENCE["cases"] if c["name"] == "plain")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def embedded() -> str:
    return str(model_loader.embedded_model_path())


# --------------------------------------------------------------------------- helpers
_Details = namedtuple(
    "_Details", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
)


class _AddMetadata(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds fixed metadata to every call of a channel (for clients that take a channel)."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self._pairs = pairs

    def _details(self, d):
        metadata = [*(d.metadata or ()), *self._pairs]
        return _Details(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready, None)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    intercept_unary_stream = intercept_unary_unary

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    intercept_stream_stream = intercept_stream_unary


def bearer(token: str = AUTH_TOKEN) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def reflected_services(channel) -> list[str]:
    return list(ProtoReflectionDescriptorDatabase(channel).get_services())


def health_status(channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (gone, or a zombie nobody reaped yet). Without /proc
    (macOS) signal 0 asks whether it exists: a missing /proc must not read as "gone"."""
    if not Path("/proc/self/stat").exists():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False  # alive, or a zombie: launchd reaps orphans at once
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


# --------------------------------------------------------------------------- auth server
@pytest.fixture(scope="module")
def auth_server():
    """run.sh with a token; no model. Env level "error" and --log-level debug: flag wins."""
    env = {interceptors.AUTH_TOKEN_ENV: AUTH_TOKEN, lifecycle.LOG_LEVEL_ENV: "error"}
    srv = ServerProcess("--log-level", "debug", entry="run.sh", env=env)
    try:
        yield srv
    finally:
        assert srv.stop() == 0


def test_auth_required_on_unary_and_streaming_rpcs(auth_server):
    stub, channel = auth_server.stub, auth_server.channel
    health = health_pb2_grpc.HealthStub(channel)
    hello = backend_pb2.HealthMessage()
    stream = backend_pb2.PredictOptions(Prompt="hi", Tokens=1)
    unknown = channel.unary_unary("/nope.Nope/Nothing")

    def codes(metadata) -> set[grpc.StatusCode]:
        return {
            # LocalAI's Health too: only the standard grpc.health.v1 Check is open.
            code_of(lambda: stub.Health(hello, metadata=metadata)),
            code_of(lambda: stub.Status(hello, metadata=metadata)),
            code_of(lambda: list(stub.PredictStream(stream, metadata=metadata))),
            code_of(lambda: next(health.Watch(health_pb2.HealthCheckRequest(), metadata=metadata))),
            # Unknown methods too: no UNIMPLEMENTED that would reveal what exists.
            code_of(lambda: unknown(b"", metadata=metadata)),
        }

    unauth = grpc.StatusCode.UNAUTHENTICATED
    for metadata in (
        None,
        bearer("guess-42"),
        [("authorization", AUTH_TOKEN)],
        bearer(AUTH_TOKEN + " "),
    ):
        assert codes(metadata) == {unauth}, metadata
    assert stub.Health(hello, metadata=bearer()).message == b"OK"
    assert stub.Status(hello, metadata=bearer()).state == backend_pb2.StatusResponse.UNINITIALIZED
    # Streaming with the token gets past auth (no model here: FAILED_PRECONDITION).
    stream = backend_pb2.PredictOptions(Prompt="hi", Tokens=1)
    assert code_of(lambda: list(stub.PredictStream(stream, metadata=bearer()))) != unauth
    assert next(health.Watch(health_pb2.HealthCheckRequest(), metadata=bearer())).status in (
        SERVING,
        NOT_SERVING,
    )
    assert health_status(channel) in (SERVING, NOT_SERVING)  # the documented exemption
    logs = auth_server.logs()
    assert "bearer-token auth on" in logs
    # --log-level debug beat LOCALAI_LOG_LEVEL=error: the denials are logged at DEBUG.
    assert "DEBUG localai.mlx.edge.interceptors: denied /backend.Backend/Health" in logs
    assert AUTH_TOKEN not in logs and "guess-42" not in logs


def test_reflection_needs_the_token_when_auth_is_on(auth_server):
    with pytest.raises(grpc.RpcError) as err:
        reflected_services(auth_server.channel)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    authed = grpc.intercept_channel(auth_server.channel, _AddMetadata(bearer()))
    assert "backend.Backend" in reflected_services(authed)


def test_health_follows_load_and_free(auth_server):
    stub, channel = auth_server.stub, auth_server.channel
    hello = backend_pb2.HealthMessage()
    for service in ("", "backend.Backend"):
        assert health_status(channel, service) == NOT_SERVING
    res = stub.LoadModel(backend_pb2.ModelOptions(Model=embedded()), metadata=bearer())
    assert res.success, res.message
    try:
        for service in ("", "backend.Backend"):
            assert health_status(channel, service) == SERVING
        assert stub.Health(hello, metadata=bearer()).message == b"OK"
    finally:
        assert stub.Free(hello, metadata=bearer()).success
    for service in ("", "backend.Backend"):
        assert health_status(channel, service) == NOT_SERVING
    # LocalAI's own Health keeps answering OK without a model.
    assert stub.Health(hello, metadata=bearer()).message == b"OK"
    assert stub.Status(hello, metadata=bearer()).state == backend_pb2.StatusResponse.UNINITIALIZED


# --------------------------------------------------------------------------- shared server
def test_no_token_means_no_auth_and_reflection_lists_services(server):
    # The session server runs without LOCALAI_GRPC_AUTH_TOKEN.
    assert server.stub.Health(backend_pb2.HealthMessage()).message == b"OK"
    assert health_status(server.channel, "backend.Backend") == SERVING
    services = reflected_services(server.channel)
    assert {"backend.Backend", "grpc.health.v1.Health"} <= set(services)
    # What `grpcurl describe` does: the whole service resolves without a .proto file.
    pool = DescriptorPool(ProtoReflectionDescriptorDatabase(server.channel))
    methods = {m.name for m in pool.FindServiceByName("backend.Backend").methods}
    assert {"Predict", "PredictStream", "LoadModel", "Health", "TokenizeString"} <= methods


def test_model_identity_guard(server):
    stub = server.stub
    loaded = embedded()  # what the session server recorded at LoadModel (--model embedded)
    ok = backend_pb2.PredictOptions(Prompt="Hi", Tokens=1, Temperature=0.0)
    for identity in ("", loaded):
        ok.ModelIdentity = identity
        assert stub.Predict(ok).tokens == 1
        assert list(stub.PredictStream(ok))[-1].tokens == 1
    bad = backend_pb2.PredictOptions(Prompt="Hi", Tokens=1, ModelIdentity="other/model")
    for call in (lambda: stub.Predict(bad), lambda: list(stub.PredictStream(bad))):
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "model identity mismatch" in err.value.details()


def test_model_identity_guard_on_tokenize_string(server):
    bad = backend_pb2.PredictOptions(Prompt="Hi", ModelIdentity="other/model")
    with pytest.raises(grpc.RpcError) as err:
        server.stub.TokenizeString(bad)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "model identity mismatch" in err.value.details()


def test_request_log_line_carries_correlation_id(server):
    req = backend_pb2.PredictOptions(
        Prompt="Log me", Tokens=3, Temperature=0.0, CorrelationId="abc-123"
    )
    reply = server.stub.Predict(req)
    pattern = (
        r"INFO localai\.mlx\.engine\.scheduler: request abc-123: prompt=(\d+) cached=(\d+) "
        r"generated=(\d+) ttft=[\d.]+ms tok/s=[\d.]+ finish=(\w+)"
    )
    assert wait_until(lambda: re.search(pattern, server.logs()), 5)
    prompt, cached, generated, finish = re.search(pattern, server.logs()).groups()
    assert int(prompt) == reply.prompt_tokens and int(generated) == reply.tokens == 3
    assert int(cached) <= int(prompt) and finish == "length"


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"Tools": '[{"type": "function"'}, "Tools"),
        ({"Metadata": {"chat_template_kwargs": "{not json"}}, "chat_template_kwargs"),
        ({"Metadata": {"chat_template_kwargs": "[1, 2]"}}, "chat_template_kwargs"),
        ({"tool_calls": "[{]"}, "tool_calls"),
        ({"tool_calls": '{"id": 1}'}, "tool_calls"),
    ],
)
def test_malformed_json_is_invalid_argument(server, fields, field):
    tool_calls = fields.pop("tool_calls", "")
    req = backend_pb2.PredictOptions(UseTokenizerTemplate=True, Tokens=2, **fields)
    req.Messages.add(role="user", content="What is the weather?")
    if tool_calls:
        req.Messages.add(role="assistant", content="", tool_calls=tool_calls)
    for call in (lambda: server.stub.Predict(req), lambda: list(server.stub.PredictStream(req))):
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in err.value.details()


def test_control_characters_and_invalid_utf8_do_not_hurt(server):
    stub = server.stub
    odd = "\x00\x01\x07\x1b[31m\u202e\ufeff\x7f\r\n<|im_end|>\U0001f600"
    reply = stub.Predict(backend_pb2.PredictOptions(Prompt=odd, Tokens=2, StopPrompts=["\x00"]))
    reply.message.decode("utf-8")
    assert reply.tokens <= 2
    # Invalid UTF-8 in a string field cannot be built with the Python client: send bytes.
    raw = backend_pb2.PredictOptions(Prompt="QQ", Tokens=2).SerializeToString()
    raw = raw.replace(b"QQ", b"\xff\xfe")
    for kind in ("Predict", "TokenizeString"):
        call = server.channel.unary_unary(f"/backend.Backend/{kind}")
        with pytest.raises(grpc.RpcError) as err:
            call(raw, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "UTF-8" in err.value.details()
    stream = server.channel.unary_stream("/backend.Backend/PredictStream")
    with pytest.raises(grpc.RpcError) as err:
        list(stream(raw, timeout=10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert stub.Predict(backend_pb2.PredictOptions(Prompt="Hi", Tokens=1)).tokens == 1


def test_messages_over_50mb_are_refused(server):
    huge = backend_pb2.PredictOptions(Prompt="a" * (50 * 1024 * 1024 + 1), Tokens=1)
    with pytest.raises(grpc.RpcError) as err:
        server.stub.Predict(huge, timeout=60)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert server.stub.Health(backend_pb2.HealthMessage()).message == b"OK"


# --------------------------------------------------------------------------- small context
CONTEXT = 24


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    """A second model server of this module: ContextSize 24, default max_tokens 2. Its
    model is the tiny 2-layer llama of tests/tiny_models.py (the embedded tokenizer): these
    limits are the tokenizer's and the context's, not the weights'."""
    model = tiny_models.build("llama", tmp_path_factory.mktemp("tiny_models"))
    srv = ServerProcess(entry="run.sh")
    try:
        load = backend_pb2.ModelOptions(
            Model=str(model), ContextSize=CONTEXT, Options=["max_tokens:2"]
        )
        res = srv.stub.LoadModel(load)
        assert res.success, res.message
        yield srv
    finally:
        assert srv.stop() == 0


def test_prompt_longer_than_context_is_invalid_argument(small_server):
    stub = small_server.stub
    prompt = PLAIN["prompt"]  # 40+ tokens
    n = stub.TokenizeString(backend_pb2.PredictOptions(Prompt=prompt)).length
    assert n >= CONTEXT
    req = backend_pb2.PredictOptions(Prompt=prompt, Tokens=4)
    for call in (lambda: stub.Predict(req), lambda: list(stub.PredictStream(req))):
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"the prompt is {n} tokens but the context holds {CONTEXT}" in err.value.details()


def test_absurd_tokens_capped_by_context(small_server):
    stub = small_server.stub
    req = backend_pb2.PredictOptions(Prompt="Once upon a time", Tokens=2**31 - 1, IgnoreEOS=True)
    n = stub.TokenizeString(req).length
    reply = stub.Predict(req, timeout=120)
    assert reply.prompt_tokens == n
    assert reply.tokens == CONTEXT - n  # capped to what the context leaves, not an error
    # Tokens 0: the load option max_tokens:2.
    assert stub.Predict(backend_pb2.PredictOptions(Prompt="Once upon a time")).tokens == 2


# --------------------------------------------------------------------------- signals
def _read_until_first_chunk(stream):
    first = next(stream)
    assert first.message or first.tokens
    return first


def test_sigterm_lets_an_in_flight_stream_finish():
    srv = ServerProcess("--model", "embedded", "--grace", "60", entry="run.sh")
    try:
        srv.wait_state(backend_pb2.StatusResponse.READY)
        expected = srv.stub.Detokenize(
            backend_pb2.DetokenizeRequest(tokens=PLAIN["greedy_40"])
        ).content
        health = health_pb2_grpc.HealthStub(srv.channel)
        watch = health.Watch(health_pb2.HealthCheckRequest(service="backend.Backend"))
        assert next(watch).status == SERVING
        req = backend_pb2.PredictOptions(Prompt=PLAIN["prompt"], Tokens=40, Temperature=0.0)
        stream = srv.stub.PredictStream(req, timeout=120)
        replies = [_read_until_first_chunk(stream)]
        srv.proc.send_signal(signal.SIGTERM)
        assert next(watch).status == NOT_SERVING  # health turns at once
        watch.cancel()  # an open Watch is an in-flight call too: let it go
        replies.extend(stream)  # completes normally: no RpcError
        assert "".join(r.message.decode() for r in replies) == expected
        assert replies[-1].tokens == 40
        assert srv.proc.wait(60) == 0
        logs = srv.logs()
        assert "SIGTERM received" in logs and "finish=length" in logs
        assert logs.index("finish=length") < logs.index("INFO localai.mlx.edge.startup: stopped")
        assert "Traceback" not in logs
    finally:
        srv.stop()


def test_sigterm_cancels_a_stream_that_outlives_the_grace():
    srv = ServerProcess("--model", "embedded", "--grace", "1", entry="run.sh")
    try:
        srv.wait_state(backend_pb2.StatusResponse.READY)
        req = backend_pb2.PredictOptions(Prompt="Once upon a time", Tokens=2000, IgnoreEOS=True)
        stream = srv.stub.PredictStream(req, timeout=120)
        replies = [_read_until_first_chunk(stream)]
        srv.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            replies.extend(stream)
        ended = time.monotonic() - t0
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        assert ended < 10
        assert len(replies) < 2000
        assert srv.proc.wait(30) == 0
        logs = srv.logs()
        # The engine job was cancelled, not left running.
        assert re.search(r"request -: .* finish=cancelled", logs, re.IGNORECASE), logs
        assert "INFO localai.mlx.edge.startup: stopped" in logs
    finally:
        srv.stop()


# --------------------------------------------------------------------------- parent watch
PARENT = """
import subprocess, sys, time
log = open(sys.argv[2], "w")
child = subprocess.Popen(
    [sys.argv[1], "--addr", "127.0.0.1:0"], stdout=subprocess.DEVNULL, stderr=log
)
print(child.pid, flush=True)
time.sleep(600)  # deliberate: this parent lives until the test kills it
"""


def _spawn_through_parent(log: Path, env: dict) -> tuple[subprocess.Popen, int]:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(ROOT / "run.sh"), str(log)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        cwd=ROOT,
    )
    pid = int(parent.stdout.readline())
    return parent, pid


def test_backend_exits_when_its_parent_dies(tmp_path):
    interval = {lifecycle.PARENT_WATCH_INTERVAL_ENV: "200ms", lifecycle.LOG_LEVEL_ENV: "trace"}
    watched_log, unwatched_log = tmp_path / "watched.log", tmp_path / "unwatched.log"
    watched_parent, watched = _spawn_through_parent(watched_log, interval)
    unwatched_parent, unwatched = _spawn_through_parent(
        unwatched_log, {**interval, lifecycle.PARENT_WATCH_ENV: "off"}
    )
    try:
        for log in (watched_log, unwatched_log):
            wait_until(lambda log=log: "serving on" in log.read_text(), 60, explain=log.read_text)
        for parent in (watched_parent, unwatched_parent):
            parent.kill()
            parent.wait()
        t0 = time.monotonic()
        wait_until(lambda: process_gone(watched), 10, explain=watched_log.read_text)
        exited_after = time.monotonic() - t0
        logs = watched_log.read_text()  # stderr only: stdout went to /dev/null
        assert re.search(r"WARNING localai\.mlx\.edge\.lifecycle: parent process \d+ is gone", logs)
        # The graceful path of SIGTERM, to the end.
        assert "SIGTERM received" in logs and "INFO localai.mlx.edge.startup: stopped" in logs
        # LOCALAI_LOG_LEVEL=trace (LocalAI's name) means DEBUG here.
        assert "DEBUG localai.mlx.edge.lifecycle: parent watch: pid" in logs
        assert exited_after < 5
        # Watch off: still alive many intervals later (1 s, five intervals), still serving.
        assert never(lambda: process_gone(unwatched), 1.0)
        os.kill(unwatched, signal.SIGINT)  # SIGINT takes the graceful path too
        assert wait_until(lambda: process_gone(unwatched), 15)
        logs = unwatched_log.read_text()
        assert "parent watch:" not in logs and "SIGINT received" in logs
        assert "INFO localai.mlx.edge.startup: stopped" in logs
    finally:
        for pid in (watched, unwatched):
            if not process_gone(pid):
                os.kill(pid, signal.SIGKILL)
