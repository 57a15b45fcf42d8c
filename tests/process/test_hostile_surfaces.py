"""Hostile requests at the surfaces added since issue 12 (issue 41, items 1, 3 and 6), over
real gRPC to one backend process (run.sh) serving the tiny random-weight llama of
tests/tiny_models.py: Rerank, Score, Embedding and TokenizeString with huge texts, sampling
windows past the context, huge message and tool lists, GrammarTriggers, tool-call
grammars, volatile spans, grammars gated by reasoning and in-flight prefix sharing.

Every case runs while innocent greedy streams go on beside it (`helpers.Innocents`,
which also records the longest wait for a reply): each must keep the text it gives alone,
the hostile request must end with a clear one-line status, the process must live and
Status must return to idle. The last test is differential: hypothesis draws mixes of
request options (seeded sampling, bias, penalties, grammar / json_schema, stop, logprobs,
shared prefixes), sends them at once with random arrival and cancellation, and every
request not cancelled must give exactly its solo output.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest
import tiny_models
from helpers import Innocents, assert_refused, chat_request, greedy, references, wait_idle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import backend_pb2
from clients.server_process import ServerProcess
from engine.memory import budget_for

CONTEXT = 512  # tokens: every window and text bound below scales with it
CALL_TIMEOUT = 60.0
STALL_BOUND = 5.0  # seconds an innocent may wait for a reply: a sanity bound, not a target
BIG = "word " * 8_000_000  # 40 MB: the Rerank document
BAD = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_models.build("llama", tmp_path_factory.mktemp("tiny_models"))


def load(srv: ServerProcess, model: Path, *options: str, **fields) -> None:
    res = srv.stub.LoadModel(
        backend_pb2.ModelOptions(
            Model=str(model), ContextSize=CONTEXT, Options=list(options), **fields
        ),
        timeout=120,
    )
    assert res.success, res.message


@pytest.fixture(scope="module")
def server(tiny):
    srv = ServerProcess(entry="run.sh")
    try:
        load(srv, tiny)
        yield srv
    finally:
        assert srv.stop() == 0, srv.logs()[-3000:]


@pytest.fixture(scope="module")
def refs(server):
    return references(server.stub)


def rss_mib(srv: ServerProcess) -> int:
    """Resident memory of the backend process, MiB (POSIX ``ps``: Linux and macOS alike,
    so no platform reads 0 and passes a bound unmeasured)."""
    out = subprocess.run(
        ["ps", "-o", "rss=", "-p", str(srv.proc.pid)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip()) // 1024  # ps reports KiB


def attacked(srv: ServerProcess, refs, call, code, *needles: str) -> tuple[str, Innocents]:
    """``call()`` with innocent streams beside it must end with ``code`` (its details
    naming ``needles``); the innocents keep their text, the process lives, the server
    returns to idle. Returns (the details, the innocents)."""
    with Innocents(srv.stub, refs) as innocents:
        details = assert_refused(call, code, *needles)
    assert innocents.longest_gap < STALL_BOUND, innocents.longest_gap
    assert srv.proc.poll() is None, srv.logs()[-3000:]
    wait_idle(srv.stub, call_timeout=5.0)
    return details, innocents


# -- 1: numeric fields bounded by the context ---------------------------------------------
@pytest.mark.parametrize(
    "fields",
    [
        {"Repeat": 2**31 - 1, "Penalty": 1.1},  # the crash: RepeatLastN 2^31-1
        {"Repeat": CONTEXT + 1, "FrequencyPenalty": 0.5},
        {"NKeep": 2**31 - 1},
    ],
    ids=["repeat-penalty", "repeat-frequency", "nkeep"],
)
def test_windows_past_the_context_are_refused(server, refs, fields):
    name = next(iter(fields))
    req = greedy("The capital of France is", 8, IgnoreEOS=True, **fields)
    details, _ = attacked(
        server, refs, lambda: server.stub.Predict(req, timeout=CALL_TIMEOUT), BAD, name
    )
    assert str(CONTEXT) in details, details
    # The whole context is a window the request may ask for.
    ok = greedy("The capital of France is", 8, IgnoreEOS=True, **{**fields, name: CONTEXT})
    assert server.stub.Predict(ok, timeout=CALL_TIMEOUT).tokens == 8


# -- 1: texts measured before they are tokenized or rendered ------------------------------
def test_a_40mb_rerank_document_is_refused_before_tokenizing(server, refs):
    stub = server.stub
    before = rss_mib(server)
    request = backend_pb2.RerankRequest(query="fox", documents=["A quick fox.", BIG], top_n=1)
    t0 = time.monotonic()
    _, innocents = attacked(
        server, refs, lambda: stub.Rerank(request, timeout=CALL_TIMEOUT), BAD, "documents[1]"
    )
    took = time.monotonic() - t0
    grown = rss_mib(server) - before
    print(
        f"40 MB Rerank document: refused in {took:.2f}s, innocents' longest wait "
        f"{innocents.longest_gap:.2f}s, RSS {grown:+d} MiB"
    )
    assert grown < 1024, grown
    # A rerank within the bounds answers, best first.
    docs = ["The fox runs.", "Bread and butter.", "A red fox sleeps."]
    out = stub.Rerank(backend_pb2.RerankRequest(query="fox", documents=docs), timeout=60)
    assert sorted(r.index for r in out.results) == [0, 1, 2]
    scores = [r.relevance_score for r in out.results]
    assert scores == sorted(scores, reverse=True)


def _chat_with(messages: int, each: int) -> backend_pb2.PredictOptions:
    req = backend_pb2.PredictOptions(UseTokenizerTemplate=True, Tokens=4, Temperature=0.0)
    for i in range(messages):
        req.Messages.add(role="user" if i % 2 == 0 else "assistant", content="x" * each)
    return req


@pytest.mark.parametrize(
    "case",
    ["score-prompt", "score-candidate", "embedding", "tokenize", "messages", "tools", "prompt"],
)
def test_huge_texts_are_refused_by_their_size(server, refs, case):
    stub = server.stub
    text = BIG[:8_000_000]  # 8 MB: far past 512 tokens of at most ~81 characters
    calls = {
        "score-prompt": (
            lambda: stub.Score(backend_pb2.ScoreRequest(prompt=text, candidates=[" a"])),
            "prompt",
        ),
        "score-candidate": (
            lambda: stub.Score(backend_pb2.ScoreRequest(prompt="Hi", candidates=[" a", text])),
            "candidates[1]",
        ),
        "embedding": (
            lambda: stub.Embedding(backend_pb2.PredictOptions(Embeddings=text)),
            "Embeddings",
        ),
        "tokenize": (
            lambda: stub.TokenizeString(backend_pb2.PredictOptions(Prompt=text * 2)),
            "Prompt",
        ),
        # 4,000 messages of 2,000 characters: measured before the template renders them.
        "messages": (lambda: stub.Predict(_chat_with(4_000, 2_000)), "Messages"),
        "tools": (
            lambda: stub.Predict(
                chat_request(
                    "hi",
                    Tokens=4,
                    Tools=json.dumps(
                        [
                            {"type": "function", "function": {"name": f"f{i}", "parameters": {}}}
                            for i in range(5_000)
                        ]
                    ),
                )
            ),
            "Tools",
        ),
        "prompt": (lambda: stub.Predict(greedy(text, 4)), "prompt"),
    }
    call, field = calls[case]
    attacked(server, refs, lambda: call(), BAD, field)


# -- 6: GrammarTriggers, tool-call grammars, reasoning-gated grammars --------------------
def test_hostile_grammar_triggers_fail_the_load_and_keep_the_model(server, refs, tiny):
    stub = server.stub
    with Innocents(stub, refs):
        res = stub.LoadModel(
            backend_pb2.ModelOptions(
                Model=str(tiny),
                ContextSize=CONTEXT,
                GrammarTriggers=[backend_pb2.GrammarTrigger(word="w" * 100) for _ in range(5_000)],
            ),
            timeout=120,
        )
    assert not res.success and "GrammarTriggers" in res.message, res.message
    assert server.proc.poll() is None
    wait_idle(stub, call_timeout=5.0)


def test_a_grammar_with_triggers_constrains_after_the_word(server, refs, tiny):
    stub = server.stub
    try:
        load(server, tiny, GrammarTriggers=[backend_pb2.GrammarTrigger(word="<call>")])
        req = greedy("Answer:", 12, Grammar='root ::= "<call>" [0-9]+', LogitBias=json.dumps({}))
        with Innocents(stub, refs):
            text = stub.Predict(req, timeout=CALL_TIMEOUT).message.decode()
        # Free text, then (when the word came) only what the grammar allows after it.
        if "<call>" in text:
            assert re.fullmatch(r"<call>[0-9]*", text[text.index("<call>") :]), text
        wait_idle(stub, call_timeout=5.0)
    finally:
        load(server, tiny)


RECURSIVE = {
    "type": "function",
    "function": {
        "name": "tree",
        "parameters": {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                }
            },
            "$ref": "#/$defs/node",
        },
    },
}


@pytest.mark.parametrize(
    "tools,choice",
    [
        ([RECURSIVE], "required"),
        ([RECURSIVE], '{"type": "function", "function": {"name": "tree"}}'),
        ([{"type": "function", "function": {"name": "x", "parameters": {"type": 5}}}], "required"),
    ],
    ids=["recursive-required", "recursive-named", "broken-schema"],
)
def test_hostile_tool_grammars_answer_clearly(server, refs, tools, choice):
    stub = server.stub
    req = chat_request("call it", Tokens=24, Temperature=0.0, Tools=json.dumps(tools))
    req.ToolChoice = choice
    with Innocents(stub, refs):
        try:
            reply = stub.Predict(req, timeout=CALL_TIMEOUT)
            outcome = "OK"
        except grpc.RpcError as err:
            outcome = err.code().name
            assert err.code() in (BAD, grpc.StatusCode.FAILED_PRECONDITION), err.details()
            assert "\n" not in err.details().strip(), err.details()
    if outcome == "OK":
        assert reply.tokens <= 24
    assert server.proc.poll() is None
    wait_idle(stub, call_timeout=5.0)


def test_a_grammar_after_an_open_think_block(server, refs):
    """The tiny model's template has no think markers: a prompt ending in an open
    ``<think>`` is text, and the grammar holds from the first token."""
    stub = server.stub
    req = greedy(
        "Question?<think>",
        10,
        Grammar='root ::= ("yes" | "no") "."',
        Metadata={"grammar_scope": "after_reasoning", "reasoning_budget": "3"},
    )
    with Innocents(stub, refs):
        text = stub.Predict(req, timeout=CALL_TIMEOUT).message.decode()
    assert text in ("yes.", "no."), text
    wait_idle(stub, call_timeout=5.0)


# -- 6: preemption: requests that outgrow a tight memory budget ---------------------------
PREEMPT_OPTIONS = ("warmup:false", "prefill_step_size:16", "max_batch_size:16")
KV_STEP = 256  # tokens: the KV grows in steps of this many


def _long_prompts(n: int) -> list[str]:
    # ~245 tokens each, so that generating to the full context crosses a KV step.
    words = ["river", "stone", "lamp", "orchard", "violet", "harbor", "copper", "meadow"]
    return [
        f"Story {i}: " + " ".join(words[(i * 3 + k) % len(words)] for k in range(236))
        for i in range(n)
    ]


def test_requests_to_the_full_context_under_a_tight_budget_are_preempted_exactly(
    server, refs, tiny
):
    """Three requests generating until the context is full (Tokens -1) outgrow a budget set
    from Status' figures (as tests/model/test_preemption.py): the newest give way and
    resume; they and the innocents beside them all give their solo text."""
    stub = server.stub
    hostile = [
        greedy(p, -1, IgnoreEOS=True, **({"Temperature": 0.9, "Seed": 7} if i == 1 else {}))
        for i, p in enumerate(_long_prompts(3))
    ]
    try:
        load(server, tiny, f"memory_budget:{64 * 1024**3}", *PREEMPT_OPTIONS)
        s = wait_idle(stub)
        solo = [stub.Predict(r, timeout=CALL_TIMEOUT).message for r in hostile]
        assert all(len(m) > 100 for m in solo), solo
        step = s["memory_fixed_per_sequence"] + s["memory_kv_per_token"] * KV_STEP
        prefill = 16 * s["memory_prefill_per_token"]
        prefill += 16 * (KV_STEP + 16) * s["memory_prefill_per_pair"]
        budget = budget_for(s["weights"] + prefill + int(6.5 * step))  # cache share on top
        load(server, tiny, f"memory_budget:{budget}", *PREEMPT_OPTIONS)
        got: list[bytes | str] = [b""] * len(hostile)

        def send(i: int) -> None:
            time.sleep(0.02 * i)
            try:
                got[i] = stub.Predict(hostile[i], timeout=CALL_TIMEOUT * 2).message
            except grpc.RpcError as err:
                got[i] = f"{err.code().name}: {err.details()}"

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(hostile))]
        with Innocents(stub, refs):
            for t in threads:
                t.start()
            for t in threads:
                t.join(CALL_TIMEOUT * 3)
        after = wait_idle(stub, call_timeout=5.0)
        assert got == solo
        assert after["preemptions"] >= 1, after
        assert after["preemption_resumes"] == after["preemptions"], after
        assert after["memory_reserved"] == 0, after
        assert server.proc.poll() is None
    finally:
        load(server, tiny)


# -- 6: in-flight prefix sharing: the request others wait on is cancelled -----------------
def test_cancelling_the_request_a_shared_prefix_waits_on(server, refs, tiny):
    """Followers sharing a long prefix with a request still prefilling it (16-token chunks)
    are parked on it (engine/sharing.py); that request, and one follower, are cancelled
    mid-way: the other followers give their solo text and nothing stays running."""
    stub = server.stub
    shared = _long_prompts(1)[0]
    leader = greedy(shared + " The end.", 40, IgnoreEOS=True)
    followers = [greedy(shared + f" Part {i}:", 12, IgnoreEOS=True) for i in range(4)]
    try:
        options = ("warmup:false", "prefill_step_size:16")
        load(server, tiny, *options)
        solo = [stub.Predict(r, timeout=CALL_TIMEOUT).message for r in followers]
        load(server, tiny, *options)  # an empty prompt cache: the prefix is shared in flight
        got: dict[int, bytes] = {}
        errors: list[str] = []

        def follow(i: int) -> None:
            try:
                if i == 3:
                    call = stub.PredictStream(followers[i], timeout=CALL_TIMEOUT)
                    threading.Timer(0.05, call.cancel).start()
                    list(call)
                else:
                    got[i] = stub.Predict(followers[i], timeout=CALL_TIMEOUT).message
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.CANCELLED:
                    errors.append(f"{i}: {err.code().name} {err.details()}")

        with Innocents(stub, refs):
            lead = stub.PredictStream(leader, timeout=CALL_TIMEOUT)
            threads = [threading.Thread(target=follow, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            time.sleep(0.02)
            lead.cancel()
            for t in threads:
                t.join(CALL_TIMEOUT * 2)
        assert not errors, errors
        assert got == {i: solo[i] for i in range(3)}
        wait_idle(stub, call_timeout=5.0)
        assert server.proc.poll() is None
    finally:
        load(server, tiny)


# -- 3: volatile spans: one documented rule, bounded log lines ---------------------------
VOLATILE_PROMPTS = 40


def test_volatile_span_timeouts_log_one_summary(server, refs, tiny):
    """A pattern that backtracks on every prompt costs its timeout per request and is
    logged once (then summarized), not once per request; ``[\\s\\S]+``-like patterns are
    read as patterns, not as JSON."""
    stub = server.stub
    bracket = stub.LoadModel(
        backend_pb2.ModelOptions(
            Model=str(tiny), ContextSize=CONTEXT, Options=[r"volatile_spans:[\s\S]+X"]
        ),
        timeout=120,
    )
    assert bracket.success, bracket.message
    try:
        load(server, tiny, "volatile_spans:(a|a)+b")
        before = server.logs().count("volatile_spans")
        with Innocents(stub, refs):
            for i in range(VOLATILE_PROMPTS):
                stub.Predict(greedy(f"{i} " + "a" * 40, 2), timeout=CALL_TIMEOUT)
        lines = server.logs().count("volatile_spans") - before
        print(f"{VOLATILE_PROMPTS} prompts hitting the span timeout: {lines} log lines")
        assert 1 <= lines <= 3, server.logs()[-3000:]
    finally:
        load(server, tiny)


# -- 6: the differential property: concurrent mixes equal their solo outputs -------------
DIFFERENTIAL_EXAMPLES = 20  # mixes of 2-6 requests: ~10 s on 2 cores
SHARED = (
    "You are a careful assistant. Answer in one short sentence, then stop. " * 3,
    "Here is a list of colours: red, green, blue, yellow, purple, orange. ",
)
GRAMMARS = ('root ::= [a-z ]+ "."', 'root ::= ("yes" | "no")')
SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})


@st.composite
def options(draw) -> backend_pb2.PredictOptions:
    prefix = draw(st.sampled_from(("", *SHARED)))
    req = greedy(prefix + draw(st.sampled_from(("Q: sky?", "Tell me", "1, 2, 3,"))), 12)
    req.IgnoreEOS = draw(st.booleans())
    if draw(st.booleans()):
        req.Temperature = draw(st.sampled_from((0.7, 1.0, 1.5)))
        req.Seed = draw(st.integers(1, 10_000))
        req.TopP = draw(st.sampled_from((0.0, 0.9)))
    if draw(st.booleans()):
        req.LogitBias = json.dumps({str(draw(st.integers(0, 49151))): -100, "28": 5})
    penalty = draw(st.sampled_from(("", "Penalty", "PresencePenalty", "FrequencyPenalty")))
    if penalty:
        setattr(req, penalty, 1.3 if penalty == "Penalty" else 0.7)
        req.Repeat = draw(st.sampled_from((0, 8, CONTEXT)))
    constraint = draw(st.sampled_from(("", "grammar", "schema")))
    if constraint == "grammar":
        req.Grammar = draw(st.sampled_from(GRAMMARS))
    elif constraint == "schema":
        req.Metadata["json_schema"] = SCHEMA
    if draw(st.booleans()):
        req.StopPrompts.append(draw(st.sampled_from((".", "e", ", "))))
    if draw(st.booleans()):
        req.Logprobs, req.TopLogprobs = 1, draw(st.integers(0, 3))
    return req


def _solo(stub, req) -> tuple[str, str]:
    reply = stub.Predict(req, timeout=CALL_TIMEOUT)
    return reply.message.decode(), reply.logprobs.decode()


def test_concurrent_mixes_equal_their_solo_outputs(server):
    stub = server.stub
    rounds: list[int] = []

    @settings(
        max_examples=DIFFERENTIAL_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        batch=st.lists(
            st.tuples(options(), st.floats(0, 0.3), st.booleans()), min_size=2, max_size=6
        )
    )
    def check(batch) -> None:
        solo = [_solo(stub, req) for req, _, _ in batch]
        got: dict[int, tuple[str, str]] = {}
        errors: list[str] = []

        def send(i: int, req, delay: float, cancel: bool) -> None:
            time.sleep(delay)
            try:
                if cancel:
                    call = stub.PredictStream(req, timeout=CALL_TIMEOUT)
                    for _ in call:
                        call.cancel()
                        break
                    return
                got[i] = _solo(stub, req)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.CANCELLED:
                    errors.append(f"{i}: {err.code().name} {err.details()}")

        threads = [
            threading.Thread(target=send, args=(i, *item), daemon=True)
            for i, item in enumerate(batch)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(CALL_TIMEOUT * 2)
        assert not errors, errors
        for i, (text, logprobs) in got.items():
            assert text == solo[i][0], (i, batch[i][0], text, solo[i][0])
            if logprobs:
                mine = [c["logprob"] for c in json.loads(logprobs)["content"]]
                alone = [c["logprob"] for c in json.loads(solo[i][1])["content"]]
                assert mine == pytest.approx(alone, abs=1e-4), (i, mine, alone)
        rounds.append(len(got))
        wait_idle(stub, call_timeout=5.0)

    t0 = time.monotonic()
    check()
    print(
        f"differential: {len(rounds)} mixes, {sum(rounds)} outputs compared, "
        f"{time.monotonic() - t0:.1f}s"
    )
    assert sum(rounds) >= DIFFERENTIAL_EXAMPLES, rounds
    assert server.proc.poll() is None
