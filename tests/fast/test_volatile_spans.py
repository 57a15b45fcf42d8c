"""Volatile spans (parsing/volatile_spans.py, option volatile_spans) leave the prompt before
it is tokenized; where a prompt parts from the prompt cache and why it missed
(engine/divergence.py, PromptCache.nearest, the miss-reason counter). Toy tokenizer and
token_kv caches, no model."""

from __future__ import annotations

import logging
import time
from types import MappingProxyType

import helpers
import pytest
from helpers import ids, token_kv
from inprocess import InProcessServer
from mlx_lm.models.cache import RotatingKVCache

import backend_pb2 as pb
import params
from engine import divergence, prepare, request_log
from engine.metrics import Metrics
from parsing import volatile_spans as vs
from prompt_cache import CacheLookup, Nearest, PromptCache
from prompting.render import without_volatile

# Claude Code 2.1.x's first system block (anthropics/claude-code issue #68900; the cch
# nonce changes with every request), and what LocalAI makes of the system blocks: joined
# with nothing between them (core/schema/anthropic.go AnthropicSystemParam).
HEADER = "x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=sdk-cli; cch={};"
IDENTITY = "You are Claude Code, Anthropic's official CLI for Claude."
DEFAULT = vs.read(None)


def served(tok, options: tuple[str, ...] = ()):
    return helpers.served(tok, 512, options)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (HEADER.format("36ee5") + IDENTITY, IDENTITY),  # LocalAI: blocks joined with ""
        (HEADER.format("0aaa9") + "\n" + IDENTITY, IDENTITY),  # on a line of its own
        (HEADER.format("0aaa9") + "\r\n" + IDENTITY, IDENTITY),
        # Inside a prompt LocalAI rendered with its own template (raw Prompt).
        (f"<|im_start|>system\n{HEADER.format('eb6c6')}{IDENTITY}<|im_end|>",
         f"<|im_start|>system\n{IDENTITY}<|im_end|>"),
        # A last field without its ";" ends at the line's end; the next line stays.
        ("x-anthropic-billing-header: cc_version=2.1.100.7b4; cch=eb6c6\nNext", "Next"),
        ("x-anthropic-billing-header:\nNext", "Next"),
        (IDENTITY, IDENTITY),  # nothing to remove
        ("the x-anthropic-billing-header docs", "the x-anthropic-billing-header docs"),
    ],
)  # fmt: skip
def test_the_default_removes_exactly_claude_codes_billing_header(text, want):
    assert DEFAULT.remove(text) == want


def test_the_option_reads_none_a_pattern_or_a_json_array_and_names_itself_when_bad():
    for off in ("none", "", "off", "false", "[]", " None "):
        assert not vs.read(off) and vs.read(off).remove(HEADER.format("1")) == HEADER.format("1")
    assert params.load_params(pb.ModelOptions(Model="m")).volatile_spans == DEFAULT
    load = params.load_params(pb.ModelOptions(Model="m", Options=["volatile_spans:none"]))
    assert load.volatile_spans == vs.read("none") and not load.volatile_spans
    one = vs.read(r"^Today's date is \d{4}-\d\d-\d\d\.\n")
    assert one.remove("A\nToday's date is 2026-12-02.\nB") == "A\nB"  # ^ at line starts
    both = vs.read('["claude_code", "^Today\'s date is .*\\\\n"]')
    assert both.sources == (vs.CLAUDE_CODE_BILLING_HEADER, "^Today's date is .*\\n")
    text = HEADER.format("abcde") + "Hi\nToday's date is 2026-12-02.\nBye"
    assert both.remove(text) == "Hi\nBye"
    # One rule: a JSON array is a list; anything else is one pattern, "[" first or not
    # (issue 41: [\s\S]+ was read as JSON and refused with a JSON error).
    for pattern, text, left in [
        (r"[\s\S]+X", "abc\nX!", "!"),
        (r"[0-9]+ tokens", "used 12 tokens", "used "),
        ("[a]", "banana", "bnn"),  # no JSON array of strings: a character class
    ]:
        load = params.load_params(pb.ModelOptions(Model="m", Options=[f"volatile_spans:{pattern}"]))
        assert load.volatile_spans.sources == (pattern,)
        assert load.volatile_spans.remove(text) == left
    for bad, needle in [
        ("(unclosed", r"option volatile_spans: '\(unclosed' is not a valid regular expression"),
        ('["a", 3]', "option volatile_spans is a JSON array, so it must hold non-empty strings"),
        ('["a",', r"'\[\"a\",' is not a valid regular expression \(.*\) nor a JSON array"),
    ]:
        with pytest.raises(ValueError, match=needle):
            params.load_params(pb.ModelOptions(Model="m", Options=[f"volatile_spans:{bad}"]))


def test_a_pattern_that_does_not_compile_fails_the_load_naming_the_option():
    """Over real gRPC, a real engine: LoadModel answers success=False with the option's
    error, before any file is read (a model name that does not exist: never reached)."""
    srv = InProcessServer()
    try:
        res = srv.stub.LoadModel(
            pb.ModelOptions(Model="/nonexistent/model", Options=["volatile_spans:(unclosed"]),
            timeout=30,
        )
        assert not res.success
        assert "option volatile_spans: '(unclosed' is not a valid regular expression" in (
            res.message
        )
    finally:
        srv.stop()


def test_repeated_warnings_are_counted_and_summarized_once_per_window():
    """20,000 requests hitting one warning wrote 19,662 lines (issue 41): the process's
    handlers log the first, count the repeats and log them with the next one after the
    window."""
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Keep()
    repeat = request_log.RepeatFilter()
    handler.addFilter(repeat)
    logger = logging.getLogger("localai.mlx.test_repeats")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        slow = vs.read("(a|a)+b")
        slow_log = logging.getLogger(vs.log.name)
        slow_log.addHandler(handler)
        for i in range(200):
            logger.warning("option %s: %r took too long on prompt %d", "x", "p", i)
            logger.info("request %d: done", i)  # INFO passes: the per-request line
        assert slow.remove("a" * 30, deadline=time.monotonic()) == "a" * 30
        assert slow.remove("a" * 30, deadline=time.monotonic()) == "a" * 30
        slow_log.removeHandler(handler)
        warned = [r for r in records if "took too long" in r]
        assert warned == ["option x: 'p' took too long on prompt 0"]
        assert len([r for r in records if r.startswith("request")]) == 200
        assert len([r for r in records if "no time left" in r]) == 1
        repeat.window_s = 0.0  # the window is over: the next one carries the count
        logger.warning("option %s: %r took too long on prompt %d", "x", "p", 200)
        assert records[-1] == (
            "option x: 'p' took too long on prompt 200 [199 more like this in the last 0 s]"
        )
    finally:
        logger.removeHandler(handler)


def test_a_pattern_that_backtracks_badly_is_cut_off_and_leaves_the_text(caplog):
    slow = vs.read("(a|aa)+$")  # exponential on "aaaa...b" without a timeout
    text = "a" * 40 + "b"
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        assert slow.remove(text) == text
    assert time.monotonic() - started < 2 * vs.TIMEOUT_S + 1.0
    assert "took over" in caplog.text and "volatile_spans" in caplog.text


def test_spans_leave_the_raw_prompt_and_every_message_content():
    raw = params.PromptSpec(prompt=HEADER.format("1") + IDENTITY)
    assert without_volatile(raw, DEFAULT).prompt == IDENTITY
    plain = params.PromptSpec(prompt=IDENTITY)
    assert without_volatile(plain, DEFAULT) is plain  # nothing matched: the same spec
    assert without_volatile(raw, vs.read("none")) is raw
    chat = params.PromptSpec(
        messages=(
            MappingProxyType({"role": "system", "content": HEADER.format("2") + IDENTITY}),
            MappingProxyType({"role": "user", "content": "hi", "name": "al"}),
        )
    )
    got = without_volatile(chat, DEFAULT)
    assert got.messages is not None
    assert [dict(m) for m in got.messages] == [
        {"role": "system", "content": IDENTITY},
        {"role": "user", "content": "hi", "name": "al"},
    ]


def test_the_prepare_step_tokenizes_the_prompt_without_the_spans(tok):
    prompt = HEADER.format("9f00d") + IDENTITY
    ready = prepare.prepare(pb.PredictOptions(Prompt=prompt), prepare.Intake(served(tok)))
    assert ready.prompt.token_ids == ids(tok, IDENTITY)
    assert ready.request.prompt.prompt == prompt  # the request itself is kept as sent
    kept = served(tok, ("volatile_spans:none",))
    ready = prepare.prepare(pb.PredictOptions(Prompt=prompt), prepare.Intake(kept))
    assert ready.prompt.token_ids == ids(tok, prompt)


# --------------------------------------------------------------------------- divergence
def test_nearest_finds_the_stored_prompt_sharing_most_and_the_evicted_ones():
    pc = PromptCache(max_entries=2)
    assert pc.nearest("m", [1, 2, 3]) == Nearest(0, (), 0, 0)
    pc.insert("m", [1, 2, 3, 4], token_kv([1, 2, 3, 4]))
    pc.insert("m", [1, 2, 9], token_kv([1, 2, 9]))
    pc.insert("other", [1, 2, 3, 4, 5], token_kv([1, 2, 3, 4, 5]))  # evicts [1, 2, 3, 4]
    assert pc.nearest("m", [1, 2, 3, 4, 7]) == Nearest(2, (1, 2, 9), 1, 4)
    assert pc.nearest("m", [1, 2, 3, 4, 7]).common == pc.longest_common_prefix("m", [1, 2, 3, 4])
    assert pc.nearest("x", [1]) == Nearest(0, (), 0, 0)
    assert pc.stats().hits == 0  # no counter moved


@pytest.mark.parametrize(
    ("near", "prompt", "cached", "reason"),
    [
        (Nearest(0, (), 0, 0), 100, 0, "cold"),
        (Nearest(90, tuple(range(95)), 1, 0), 100, 90, None),  # served most: a hit
        (Nearest(0, (), 0, 0), 1, 0, None),  # one token: nothing could be served
        (Nearest(20, tuple(range(20)), 1, 0), 100, 20, None),  # extends a stored prompt
        (Nearest(20, tuple(range(60)), 1, 0), 100, 20, "diverged"),  # parts early
        (Nearest(3, tuple(range(60)), 2, 80), 100, 3, "evicted"),
        (Nearest(0, (), 0, 80), 100, 0, "evicted"),
        (Nearest(3, tuple(range(60)), 2, 40), 100, 3, "diverged"),  # evicted one: < half
        (Nearest(60, tuple(range(99)), 1, 0), 130, 0, "untrimmable"),
    ],
)
def test_a_miss_has_one_reason(near, prompt, cached, reason):
    assert divergence.miss_reason(near, prompt, cached) == reason


def test_a_rotated_entry_that_cannot_be_cut_back_is_an_untrimmable_miss():
    pc = PromptCache()
    toks = list(range(1, 41))
    pc.insert("m", toks, token_kv(toks, cls=RotatingKVCache, max_size=8, keep=0))
    prompt = [*toks[:30], 99, 98, 97, 96, 95, 94, 93, 92, 91, 90]
    near = pc.nearest("m", prompt)
    lookup = pc.fetch("m", prompt)
    assert (near.common, lookup.cached_tokens) == (30, 0)
    assert divergence.miss_reason(near, len(prompt), lookup.cached_tokens) == "untrimmable"


def test_record_counts_the_reason_and_logs_where_the_prompt_parts(tok, caplog):
    stored = ids(tok, HEADER.format("36ee5") + " the rest of a long system prompt" * 5)
    prompt = ids(tok, HEADER.format("0aaa9") + " the rest of a long system prompt" * 5)
    pc = PromptCache()
    pc.insert("m", stored, token_kv(stored))
    near = pc.nearest("m", prompt)
    lookup = pc.fetch("m", prompt)
    metrics = Metrics()
    with caplog.at_level(logging.DEBUG, logger="localai.mlx.engine.divergence"):
        assert divergence.record(near, prompt, lookup, tok, metrics) == "diverged"
    at = near.common
    assert 0 < at < len(prompt) // 2 and lookup.cached_tokens == at
    line = caplog.records[-1].getMessage()
    assert f"{at} of {len(prompt)} prompt tokens reused" in line
    assert f"parts at token {at}: " in line and "miss: diverged" in line
    assert tok.decode(list(prompt[at : at + divergence.WINDOW])) in line
    assert tok.decode(list(stored[at : at + divergence.WINDOW])) in line
    assert metrics.snapshot()["prompt_cache_miss_reasons"] == {
        "cold": 0, "diverged": 1, "evicted": 0, "untrimmable": 0
    }  # fmt: skip
    hit = CacheLookup(kv=None, cached_tokens=len(prompt) - 1, rest=[prompt[-1]])
    assert divergence.record(near, prompt, hit, tok, metrics) is None
    assert divergence.window(tok, [1 << 100, *prompt[:2]], 3)[0].startswith("<image>")
