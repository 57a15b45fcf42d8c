"""The load options' table (parsing/options.py): the parser, the unknown-key list, LoadParams
and the README's option list all follow it; the one on/off reader."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from inprocess import InProcessServer
from scripted import ScriptedModel

import backend_pb2 as pb
import params
from parsing import options as opts
from parsing.options import OPTIONS, Option, env_on, on_off
from seam.tokenizer import vocab_size

ROOT = Path(__file__).resolve().parents[2]


def load(*options: str, **fields) -> params.LoadParams:
    return params.load_params(pb.ModelOptions(Model="m", Options=list(options), **fields))


# --- the documents follow the table -------------------------------------------------


def test_readme_option_list_is_the_table():
    readme = (ROOT / "docs" / "FIELDS.md").read_text(encoding="utf-8")
    assert readme.count(opts.README_BEGIN) == 1 and readme.count(opts.README_END) == 1
    assert opts.readme_with_table(readme) == readme, (
        "docs/FIELDS.md's option list differs from parsing/options.py OPTIONS: run "
        "`python -m parsing.fields docs/FIELDS.md`"
    )
    # Every key has its row, with its accepted values, default and doc.
    part = readme[readme.index(opts.README_BEGIN) : readme.index(opts.README_END)]
    rows = {m[1]: m[0] for m in re.findall(r"^(\| `([a-z_]+)`.*\|)$", part, re.M)}
    assert list(rows) == [o.key for o in OPTIONS]
    for o in OPTIONS:
        assert o.doc in rows[o.key] and opts._default(o) in rows[o.key]


def test_readme_table_is_regenerated_between_the_markers():
    stale = f"intro\n{opts.README_BEGIN}| `old_key` | x | y | z |\n{opts.README_END}after\n"
    fresh = opts.readme_with_table(stale)
    assert "old_key" not in fresh and fresh.startswith("intro\n") and fresh.endswith("after\n")
    assert "| `max_batch_size` | integer ≥ 1 | 256 | most sequences decoded together (" in fresh
    with pytest.raises(ValueError, match="markers"):
        opts.readme_with_table("no markers here")


@pytest.mark.parametrize(
    "doc", ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
)
def test_options_the_docs_name_are_in_the_table(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    named = set(re.findall(r"options? `([a-z_]+)`", text))
    # The `options:` lists of the model-file examples.
    for block in re.findall(r"^(\s*)options:\s*\n((?:\1\s*- .*\n)+)", text, re.M):
        named |= set(re.findall(r'-\s*"?([a-z_]+):', block[1]))
    unknown = named - opts.KNOWN_KEYS
    assert not unknown, f"{doc} names options the table lacks: {sorted(unknown)}"
    if doc == "docs/LOCALAI.md":
        assert {"cpu_dequantize", "tool_parser"} <= named  # the check reads its examples


def test_params_docstring_lists_no_options():
    # The table is the one list: the module docstring points at it instead of repeating
    # it (its request-field table names the option each field falls back to).
    doc = params.__doc__ or ""
    assert "`OPTIONS` in\n`parsing/options.py`" in doc
    named = set(re.findall(r"\boptions? ([a-z]+_[a-z_]*)", doc))
    assert named <= opts.KNOWN_KEYS, sorted(named - opts.KNOWN_KEYS)
    listed = {o.key for o in OPTIONS if re.search(rf"\b{o.key}\b", doc)}
    assert len(listed) < len(OPTIONS) // 2, sorted(listed)


# --- the table ------------------------------------------------------------------------


def test_table_entries_are_well_formed():
    keys = [k for o in OPTIONS for k in (o.key, *o.aliases)]
    assert len(keys) == len(set(keys))
    assert set(opts._READERS) == {o.kind for o in OPTIONS}
    for o in OPTIONS:
        assert o.doc and o.group, o.key
        assert (o.kind == "choice") == bool(o.choices), o.key
        if o.kind in ("int", "float"):
            assert o.lo is not None or o.kind == "float", o.key
        if o.env:
            assert o.kind == "switch", o.key


def test_fields_named_after_options_take_the_table_default():
    fields = {f.name: f for f in dataclasses.fields(params.LoadParams)}
    for o in OPTIONS:
        if o.field:
            assert o.key in fields, o.key
            if fields[o.key].default is not dataclasses.MISSING:
                assert fields[o.key].default == o.default, o.key
    # What load_params gives without options is the table's default, for every option.
    got = dataclasses.asdict(load())
    for o in OPTIONS:
        if o.field and not o.env:
            assert got[o.key] == o.default, o.key


_BAD = {
    "int": "x",
    "float": "x",
    "size": "lots",
    "switch": "maybe",
    "auto_switch": "maybe",
    "choice": "nope",
    "path": "",
    "normalize": "x",
    "patterns": "(unclosed",
}


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.key)
def test_every_option_is_checked_naming_itself(option: Option):
    """The parser is generated from the table: each kind's bad value fails the load with
    a message naming the option, and each bound is enforced."""
    if option.kind == "text":
        assert opts.read_options([f"{option.key}:  a:b  "]).values[option.key] == "a:b"
        return
    with pytest.raises(ValueError, match=rf"option {option.key}\b"):
        load(f"{option.key}:{_BAD[option.kind]}")
    if option.kind == "int" and option.lo is not None and option.key != "seed":
        load(f"{option.key}:{int(option.lo)}")
        with pytest.raises(ValueError, match=rf"option {option.key}\b"):
            load(f"{option.key}:{int(option.lo) - 1}")
    if option.hi is not None:
        with pytest.raises(ValueError, match=rf"option {option.key}\b"):
            load(f"{option.key}:{option.hi * 2}")


def test_only_keys_outside_the_table_are_unknown():
    lp = load(
        "foo:1",
        "max_batch_size:2",
        "temp:0.5",
        "embd_normalize:1",
        "vision_cache_entries:4",
        "eos_token:</s>",
        "gpu_layers:99",
    )
    assert lp.unknown_options == ("foo", "gpu_layers")
    assert load("max_batch_size:2").unknown_options == ()
    every = [f"{o.key}:{_valid(o)}" for o in OPTIONS]
    assert load(*every, DraftModel="d").unknown_options == ()


def _valid(o: Option) -> str:
    if o.key == "speculative":
        return "draft"
    if o.kind == "choice":
        return next(c for c in o.choices if c)
    return {"switch": "on", "auto_switch": "auto", "path": "/h", "normalize": "2"}.get(
        o.kind, str(o.lo if o.lo is not None else 1)
    )


# --- behaviour the table keeps ------------------------------------------------------


def test_aliases_are_read_only_when_the_key_is_absent():
    assert load("temp:0.5").defaults["temperature"] == 0.5
    assert load("temp:0.5", "temperature:0.7").defaults["temperature"] == 0.7
    # As before the table: the spelling not read is not checked either.
    assert load("temperature:0.7", "temp:-1").defaults == {"temperature": 0.7}
    assert load("embd_normalize:1").embedding_normalize == 1
    assert load("embedding_normalize:0", "embd_normalize:x").embedding_normalize == 0
    with pytest.raises(ValueError, match=r"option embedding_normalize must be true/false"):
        load("embd_normalize:x")  # llama.cpp's spelling: the message names ours


def test_sampling_defaults_hold_only_the_options_given():
    lp = load("top_k:40", "seed:0", "xtc_probability:0.5", "max_tokens:1e2")
    assert lp.defaults == {"top_k": 40, "seed": 0, "xtc_probability": 0.5, "max_tokens": 100}
    assert type(lp.defaults["max_tokens"]) is int


def test_memory_budget_zero_is_off_and_sizes_are_bytes():
    assert load().memory_budget is None  # the platform's default (engine/memory.py)
    for off in ("0", "0.0", "false"):
        assert load(f"memory_budget:{off}").memory_budget == 0
    assert load("memory_budget:12GiB").memory_budget == 12 << 30
    assert load("memory_budget:1.5GB").memory_budget == 1_500_000_000
    with pytest.raises(ValueError, match=r"option memory_budget\b"):
        load("memory_budget:0GiB")
    with pytest.raises(ValueError, match=r"option cpu_dequantize_budget\b"):
        load("cpu_dequantize_budget:0")  # 0 is off only where the table says so


def _off_at_zero(o: Option) -> bool:
    """The table tells users that 0 turns ``o`` off (README's default column)."""
    return bool(re.search(r"\(0 = off\)|^0 \(off\)$", o.shown))


@pytest.mark.parametrize("o", [o for o in OPTIONS if _off_at_zero(o)], ids=lambda o: o.key)
def test_an_option_the_table_calls_off_at_0_takes_0(o):
    """What README says is what the parser does (max_cache_bytes:0 was documented as the
    prompt cache off and refused)."""
    lp = load(f"{o.key}:0")
    if o.field:
        assert getattr(lp, o.key) == 0


def test_max_cache_bytes_0_is_among_the_options_off_at_0():
    assert "max_cache_bytes" in {o.key for o in OPTIONS if _off_at_zero(o)}
    assert load("max_cache_bytes:0").max_cache_bytes == 0


@pytest.mark.parametrize(("options", "kept"), [([], True), (["max_cache_bytes:0"], False)])
def test_max_cache_bytes_0_keeps_no_prompt(tok, options, kept):
    """Served over real gRPC (a scripted model): after a request the prompt cache holds its
    prompt, unless max_cache_bytes is 0 (Status's prompt_cache bytes)."""
    srv = InProcessServer(ScriptedModel(vocab_size(tok), tok.eos_token_id), tok, options)
    try:
        srv.stub.Predict(pb.PredictOptions(Prompt="a prompt the cache could keep", Tokens=2))
        held = srv.stub.Status(pb.HealthMessage()).memory.breakdown["prompt_cache"]
        assert (held > 0) is kept
        assert srv.engine.scheduler.sharing.enabled is kept  # nothing to share through it
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def no_model():
    """The real servicer and engine over gRPC, nothing loaded."""
    srv = InProcessServer()
    yield srv
    srv.stop()


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"CacheTypeKey": "q3_z"}, ("CacheTypeKey", "q8_0", "q4_0")),
        ({"Options": ["speculative:lookahead"]}, ("option speculative",)),
        ({"Options": ["speculative:ngram", "ngram_size:0"]}, ("option ngram_size",)),
        ({"Options": ["speculative:draft"]}, ("needs ModelOptions.DraftModel",)),
    ],
    ids=["cache-type", "speculative", "ngram-size", "draft-without-model"],
)
def test_load_model_refuses_a_bad_option_saying_what_to_change(no_model, fields, words):
    """LoadModel answers success=False naming the field or option and what it accepts,
    before any file is read (the model name is never reached)."""
    res = no_model.stub.LoadModel(pb.ModelOptions(Model="/nonexistent/model", **fields))
    assert not res.success
    for word in words:
        assert word in res.message, res.message


def test_switches_take_every_on_off_word_and_auto_is_the_default():
    for word in ("true", "YES", " on ", "1"):
        assert load(f"cpu_fuse:{word}").cpu_fuse is True
        assert load(f"trust_remote_code:{word}").trust_remote_code is True
    for word in ("false", "No", "OFF", "0"):
        lp = load(f"cpu_fuse:{word}", f"distributed_vocab:{word}", f"vision:{word}")
        assert (lp.cpu_fuse, lp.distributed_vocab, lp.vision.on) == (False, False, False)
    assert load("cpu_fuse:auto").cpu_fuse is True and load("cpu_fuse:").cpu_fuse is True
    assert [load(f"cpu_dequantize:{w}").cpu_dequantize for w in ("dense", "quantized", "")] == [
        True,
        False,
        None,
    ]
    with pytest.raises(ValueError, match=r"option cpu_fuse must be true or false"):
        load("cpu_fuse:dense")  # the synonyms are cpu_dequantize's alone


def test_warmup_default_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(opts.WARMUP_ENV, raising=False)
    assert load().warmup is True
    for off in ("false", "0", "no", "OFF"):
        monkeypatch.setenv(opts.WARMUP_ENV, off)
        assert load().warmup is False
        assert load("warmup:true").warmup is True  # the option wins
    for other in ("true", "auto", "", "garbage"):
        monkeypatch.setenv(opts.WARMUP_ENV, other)
        assert load().warmup is True and load("warmup:off").warmup is False


def test_fields_that_fill_options_and_options_that_depend_on_others(tmp_path):
    lp = load(NBatch=256, Seed=7)
    assert (lp.prefill_step_size, lp.defaults["seed"]) == (256, 7)
    assert load("prefill_step_size:64", NBatch=256).prefill_step_size == 64
    with pytest.raises(ValueError, match=r"option prefill_step_size\b"):
        load("prefill_step_size:0", NBatch=256)
    assert load().num_draft_tokens == 3 and load("speculative:ngram").num_draft_tokens == 8
    assert load("speculative:NGRAM", "num_draft_tokens:5").num_draft_tokens == 5
    with pytest.raises(ValueError, match="speculative:draft needs"):
        load("speculative:draft")
    with pytest.raises(ValueError, match="kv_bits must be one of"):
        load("kv_bits:7")
    assert load("kv_bits:4", CacheTypeKey="q8_0", CacheTypeValue="q8_0").kv_bits == 4
    with pytest.raises(ValueError, match=r"option hostfile needs a file path"):
        load("hostfile:  ")
    assert load("distributed_backend: JACCL ").distributed_backend == "jaccl"
    lp = load("prompt_cache_dir:cache", ModelPath=str(tmp_path))
    assert lp.prompt_cache_dir == str(tmp_path / "cache")
    assert load("prompt_cache_disk_bytes:1GiB").prompt_cache_disk_bytes == 1 << 30
    lp = load("eos_token: <|im_end|> ", "pad_token:true", "tool_parser: hermes ")
    assert lp.tokenizer_config == {"eos_token": "<|im_end|>", "pad_token": "true"}
    assert lp.tool_parser == "hermes"


def test_load_options_are_read_once_into_frozen_values():
    lp = load("max_images:2", "vision_cache_bytes:1024")
    assert lp.vision.limits.max_images == 2 and lp.vision.cache_bytes == 1024
    with pytest.raises(dataclasses.FrozenInstanceError):
        lp.vision.cache_bytes = 0  # type: ignore[misc]
    # A request reads the limits parsed at load; it parses no load option again.
    req = pb.PredictOptions(Prompt="x", Images=["AAAA"] * 3)
    with pytest.raises(ValueError, match="max_images"):
        params.parse_request(req, lp)
    assert lp == load("max_images:2", "vision_cache_bytes:1024")  # a reload compares equal


# --- the one on/off reader ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("true", True),
        (" Yes ", True),
        ("ON", True),
        ("1", True),
        ("false", False),
        ("no", False),
        ("Off", False),
        ("0", False),
        (True, True),
        (False, False),
        (None, "default"),
        ("", "default"),
        (" auto ", "default"),
    ],
)
def test_on_off(value, expected):
    assert on_off(value, None) is (None if expected == "default" else expected)
    assert on_off(value, True) is (True if expected == "default" else expected)


@pytest.mark.parametrize("value", ["maybe", "2", "dense", 1, 0.5, "1.0"])
def test_on_off_refuses_other_words_and_types(value):
    with pytest.raises(ValueError, match="on/off"):
        on_off(value)
    assert on_off("dense", None, ("dense", "quantized")) is True
    assert on_off("Quantized", None, ("dense", "quantized")) is False


def test_env_on_never_fails():
    assert env_on({}, "X") is True and env_on({}, "X", False) is False
    assert env_on({"X": "off"}, "X") is False and env_on({"X": "yes"}, "X", False) is True
    assert env_on({"X": "garbage"}, "X") is True and env_on({"X": "auto"}, "X", False) is False
