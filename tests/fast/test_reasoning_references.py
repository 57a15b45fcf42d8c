"""vLLM's reasoning-parser tests (tests/vllm_reasoning_cases.py) through the output
pipeline: the reasoning, content and calls this backend extracts for each
`reasoning_parser:` name equal what vLLM's parser of that name extracts.

Each output is fed twice on a byte-level toy tokenizer, as one token holding the whole
text and byte by byte (every marker split across tokens, as vLLM's streaming tests split
at every token); the prompt's state comes from `initial_state_for` on the case's prompt.
Known differences (`KNOWN`) assert ours, with the reason. Over real gRPC:
tests/fast/test_reasoning_references_grpc.py.
"""

from __future__ import annotations

import json

import pytest
import vllm_parser_cases
from helpers import feed_output
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
from toy_tokenizer import build_hf, byte_level
from vllm_reasoning_cases import (
    CASES,
    IDS,
    KNOWN,
    MARKERS,
    NOT_APPLICABLE,
    PROMPT_CASES,
    STREAM_CASES,
    Case,
    expected,
    prompt_tail,
)

from decoding import reasoning_formats
from decoding.output import OutputPipeline, initial_state_for
from decoding.parsers import apply_parser_overrides


@pytest.fixture(scope="module")
def hf():
    """Byte-level BPE (id b = byte b) plus each case's whole output as one token."""
    texts = [c.output for c in CASES] + [c.output for c, _ in KNOWN]
    texts += [t for c in STREAM_CASES for t in (c.prefix, *(s[0] for s in c.steps))]
    return build_hf(sorted({t for t in texts if t}), markers=False)


def named(hf, parser: str, tool: str = ""):
    return apply_parser_overrides(TokenizerWrapper(hf, BPEStreamingDetokenizer), tool, parser)


def prompt_text(case: Case) -> str:
    fmt = reasoning_formats.resolve(case.parser)
    assert fmt is not None
    return prompt_tail(fmt, case.prompt)


def extract(hf, case: Case, whole: bool) -> tuple[dict, bool]:
    """(what the pipeline extracted, whether a streamed call was withdrawn)."""
    tok = named(hf, case.parser, case.tool)
    initial = initial_state_for(tok, tok.encode(prompt_text(case), add_special_tokens=False))
    pipe = OutputPipeline(tok, initial_state=initial)
    pieces = feed_output(hf, pipe, case.output, whole)
    calls = [(c.name, json.loads(c.arguments)) for c in pipe.tool_calls]
    got = {"calls": calls, "content": pipe.content, "reasoning": pipe.reasoning}
    return got, any(p.dropped for p in pieces)


@pytest.mark.parametrize("whole", [True, False], ids=["one_piece", "byte_by_byte"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_extracts_what_vllm_extracts(hf, case, whole):
    got, withdrawn = extract(hf, case, whole)
    assert got == expected(case), case.source
    assert not withdrawn


@pytest.mark.parametrize("whole", [True, False], ids=["one_piece", "byte_by_byte"])
@pytest.mark.parametrize(("case", "ours"), KNOWN, ids=lambda c: getattr(c, "id", ""))
def test_known_differences_from_vllm(hf, case, ours, whole):
    assert case.why
    got, _ = extract(hf, case, whole)
    assert got == {**expected(case), **ours}, case.why
    assert got != expected(case)  # still a difference: else it belongs in CASES


def test_whole_text_split_agrees_with_the_stream():
    """`ReasoningFormat.split_text` (the whole-text split) gives each case's result."""
    for case in CASES:
        if case.calls or case.tool or case.prompt:
            continue
        fmt = reasoning_formats.resolve(case.parser)
        assert fmt is not None
        assert fmt.split_text(case.output) == (case.reasoning, case.content), case.id


@pytest.mark.parametrize("case", STREAM_CASES, ids=lambda c: c.id)
def test_streaming_steps_emit_what_vllm_emits(hf, case):
    """vLLM's streaming sub-cases: each delta (one token, as vLLM feeds it) emits exactly
    what vLLM's parser returns for it; nothing yet where vLLM returns None."""
    tok = named(hf, case.parser)
    pipe = OutputPipeline(tok, initial_state=initial_state_for(tok, []))
    vocab = hf.get_vocab()
    if case.prefix:
        pipe.feed(vocab[byte_level(case.prefix)])
    for text, reasoning, content in case.steps:
        d = pipe.feed(vocab[byte_level(text)])
        assert (d.reasoning, d.content) == (reasoning, content), (case.source, text)


@pytest.mark.parametrize("case", PROMPT_CASES, ids=lambda c: c.id)
def test_the_prompt_leaves_the_state_vllm_reads_on_in(hf, case):
    tok = named(hf, case.parser)
    prompt = tok.encode(case.prompt, add_special_tokens=False)
    assert initial_state_for(tok, prompt) == case.state, case.source


def test_each_format_has_its_markers():
    for name, (start, end, source, _) in MARKERS.items():
        assert reasoning_formats.FORMATS[name].markers == (start, end), source
    for fmt in reasoning_formats.FORMATS.values():
        start, end = fmt.markers
        assert start and end and start != end, fmt.name  # ModelMetadata has them to show
        assert fmt.source.startswith("vllm/reasoning/"), fmt.name


def test_every_vllm_test_id_is_a_case():
    """Wholesale: each test id of each vLLM file is a case (here or in
    tests/vllm_parser_cases.py), a known difference, or not applicable with a reason."""
    old = vllm_parser_cases.CASES + [c for c, _ in vllm_parser_cases.KNOWN_DIFFERENCES]
    for source, ids in IDS.items():
        path = source.split("@")[0]
        covered = {i for c in CASES + [k for k, _ in KNOWN] if c.source == source for i in c.ids}
        covered |= {i for c in STREAM_CASES + PROMPT_CASES if c.source == source for i in c.ids}
        covered |= {c.id for c in old if c.source == path}
        covered |= {i for s, i in NOT_APPLICABLE if s == source}
        covered |= {tid for _, _, src, tid in MARKERS.values() if src == source}
        missing = [i for i in ids if i not in covered]
        assert not missing, (source, missing)
        extra = {i for c in CASES if c.source == source for i in c.ids} - set(ids)
        assert not extra, (source, extra)


def test_an_unknown_name_is_one_warning_naming_the_known_ones(hf, caplog):
    tok = TokenizerWrapper(hf, BPEStreamingDetokenizer)
    with caplog.at_level("WARNING"):
        assert apply_parser_overrides(tok, "", "no_such_parser") is tok
    [record] = caplog.records
    message = record.getMessage()
    assert "\n" not in message and "unknown reasoning_parser 'no_such_parser'" in message
    assert all(name in message for name in reasoning_formats.known_names())


def test_granite_reads_heres_as_vllms_parser_does():
    """vLLM's granite_reasoning_parser.py matches "Here's" as well as "Here is" (its
    think_start_expr / response_start_expr); its tests have no such case."""
    fmt = reasoning_formats.FORMATS["granite"]
    text = "Here's my thought process: foo Here's my response: bar"
    assert fmt.split_text(text) == (" foo ", " bar")
    assert fmt.split_text("Here is my thought process: a Here's my response: b") == (" a ", " b")


def test_ernie45_drops_its_response_wrapper_as_vllms_parser_does():
    """The two output forms vLLM's ernie45_reasoning_parser.py names in its docstring
    (its tests have none): the <response> wrapper and the newlines after </think> and
    </response> are no content. For `abc\\n</think>\\ndef` vLLM's streaming path drops the
    newline, its non-streaming path keeps it; here both give the streaming result."""
    fmt = reasoning_formats.FORMATS["ernie45"]
    wrapped = "abc\n</think>\n\n<response>\ndef\n</response>\n"
    assert fmt.split_text(wrapped) == ("abc\n", "\ndef\n")
    assert fmt.split_text("abc\n</think>\ndef") == ("abc\n", "def")
    assert fmt.split_text("abc\n</think>\n\n\n") == ("abc\n", "")


def test_a_marker_kept_by_both_states_is_refused():
    """A kept marker (`ends_reasoning`) stays as text of the state it enters; were it kept
    there too, the router would bounce between the two states forever."""
    from decoding.text_router import TextRouter

    with pytest.raises(ValueError, match="kept again"):
        TextRouter(
            {"normal": [("<x>", "reasoning", True)], "reasoning": [("<x>", "normal", True)]},
            "normal",
        )
    router = TextRouter({"reasoning": [("<x>", "normal", True)], "normal": []}, "reasoning")
    assert [(s.state, s.text) for s in router.push("a<x>b")] == [
        ("reasoning", "a"),
        ("normal", "<x>b"),
    ]
