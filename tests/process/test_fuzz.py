"""Hostile input: hypothesis throws 500 generated PredictOptions at a live server.

Every answer must be a well-formed Reply (or stream of them) or a clear refusal
(INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED, FAILED_PRECONDITION); nothing may
crash or hang the server (each call has a deadline), and afterwards a plain greedy
request must give the same text as before the barrage.

A request is a sane-looking base (odd strings, in-range numbers, well-formed JSON) plus
up to three hostile mutations (out-of-range or non-finite numbers, broken JSON, odd roles,
huge Tokens, a foreign ModelIdentity, JSON nested past the depth bound or oversized in
Tools, LogitBias, Metadata values and Messages' tool_calls...), so that both the refusals
and the paths that reach the model are exercised. The server is this module's own: loaded
with ContextSize 24 and option max_tokens:2, so generations stay a few tokens long even
when Tokens is huge (it is capped to the context left after the prompt). Its model is the
tiny 2-layer llama of tests/tiny_models.py (random weights, the embedded SmolLM2's
tokenizer and chat template): the requests reach a real model through the same paths, and
the ~200 that do cost a fraction of a 30-layer forward pass each.
"""

from __future__ import annotations

import json
import math
import time

import grpc
import pytest
import tiny_models
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import backend_pb2
from clients.server_process import ServerProcess

CONTEXT = 24
DEFAULT_TOKENS = 2  # the load option max_tokens
CALL_TIMEOUT = 60.0  # seconds; a hang fails the test with DEADLINE_EXCEEDED
EXAMPLES = 500
ALLOWED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
}
INT32 = (-(2**31), 2**31 - 1)

# -- strategies --------------------------------------------------------------------------
# Any unicode but surrogates (protobuf strings cannot hold them), control characters included.
any_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=10)
odd_text = st.one_of(
    any_text,
    st.sampled_from(
        [
            "",
            " ",
            "\x00",
            "\n\n",
            "\x1b[31m",
            "\u202e",
            "\ufeff",
            "<|im_end|>",
            "<|im_start|>",
            "<think>",
            "</think>",
            "<tool_call>",
            "{{ raise_exception('x') }}",
            "{%",
            "🙂🙂",
            "e\u0301",
        ]
    ),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
# Nested and oversized JSON: past the depth bound (jsonfield.MAX_JSON_DEPTH = 64) and,
# rarely, past a field's size bound; every such value must be a clean INVALID_ARGUMENT.
deep_json = st.one_of(
    st.sampled_from([65, 500, 20_000]).map(lambda d: "[" * d + "]" * d),
    st.sampled_from([65, 1_000]).map(lambda d: '{"a": ' * d + "1" + "}" * d),
)
huge_json = st.sampled_from(
    [json.dumps(["x" * 1000] * 200), json.dumps({str(i): 0.5 for i in range(20_000)})]
)
hostile_json = st.one_of(deep_json, huge_json)
broken_json = st.sampled_from(["[", "{", "null", "[]", '{"a": 1', "[1,]", "NaN", "[{}]"])
json_text = st.one_of(odd_text, json_values.map(json.dumps), broken_json, hostile_json)
tool = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.text("abcxyz_", min_size=1, max_size=8), "parameters": json_values}
        ),
    }
)
tool_call = st.fixed_dictionaries(
    {
        "id": any_text,
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": any_text, "arguments": st.one_of(any_text, json_values.map(json.dumps))}
        ),
    }
)
message = st.builds(
    backend_pb2.Message,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    content=odd_text,
    name=st.sampled_from(["", "bob"]),
    reasoning_content=st.sampled_from(["", "hmm"]),
    tool_calls=st.one_of(st.just(""), st.lists(tool_call, max_size=2).map(json.dumps)),
)
base = st.fixed_dictionaries(
    {
        "Prompt": odd_text,
        "Seed": st.integers(*INT32),
        "Tokens": st.integers(0, 3),
        "TopK": st.integers(0, 50),
        "Repeat": st.integers(0, 64),
        "Temperature": st.floats(0, 2, width=32),
        "Penalty": st.floats(0, 2, width=32),
        "FrequencyPenalty": st.floats(-2, 2, width=32),
        "PresencePenalty": st.floats(-2, 2, width=32),
        # A few values only: mlx-lm recompiles its top-p / min-p filters for every new
        # value (seconds each on CPU; reported), which would swamp the run.
        "TopP": st.sampled_from([0.0, 0.5, 0.9, 1.0]),
        "MinP": st.sampled_from([0.0, 0.05, 0.1]),
        "StopPrompts": st.lists(odd_text, max_size=3),
        "IgnoreEOS": st.booleans(),
        "LogitBias": st.dictionaries(
            st.integers(0, 49151).map(str), st.floats(-100, 100), max_size=3
        ).map(json.dumps),
        "UseTokenizerTemplate": st.booleans(),
        "Messages": st.lists(message, max_size=3),
        "Tools": st.one_of(st.just(""), st.lists(tool, max_size=2).map(json.dumps)),
        "ToolChoice": odd_text,
        "Logprobs": st.integers(0, 1),
        "TopLogprobs": st.integers(0, 20),
        "Metadata": st.dictionaries(
            st.sampled_from(["enable_thinking", "chat_template_kwargs", "other"]),
            st.sampled_from(["true", "false", "", "{}", '{"enable_thinking": false}']),
            max_size=2,
        ),
        "CorrelationId": odd_text,
        # llama.cpp knobs this backend ignores or checks.
        "Threads": st.integers(0, INT32[1]),
        "NKeep": st.integers(0, INT32[1]),
        "Batch": st.integers(0, INT32[1]),
    }
)
any_float = st.floats(width=32)  # nan, inf, negatives, huge
out_of_unit = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1e-45, 1.0000001]),
    st.floats(width=32).filter(lambda x: not 0.0 <= x <= 1.0),
)
number_fields = ["Temperature", "Penalty", "FrequencyPenalty", "PresencePenalty"]
mutation = st.one_of(
    # Huge Tokens rarer than negative ones: each may generate up to the whole context.
    st.tuples(st.just("Tokens"), st.sampled_from([-1, INT32[0], -7, INT32[1], 10**6])),
    st.tuples(
        st.sampled_from(["TopK", "Repeat", "Logprobs", "NDraft", "NKeep", "Threads", "Batch"]),
        st.integers(*INT32),
    ),
    st.tuples(st.just("TopLogprobs"), st.one_of(st.integers(*INT32), st.just(21))),
    st.tuples(st.sampled_from(number_fields), any_float),
    st.tuples(st.sampled_from(["TopP", "MinP"]), out_of_unit),
    st.tuples(
        st.just("LogitBias"),
        st.one_of(
            json_text,
            st.dictionaries(
                st.integers(-5, 10**6).map(str), st.floats(), min_size=1, max_size=2
            ).map(json.dumps),
        ),
    ),
    st.tuples(st.just("Tools"), json_text),
    st.tuples(
        st.just("Messages"),
        st.lists(
            st.builds(
                backend_pb2.Message,
                role=st.one_of(st.sampled_from(["", "tool", "function"]), any_text),
                content=odd_text,
                tool_call_id=any_text,
                tool_calls=json_text,
            ),
            min_size=1,
            max_size=2,
        ),
    ),
    st.tuples(
        st.just("Metadata"),
        st.dictionaries(
            st.sampled_from(["enable_thinking", "chat_template_kwargs"]), json_text, min_size=1
        ),
    ),
    st.tuples(
        st.just("Metadata"),
        st.dictionaries(
            st.sampled_from(["json_schema", "response_format", "chat_template_kwargs"]),
            hostile_json,
            min_size=1,
            max_size=2,
        ),
    ),
    st.tuples(st.sampled_from(["Tools", "LogitBias"]), hostile_json),
    st.tuples(
        st.just("Messages"),
        st.lists(
            st.builds(
                backend_pb2.Message,
                role=st.just("assistant"),
                content=odd_text,
                tool_calls=hostile_json,
            ),
            min_size=1,
            max_size=2,
        ),
    ),
    st.tuples(st.just("Prompt"), st.sampled_from(["word " * 30, "\x00" * 50, "🙂" * 40])),
    st.tuples(st.just("ModelIdentity"), any_text),
    # Fields the backend refuses or parses: Mirostat, media, grammars.
    st.tuples(st.just("Mirostat"), st.integers(*INT32)),
    st.tuples(st.sampled_from(["Images", "Audios"]), st.lists(odd_text, min_size=1, max_size=1)),
    st.tuples(st.just("Grammar"), st.one_of(odd_text, st.just('root ::= "a"'))),
    st.tuples(st.just("StopPrompts"), st.lists(any_text, min_size=5, max_size=20)),
)
requests = st.builds(
    lambda fields, mutations: backend_pb2.PredictOptions(**{**fields, **dict(mutations)}),
    base,
    st.lists(mutation, max_size=3),
)


# -- checks ------------------------------------------------------------------------------
def token_limit(req: backend_pb2.PredictOptions) -> int:
    if req.Tokens == -1:  # until EOS or the context is full
        return CONTEXT
    return min(req.Tokens or DEFAULT_TOKENS, CONTEXT)


def check_reply(req: backend_pb2.PredictOptions, reply: backend_pb2.Reply) -> str:
    text = reply.message.decode("utf-8")  # never a split multi-byte character
    assert 0 <= reply.tokens <= token_limit(req)
    assert reply.prompt_tokens >= 0
    assert reply.timing_prompt_processing >= 0 and reply.timing_token_generation >= 0
    # The structured deltas carry exactly the text of the reply's message, no more.
    assert "".join(delta.content for delta in reply.chat_deltas) == text
    if reply.logprobs:
        assert isinstance(json.loads(reply.logprobs)["content"], list)
    return text


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    model = tiny_models.build("llama", tmp_path_factory.mktemp("tiny_models"))
    srv = ServerProcess(entry="run.sh")
    try:
        load = backend_pb2.ModelOptions(
            Model=str(model),
            ContextSize=CONTEXT,
            Options=[f"max_tokens:{DEFAULT_TOKENS}"],
        )
        res = srv.stub.LoadModel(load)
        assert res.success, res.message
        yield srv
    finally:
        assert srv.stop() == 0, srv.logs()[-3000:]


def test_generated_requests_never_break_the_server(fuzz_server):
    stub = fuzz_server.stub
    greedy = backend_pb2.PredictOptions(Prompt="The capital of France is", Tokens=6)
    before = stub.Predict(greedy, timeout=CALL_TIMEOUT)
    assert before.tokens == 6
    seen: dict[str, int] = {}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(req=requests, stream=st.booleans())
    def check(req: backend_pb2.PredictOptions, stream: bool) -> None:
        try:
            if stream:
                replies = list(stub.PredictStream(req, timeout=CALL_TIMEOUT))
                assert replies, "a stream must end with at least one reply"
                for reply in replies:
                    check_reply(req, reply)
                assert replies[-1].tokens <= token_limit(req)
            else:
                check_reply(req, stub.Predict(req, timeout=CALL_TIMEOUT))
            outcome = "OK"
        except grpc.RpcError as err:
            assert err.code() in ALLOWED, (err.code(), err.details(), req)
            assert err.details(), "a refusal must say why"
            outcome = err.code().name
        seen[outcome] = seen.get(outcome, 0) + 1

    t0 = time.monotonic()
    check()
    elapsed = time.monotonic() - t0
    # Useful fuzzing reaches the model and gets refused too; the server is still whole.
    assert seen.get("OK", 0) >= 50 and seen.get("INVALID_ARGUMENT", 0) >= 50, seen
    assert fuzz_server.proc.poll() is None
    after = stub.Predict(greedy, timeout=CALL_TIMEOUT)
    assert after.message == before.message and after.tokens == before.tokens
    print(f"{EXAMPLES} examples in {elapsed:.1f}s: {seen}")
