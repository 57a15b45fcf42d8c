"""``ModelOptions.EngineArgs`` (field 73): LocalAI's model-file ``engine_args:`` map, sent as
one JSON object (core/backend/options.go), read as this backend's load options through the
options table (`parsing.options.read_engine_args`): the same keys, types and bounds as
``Options``; unknown keys fail LoadModel (LocalAI's backend.proto comment on the field);
EngineArgs wins over Options for an option both set (LocalAI's vLLM backend applies
engine_args last). Parsing directly, then over real gRPC with the real engine (the load
fails before any model is read)."""

from __future__ import annotations

import json

import pytest
from inprocess import InProcessServer

import backend_pb2
import params
from parsing.options import KNOWN_KEYS, read_engine_args


def load(engine_args: object, *options: str, **fields) -> params.LoadParams:
    text = engine_args if isinstance(engine_args, str) else json.dumps(engine_args)
    return params.load_params(
        backend_pb2.ModelOptions(Model="m", Options=list(options), EngineArgs=text, **fields)
    )


def test_typed_values_become_load_params():
    lp = load(
        {
            "max_batch_size": 3,
            "temperature": 0.25,
            "warmup": False,
            "memory_budget": "2GiB",
            "kv_bits": 8.0,  # an integral JSON number is an integer
            "volatile_spans": ["nonce=\\d+"],
            "tool_parser": "hermes",
            "max_queue": "5",  # a string reads as the same Options entry would
        }
    )
    assert (lp.max_batch_size, lp.max_queue, lp.warmup, lp.kv_bits) == (3, 5, False, 8)
    assert lp.defaults == {"temperature": 0.25}
    assert lp.memory_budget == 2 << 30
    assert lp.tool_parser == "hermes"
    assert lp.volatile_spans.remove("a nonce=123 b") == "a  b"
    assert lp.unknown_options == ()


def test_empty_and_null_are_not_set():
    default = load("")
    assert load("{}") == default
    assert load("  ") == default
    assert load("null") == default
    assert load({"max_batch_size": None}).max_batch_size == default.max_batch_size


def test_engine_args_win_over_options_whatever_the_spelling():
    assert load({"max_batch_size": 4}, "max_batch_size:2").max_batch_size == 4
    assert load({}, "max_batch_size:2").max_batch_size == 2  # Options alone still apply
    # temp is temperature's alias: the EngineArgs value wins in either direction.
    assert load({"temperature": 0.5}, "temp:0.9").defaults["temperature"] == 0.5
    assert load({"temp": 0.5}, "temperature:0.9").defaults["temperature"] == 0.5
    # Within EngineArgs the key wins over its alias, as within Options.
    assert load({"temp": 0.5, "temperature": 0.7}).defaults["temperature"] == 0.7
    # Over the load fields the options fall back from (ModelOptions.Seed, NBatch) too.
    assert load({"prefill_step_size": 64}, NBatch=128).prefill_step_size == 64
    assert load({"seed": 9}, Seed=3).defaults["seed"] == 9


def test_unknown_keys_fail_naming_each_and_listing_the_known():
    with pytest.raises(ValueError) as err:
        load({"gpu_memory_utilization": 0.9, "max_batchsize": 3, "max_queue": 2})
    message = str(err.value)
    assert message.startswith("ModelOptions.EngineArgs has keys this backend does not know: ")
    assert "'gpu_memory_utilization'" in message
    assert "'max_batchsize' (did you mean 'max_batch_size'?)" in message
    assert "'max_queue'" not in message.split(";")[0]  # a known key is not named unknown
    listed = message.split("options table): ")[1].split(", ")
    assert listed == sorted(KNOWN_KEYS)


@pytest.mark.parametrize(
    ("engine_args", "expected"),
    [
        ('{"max_batch_size": 0}', r"option max_batch_size \(in ModelOptions.EngineArgs\) must "
         r"be an integer >= 1, got 0"),
        ('{"max_batch_size": 2.5}', r"max_batch_size \(in ModelOptions.EngineArgs\) must be "
         "an integer"),
        ('{"max_batch_size": true}', r"max_batch_size \(in ModelOptions.EngineArgs\) must be "
         "an integer"),
        ('{"warmup": "maybe"}', r"warmup \(in ModelOptions.EngineArgs\) must be true or false"),
        ('{"top_p": 2}', r"top_p \(in ModelOptions.EngineArgs\) must be a finite number in "
         r"\[0, 1\]"),
        ('{"grammar_scope": "some"}', r"grammar_scope \(in ModelOptions.EngineArgs\) must be "
         "one of after_reasoning, all"),
        ('{"max_batch_size": {"a": 1}}', "ModelOptions.EngineArgs: max_batch_size takes "
         "integer ≥ 1 .*not a JSON object"),
        ('{"tool_parser": ["a"]}', "ModelOptions.EngineArgs: tool_parser takes text .*not a "
         "JSON array"),
        ('[{"max_batch_size": 1}]', "ModelOptions.EngineArgs must be a JSON object, got array"),
        ('{"max_batch_size": ', "ModelOptions.EngineArgs must be a JSON object"),
        ('{"top_p": NaN}', r"top_p \(in ModelOptions.EngineArgs\) must be a finite number"),
    ],
)  # fmt: skip
def test_bad_values_name_the_option_and_the_field(engine_args, expected):
    with pytest.raises(ValueError, match=expected):
        load(engine_args)


def test_engine_args_are_bounded_as_every_json_field():
    with pytest.raises(ValueError, match=r"ModelOptions\.EngineArgs nests"):
        read_engine_args('{"volatile_spans": ' + "[" * 100 + "]" * 100 + "}")


# --- over gRPC: LoadModel answers Result(success=false) naming the keys ------------------


@pytest.fixture(scope="module")
def server():
    srv = InProcessServer()
    yield srv
    srv.stop()


def test_load_model_refuses_unknown_engine_args_over_grpc(server):
    res = server.stub.LoadModel(
        backend_pb2.ModelOptions(
            Model="/nonexistent/model",
            Options=["max_batch_size:2"],
            EngineArgs=json.dumps({"enable_prefix_caching": True, "max_num_seqs": 8}),
        )
    )
    assert not res.success
    assert "ModelOptions.EngineArgs has keys this backend does not know" in res.message
    assert "'enable_prefix_caching'" in res.message and "'max_num_seqs'" in res.message
    assert "max_batch_size" in res.message  # the known keys are listed


def test_load_model_refuses_a_bad_engine_arg_value_over_grpc(server):
    res = server.stub.LoadModel(
        backend_pb2.ModelOptions(Model="/nonexistent/model", EngineArgs='{"max_queue": -1}')
    )
    assert not res.success
    assert "option max_queue (in ModelOptions.EngineArgs) must be an integer >= 0" in res.message
