"""Reasoning budget (reasoning_budget.py, params.py, the scheduler hook).

Unit tests drive the processor the way mlx-lm does (context = prompt + generated tokens) on
real mlx-lm `TokenizerWrapper`s: the Qwen/Hermes-style one of tests/toy_tokenizer.py (single
token "<think>" / "</think>") and an XTML-style one whose markers span several tokens. The
processor also runs inside mlx-lm's own `generate_step` and `speculative_generate_step`.
Scripted-model tests over real gRPC check the exact reasoning / content deltas.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import mlx.core as mx
import pytest
from helpers import chat_request, joined_from, load_opts
from inprocess import InProcessServer
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.tokenizer_utils import TokenizerWrapper
from scripted import ScriptedModel
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from toy_tokenizer import PIECES, build_hf, ids
from transformers import PreTrainedTokenizerFast

import backend_pb2
import params
from decoding.reasoning_budget import ReasoningBudgetProcessor, make_budget_processor
from prompting import render as prompt_mod
from seam.tokenizer import vocab_size

XTML = ["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"]


@pytest.fixture(scope="module")
def xtml_tok() -> TokenizerWrapper:
    """Byte-level BPE with XTML markers: mlx-lm infers "<|close|>think<|sep|>" (7 tokens)."""
    hf = build_hf(PIECES, markers=False)
    vocab = hf.backend_tokenizer.get_vocab()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in XTML])
    wrapper = TokenizerWrapper(
        PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end_of_msg|>")
    )
    if wrapper.think_end_tokens is None:  # mlx-lm's main branch infers no XTML markers
        pytest.skip("this mlx-lm infers no multi-token XTML think markers")
    return wrapper


def drive(proc, tok, prompt: list[int], script: list[int]) -> list[int]:
    """Greedy decoding as mlx-lm does it: the model wants script[i] at step i (logit 50)."""
    vocab = vocab_size(tok)
    context = list(prompt)
    out = []
    for want in script:
        logits = (mx.arange(vocab)[None, :] == want).astype(mx.float32) * 50.0
        processed = proc(mx.array(context), logits) if proc is not None else logits
        token = int(mx.argmax(processed, axis=-1).item())
        context.append(token)
        out.append(token)
    return out


# --- the processor ------------------------------------------------------------------------


def test_factory_returns_nothing_to_do_as_none(tok):
    assert make_budget_processor(tok, -1, "reasoning") is None
    plain = TokenizerWrapper(build_hf(PIECES, markers=False))
    assert not plain.has_thinking
    assert make_budget_processor(plain, 5, "reasoning") is None
    proc = make_budget_processor(tok, 0, "normal")
    assert isinstance(proc, ReasoningBudgetProcessor) and proc.budget == 0


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_budget_spent_in_an_open_block_forces_the_end_marker(tok, budget):
    prompt = ids(tok, "Hello", "<think>")
    script = ids(tok, "Let", " me", " think", "plan", "Sure", "!")
    proc = make_budget_processor(tok, budget, "reasoning")
    out = drive(proc, tok, prompt, script)
    end = tok.think_end_tokens[0]
    # Exactly `budget` reasoning tokens, then the marker in place of the model's choice,
    # then the model's own tokens again.
    assert out == [*script[:budget], end, *script[budget + 1 :]]
    assert proc.reasoning_tokens == budget and proc.done


def test_forced_step_masks_every_other_logit_and_wins_over_earlier_processors(tok):
    proc = make_budget_processor(tok, 1, "reasoning")
    vocab = vocab_size(tok)
    end = tok.think_end_tokens[0]
    context = ids(tok, "<think>")
    logits = mx.random.normal((1, vocab))
    assert proc(mx.array(context), logits) is logits  # budget not spent: untouched
    context += ids(tok, "plan")
    banned = logits.at[:, end].add(-mx.inf)  # e.g. a bias that excluded the marker
    forced = proc(mx.array(context), banned)
    assert forced.shape == (1, vocab)
    assert forced[0, end].item() == 0.0
    assert mx.sum(mx.isfinite(forced)).item() == 1  # everything else is -inf


def test_model_closing_the_block_in_time_is_never_touched(tok):
    prompt = ids(tok, "<think>")
    script = ids(tok, "Let", " me", "</think>", "Sure", "!")
    proc = make_budget_processor(tok, 3, "reasoning")
    assert drive(proc, tok, prompt, script) == script
    assert proc.reasoning_tokens == 2 and not proc.done


def test_end_marker_spelled_in_other_tokens_ends_the_block_too(tok):
    # " </think>" byte by byte (issue 41): the budget must see the block closed, not force
    # a second marker into the answer once it is spent.
    script = ids(tok, "Let", "b: </think>", "Sure", "!", " more", "Hello", " world")
    proc = make_budget_processor(tok, 12, "reasoning")  # 9 tokens before the marker ends
    assert drive(proc, tok, ids(tok, "<think>"), script) == script
    assert proc.reasoning_tokens == 2 and not proc.done  # "Let" and the space before it


def test_reasoning_formats_other_ends_end_the_block_too(tok):
    # Qwen3's format ends reasoning at `<tool_call>` (decoding/reasoning_formats.py, as
    # vLLM's qwen3 reasoning parser): the block is over there, so a spent budget must not
    # force `</think>` into the call.
    from decoding import parsers

    qwen3 = parsers.apply_parser_overrides(tok, reasoning_parser="qwen3")
    script = ids(tok, "Let", "<tool_call>", "b:{", "b:}", "</tool_call>", "Sure", "!", "!")
    proc = make_budget_processor(qwen3, 3, "reasoning")
    assert drive(proc, qwen3, ids(tok, "<think>"), script) == script
    assert proc.reasoning_tokens == 1 and not proc.done
    # The tokenizer's think_end alone would have counted on and forced the marker.
    plain = make_budget_processor(tok, 3, "reasoning")
    assert drive(plain, tok, ids(tok, "<think>"), script) != script


def test_block_opened_by_the_model_counts_from_its_start_marker(tok):
    script = ids(tok, "Sure", "<think>", "Let", " me", " think", "Answer")
    proc = make_budget_processor(tok, 2, "normal")
    out = drive(proc, tok, ids(tok, "Hello"), script)
    assert out == ids(tok, "Sure", "<think>", "Let", " me", "</think>", "Answer")


def test_after_the_forced_marker_a_new_block_is_left_alone(tok):
    script = ids(tok, "Let", "plan", "<think>", "Let", " me", "Answer")
    proc = make_budget_processor(tok, 1, "reasoning")
    out = drive(proc, tok, ids(tok, "<think>"), script)
    assert out == ids(tok, "Let", "</think>", "<think>", "Let", " me", "Answer")


def test_budget_zero_ends_an_open_block_at_once(tok):
    proc = make_budget_processor(tok, 0, "reasoning")
    out = drive(proc, tok, ids(tok, "<think>"), ids(tok, "Let", "Sure"))
    assert out == ids(tok, "</think>", "Sure")
    proc = make_budget_processor(tok, 0, "normal")
    out = drive(proc, tok, ids(tok, "Hello"), ids(tok, "<think>", "Let", "Sure"))
    assert out == ids(tok, "<think>", "</think>", "Sure")


def test_multi_token_marker_is_forced_token_by_token_as_the_tokenizer_encodes_it(xtml_tok):
    tok = xtml_tok
    end = list(tok.think_end_tokens)
    assert tok.think_end == "<|close|>think<|sep|>" and len(end) == 7
    assert end == tok.encode(tok.think_end, add_special_tokens=False)
    start = list(tok.think_start_tokens)
    script = list(tok.encode("abcdefghijklmnop", add_special_tokens=False))
    proc = make_budget_processor(tok, 3, "normal")
    out = drive(proc, tok, [1, 2], start + script)
    assert out == start + script[:3] + end + script[3 + len(end) :]
    assert tok.decode(out[len(start) :]) == "abc<|close|>think<|sep|>klmnop"


def test_marker_already_begun_when_the_budget_runs_out_is_completed_not_repeated(xtml_tok):
    tok = xtml_tok
    end = list(tok.think_end_tokens)
    a, b = tok.encode("ab", add_special_tokens=False)
    # The model writes "a", then the first two marker tokens; the budget (3) is then spent.
    script = [a, *end[:2], b, b, b, b, b, b, b]
    proc = make_budget_processor(tok, 3, "reasoning")
    out = drive(proc, tok, [1], script)
    assert out == [a, *end, b, b]


def test_context_rewound_or_rewritten_replays_the_state(tok):
    """As speculative decoding does: rejected draft tokens are replaced."""
    proc = make_budget_processor(tok, 2, "reasoning")
    end = tok.think_end_tokens[0]
    prompt = ids(tok, "<think>")
    let, me, plan = ids(tok, "Let", " me", "plan")
    logits = mx.zeros((1, vocab_size(tok)))
    proc(mx.array(prompt), logits)
    assert proc.forcing() is None
    proc(mx.array([*prompt, let, me]), logits)
    assert proc.forcing() == end
    proc(mx.array([*prompt, let]), logits)  # shrank: one token in
    assert proc.forcing() is None and proc.reasoning_tokens == 1
    proc(mx.array([*prompt, let, end, plan]), logits)  # rewritten: the model closed it
    assert proc.forcing() is None and proc.reasoning_tokens == 1 and not proc.done


# --- inside mlx-lm's generation loops -------------------------------------------------------


class PositionalScripted(ScriptedModel):
    """ScriptedModel whose every position predicts its own next token (for verify passes)."""

    def __call__(self, inputs, cache=None, **kwargs):
        batch, length = inputs.shape
        layer = cache[0]
        dummy = mx.zeros((batch, 1, length, 1))
        layer.update_and_fetch(dummy, dummy)
        positions = layer.offset - length + mx.arange(length) + 1  # the token each predicts
        index = mx.clip(positions - self.prompt_len, 0, self.tokens.size - 1)
        hot = mx.arange(self.vocab_size)[None, :] == self.tokens[index][:, None]
        logits = (hot.astype(mx.float32) * 50.0)[None]
        return mx.broadcast_to(logits, (batch, length, self.vocab_size))


def test_generate_step_and_speculative_decoding_agree(tok):
    prompt = ids(tok, "Hello", "<think>")
    script = ids(tok, "Let", " me", " think", "plan", "plan", "Sure", "!", "Answer")
    # The draft agrees on some tokens and not on others, so drafts get rejected.
    draft_script = ids(tok, "Let", " me", "plan", "plan", "Sure", "Sure", "!", "Answer")
    model = PositionalScripted(vocab_size(tok), tok.eos_token_id)
    model.set_script(len(prompt), script)
    draft = PositionalScripted(vocab_size(tok), tok.eos_token_id)
    draft.set_script(len(prompt), draft_script)
    end = tok.think_end_tokens[0]
    expected = [*script[:3], end, *script[4:]]

    proc = make_budget_processor(tok, 3, "reasoning")
    steps = generate_step(mx.array(prompt), model, max_tokens=8, logits_processors=[proc])
    assert [int(t) for t, _ in steps] == expected

    model.set_script(len(prompt), script)  # fresh caches below; the script is unchanged
    proc = make_budget_processor(tok, 3, "reasoning")
    steps = speculative_generate_step(
        mx.array(prompt),
        model,
        draft,
        num_draft_tokens=3,
        max_tokens=8,
        logits_processors=[proc],
    )
    assert [int(t) for t, _, _ in steps] == expected


# --- parameters -----------------------------------------------------------------------------


def chat(budget: str | None = None, **fields) -> backend_pb2.PredictOptions:
    req = chat_request("Hi", Tokens=40, **fields)
    if budget is not None:
        req.Metadata["reasoning_budget"] = budget
    return req


def test_load_option_and_metadata_override():
    assert load_opts().reasoning_budget == -1
    assert load_opts("reasoning_budget:256").reasoning_budget == 256
    assert load_opts("reasoning_budget:0").reasoning_budget == 0
    assert params.generation_params(chat()).reasoning_budget == -1
    assert params.generation_params(chat(), load_opts("reasoning_budget:7")).reasoning_budget == 7
    assert (
        params.generation_params(chat("3"), load_opts("reasoning_budget:7")).reasoning_budget == 3
    )
    assert (
        params.generation_params(chat(" -1 "), load_opts("reasoning_budget:7")).reasoning_budget
        == -1
    )


@pytest.mark.parametrize("value", ["-2", "x", "1.5"])
def test_bad_load_option_names_it(value):
    with pytest.raises(ValueError, match="option reasoning_budget must be an integer"):
        load_opts(f"reasoning_budget:{value}")


@pytest.mark.parametrize("value", ["-2", "abc", "1.5", "1e3"])
def test_bad_metadata_value_names_it(value):
    with pytest.raises(ValueError, match=r"Metadata\.reasoning_budget must be an integer >= -1"):
        params.generation_params(chat(value))


def test_budget_zero_turns_thinking_off_in_the_template_unless_the_request_set_it():
    assert params.parse_request(chat("0")).prompt.enable_thinking is False
    assert (
        params.parse_request(chat(), load_opts("reasoning_budget:0")).prompt.enable_thinking
        is False
    )
    assert params.parse_request(chat("1")).prompt.enable_thinking is None
    req = chat("0")
    req.Metadata["enable_thinking"] = "true"
    assert params.parse_request(req).prompt.enable_thinking is True
    req = chat("0")
    req.Metadata["chat_template_kwargs"] = '{"enable_thinking": true, "x": 1}'
    spec = params.parse_request(req).prompt
    assert spec.enable_thinking is True and spec.template_kwargs["x"] == 1
    raw = backend_pb2.PredictOptions(Prompt="Hi")  # no template: nothing to set
    raw.Metadata["reasoning_budget"] = "0"
    assert params.parse_request(raw).prompt.template_kwargs == {}


# --- over gRPC, through the real engine -------------------------------------------------------

REASONING = ["Let", " me", " think", "plan", "plan"]
ANSWER = ["Sure", "!"]


@pytest.fixture(scope="module")
def served(tok):
    model = ScriptedModel(vocab_size(tok), tok.eos_token_id)
    srv = InProcessServer(model, tok)
    yield srv, model, params.load_params(backend_pb2.ModelOptions(Model="scripted"))
    srv.stop()


@pytest.fixture(scope="module")
def served_opt(tok):
    options = ["reasoning_budget:1"]
    model = ScriptedModel(vocab_size(tok), tok.eos_token_id)
    srv = InProcessServer(model, tok, options)
    yield srv, model, params.load_params(backend_pb2.ModelOptions(Model="s", Options=options))
    srv.stop()


def script(server, tok, req, *parts: str) -> None:
    _, model, load_params = server
    spec = params.parse_request(req, load_params).prompt
    model.set_script(len(prompt_mod.prepare_prompt(spec, tok).token_ids), ids(tok, *parts))


def view(replies) -> list[tuple[str, str]]:
    return [(d.content, d.reasoning_content) for r in replies for d in r.chat_deltas]


@pytest.mark.parametrize("budget", [1, 3])
def test_stream_has_exactly_budget_reasoning_tokens_then_the_answer(served, tok, budget):
    srv = served[0]
    req = chat(str(budget))
    script(served, tok, req, *REASONING, *ANSWER)
    replies = list(srv.stub.PredictStream(req))
    after = [*REASONING, *ANSWER][budget + 1 :]  # the forced marker took one position
    # Replies come one per engine step, or joined when this reader lags behind.
    expected = [("", t) for t in REASONING[:budget]] + [(t, "") for t in after]
    assert joined_from(view(replies), expected), view(replies)
    assert replies[-1].tokens == budget + 1 + len(after) + 1  # marker and EOS counted
    for r in replies:  # the marker never reaches the content bytes
        assert b"<" not in r.message
    (d,) = srv.stub.Predict(req).chat_deltas
    assert d.reasoning_content == "".join(REASONING[:budget])
    assert d.content == "".join(after)


def test_unlimited_budget_lets_the_model_finish_thinking(served_opt, tok):
    srv = served_opt[0]
    req = chat("-1")
    script(served_opt, tok, req, *REASONING, "</think>", *ANSWER)
    (d,) = srv.stub.Predict(req).chat_deltas
    assert (d.reasoning_content, d.content) == ("".join(REASONING), "Sure!")


def test_load_option_applies_and_metadata_wins(served_opt, tok):
    srv = served_opt[0]
    req = chat()
    script(served_opt, tok, req, *REASONING, *ANSWER)
    (d,) = srv.stub.Predict(req).chat_deltas
    assert (d.reasoning_content, d.content) == ("Let", " thinkplanplanSure!")
    req = chat("2")
    (d,) = srv.stub.Predict(req).chat_deltas
    assert (d.reasoning_content, d.content) == ("Let me", "planplanSure!")


def test_budget_zero_renders_thinking_off_and_closes_a_block_the_model_opens(served, tok):
    srv = served[0]
    req = chat("0")
    load_params = served[2]
    spec = params.parse_request(req, load_params).prompt
    assert prompt_mod.prepare_prompt(spec, tok).text.endswith("</think>\n\n")
    script(served, tok, req, "<think>", "Let", "Sure", "!")
    (d,) = srv.stub.Predict(req).chat_deltas
    assert (d.reasoning_content, d.content) == ("", "Sure!")
    req.Metadata["enable_thinking"] = "true"  # explicit: the prompt opens the block
    script(served, tok, req, "Let", "Sure", "!")
    (d,) = srv.stub.Predict(req).chat_deltas
    assert (d.reasoning_content, d.content) == ("", "Sure!")


def test_concurrent_requests_keep_their_own_budgets(served, tok):
    srv = served[0]
    reqs = [chat(b) for b in ("1", "4", "-1", "2")]
    script(served, tok, reqs[0], *REASONING, *ANSWER)  # same prompt length for all
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(srv.stub.Predict, reqs))
    got = [r.chat_deltas[0].reasoning_content for r in replies]
    # -1: no end marker in the script, so everything stays reasoning.
    assert got == ["Let", "Let me thinkplan", "Let me thinkplanplanSure!", "Let me"]


@pytest.mark.parametrize("value", ["-2", "lots"])
def test_invalid_metadata_is_invalid_argument(served, value):
    srv = served[0]
    with pytest.raises(grpc.RpcError) as err:
        srv.stub.Predict(chat(value))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Metadata.reasoning_budget must be an integer >= -1" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        list(srv.stub.PredictStream(chat(value)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
