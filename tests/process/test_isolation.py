"""No request can hurt another (issue 12), over real gRPC with the embedded SmolLM2.

Every case runs while innocent greedy streams go on in other threads (`Innocents`): each
streams a 20-token greedy completion again and again until the case ends, and every one of
those completions must equal the text the same request gives alone (computed first, on
the same server). Short completions, repeated, keep them running beside the hostile
request just the same, and each block ends (and each reference is made) sooner. The
hostile requests: deeply nested JSON in every JSON field, a 45 MB prompt, a 1 MB grammar,
too many or too slow Score candidates, broken model files, a client that stops reading, a
grammar matching nothing, and a bounded soak of mixed churn.

Timing is only checked loosely (a generous bound on Health, and a ratio measured within
one test for Score's cancellation); throughput targets belong in bench/.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time

import grpc
import pytest
from helpers import (
    INNOCENT_TOKENS,
    PROMPTS,
    Innocents,
    assert_refused,
    chat_request,
    greedy,
    references,
    status,
    stream_text,
    wait_idle,
    wait_until,
)

import backend_pb2
import backend_pb2_grpc
from clients.server_process import ServerProcess
from loading import model_loader
from tasks import scoring

CALL_TIMEOUT = 60.0  # seconds; a hang fails the test with DEADLINE_EXCEEDED
HEALTH_BOUND = 5.0  # seconds: a sanity bound only (the README promises milliseconds)
DEEP = "[" * 100_000 + "]" * 100_000


def timed_health(stub) -> float:
    t0 = time.monotonic()
    reply = stub.Health(backend_pb2.HealthMessage(), timeout=HEALTH_BOUND)
    assert reply.message == b"OK"
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def refs(server):
    return references(server.stub)


# -- 1: deeply nested JSON in every JSON field ------------------------------------------
def _nested_schema(levels: int) -> str:
    schema = '{"type": "string"}'
    for _ in range(levels):
        schema = '{"type": "object", "properties": {"a": ' + schema + "}}"
    return schema


def _hostile_json_requests() -> list[tuple[str, backend_pb2.PredictOptions, str]]:
    """(name, request, a word the refusal must contain)."""
    out = []
    req = chat_request("hi", Tokens=4, Temperature=0.0)
    req.Messages.add(role="assistant", content="", tool_calls=DEEP)
    req.Messages.add(role="user", content="again")
    out.append(("tool_calls", req, "tool_calls"))
    for name, schema in (
        ("json_schema", '{"a": ' + DEEP + "}"),
        ("json_schema 500 levels", _nested_schema(500)),
    ):
        out.append(
            (
                name,
                greedy("x", tokens=4, IgnoreEOS=True, Metadata={"json_schema": schema}),
                "json_schema",
            )
        )
    out.append(("LogitBias", greedy("x", tokens=4, IgnoreEOS=True, LogitBias=DEEP), "LogitBias"))
    out.append(
        (
            "LogitBias-object",
            greedy("x", tokens=4, IgnoreEOS=True, LogitBias='{"1": ' + DEEP + "}"),
            "LogitBias",
        )
    )
    tools_req = chat_request("hi", Tokens=4, Temperature=0.0, Tools=DEEP)
    out.append(("Tools", tools_req, "Tools"))
    kw = chat_request(
        "hi",
        Tokens=4,
        Temperature=0.0,
        Metadata={"chat_template_kwargs": '{"x": ' + DEEP + "}"},
    )
    out.append(("chat_template_kwargs", kw, "chat_template_kwargs"))
    return out


def test_nested_json_is_refused_without_harming_others(server, refs):
    stub = server.stub
    with Innocents(stub, refs):
        for name, req, field in _hostile_json_requests():
            bad = grpc.StatusCode.INVALID_ARGUMENT
            unary = lambda r=req: stub.Predict(r, timeout=CALL_TIMEOUT)  # noqa: E731
            stream = lambda r=req: list(stub.PredictStream(r, timeout=CALL_TIMEOUT))  # noqa: E731
            assert_refused(unary, bad, field, case=name)
            assert_refused(stream, bad, field, case=name)
    assert server.proc.poll() is None


# -- 2: a 45 MB prompt ------------------------------------------------------------------
def _health_while(stub, work) -> tuple[list[float], object]:
    """Run `work()` in a thread; call Health until it ends (at least 3 times)."""
    result: dict[str, object] = {}

    def run():
        try:
            result["value"] = work()
        except BaseException as exc:  # handed to the test thread
            result["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    times = []
    while t.is_alive() or len(times) < 3:
        times.append(timed_health(stub))
        t.join(0.02)  # the next call in 20 ms, or at once when the work is done
    t.join()
    return times, result


def test_huge_prompt_is_refused_cheaply(server, refs):
    stub = server.stub
    prompt = "hello world " * (45_000_000 // 12)
    req = greedy(prompt, tokens=4, IgnoreEOS=True)
    assert req.ByteSize() < 50 * 1024 * 1024
    with Innocents(stub, refs):
        times, result = _health_while(stub, lambda: stub.Predict(req, timeout=CALL_TIMEOUT).message)
    err = result.get("error")
    assert isinstance(err, grpc.RpcError), result
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
    assert "context" in err.details(), err.details()
    assert "Traceback" not in err.details()
    assert all(t < HEALTH_BOUND for t in times), times
    print(f"45 MB prompt: {len(times)} Health calls, slowest {max(times) * 1000:.0f} ms")


# -- 3: a 1 MB grammar ------------------------------------------------------------------
def _alternatives(n: int) -> str:
    return "root ::= " + " | ".join(f'"w{i:06d}"' for i in range(n))


@pytest.mark.parametrize("alternatives", [100_000, 1_500])
def test_huge_grammar_is_refused_in_one_line(server, refs, alternatives):
    """100,000 alternatives (1 MB) hit the size bound; 1,500 (16 KB, under the bounds and
    llguidance's 2,000 items per rule) compile off the event loop: either way Health
    answers meanwhile and innocents are untouched."""
    stub = server.stub
    grammar = _alternatives(alternatives)
    req = backend_pb2.PredictOptions(
        Prompt="Pick a word:", Tokens=16, Temperature=0.0, Grammar=grammar
    )
    with Innocents(stub, refs):
        times, result = _health_while(stub, lambda: stub.Predict(req, timeout=CALL_TIMEOUT))
    assert all(t < HEALTH_BOUND for t in times), times
    if alternatives == 100_000:
        assert len(grammar) > 1_000_000
        err = result.get("error")
        assert isinstance(err, grpc.RpcError), result
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
        details = err.details()
        assert "Grammar" in details and "\n" not in details.strip(), details
        assert "panicked" not in details and "backtrace" not in details.lower(), details
    else:
        # Under the bounds the grammar is legitimate: the answer is one of its words.
        assert "error" not in result, result
        text = result["value"].message.decode("utf-8")
        assert re.fullmatch(r"w\d{6}", text) and int(text[1:]) < alternatives, text


# -- 4: Score bounded and cancellable ---------------------------------------------------
SCORED = 32


def _candidates(n: int, tag: str) -> list[str]:
    return [f" {tag} {i}: the old mill by the river turned all day" for i in range(n)]


@pytest.mark.slow
def test_score_is_bounded_and_stops_when_its_caller_leaves(server, refs):
    stub = server.stub
    prompt = "A short story:"
    too_many = backend_pb2.ScoreRequest(
        prompt=prompt, candidates=_candidates(scoring.MAX_SCORE_CANDIDATES + 344, "x")
    )
    assert len(too_many.candidates) == 600
    # 32 candidates: several seconds here, many times what a 5-token Predict takes.
    full = backend_pb2.ScoreRequest(prompt=prompt, candidates=_candidates(SCORED, "first"))
    # The same work with other candidates (so no cache helps) and a 1 s deadline.
    cut = backend_pb2.ScoreRequest(prompt=prompt, candidates=_candidates(SCORED, "second"))
    # The full cost, with innocent streams beside it: between candidates the engine steps
    # the running batch and admits new requests, so the streams go on (exactly) meanwhile.
    with Innocents(stub, refs) as innocents:
        t0 = time.monotonic()
        scored = stub.Score(full, timeout=300)
        t_full = time.monotonic() - t0
        during = sum(len(v) for v in innocents.outputs.values())
    assert during >= 2, "no innocent stream finished while the Score ran"
    assert len(scored.candidates) == SCORED
    assert all(c.num_tokens >= 10 and c.log_prob < 0 for c in scored.candidates)
    with Innocents(stub, refs):
        assert_refused(
            lambda: stub.Score(too_many, timeout=CALL_TIMEOUT),
            grpc.StatusCode.INVALID_ARGUMENT,
            "candidates",
        )
        assert_refused(lambda: stub.Score(cut, timeout=1.0), grpc.StatusCode.DEADLINE_EXCEEDED)
        t0 = time.monotonic()
        reply = stub.Predict(greedy("The sky is", tokens=5, IgnoreEOS=True), timeout=CALL_TIMEOUT)
        t_next = time.monotonic() - t0
    assert reply.tokens == 5
    print(f"full score {t_full:.2f}s; Predict after a cut score answered in {t_next:.2f}s")
    # The cut score stopped: the next request did not wait for the remaining candidates.
    assert t_next < t_full / 2, (t_next, t_full)


# -- 7: a grammar that matches nothing; no KV held after a reply ------------------------
def test_empty_language_grammar_is_refused(server, refs):
    stub = server.stub
    with Innocents(stub, refs):
        assert_refused(
            lambda: stub.Predict(
                greedy("x", tokens=4, IgnoreEOS=True, Grammar="root ::= root"), timeout=30
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "Grammar",
        )
    wait_idle(stub, call_timeout=HEALTH_BOUND)
    reply = stub.Predict(greedy(PROMPTS[0], tokens=8, IgnoreEOS=True), timeout=CALL_TIMEOUT)
    assert reply.tokens == 8
    s = status(stub, HEALTH_BOUND)
    assert s["requests_running"] == 0, s
    assert s["kv_active"] == 0, s


# -- 5: LoadModel with broken files keeps the working model -----------------------------
@pytest.mark.slow
def test_failed_loads_keep_the_previous_model(tmp_path):
    gguf = model_loader.embedded_model_path()
    truncated = tmp_path / "truncated.gguf"
    with open(gguf, "rb") as src, open(truncated, "wb") as dst:
        dst.write(src.read(1 << 20))
    text = tmp_path / "notes.gguf"
    text.write_text("this is not a model\n" * 100)
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(gguf, copy)  # a good model under another name, for the draft case

    srv = ServerProcess("--model", "embedded", entry="run.sh")
    try:
        srv.wait_state(backend_pb2.StatusResponse.READY)
        stub = srv.stub
        refs = references(stub)
        loads = {
            "truncated GGUF": backend_pb2.ModelOptions(Model="m", ModelFile=str(truncated)),
            "text file named .gguf": backend_pb2.ModelOptions(Model="m", ModelFile=str(text)),
            "FIFO": backend_pb2.ModelOptions(Model="m", ModelFile=str(fifo)),
            "missing DraftModel": backend_pb2.ModelOptions(
                Model=str(copy), DraftModel=str(tmp_path / "absent.gguf")
            ),
            "truncated DraftModel": backend_pb2.ModelOptions(
                Model=str(copy), DraftModel=str(truncated)
            ),
        }
        with Innocents(stub, refs):
            for name, load in loads.items():
                res = stub.LoadModel(load, timeout=120)
                assert not res.success, name
                msg = res.message
                assert msg.startswith("failed to load model"), (name, msg)
                assert "Traceback" not in msg and len(msg) < 2000, (name, msg)
                if "FIFO" in name:
                    assert "FIFO" in msg, msg
                if "Draft" in name:
                    assert "absent.gguf" in msg or "truncated.gguf" in msg, (name, msg)
                s = status(stub, HEALTH_BOUND)
                assert s["state"] == backend_pb2.StatusResponse.READY or s["requests_running"]
                assert s["state"] != backend_pb2.StatusResponse.UNINITIALIZED, (name, s)
                assert "released" not in msg, (name, msg)
        # The innocent streams served through every load; a new request after them too.
        out = stream_text(stub, greedy(PROMPTS[0], INNOCENT_TOKENS, IgnoreEOS=True), CALL_TIMEOUT)
        assert out[0] == refs[PROMPTS[0]], out
        assert (
            wait_idle(stub, call_timeout=HEALTH_BOUND)["state"] == backend_pb2.StatusResponse.READY
        )
    finally:
        srv.stop()


# -- 6: a client that stops reading -----------------------------------------------------
@pytest.mark.slow
def test_client_that_stops_reading_is_ended():
    """With option max_pending_events:16, a stream whose client reads one reply and then
    nothing is ended by the server once the flow-control window and 16 events are full:
    its KV is released while an innocent stream completes; reading on, the client finds
    RESOURCE_EXHAUSTED."""
    srv = ServerProcess(entry="run.sh")
    # A small receive window, so the transport holds few replies for the idle reader.
    slow = grpc.insecure_channel(
        srv.address,
        options=[("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)],
    )
    try:
        res = srv.stub.LoadModel(
            backend_pb2.ModelOptions(
                Model=str(model_loader.embedded_model_path()),
                ContextSize=4096,
                Options=["max_pending_events:16"],
            ),
            timeout=120,
        )
        assert res.success, res.message
        stub = srv.stub
        refs = references(stub, PROMPTS[:2])
        slow_stub = backend_pb2_grpc.BackendStub(slow)
        idle = greedy(
            "Tell me a long story.", tokens=4000, IgnoreEOS=True, CorrelationId="idle-reader"
        )
        stream = slow_stub.PredictStream(idle, timeout=300)
        first = next(stream)
        assert first.message
        with Innocents(stub, refs):
            ended = re.compile(r"request idle-reader: .* generated=(\d+) .*=RESOURCE_EXHAUSTED")
            m = wait_until(
                lambda: ended.search(srv.logs()),
                120,
                interval=0.2,
                explain=lambda: f"idle reader never ended: {status(stub, HEALTH_BOUND)}",
            )
        # Its KV is released although the client has still not read its replies.
        wait_idle(stub, call_timeout=HEALTH_BOUND)
        generated = int(m.group(1))
        assert generated < 4000, generated
        got = 1
        with pytest.raises(grpc.RpcError) as info:
            for _ in stream:
                got += 1
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
        assert "stopped reading" in info.value.details()
        assert got < 4000, got
        print(f"idle reader ended after {generated} tokens, {got} replies delivered")
    finally:
        slow.close()
        srv.stop()


# -- 8: a bounded soak ------------------------------------------------------------------
SOAK_ROUNDS = 3
CACHE_BYTES = 16_000_000


@pytest.mark.slow
def test_soak_returns_to_idle_and_memory_stays_bounded():
    srv = ServerProcess(entry="run.sh")
    try:
        res = srv.stub.LoadModel(
            backend_pb2.ModelOptions(
                Model=str(model_loader.embedded_model_path()),
                Options=[f"max_cache_bytes:{CACHE_BYTES}"],
            ),
            timeout=120,
        )
        assert res.success, res.message
        stub = srv.stub
        refs = references(stub)
        seeded = greedy(
            "Write a poem about rain:", tokens=24, IgnoreEOS=True, Temperature=0.9, Seed=1234
        )
        after: list[dict[str, int]] = []
        t_start = time.monotonic()
        for rnd in range(SOAK_ROUNDS):
            problems: list[str] = []

            def cancelled(i: int, rnd=rnd, problems=problems) -> None:
                call = stub.PredictStream(
                    greedy(
                        f"Round {rnd}, request {i}: count slowly to fifty.",
                        tokens=200,
                        IgnoreEOS=True,
                    ),
                    timeout=CALL_TIMEOUT,
                )
                for n, _ in enumerate(call):
                    if n == 3:
                        call.cancel()
                        break

            def short_deadline(i: int, rnd=rnd, problems=problems) -> None:
                try:
                    stub.Predict(
                        greedy(
                            f"Round {rnd} deadline {i}: the history of tea",
                            tokens=300,
                            IgnoreEOS=True,
                        ),
                        timeout=0.3,
                    )
                except grpc.RpcError as err:
                    if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                        problems.append(f"deadline: {err.code().name} {err.details()}")

            def seeded_run(problems=problems) -> None:
                # Sampled output is only reproducible for the same batch composition (the
                # batched logits differ in the last bits), so only its length is checked.
                replies = list(stub.PredictStream(seeded, timeout=CALL_TIMEOUT))
                if replies[-1].tokens != seeded.Tokens:
                    problems.append(f"seeded: {replies[-1].tokens} tokens")

            def fresh(i: int, rnd=rnd, problems=problems) -> None:
                # A new prompt every round: churns the prompt cache.
                stub.Predict(
                    greedy(f"Round {rnd}, fresh {i}: " + "lorem " * 60, tokens=8, IgnoreEOS=True)
                )

            work = [
                *(lambda i=i: cancelled(i) for i in range(2)),
                *(lambda i=i: short_deadline(i) for i in range(2)),
                seeded_run,
                *(lambda i=i: fresh(i) for i in range(2)),
            ]
            threads = [threading.Thread(target=w, daemon=True) for w in work]
            with Innocents(stub, refs):
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(CALL_TIMEOUT * 2)
            assert not problems, problems
            after.append(wait_idle(stub, call_timeout=HEALTH_BOUND))
        elapsed = time.monotonic() - t_start
        first, third = after[0]["mlx_active"], after[2]["mlx_active"]
        print(
            f"soak {elapsed:.1f}s; mlx_active after rounds: "
            f"{[a['mlx_active'] // 1_000_000 for a in after]} MB; prompt cache "
            f"{[a['prompt_cache'] // 1_000_000 for a in after]} MB"
        )
        assert all(a["prompt_cache"] <= CACHE_BYTES for a in after), after
        assert abs(third - first) <= 64 << 20, (first, third)
        assert srv.proc.poll() is None
    finally:
        srv.stop()
