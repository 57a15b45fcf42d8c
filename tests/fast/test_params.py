"""Unit tests for params.py: defaults, zero meanings, option defaults, validation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import backend_pb2 as pb
import params
from params import (
    DEFAULT_MAX_TOKENS,
    MAX_TOP_LOGPROBS,
    generation_params,
    load_params,
    parse_options,
)
from parsing import bounds


def gen(load: params.LoadParams | None = None, **fields) -> params.GenerationParams:
    """Parse a whole request, as the servicer does; its generation parameters."""
    return params.parse_request(pb.PredictOptions(**fields), load).params


def load(*options: str, **fields) -> params.LoadParams:
    return load_params(pb.ModelOptions(Options=list(options), **fields))


# --- parse_options -----------------------------------------------------------------


def test_parse_options_typing() -> None:
    parsed = parse_options(
        [
            "a:b:c",
            "flag:TRUE",
            "off: false ",
            " n : 10 ",
            "neg:-3",
            "f:0.5",
            "e:1e3",
            "s:hello",
            "nocolon",
            ":novalue-key",
            "empty:",
        ]
    )
    assert parsed == {
        "a": "b:c",
        "flag": True,
        "off": False,
        "n": 10,
        "neg": -3,
        "f": 0.5,
        "e": 1000.0,
        "s": "hello",
        "empty": "",
    }
    assert type(parsed["n"]) is int
    assert type(parsed["f"]) is float


def test_parse_options_last_key_wins() -> None:
    assert parse_options(["k:1", "k:2"]) == {"k": 2}


@given(st.text(alphabet=st.characters(blacklist_characters=":"), min_size=1), st.text())
def test_parse_options_never_raises_and_splits_at_first_colon(key: str, value: str) -> None:
    parsed = parse_options([f"{key}:{value}"])
    if key.strip():
        assert key.strip() in parsed
    else:
        assert parsed == {}


# --- GenerationParams defaults -----------------------------------------------------


def test_all_zero_request_gives_builtin_defaults() -> None:
    p = gen()
    assert p.max_tokens == DEFAULT_MAX_TOKENS == 512
    assert p.temperature == 0.0  # greedy, not the original's 0.6
    assert p.top_p == 1.0
    assert p.top_k == 0
    assert p.min_p == 0.0
    assert p.repetition_penalty == 0.0
    assert p.repetition_context_size == 20
    assert p.presence_penalty == 0.0
    assert p.frequency_penalty == 0.0
    assert p.xtc_threshold == 0.1
    assert p.xtc_probability == 0.0
    assert p.seed is None
    assert p.stop == ()
    assert p.logprobs is False
    assert p.top_logprobs == 0
    assert p.ignore_eos is False
    assert p.logit_bias is None
    assert p.correlation_id == ""
    assert p.model_identity == ""


def test_request_values_are_read() -> None:
    p = gen(
        Tokens=64,
        Temperature=0.7,
        TopP=0.9,
        TopK=40,
        MinP=0.05,
        Penalty=1.1,
        Repeat=64,
        PresencePenalty=0.5,
        FrequencyPenalty=-0.5,
        Seed=42,
        StopPrompts=["", "\n\n", "END", "\n\n", ""],
        Logprobs=1,
        TopLogprobs=5,
        IgnoreEOS=True,
        LogitBias='{"7": -100, "3": 2.5}',
        CorrelationId="cid",
        ModelIdentity="m",
    )
    assert p.max_tokens == 64
    assert p.temperature == 0.7  # float32 noise removed
    assert p.top_p == 0.9
    assert p.top_k == 40
    assert p.min_p == 0.05
    assert p.repetition_penalty == 1.1
    assert p.repetition_context_size == 64
    assert p.presence_penalty == 0.5
    assert p.frequency_penalty == -0.5
    assert p.seed == 42
    assert p.stop == ("\n\n", "END")
    assert p.logprobs is True
    assert p.top_logprobs == 5
    assert p.ignore_eos is True
    assert p.logit_bias == {7: -100.0, 3: 2.5}
    assert p.correlation_id == "cid"
    assert p.model_identity == "m"


def test_top_logprobs_alone_turns_logprobs_on() -> None:
    assert gen(TopLogprobs=3).logprobs is True
    assert gen(Logprobs=1).logprobs is True
    assert gen(Logprobs=1).top_logprobs == 0


def test_tokens_capped_not_rejected() -> None:
    # As requested: the prepare step caps it (prompting.fit.max_tokens, tests/fast/test_prepare.py).
    assert gen(Tokens=10**9).max_tokens == 10**9
    assert gen(load("max_tokens:100000")).max_tokens == 100000


def test_seed_zero_and_negative_are_random() -> None:
    assert gen(Seed=0).seed is None
    assert gen(Seed=-1).seed is None


# --- option defaults vs request ----------------------------------------------------


OPTIONS = (
    "max_tokens:128",
    "temp:0.3",
    "top_p:0.8",
    "min_p:0.1",
    "top_k:20",
    "xtc_threshold:0.2",
    "xtc_probability:0.5",
    "repetition_penalty:1.2",
    "repetition_context_size:32",
    "presence_penalty:0.4",
    "frequency_penalty:0.6",
    "seed:7",
)


def test_option_defaults_apply_to_zero_fields() -> None:
    p = gen(load(*OPTIONS))
    assert p.max_tokens == 128
    assert p.temperature == 0.3
    assert p.top_p == 0.8
    assert p.min_p == 0.1
    assert p.top_k == 20
    assert p.xtc_threshold == 0.2
    assert p.xtc_probability == 0.5
    assert p.repetition_penalty == 1.2
    assert p.repetition_context_size == 32
    assert p.presence_penalty == 0.4
    assert p.frequency_penalty == 0.6
    assert p.seed == 7


def test_request_wins_over_options() -> None:
    p = gen(
        load(*OPTIONS),
        Tokens=5,
        Temperature=0.9,
        TopP=0.5,
        MinP=0.2,
        TopK=3,
        Penalty=1.5,
        Repeat=8,
        PresencePenalty=0.1,
        FrequencyPenalty=0.2,
        Seed=99,
    )
    assert (p.max_tokens, p.temperature, p.top_p, p.min_p, p.top_k) == (
        5,
        0.9,
        0.5,
        0.2,
        3,
    )
    assert (p.repetition_penalty, p.repetition_context_size) == (1.5, 8)
    assert (p.presence_penalty, p.frequency_penalty, p.seed) == (0.1, 0.2, 99)


def test_negative_request_seed_overrides_option_seed() -> None:
    assert gen(load("seed:7"), Seed=-1).seed is None


def test_non_positive_option_seed_is_random() -> None:
    assert gen(load("seed:0")).seed is None
    assert gen(load("seed:-5")).seed is None


def test_temperature_alias_and_precedence() -> None:
    assert load("temp:0.4").defaults["temperature"] == 0.4
    assert load("temperature:0.5").defaults["temperature"] == 0.5
    assert load("temp:0.4", "temperature:0.5").defaults["temperature"] == 0.5
    assert gen(load("temperature:0")).temperature == 0.0


# --- validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"Tokens": -2}, "Tokens"),
        ({"TopP": 1.5}, "TopP"),
        ({"TopP": -0.1}, "TopP"),
        ({"MinP": 1.01}, "MinP"),
        ({"MinP": -0.5}, "MinP"),
        ({"Temperature": -0.1}, "Temperature"),
        ({"Temperature": math.nan}, "Temperature"),
        ({"Temperature": math.inf}, "Temperature"),
        # TopK -1 is accepted as "off" (issue 25): tests/fast/test_localai_inputs.py
        ({"Penalty": -1.0}, "Penalty"),
        ({"Penalty": math.nan}, "Penalty"),
        ({"Repeat": -1}, "Repeat"),
        ({"PresencePenalty": math.inf}, "PresencePenalty"),
        ({"FrequencyPenalty": math.nan}, "FrequencyPenalty"),
        ({"Logprobs": -1}, "Logprobs"),
        ({"TopLogprobs": -1}, "TopLogprobs"),
        ({"TopLogprobs": MAX_TOP_LOGPROBS + 1}, "TopLogprobs"),
        ({"Tools": "{not json"}, "Tools"),
        ({"Tools": '{"type": "function"}'}, "Tools"),
        ({"Tools": "[1, 2]"}, "Tools"),
        ({"LogitBias": "{bad"}, "LogitBias"),
        ({"LogitBias": "[1]"}, "LogitBias"),
        ({"LogitBias": '{"abc": 1}'}, "LogitBias"),
        ({"LogitBias": '{"-3": 1}'}, "LogitBias"),
        ({"LogitBias": '{"3": "x"}'}, "LogitBias"),
        ({"LogitBias": '{"3": 101}'}, "LogitBias"),
    ],
)
def test_invalid_request_values_name_the_field(fields: dict, name: str) -> None:
    with pytest.raises(ValueError, match=rf"PredictOptions\.{name}"):
        gen(**fields)


def test_boundary_values_are_accepted() -> None:
    p = gen(TopP=1.0, MinP=1.0, TopLogprobs=MAX_TOP_LOGPROBS, LogitBias='{"0": 100}')
    assert (p.top_p, p.min_p, p.top_logprobs) == (1.0, 1.0, MAX_TOP_LOGPROBS)
    assert p.logit_bias == {0: 100.0}


@pytest.mark.parametrize(
    ("tools", "parsed"),
    [
        ("", None),
        ("  ", None),
        ("null", None),
        ("[]", None),
        ('[{"type": "function"}]', ({"type": "function"},)),
    ],
)
def test_valid_tools(tools: str, parsed) -> None:
    spec = params.parse_request(pb.PredictOptions(Tools=tools)).prompt
    assert spec.tools == parsed


@pytest.mark.parametrize("bias", ["", "null", "{}"])
def test_empty_logit_bias_is_none(bias: str) -> None:
    assert gen(LogitBias=bias).logit_bias is None


@given(st.floats(min_value=0.0, max_value=1.0, width=32))
def test_any_top_p_in_range_is_accepted(top_p: float) -> None:
    value = gen(TopP=top_p).top_p
    assert 0.0 <= value <= 1.0


# --- LoadParams ----------------------------------------------------------------------


def test_load_defaults() -> None:
    lp = load_params(pb.ModelOptions(Model="org/model", ModelFile="/f", ModelPath="/p"))
    assert (lp.model, lp.model_file, lp.model_path) == ("org/model", "/f", "/p")
    assert lp.context_size == 0
    assert lp.trust_remote_code is False
    assert lp.max_cache_entries is None  # caches.prompt_tiers.entry_bound decides
    assert lp.max_cache_bytes is None
    assert lp.max_kv_size is None
    assert lp.tokenizer_config == {}
    assert lp.defaults == {}
    assert lp.unknown_options == ()


def test_load_reads_options() -> None:
    lp = load(
        "max_cache_entries:3",
        "max_cache_bytes:1048576",
        "max_kv_size:4096",
        "eos_token:<|im_end|>",
        "pad_token:true",
        "cpu_dequantize:true",
        ContextSize=2048,
    )
    assert lp.context_size == 2048
    assert lp.max_cache_entries == 3
    assert lp.max_cache_bytes == 1048576
    assert lp.max_kv_size == 4096
    # token options keep their raw text, even when it looks like a bool
    assert lp.tokenizer_config == {"eos_token": "<|im_end|>", "pad_token": "true"}
    assert lp.cpu_dequantize is True


@pytest.mark.parametrize(
    ("value", "expected"),
    [("8GiB", 8 * 1024**3), ("512MB", 512 * 10**6), ("2k", 2000), ("8e9", 8 * 10**9)],
)
def test_max_cache_bytes_sizes(value: str, expected: int) -> None:
    assert load(f"max_cache_bytes:{value}").max_cache_bytes == expected


def test_trust_remote_code_from_field_or_option() -> None:
    assert load(TrustRemoteCode=True).tokenizer_config == {"trust_remote_code": True}
    lp = load("trust_remote_code:true")
    assert lp.trust_remote_code is True
    assert lp.tokenizer_config == {"trust_remote_code": True}


@pytest.mark.parametrize(
    ("option", "name"),
    [
        ("max_cache_entries:0", "max_cache_entries"),
        ("max_cache_entries:-2", "max_cache_entries"),
        ("max_cache_entries:abc", "max_cache_entries"),
        ("max_cache_bytes:-1", "max_cache_bytes"),
        ("max_cache_bytes:lots", "max_cache_bytes"),
        ("max_kv_size:0", "max_kv_size"),
        ("max_kv_size:-10", "max_kv_size"),
        ("trust_remote_code:maybe", "trust_remote_code"),
        ("max_tokens:0", "max_tokens"),
        ("temp:-1", "temp"),
        ("temperature:hot", "temperature"),
        ("top_p:2", "top_p"),
        ("min_p:-0.1", "min_p"),
        ("top_k:-1", "top_k"),
        ("top_k:1.5", "top_k"),
        ("xtc_threshold:0.9", "xtc_threshold"),
        ("xtc_probability:1.5", "xtc_probability"),
        ("repetition_penalty:-1", "repetition_penalty"),
        ("repetition_context_size:0", "repetition_context_size"),
        ("presence_penalty:nan", "presence_penalty"),
        ("frequency_penalty:x", "frequency_penalty"),
        ("seed:abc", "seed"),
    ],
)
def test_invalid_options_name_the_option(option: str, name: str) -> None:
    with pytest.raises(ValueError, match=rf"option {name}\b"):
        load(option)


def test_negative_context_size_names_field() -> None:
    with pytest.raises(ValueError, match=r"ModelOptions\.ContextSize"):
        load(ContextSize=-1)


def test_dataclasses_are_frozen() -> None:
    p = gen()
    with pytest.raises(AttributeError):
        p.temperature = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "fields, name",
    [
        ({"Mirostat": 2}, "Mirostat"),
        ({"TypicalP": 0.5}, "TypicalP"),
        ({"TailFreeSamplingZ": 0.9}, "TailFreeSamplingZ"),
        ({"NegativePrompt": "ugly"}, "NegativePrompt"),
        ({"RopeFreqBase": 10000.0}, "RopeFreqBase"),
        ({"Audios": ["aGVsbG8="]}, "Audios"),
    ],
)
def test_refused_predict_fields_name_themselves(fields, name):
    with pytest.raises(ValueError, match=f"PredictOptions.{name} is not supported"):
        generation_params(pb.PredictOptions(Prompt="x", **fields))


def test_disabled_values_of_refused_samplers_are_accepted():
    # LocalAI sends TypicalP / TailFreeSamplingZ 1.0 (= off) by default.
    req = pb.PredictOptions(Prompt="x", TypicalP=1.0, TailFreeSamplingZ=1.0)
    assert generation_params(req).max_tokens == DEFAULT_MAX_TOKENS


@pytest.mark.parametrize(
    "fields, name",
    [
        ({"RopeScaling": "yarn"}, "RopeScaling"),
        ({"MMProj": "p.gguf"}, "MMProj"),
        ({"Overrides": ["a=b"]}, "Overrides"),
    ],
)
def test_refused_load_fields_name_themselves(fields, name):
    with pytest.raises(ValueError, match=f"ModelOptions.{name} is not supported"):
        load_params(pb.ModelOptions(Model="m", **fields))


def test_load_seed_and_nbatch_fill_options_unless_set():
    lp = load_params(pb.ModelOptions(Model="m", Seed=7, NBatch=256))
    assert lp.defaults["seed"] == 7 and lp.prefill_step_size == 256
    lp = load_params(pb.ModelOptions(Model="m", Seed=7, Options=["seed:9"]))
    assert lp.defaults["seed"] == 9
    assert generation_params(pb.PredictOptions(Prompt="x"), lp).seed == 9


def test_parser_hints_are_validated_at_load():
    # LocalAI's importer writes vLLM's parser names into the model file's options.
    lp = load("tool_parser:hermes", "reasoning_parser:qwen3")
    assert (lp.tool_parser, lp.reasoning_parser) == ("hermes", "qwen3")
    # Issue 25: an unknown name no longer fails the load (LocalAI passes options meant for
    # other backends too); it is a warning when the tokenizer is set up
    # (parsers.apply_parser_overrides, tested in tests/fast/test_localai_inputs.py).
    lp = load("tool_parser: nope", "reasoning_parser:nope")
    assert (lp.tool_parser, lp.reasoning_parser) == ("nope", "nope")


@pytest.mark.parametrize(
    ("option", "name"),
    [
        ("max_batch_size:0", "max_batch_size"),
        ("max_queue:-1", "max_queue"),
        ("prefill_step_size:0", "prefill_step_size"),
        ("cpu_dequantize:maybe", "cpu_dequantize"),
        ("embedding_pooling:max", "embedding_pooling"),
        ("embedding_normalize:x", "embedding_normalize"),
        ("distributed_mode:ring", "distributed_mode"),
        ("cpu_dequantize_budget:lots", "cpu_dequantize_budget"),
    ],
)
def test_every_engine_option_is_parsed_at_load(option: str, name: str) -> None:
    with pytest.raises(ValueError, match=rf"option {name}\b"):
        load(option)


def test_engine_options_become_load_fields():
    lp = load(
        "max_batch_size:4",
        "max_queue:0",
        "prefill_step_size:128",
        "cpu_dequantize:dense",
        "embedding_pooling:last",
        "embedding_normalize:false",
        "distributed_vocab:false",
    )
    assert (lp.max_batch_size, lp.max_queue, lp.prefill_step_size) == (4, 0, 128)
    assert (lp.cpu_dequantize, lp.embedding_pooling, lp.embedding_normalize) == (True, "last", -1)
    assert lp.distributed_vocab is False and lp.distributed_mode == ""


def test_embedding_settings_from_load_options():
    # (pooling, llama.cpp's embd_normalize code): true is 2 (L2), false is -1 (none).
    assert (load().embedding_pooling, load().embedding_normalize) == ("mean", 2)
    got = load("embedding_pooling:last", "embd_normalize:-1")
    assert (got.embedding_pooling, got.embedding_normalize) == ("last", -1)
    assert load("embedding_normalize:false").embedding_normalize == -1
    with pytest.raises(ValueError, match="embedding_pooling"):
        load("embedding_pooling:3")
    with pytest.raises(ValueError, match="embedding_normalize"):
        load("embedding_normalize:yes")


def test_tokens_minus_one_means_until_eos_or_a_full_context():
    assert gen(Tokens=-1).max_tokens == params.UNTIL_CONTEXT_FULL  # capped by prompting.fit
    assert gen(Tokens=10**6).max_tokens == 10**6


# --- bounds before work (parsing/bounds.py, issue 41 item 1) -------------------------
CTX = bounds.Bounds(512, 81)  # the tiny llama's: 512 tokens of at most 81 characters


def bounded(**fields) -> params.GenerationRequest:
    return params.parse_request(pb.PredictOptions(**fields), None, CTX)


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        # RepeatLastN 2^31-1 with a penalty froze the engine building a (rows, window) array.
        ({"Repeat": 2**31 - 1, "Penalty": 1.1}, r"PredictOptions\.Repeat .*\[0, 512\]"),
        ({"Repeat": 513}, r"PredictOptions\.Repeat .*512-token context"),
        ({"NKeep": 2**31 - 1}, r"PredictOptions\.NKeep .*\[0, 512\]"),
        ({"Prompt": "x" * (512 * 81 + 1)}, r"PredictOptions\.Prompt .* 41473 characters"),
        ({"StopPrompts": ["a"] * 65}, r"PredictOptions\.StopPrompts has 65 entries; .* 64"),
        ({"StopPrompts": ["a" * 1025]}, r"PredictOptions\.StopPrompts\[0\] .* 1024"),
        (
            {"Tools": "[" + ",".join(['{"type": "function"}'] * 129) + "]"},
            r"PredictOptions\.Tools has 129 entries; the limit is 128",
        ),
    ],
)
def test_bounds_refuse_before_parsing_naming_the_field_and_limit(fields, needle) -> None:
    with pytest.raises(ValueError, match=needle):
        bounded(**fields)


def test_messages_are_measured_before_rendering() -> None:
    long = pb.PredictOptions(UseTokenizerTemplate=True)
    for _ in range(3):
        long.Messages.add(role="user", content="y" * 14_000)  # 42,000 > 41,472 together
    with pytest.raises(ValueError, match=r"PredictOptions\.Messages hold 42000 characters"):
        params.parse_request(long, None, CTX)
    many = pb.PredictOptions(UseTokenizerTemplate=True)
    for _ in range(513):
        many.Messages.add(role="user", content="")
    with pytest.raises(ValueError, match=r"PredictOptions\.Messages has 513 entries"):
        params.parse_request(many, None, CTX)


def test_windows_up_to_the_context_and_option_windows_are_bounded_too() -> None:
    got = bounded(Repeat=512, Penalty=1.1, NKeep=512).params
    assert (got.repetition_context_size, got.keep) == (512, 512)
    assert bounded().params.repetition_context_size == 20
    wide = load("repetition_context_size:100000")
    assert gen(wide).repetition_context_size == 100000  # no model: the fallback context
    with pytest.raises(ValueError, match=r"option repetition_context_size .*\[0, 512\]"):
        params.parse_request(pb.PredictOptions(), wide, CTX)
    # Without a context the window is still bounded (parsing.bounds.FALLBACK_CONTEXT).
    with pytest.raises(ValueError, match=r"PredictOptions\.Repeat .*\[0, 131072\]"):
        gen(Repeat=2**31 - 1)


def test_grammar_triggers_are_counted_at_load() -> None:
    many = [pb.GrammarTrigger(word=f"w{i}") for i in range(257)]
    with pytest.raises(ValueError, match=r"ModelOptions\.GrammarTriggers has 257 entries"):
        load(GrammarTriggers=many)
    with pytest.raises(ValueError, match=r"ModelOptions\.GrammarTriggers\[1\] is 1025"):
        load(GrammarTriggers=[pb.GrammarTrigger(word="a"), pb.GrammarTrigger(word="b" * 1025)])
    ok = load(GrammarTriggers=[pb.GrammarTrigger(word="<tool_call>"), pb.GrammarTrigger()])
    assert ok.grammar_triggers == ("<tool_call>",)
