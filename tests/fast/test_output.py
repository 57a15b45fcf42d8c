"""Unit tests for output.py / tool_calls.py: token ids -> exact Delta sequences.

On the toy tokenizer of tests/toy_tokenizer.py (the ``tok`` fixture: a byte-level BPE with
Qwen/Hermes-style markers, no model weights) and tokenizers built here from byte chunks.
"""

from __future__ import annotations

import codecs
import itertools
import json
import logging
import math
import re

import mlx.core as mx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx_lm.tokenizer_utils import (
    BPEStreamingDetokenizer,
    NaiveStreamingDetokenizer,
    SPMStreamingDetokenizer,
    TokenizerWrapper,
)
from mlx_lm.tool_parsers import json_tools, mistral
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from toy_tokenizer import EOS_TEXT, MARKERS, PIECES, TO_CHAR, WEATHER, build_hf, ids
from transformers import PreTrainedTokenizerFast

from decoding.output import Delta, OutputPipeline, ToolCall, initial_state_for
from decoding.tool_calls import merge_tool_call_deltas, parse_tool_block
from seam.tokenizer import vocab_size


def wrap(hf, detok_class) -> TokenizerWrapper:
    """As tokenizer_utils.load would, but with a chosen detokenizer."""
    return TokenizerWrapper(
        hf,
        detok_class,
        tool_parser=json_tools.parse_tool_call,
        tool_call_start=json_tools.tool_call_start,
        tool_call_end=json_tools.tool_call_end,
    )


@pytest.fixture(scope="module", params=["bpe", "naive"])
def any_tok(request) -> TokenizerWrapper:
    classes = {"bpe": BPEStreamingDetokenizer, "naive": NaiveStreamingDetokenizer}
    return wrap(build_hf(PIECES), classes[request.param])


def run(pipe: OutputPipeline, tokens, reason: str = "stop", rows=None) -> list[Delta]:
    """Feed until the pipeline stops, then finish; the last delta is finish()'s."""
    deltas = []
    for i, t in enumerate(tokens):
        deltas.append(pipe.feed(t, None if rows is None else rows[i]))
        if pipe.stopped:
            break
    deltas.append(pipe.finish("stop" if pipe.stopped else reason))
    return deltas


def view(deltas) -> list[tuple]:
    """(content, reasoning, ((index, name, arguments), ...)) per delta, ids left out."""
    return [
        (d.content, d.reasoning, tuple((c.index, c.name, c.arguments) for c in d.tool_calls))
        for d in deltas
    ]


def C(text: str = "") -> tuple:  # a content-only row of view()
    return (text, "", ())


def R(text: str) -> tuple:  # a reasoning-only row of view()
    return ("", text, ())


def check_joined(pipe: OutputPipeline, deltas) -> None:
    """Predict's join of the stream equals the pipeline's record; no U+FFFD anywhere."""
    assert "".join(d.content for d in deltas) == pipe.content
    assert "".join(d.reasoning for d in deltas) == pipe.reasoning
    assert merge_tool_call_deltas(c for d in deltas for c in d.tool_calls) == pipe.tool_calls
    assert all("\ufffd" not in d.content + d.reasoning for d in deltas)


# --- tokenizer inference (what the engine gets from mlx_lm.load) -------------------------


def test_loaded_tokenizer_infers_thinking_tools_and_detokenizer(tok):
    assert tok.has_thinking and (tok.think_start, tok.think_end) == ("<think>", "</think>")
    assert tok.has_tool_calling and tok.tool_parser is json_tools.parse_tool_call
    assert isinstance(tok.detokenizer, BPEStreamingDetokenizer)
    assert tok.eos_token_ids == {tok.convert_tokens_to_ids(EOS_TEXT)}


def test_initial_state_follows_the_prompts_open_think_block(tok):
    msgs = [{"role": "user", "content": "hi"}]
    opened = tok.apply_chat_template(msgs, add_generation_prompt=True)
    closed = tok.apply_chat_template(msgs, add_generation_prompt=True, enable_thinking=False)
    assert initial_state_for(tok, opened) == "reasoning"
    assert initial_state_for(tok, closed) == "normal"
    assert initial_state_for(tok, []) == "normal"


# --- reasoning and content ----------------------------------------------------------------


def test_reasoning_is_separated_and_markers_never_emitted(tok):
    pipe = OutputPipeline(tok)
    toks = ids(tok, "<think>", "Let", " me", " think", "</think>", "\n\n", "Hello", " world")
    deltas = run(pipe, [*toks, *ids(tok, EOS_TEXT)])
    assert view(deltas) == [
        C(), R("Let"), R(" me"), R(" think"), C(), C("\n\n"), C("Hello"), C(" world"), C(), C()
    ]  # fmt: skip
    assert (pipe.content, pipe.reasoning, pipe.finish_reason) == (
        "\n\nHello world",
        "Let me think",
        "stop",
    )
    check_joined(pipe, deltas)


def test_initial_state_reasoning_needs_only_the_end_marker(tok):
    pipe = OutputPipeline(tok, initial_state="reasoning")
    deltas = run(pipe, ids(tok, "<think>", "Thinking", "</think>", "Answer", EOS_TEXT))
    # A repeated open marker inside reasoning is stripped, not shown.
    assert view(deltas) == [C(), R("Thinking"), C(), C("Answer"), C(), C()]


def test_initial_reasoning_without_think_markers_falls_back_to_content(caplog):
    plain = TokenizerWrapper(build_hf(PIECES, markers=False), BPEStreamingDetokenizer)
    pipe = OutputPipeline(plain, initial_state="reasoning", stop="!")  # a lone str is one stop
    run(pipe, ids(plain, "Hello", "!", " world"))
    assert (pipe.content, pipe.reasoning) == ("Hello", "") and "ignored" in caplog.text


def test_markers_split_across_byte_tokens_are_still_found(any_tok):
    pipe = OutputPipeline(any_tok)
    deltas = run(pipe, ids(any_tok, "b:<think>hm</think>ok"), reason="length")
    check_joined(pipe, deltas)
    assert (pipe.reasoning, pipe.content) == ("hm", "ok")


def test_text_that_might_start_a_marker_is_held_then_released(tok):
    pipe = OutputPipeline(tok)
    deltas = run(pipe, ids(tok, "b:a<b", EOS_TEXT))
    assert view(deltas) == [C("a"), C(), C("<b"), C(), C()]


def test_unterminated_reasoning_is_flushed_as_reasoning(tok):
    pipe = OutputPipeline(tok)
    deltas = run(pipe, ids(tok, "<think>", "plan", "b:</thi"), reason="length")
    assert view(deltas)[-1] == R("</thi")
    assert (pipe.reasoning, pipe.content, pipe.finish_reason) == ("plan</thi", "", "length")


# --- tool calls ----------------------------------------------------------------------------


def test_tool_calls_stream_name_first_then_argument_fragments(tok):
    pipe = OutputPipeline(tok)
    toks = ids(
        tok, "Sure", "<tool_call>", "\n", '{"name": "get_weather", ',
        '"arguments": {"city": "Paris"}}', "\n", "</tool_call>", "\n",
        "<tool_call>", '{"name": "get_time", "arguments": {}}', "</tool_call>", EOS_TEXT,
    )  # fmt: skip
    deltas = run(pipe, toks)
    # A call starts once its name and the arguments' "{" are in; the closing marker adds nothing.
    weather = ((0, "get_weather", ""), (0, "", '{"city": "Paris"}'))
    assert view(deltas) == [
        C("Sure"), C(), C(), C(), ("", "", weather), C(), C(), C("\n"),
        C(), ("", "", ((1, "get_time", ""), (1, "", "{}"))), C(), C(), C(),
    ]  # fmt: skip
    assert pipe.content == "Sure\n"
    assert [json.loads(c.arguments) for c in pipe.tool_calls] == [{"city": "Paris"}, {}]
    call_ids = [c.id for c in pipe.tool_calls]
    assert len(set(call_ids)) == 2 and all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in call_ids)
    assert [c.id for d in deltas for c in d.tool_calls if c.name] == call_ids
    check_joined(pipe, deltas)


def test_tool_call_inside_reasoning_ends_the_reasoning(tok):
    pipe = OutputPipeline(tok)
    deltas = run(pipe, ids(tok, "<think>", "plan", "<tool_call>", WEATHER, "</tool_call>"))
    weather = ((0, "get_weather", ""), (0, "", '{"city": "Paris"}'))
    assert view(deltas) == [C(), R("plan"), C(), ("", "", weather), C(), C()]
    assert pipe.tool_calls[0].arguments == '{"city": "Paris"}'


def test_malformed_tool_call_comes_back_as_content(tok, caplog):
    pipe = OutputPipeline(tok)
    with caplog.at_level(logging.WARNING, logger="output"):
        deltas = run(pipe, ids(tok, "<tool_call>", "{not json", "</tool_call>", "!"))
    assert view(deltas) == [C(), C(), C("<tool_call>{not json</tool_call>"), C("!"), C()]
    assert pipe.tool_calls == [] and "malformed tool call" in caplog.text
    check_joined(pipe, deltas)


def test_unterminated_tool_call_comes_back_as_content(tok, caplog):
    pipe = OutputPipeline(tok)
    with caplog.at_level(logging.WARNING, logger="output"):
        deltas = run(pipe, ids(tok, "Sure", "<tool_call>", '{"name": "x"'), reason="length")
    assert view(deltas) == [C("Sure"), C(), C(), C('<tool_call>{"name": "x"')]
    assert pipe.finish_reason == "length" and "unterminated tool call" in caplog.text


def test_tool_call_without_end_marker_is_parsed_at_finish():
    # Mistral's format has no closing marker: the call runs to the end of the output.
    hf = build_hf(PIECES)
    tok = TokenizerWrapper(
        hf, BPEStreamingDetokenizer, tool_parser=mistral.parse_tool_call,
        tool_call_start=mistral.tool_call_start, tool_call_end=mistral.tool_call_end,
    )  # fmt: skip
    pipe = OutputPipeline(tok)
    deltas = run(pipe, ids(tok, "Sure", 'b:[TOOL_CALLS]f[ARGS]{"a": 1}', EOS_TEXT))
    pieces = [(c.index, c.name, c.arguments) for d in deltas for c in d.tool_calls]
    assert pieces[0] == (0, "f", "") and "".join(p[2] for p in pieces) == '{"a": 1}'
    assert [(c.index, c.name, c.arguments) for c in pipe.tool_calls] == [(0, "f", '{"a": 1}')]
    assert pipe.content == "Sure"
    check_joined(pipe, deltas)


def test_tool_parsing_off_streams_markup_as_content(tok):
    pipe = OutputPipeline(tok, parse_tool_calls=False)
    run(pipe, ids(tok, "<tool_call>", WEATHER, "</tool_call>", EOS_TEXT))
    assert pipe.content == f"<tool_call>{WEATHER}</tool_call>" and pipe.tool_calls == []


def test_parse_tool_block_normalises_arguments():
    def parser(text, tools):
        return json.loads(text)

    block = '[{"name": "a", "arguments": "{\\"x\\": 1}"}, {"name": "b", "parameters": {"y": 2}}]'
    calls = parse_tool_block(parser, block, first_index=3)
    assert [(c.index, c.name, json.loads(c.arguments)) for c in calls] == [
        (3, "a", {"x": 1}),
        (4, "b", {"y": 2}),
    ]
    with_id = parse_tool_block(parser, '{"name": "a", "id": "functions.a:0"}')
    assert with_id == [ToolCall(0, "functions.a:0", "a", "{}")]
    for bad in ['"text"', '{"arguments": {}}', '{"name": "a", "arguments": [1]}', "{"]:
        with pytest.raises(ValueError):
            parse_tool_block(parser, bad)


# --- UTF-8 ---------------------------------------------------------------------------------


def test_multibyte_characters_split_byte_by_byte_arrive_whole(any_tok):
    pipe = OutputPipeline(any_tok)
    deltas = run(pipe, ids(any_tok, "b:aé日本🙂", "!", EOS_TEXT))
    expected = ["a", "", "é", "", "", "日", "", "", "本", "", "", "", "🙂", "!", "", ""]
    assert [d.content for d in deltas] == expected
    check_joined(pipe, deltas)


def test_spm_byte_fallback_pieces_arrive_whole():
    vocab = {f"<0x{b:02X}>": b for b in range(256)} | {"▁Hello": 256}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True))
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    backend.add_special_tokens([AddedToken(EOS_TEXT, special=True)])
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS_TEXT)
    spm = TokenizerWrapper(hf, SPMStreamingDetokenizer)
    pipe = OutputPipeline(spm, top_logprobs=0)
    row = mx.zeros((vocab_size(spm),)) - math.log(vocab_size(spm))
    toks = [256, 0xF0, 0x9F, 0x99, 0x82]
    deltas = run(pipe, toks, rows=[row] * len(toks))
    assert [d.content for d in deltas] == ["Hello", "", "", "", "🙂", ""]
    assert [e["bytes"] for d in deltas for e in d.logprobs] == [
        list(b" Hello"), [0xF0], [0x9F], [0x99], [0x82]
    ]  # fmt: skip


# --- stop sequences ------------------------------------------------------------------------


def test_stop_spanning_tokens(tok):
    pipe = OutputPipeline(tok, stop=["STOP"])
    deltas = run(pipe, ids(tok, "Hello", " ST", "OP", " more"))
    assert view(deltas) == [C("Hello"), C(" "), C(), C()]
    assert pipe.stopped and pipe.content == "Hello " and pipe.finish_reason == "stop"


def test_stop_ending_inside_a_token_drops_the_rest(tok):
    pipe = OutputPipeline(tok, stop=["END"])
    assert view(run(pipe, ids(tok, "The", " EN", "D!", "!"))) == [C("The"), C(" "), C(), C()]
    pipe = OutputPipeline(tok, stop=["END"])
    assert view(run(pipe, ids(tok, "xENDy", "!"))) == [C("x"), C()]


def test_overlapping_stops_first_to_complete_wins(tok):
    # "xy" may start "xyz"; "yq" completes first, so "x" is released and content ends there.
    pipe = OutputPipeline(tok, stop=["xyz", "yq"])
    assert view(run(pipe, ids(tok, "b:axyq!"))) == [C("a"), C(), C(), C("x"), C()]
    # Both end at the same character: the longer one cuts.
    pipe = OutputPipeline(tok, stop=["bc", "abc"])
    assert view(run(pipe, ids(tok, "b:abc"))) == [C(), C(), C(), C()]


def test_empty_stop_strings_are_ignored(tok):
    pipe = OutputPipeline(tok, stop=[""])
    deltas = run(pipe, ids(tok, "Hello", " world", EOS_TEXT))
    assert view(deltas) == [C("Hello"), C(" world"), C(), C()] and not pipe.stopped
    pipe = OutputPipeline(tok, stop=["", "END"])
    assert run(pipe, ids(tok, "The", " EN", "D!"))[-1] == Delta() and pipe.content == "The "


def test_held_text_that_is_not_a_stop_is_released(tok):
    pipe = OutputPipeline(tok, stop=["STOP"])
    assert view(run(pipe, ids(tok, "ST", "ART", EOS_TEXT))) == [C(), C("START"), C(), C()]
    pipe = OutputPipeline(tok, stop=["STOP"])  # released by finish when nothing follows
    assert view(run(pipe, ids(tok, "Hello", " ST", EOS_TEXT))) == [
        C("Hello"), C(" "), C(), C("ST")
    ]  # fmt: skip
    assert not pipe.stopped and pipe.content == "Hello ST"


def test_stop_completed_by_the_final_flush_still_applies(tok):
    # The BPE detokenizer holds a lone space token until finalize().
    pipe = OutputPipeline(tok, stop=["a "])
    deltas = run(pipe, ids(tok, "b:a "), reason="length")
    assert view(deltas) == [C(), C(), C()]
    assert pipe.stopped and pipe.content == "" and pipe.finish_reason == "stop"


def test_stops_apply_to_content_not_reasoning_or_tool_calls(tok):
    pipe = OutputPipeline(tok, stop=["END", "Paris"])
    toks = ids(tok, "<think>", "END", "</think>", "<tool_call>", WEATHER, "</tool_call>")
    deltas = run(pipe, [*toks, *ids(tok, "Hello", "END", "!")])
    assert pipe.reasoning == "END" and pipe.tool_calls[0].arguments == '{"city": "Paris"}'
    assert pipe.content == "Hello" and pipe.stopped
    assert pipe.feed(ids(tok, "!")[0]) == Delta() and pipe.finish("length") == Delta()
    check_joined(pipe, deltas)


# --- logprobs ------------------------------------------------------------------------------


def rows_for(tokens, vocab_size: int, seed: int = 0) -> list[mx.array]:
    """Log-softmax rows whose argmax is the token fed (greedy decoding)."""
    keys = mx.random.split(mx.random.key(seed), len(tokens))  # no global RNG state
    out = []
    for key, t in zip(keys, tokens, strict=True):
        logits = mx.random.normal((vocab_size,), key=key)
        logits = mx.where(mx.arange(vocab_size) == t, logits.max() + 1.0, logits)
        out.append(logits - mx.logsumexp(logits))
    return out


def test_logprobs_one_entry_per_non_eos_token_even_when_text_is_held(tok):
    toks = ids(tok, "Hello", " ST", "b:🙂", EOS_TEXT)
    pipe = OutputPipeline(tok, stop=["STOP"], top_logprobs=5)
    deltas = run(pipe, toks, rows=rows_for(toks, vocab_size(tok)))
    entries = [e for d in deltas for e in d.logprobs]
    assert [len(d.logprobs) for d in deltas] == [1, 1, 1, 1, 1, 1, 0, 0]
    assert [e["bytes"] for e in entries] == [
        list(b"Hello"), list(b" ST"), [0xF0], [0x9F], [0x99], [0x82]
    ]  # fmt: skip
    assert [e["token"] for e in entries][:3] == ["Hello", " ST", "\ufffd"]
    for e in entries:
        top = e["top_logprobs"]
        assert e["logprob"] <= 0 and len(top) == 5
        assert top[0] == {k: e[k] for k in ("token", "logprob", "bytes")}  # greedy: the argmax
        assert [a["logprob"] for a in top] == sorted((a["logprob"] for a in top), reverse=True)
        assert sum(math.exp(a["logprob"]) for a in top) <= 1.0


def test_logprobs_follow_the_sampling_temperature(tok):
    toks = ids(tok, "Hello", " world")
    rows = rows_for(toks, vocab_size(tok), seed=1)
    greedy = run(OutputPipeline(tok, top_logprobs=3), toks, rows=rows)
    hot = run(OutputPipeline(tok, top_logprobs=3, temperature=0.5), toks, rows=rows)
    for d_greedy, d_hot, row in zip(greedy, hot, rows, strict=False):
        (g,), (h,) = d_greedy.logprobs, d_hot.logprobs
        t = g["top_logprobs"][0]["bytes"]
        assert g["bytes"] == h["bytes"] == t
        assert g["logprob"] == pytest.approx(row.max().item(), abs=1e-5)
        scaled = row / 0.5 - mx.logsumexp(row / 0.5)
        assert h["logprob"] == pytest.approx(scaled.max().item(), abs=1e-5)
        assert h["logprob"] != pytest.approx(g["logprob"])


def test_logprobs_options(tok):
    toks = ids(tok, "<think>", "Hello")
    rows = rows_for(toks, vocab_size(tok))
    chosen_only = run(OutputPipeline(tok, top_logprobs=0), toks, rows=rows)
    assert [e["top_logprobs"] for d in chosen_only for e in d.logprobs] == [[], []]
    assert chosen_only[0].logprobs[0]["token"] == "<think>" and chosen_only[0]  # truthy
    capped = run(OutputPipeline(tok, top_logprobs=50), toks, rows=rows)
    assert len(capped[0].logprobs[0]["top_logprobs"]) == 20
    off = run(OutputPipeline(tok), toks, rows=rows)
    assert all(d.logprobs == () for d in off)


# --- properties ----------------------------------------------------------------------------


def first_stop_cut(text: str, stops) -> str | None:
    """Text before the stop string that completes first (ties: the longer), or None."""
    hits = [(text.find(s) + len(s), text.find(s)) for s in stops if s and s in text]
    return text[: min(hits)[1]] if hits else None


def visible_prefix(text: str, stops) -> str:
    """vLLM's hold-back: drop the longest suffix that is a proper prefix of a stop string."""
    stops = [s for s in stops if s]
    for k in range(min(len(text), max(map(len, stops), default=1) - 1), 0, -1):
        if any(s.startswith(text[-k:]) for s in stops):
            return text[:-k]
    return text


ALPHABET = "ab \n<é日🙂"


@st.composite
def chunked(draw, text_strategy):
    """A text and its UTF-8 bytes cut at random byte boundaries (one token per chunk)."""
    text = draw(text_strategy)
    raw = text.encode("utf-8")
    cuts = sorted(draw(st.sets(st.integers(1, max(len(raw) - 1, 1)), max_size=len(raw))))
    bounds = [0, *[c for c in cuts if c < len(raw)], len(raw)]
    return text, [raw[i:j] for i, j in itertools.pairwise(bounds) if j > i]


def chunk_tokenizer(chunks, detok_class, *, markers: bool = False):
    """A tokenizer whose vocab holds every chunk as one token; returns (wrapper, ids)."""
    keys = ["".join(TO_CHAR[b] for b in c) for c in chunks]
    vocab = {TO_CHAR[b]: b for b in range(256)}
    for k in keys:
        vocab.setdefault(k, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(EOS_TEXT, special=True)])
    if markers:
        backend.add_tokens([AddedToken(s, special=False) for s in MARKERS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=EOS_TEXT, clean_up_tokenization_spaces=False
    )
    wrapper = wrap(hf, detok_class) if markers else TokenizerWrapper(hf, detok_class)
    return wrapper, [vocab[k] for k in keys]


def shown_text(chunks, detok_class) -> str:
    """Text a detokenizer has released after these tokens: whole characters only."""
    if detok_class is not BPEStreamingDetokenizer:
        return codecs.getincrementaldecoder("utf-8")().decode(b"".join(chunks))
    # BPEStreamingDetokenizer releases whole tokens, once they end on a whole character and
    # are not a lone space (kept to trim it, were it the first).
    released, pending = b"", b""
    for chunk in chunks:
        pending += chunk
        if chunk != b" " and not pending.decode("utf-8", "replace").endswith("\ufffd"):
            released, pending = released + pending, b""
    return released.decode("utf-8")


DETOKENIZERS = st.sampled_from([BPEStreamingDetokenizer, NaiveStreamingDetokenizer])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), detok_class=DETOKENIZERS)
def test_stream_equals_text_cut_at_first_stop(data, detok_class):
    # No leading space: BPEStreamingDetokenizer trims one (a mlx-lm choice, not ours).
    texts = st.text(ALPHABET, min_size=1, max_size=40).filter(lambda t: t[0] != " ")
    text, chunks = data.draw(chunked(texts))
    substrings = st.integers(0, len(text)).flatmap(
        lambda i: st.integers(i, min(len(text), i + 4)).map(lambda j: text[i:j])
    )
    stops = data.draw(st.lists(substrings | st.text(ALPHABET, max_size=4), max_size=3))
    tok, token_ids = chunk_tokenizer(chunks, detok_class)
    pipe = OutputPipeline(tok, stop=stops)
    deltas = []
    for k, t in enumerate(token_ids):
        deltas.append(pipe.feed(t))
        so_far = shown_text(chunks[: k + 1], detok_class)
        cut = first_stop_cut(so_far, stops)
        emitted = "".join(d.content for d in deltas)
        # Exactly vLLM's rule: everything is out except a possible stop prefix, at once.
        assert emitted == (visible_prefix(so_far, stops) if cut is None else cut)
        assert pipe.stopped == (cut is not None)
        if pipe.stopped:
            break
    deltas.append(pipe.finish("stop" if pipe.stopped else "length"))
    cut = first_stop_cut(text, stops)
    assert pipe.content == (text if cut is None else cut)
    assert not any(s and s in d.content for d in deltas for s in stops)
    check_joined(pipe, deltas)


PART = st.tuples(
    st.sampled_from(["content", "reasoning", "tool"]), st.text("ab <é🙂\n", max_size=8)
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), parts=st.lists(PART, max_size=5), detok_class=DETOKENIZERS)
def test_structure_survives_any_byte_split(data, parts, detok_class):
    text, want = "Q", {"content": "Q", "reasoning": "", "tool": []}
    for kind, body in parts:
        if kind == "content":
            text += body
            want["content"] += body
        elif kind == "reasoning":
            text += f"<think>{body}</think>"
            want["reasoning"] += body
        else:
            call = {"name": "f", "arguments": {"s": body}}
            text += f"<tool_call>{json.dumps(call)}</tool_call>"
            want["tool"].append(body)
    _, chunks = data.draw(chunked(st.just(text)))
    tok, token_ids = chunk_tokenizer(chunks, detok_class, markers=True)
    pipe = OutputPipeline(tok)
    deltas = run(pipe, token_ids, reason="length")
    assert (pipe.content, pipe.reasoning) == (want["content"], want["reasoning"])
    assert [json.loads(c.arguments)["s"] for c in pipe.tool_calls] == want["tool"]
    assert [c.index for c in pipe.tool_calls] == list(range(len(want["tool"])))
    check_joined(pipe, deltas)
