"""Request and load options beyond plain sampling, on the embedded model over gRPC:
speculative decoding, KV cache quantization, context size and rotating KV, logit bias,
IgnoreEOS. A second server process is reloaded with each load-time setting."""

from __future__ import annotations

import json

import grpc
import pytest
from helpers import chat_request, greedy

import backend_pb2
from clients.server_process import ServerProcess
from loading import model_loader

GGUF = str(model_loader.embedded_model_path())
STORY = "The old lighthouse keeper climbed the stairs every evening, and one night he saw"


@pytest.fixture(scope="module")
def other():
    """A second backend, reloaded by each test with the settings it exercises."""
    srv = ServerProcess(entry="run.sh")
    try:
        yield srv
    finally:
        srv.stop()


def load(srv, **fields):
    res = srv.stub.LoadModel(backend_pb2.ModelOptions(Model=GGUF, **fields))
    assert res.success, res.message
    return res


def info(stub) -> dict:
    return json.loads(stub.GetMetrics(backend_pb2.MetricsRequest()).prompt_json_for_slot)


def test_speculative_decoding_gives_the_same_greedy_text(stub, other):
    expected = stub.Predict(greedy(STORY, tokens=20)).message
    load(other, DraftModel=GGUF)
    assert info(other.stub)["draft_model"] is True
    reply = other.stub.Predict(greedy(STORY, tokens=20))
    assert reply.message == expected
    # The model is its own draft, so nearly every proposed token is accepted.
    assert info(other.stub)["last_request_draft_tokens_accepted"] >= 10
    streamed = b"".join(
        r.message for r in other.stub.PredictStream(greedy(STORY, tokens=20, NDraft=2))
    )
    assert streamed == expected


def test_quantized_kv_cache_is_smaller_and_coherent(stub, other):
    load(other)
    other.stub.Predict(greedy(STORY, tokens=12))
    full = other.stub.Status(backend_pb2.HealthMessage()).memory.breakdown["prompt_cache"]
    load(other, CacheTypeKey="q8_0", CacheTypeValue="q8_0")
    assert info(other.stub)["kv_bits"] == 8
    reply = other.stub.Predict(greedy(STORY, tokens=12))
    quantized = other.stub.Status(backend_pb2.HealthMessage()).memory.breakdown["prompt_cache"]
    assert 0 < quantized < full / 2  # float32 KV vs 8-bit KV with per-group scales
    text = reply.message.decode()
    assert reply.tokens == 12 and len(text.split()) >= 4
    # q8 KV barely perturbs the model: the first words agree with the float KV.
    assert text.split()[:3] == stub.Predict(greedy(STORY, tokens=12)).message.decode().split()[:3]


def test_context_size_bounds_the_prompt(other):
    load(other, ContextSize=32)
    with pytest.raises(grpc.RpcError) as err:
        other.stub.Predict(greedy(STORY * 3, tokens=20))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "context holds 32" in err.value.details()
    # Tokens are capped to what the context has left.
    short = other.stub.Predict(greedy("Hi", tokens=100))
    assert short.prompt_tokens + short.tokens <= 32


def test_rotating_kv_cache_keeps_nkeep_and_accepts_long_prompts(other):
    load(other, ContextSize=32, Options=["max_kv_size:48"])
    reply = other.stub.Predict(greedy(STORY * 5, tokens=8, NKeep=8))
    assert reply.prompt_tokens > 48 and reply.tokens == 8


def test_logit_bias_on_the_greedy_token_changes_output(stub):
    base = stub.Predict(greedy(STORY, tokens=6, Logprobs=1))
    first = json.loads(base.logprobs)["content"][0]
    token_id = stub.TokenizeString(backend_pb2.PredictOptions(Prompt=first["token"])).tokens
    assert len(token_id) == 1
    biased = stub.Predict(greedy(STORY, tokens=6, LogitBias=json.dumps({str(token_id[0]): -100})))
    assert biased.message != base.message
    assert not biased.message.startswith(first["token"].encode())
    with pytest.raises(grpc.RpcError) as err:
        stub.Predict(greedy(STORY, tokens=20, LogitBias="{not json"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "LogitBias" in err.value.details()


def test_ignore_eos_generates_to_the_token_limit(stub):
    req = chat_request("What is the capital of France? One word.", Temperature=0.0, Tokens=40)
    stopped = stub.Predict(req)
    assert stopped.tokens < 40  # the model ends its turn with <|im_end|>
    req.IgnoreEOS = True
    assert stub.Predict(req).tokens == 40


def test_prompt_cache_read_only_request_stores_nothing(stub):
    prompt = "A read-only request about zebras crossing a wide river at dawn"
    stub.Predict(greedy(prompt, tokens=4, PromptCacheRO=True))
    cold = stub.Predict(greedy(prompt, tokens=4))
    # Nothing was cached by the read-only request: the second one prefilled everything.
    assert stub.GetMetrics(backend_pb2.MetricsRequest()).prompt_tokens_processed == (
        cold.prompt_tokens
    )


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_json_schema_and_grammar_constrain_output(stub):
    import jsonschema

    def ask(seed):
        req = chat_request("Invent a person. Reply in JSON.", Temperature=1.0, Seed=seed, Tokens=60)
        req.Metadata["json_schema"] = json.dumps(SCHEMA)
        return stub.Predict(req)

    # Sampled and batched together: every output validates against the schema.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(ask, range(1, 5)))
    for reply in replies:
        jsonschema.validate(json.loads(reply.message), SCHEMA)

    req = chat_request("Is Paris in France?", Temperature=0.0, Tokens=8)
    req.Grammar = 'root ::= "yes" | "no"'
    assert stub.Predict(req).message.decode() in ("yes", "no")
    req.Grammar = "root ::= oops("
    with pytest.raises(grpc.RpcError) as err:
        stub.Predict(req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Grammar" in err.value.details()


# Four lines listing the planets, then the start of a fifth (issue 15's benchmark prompt).
PLANETS = "Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus, Neptune\n" * 4 + "Mercury, Venus,"


def test_ngram_speculation_gives_the_same_greedy_text(stub, other):
    prompts = [
        greedy(PLANETS, tokens=28),  # the continuation repeats the prompt's pattern
        greedy(STORY, tokens=12),  # a story: little to copy
        chat_request("Name a colour.", Tokens=8, Temperature=0.0),
    ]
    expected = [stub.Predict(p).message for p in prompts]
    load(other, Options=["speculative:ngram"])
    assert info(other.stub)["speculative"] == "ngram"
    assert other.stub.Predict(prompts[0]).message == expected[0]
    # Drafts copied from the repeated lines are accepted, so fewer forward passes ran.
    assert info(other.stub)["last_request_draft_tokens_accepted"] >= 10
    for prompt, text in zip(prompts[1:], expected[1:], strict=True):
        assert other.stub.Predict(prompt).message == text
    streamed = b"".join(r.message for r in other.stub.PredictStream(prompts[0]))
    assert streamed == expected[0]
