"""When a constraint starts: after the reasoning (grammar_scope) and at a lazy trigger.

Unit tests drive `ConstraintProcessor` with its gate (decoding/grammar_gate.py) the way
mlx-lm does (context = prompt + generated tokens) on the toy tokenizer
(tests/toy_tokenizer.py: single-token "<think>" / "</think>"), and the batch-wide path
(batch/logits.py) beside a per-row reference. Scripted-model tests over real gRPC
check the reasoning / content split of PredictStream and Predict.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from helpers import chat_request, joined_from, load_opts
from inprocess import InProcessServer
from scripted import ScriptedModel
from toy_tokenizer import ids

import backend_pb2
import params
from batch.logits import BatchLogits
from decoding import grammar
from decoding.grammar_gate import ChainGate, ReasoningGate, TriggerGate
from engine.sequences import stops_at_eos
from parsing.constraint import Constraint
from prompting import render as prompt_mod
from seam.tokenizer import vocab_size

SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
    }
)
JSON = 'b:{"a": 1}'  # its bytes (the toy tokenizer's byte ids): valid under SCHEMA
ANSWER_GBNF = 'root ::= "Answer" "!"'


def gbnf(source: str) -> Constraint:
    return Constraint("gbnf", source, "PredictOptions.Grammar")


def hot(tok, want: int) -> mx.array:
    return (mx.arange(vocab_size(tok))[None, :] == want).astype(mx.float32) * 50.0


def drive(proc, tok, prompt: list[int], script: list[int]) -> list[int]:
    """Greedy decoding: the model wants script[i] at step i (logit 50, the rest 0)."""
    context, out = list(prompt), []
    for want in script:
        token = int(mx.argmax(proc(mx.array(context), hot(tok, want)), axis=-1).item())
        context.append(token)
        out.append(token)
    return out


# --- the gates ------------------------------------------------------------------------


def test_reasoning_gate_opens_after_the_end_marker_and_passes_what_follows():
    gate = ReasoningGate([1], [2, 3], inside=True)
    assert not gate.open and gate.extra is None
    assert gate.feed([5, 2, 6, 2]) == [] and not gate.open
    assert gate.feed([3, 7, 8]) == [7, 8] and gate.open
    assert gate.feed([9]) == [9]


def test_reasoning_gate_lets_the_model_open_a_block_with_its_first_token():
    gate = ReasoningGate([1], [2], inside=False)
    assert gate.open and gate.extra == 1  # the grammar masks; the think start is allowed too
    assert gate.feed([1, 5]) == [] and not gate.open
    assert gate.feed([2, 6]) == [6] and gate.open and gate.extra is None
    later = ReasoningGate([1], [2], inside=False)
    assert later.feed([7, 1]) == [7, 1] and later.extra is None  # only before the first token


def test_trigger_gate_feeds_the_text_from_the_word_on_even_across_tokens():
    pieces = {1: b"Hel", 2: b"lo <to", 3: b"ol>{", 4: b"}"}
    decode = lambda ts: b"".join(pieces[t] for t in ts)  # noqa: E731
    gate = TriggerGate(["<tool>"], decode, lambda b: list(b))
    assert gate.feed([1, 2]) == [] and not gate.open
    assert gate.feed([3, 4]) == [*b"<tool>{", 4] and gate.open
    with pytest.raises(ValueError, match="trigger"):
        TriggerGate([""], decode, list)


def test_chain_gate_looks_for_the_trigger_after_the_reasoning():
    pieces = {1: b"<think>", 2: b"</think>", 5: b"T", 6: b"x"}
    trigger = TriggerGate(["T"], lambda ts: b"".join(pieces[t] for t in ts), lambda b: [5])
    chain = ChainGate([ReasoningGate([1], [2], inside=True), trigger])
    assert chain.feed([5, 6]) == [] and not chain.open  # a trigger inside the reasoning
    assert chain.feed([2, 6, 5, 6]) == [5, 6] and chain.open


# --- the processor ----------------------------------------------------------------------


def test_dormant_rows_keep_their_logits_then_the_grammar_masks(tok):
    proc = grammar.make_constraint_processor(gbnf(ANSWER_GBNF), tok, "reasoning")
    prompt = ids(tok, "Hello", "<think>")
    logits = hot(tok, ids(tok, "Let")[0])
    assert proc.dormant and not proc.masking
    assert mx.array_equal(proc(mx.array(prompt), logits), logits)  # unchanged, not EOS-only
    out = drive(proc, tok, prompt, ids(tok, "Let", "</think>", "Sure", "Sure"))
    assert tok.decode(out) == "Let</think>An"  # masked from the token after the marker
    assert proc.failure is None and grammar.failure_of([proc]) is None


def test_scope_all_masks_the_reasoning_too(tok):
    proc = grammar.make_constraint_processor(gbnf(ANSWER_GBNF), tok, "reasoning", "all")
    out = drive(proc, tok, ids(tok, "Hello", "<think>"), ids(tok, "Let", "Let"))
    assert tok.decode(out) == "An"


def test_model_may_open_a_think_block_before_the_grammar(tok):
    proc = grammar.make_constraint_processor(gbnf(ANSWER_GBNF), tok, "normal")
    script = ids(tok, "<think>", "Let", "</think>", "Sure", "Sure")
    assert tok.decode(drive(proc, tok, ids(tok, "Hello"), script)) == "<think>Let</think>An"
    proc = grammar.make_constraint_processor(gbnf(ANSWER_GBNF), tok, "normal")
    assert tok.decode(drive(proc, tok, ids(tok, "Hello"), ids(tok, "Let"))) == "A"  # masked


def test_lazy_grammar_is_free_before_its_trigger_and_includes_it(tok):
    make = lambda: grammar.make_constraint_processor(  # noqa: E731
        gbnf(ANSWER_GBNF), tok, triggers=("Answer",)
    )
    proc = make()
    assert tok.decode(drive(proc, tok, ids(tok, "Sure"), ids(tok, "Hello", " world"))) == (
        "Hello world"
    )
    assert proc.dormant and proc.failure is None
    proc = make()
    out = drive(proc, tok, ids(tok, "Sure"), ids(tok, "Hello", "Answer", " me", "Sure"))
    assert tok.decode(out[:3]) == "HelloAnswer!"  # " me" breaks the grammar: "!" forced
    assert out[3] == tok.eos_token_id  # complete: only EOS
    assert proc.failure is None


def test_trigger_not_matching_the_grammar_fails_with_a_reason(tok):
    proc = grammar.make_constraint_processor(gbnf(ANSWER_GBNF), tok, triggers=("Sure",))
    drive(proc, tok, ids(tok, "Sure"), ids(tok, "Hello", "Sure", "!"))
    failure = grammar.failure_of([proc])
    assert failure is not None and failure.startswith("PredictOptions.Grammar")


def test_batch_wide_mask_leaves_dormant_rows_alone_and_matches_per_row(tok):
    """Three rows: dormant (reasoning), started, lazy without trigger; the batch-wide
    path (`BatchLogits._mask`) gives each the logits of its own per-row call."""
    prompt = ids(tok, "Hello", "<think>")
    states = ["reasoning", "normal", "normal"]
    triggers = [(), (), ("Answer",)]

    def procs():
        return [
            grammar.make_constraint_processor(gbnf(ANSWER_GBNF), tok, s, triggers=t)
            for s, t in zip(states, triggers, strict=True)
        ]

    batch, solo = procs(), procs()
    rows = [SimpleNamespace(processors=(p,), tokens=list(prompt), history=None) for p in batch]
    state = BatchLogits(rows)
    rng = np.random.default_rng(0)
    for step, want in enumerate(ids(tok, "Let", "Answer", "!")):
        logits = mx.array(rng.normal(size=(3, vocab_size(tok))).astype(np.float32))
        logits[:, want] = 50.0
        inputs = mx.array([r.tokens[-1] for r in rows])
        if step:
            assert state.matches(rows)
        got, _ = state.apply(logits, inputs)
        for e, p in enumerate(solo):
            expected = p(mx.array(rows[e].tokens), logits[e : e + 1])
            assert mx.array_equal(got[e : e + 1], expected), (step, e)
        picked = [int(t) for t in mx.argmax(got, axis=-1).tolist()]
        for r, t in zip(rows, picked, strict=True):
            r.tokens.append(t)
        if step == 0:
            assert mx.array_equal(got[0], logits[0])  # dormant: unchanged
            assert mx.array_equal(got[2], logits[2])  # lazy, no trigger yet


def test_stops_at_eos_under_a_dormant_grammar_too():
    assert stops_at_eos(params.GenerationParams(**_gen(constraint=gbnf(ANSWER_GBNF))))


def _gen(**changes):
    base = params.generation_params(backend_pb2.PredictOptions())
    return {**base.__dict__, "ignore_eos": True, **changes}


# --- options ----------------------------------------------------------------------------


def test_grammar_triggers_load_and_reach_each_request():
    load = load_opts(GrammarTriggers=[backend_pb2.GrammarTrigger(word="<tool_call>")])
    assert load.grammar_triggers == ("<tool_call>",)
    gen = params.generation_params(backend_pb2.PredictOptions(), load)
    assert gen.grammar_triggers == ("<tool_call>",)


def test_grammar_scope_option_and_metadata():
    assert load_opts().grammar_scope == "after_reasoning"
    load = load_opts("grammar_scope:all")
    assert params.generation_params(backend_pb2.PredictOptions(), load).grammar_scope == "all"
    req = backend_pb2.PredictOptions()
    req.Metadata["grammar_scope"] = "after_reasoning"
    assert params.generation_params(req, load).grammar_scope == "after_reasoning"
    req.Metadata["grammar_scope"] = "thinking"
    with pytest.raises(ValueError, match=r"Metadata\.grammar_scope must be one of"):
        params.generation_params(req, load)
    with pytest.raises(ValueError, match="grammar_scope"):
        load_opts("grammar_scope:bogus")


# --- over gRPC, through the real engine -------------------------------------------------


def serve(tok, *triggers: str):
    """An in-process server of the scripted model, loaded with ``triggers`` as LocalAI's
    ModelOptions.GrammarTriggers."""
    model = ScriptedModel(vocab_size(tok), tok.eos_token_id)
    srv = InProcessServer()
    words = [backend_pb2.GrammarTrigger(word=w) for w in triggers]
    load = params.load_params(backend_pb2.ModelOptions(Model="scripted", GrammarTriggers=words))
    asyncio.run_coroutine_threadsafe(srv.engine.install(model, tok, load), srv.loop).result(60)
    return srv, model, load


@pytest.fixture(scope="module")
def served(tok):
    server = serve(tok)
    yield server
    server[0].stop()


@pytest.fixture(scope="module")
def lazy(tok):
    server = serve(tok, "Answer")
    yield server
    server[0].stop()


def run(server, tok, req, *parts: str):
    """(the stream's (content, reasoning) deltas, Predict's one delta) of `req` scripted."""
    srv, model, load = server
    spec = params.parse_request(req, load).prompt
    model.set_script(len(prompt_mod.prepare_prompt(spec, tok).token_ids), ids(tok, *parts))
    replies = list(srv.stub.PredictStream(req))
    deltas = [(d.content, d.reasoning_content) for r in replies for d in r.chat_deltas]
    (whole,) = srv.stub.Predict(req).chat_deltas
    content = "".join(c for c, _ in deltas)
    reasoning = "".join(r for _, r in deltas)
    assert (whole.content, whole.reasoning_content) == (content, reasoning)
    return deltas, whole


def schema_request(**metadata: str):
    req = chat_request("Hi", Tokens=30)
    req.Metadata["json_schema"] = SCHEMA
    req.Metadata.update(metadata)
    return req


def test_schema_applies_after_the_reasoning_over_grpc(served, tok):
    # The template leaves "<think>\n" open: the job starts in the reasoning.
    deltas, whole = run(served, tok, schema_request(), "Let", " me", "</think>", JSON)
    assert joined_from(deltas, [("", "Let"), ("", " me"), *[(c, "") for c in '{"a": 1}']])
    assert json.loads(whole.content) == {"a": 1}


def test_reasoning_budget_hands_over_to_the_schema(served, tok):
    req = schema_request(reasoning_budget="2")
    # Position 2 is taken by the forced "</think>"; the schema holds from position 3.
    _, whole = run(served, tok, req, "Let", " me", "plan", JSON)
    assert whole.reasoning_content == "Let me"
    assert json.loads(whole.content) == {"a": 1}
    # Without the hand-over the schema would have held the reasoning: it starts with "{".
    _, whole = run(served, tok, schema_request(grammar_scope="all"), "Let", JSON)
    assert whole.reasoning_content.startswith("{")


def test_scope_all_holds_the_reasoning_to_the_schema(served, tok):
    _, whole = run(served, tok, schema_request(grammar_scope="all"), "Let", "</think>")
    assert not whole.reasoning_content.startswith("Let"), whole


def lazy_request():
    req = chat_request("Hi", Tokens=10, Grammar=ANSWER_GBNF)
    req.Metadata["enable_thinking"] = "false"  # no open think block: the answer from the start
    return req


def test_lazy_grammar_without_its_trigger_is_free_over_grpc(lazy, tok):
    _, whole = run(lazy, tok, lazy_request(), "Hello", " world")
    assert whole.content == "Hello world"


def test_lazy_grammar_holds_from_its_trigger_on_over_grpc(lazy, tok):
    _, whole = run(lazy, tok, lazy_request(), "Hello", "Answer", " me", " more")
    assert whole.content == "HelloAnswer!"


# --- issue 41 item 2: no silent constraint failures -------------------------------------


def test_reasoning_gate_finds_the_end_marker_in_text_split_otherwise(tok):
    llg = grammar.llg_tokenizer(tok)
    think = tok.convert_tokens_to_ids(["<think>", "</think>"])
    gate = ReasoningGate(
        [think[0]], [think[1]], inside=True, end_text="</think>",
        decode=llg.decode_bytes, encode=llg.tokenize_bytes,
    )  # fmt: skip
    # " </th" "ink>\nA": the marker's bytes, in other tokens than the template's one.
    split = [*ids(tok, "b: </th"), *llg.tokenize_bytes(b"ink>\nA")]
    assert gate.feed(split[:-3]) == [] and gate.in_reasoning
    out = gate.feed(split[-3:])
    assert gate.open and not gate.in_reasoning
    assert llg.decode_bytes(out) == b"\nA"  # what followed the marker goes to the grammar
    # The token form still works, and without text matching only it does.
    by_token = ReasoningGate([think[0]], [think[1]], inside=True)
    assert by_token.feed(split) == [] and by_token.in_reasoning
    assert by_token.feed([think[1], 7]) == [7] and by_token.open


def test_reasoning_gate_ends_where_the_reasoning_format_ends_the_block(tok):
    # Qwen3's format (decoding/reasoning_formats.py) ends reasoning at `<tool_call>` too,
    # the marker staying in what follows (vLLM's qwen3 reasoning parser); the output
    # pipeline routes the call there, so the gate must open there and hand the marker on
    # (a tool-call grammar's trigger). granite's "Here's my response:" is an end spelling.
    from decoding import parsers

    qwen3 = parsers.apply_parser_overrides(tok, reasoning_parser="qwen3")
    assert grammar.reasoning_end_markers(qwen3) == (("</think>",), ("<tool_call>",))
    granite = parsers.apply_parser_overrides(tok, reasoning_parser="granite")
    assert "Here's my response:" in grammar.reasoning_end_markers(granite)[0]
    llg = grammar.llg_tokenizer(tok)
    think = tok.convert_tokens_to_ids(["<think>", "</think>"])
    gate = ReasoningGate(
        [think[0]], [think[1]], inside=True, end_text=("</think>", "Here's my response:"),
        decode=llg.decode_bytes, encode=llg.tokenize_bytes, kept_text=("<tool_call>",),
    )  # fmt: skip
    assert gate.feed(llg.tokenize_bytes(b"plan it ")) == [] and gate.in_reasoning
    out = gate.feed(llg.tokenize_bytes(b'<tool_call>{"a"'))
    assert gate.open and llg.decode_bytes(out) == b'<tool_call>{"a"'
    other = ReasoningGate(
        [think[0]], [think[1]], inside=True, end_text=("</think>", "Here's my response:"),
        decode=llg.decode_bytes, encode=llg.tokenize_bytes,
    )  # fmt: skip
    out = other.feed(llg.tokenize_bytes(b"plan. Here's my response: Hi"))
    assert other.open and llg.decode_bytes(out) == b" Hi"


def test_think_end_spelled_in_other_tokens_still_engages_the_grammar(served, tok):
    # The model closes its think block with " </think>" written byte by byte (issue 41:
    # the grammar stayed dormant and "Hello world" came back as an OK answer).
    req = chat_request("Hi", Tokens=24, Grammar=ANSWER_GBNF)
    _, whole = run(served, tok, req, "Let", "b: </think>", "Hello", " world")
    assert whole.reasoning_content == "Let "
    assert whole.content == "Answer!"


def grpc_error(server, tok, req, *parts: str):
    """The status of Predict and of PredictStream for `req` scripted (they must agree)."""
    import grpc

    srv, model, load = server
    spec = params.parse_request(req, load).prompt
    model.set_script(len(prompt_mod.prepare_prompt(spec, tok).token_ids), ids(tok, *parts))
    errors = []
    for call in (lambda: srv.stub.Predict(req), lambda: list(srv.stub.PredictStream(req))):
        with pytest.raises(grpc.RpcError) as info:
            call()
        errors.append((info.value.code(), info.value.details()))
    assert errors[0] == errors[1]
    return errors[0]


def test_output_ending_inside_the_reasoning_is_an_error_not_an_ok_without_the_grammar(served, tok):
    import grpc

    req = chat_request("Hi", Tokens=12, Grammar=ANSWER_GBNF)
    code, details = grpc_error(served, tok, req, "Let", " me")  # then EOS, still thinking
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert details.startswith("PredictOptions.Grammar: the output ended inside the reasoning")
    schema = schema_request()
    code, details = grpc_error(served, tok, schema, "Let", " me")
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "Metadata.json_schema" in details
    # Cut by the token limit while thinking: a "length" reply, as any cut-off output.
    req.Tokens = 2
    _, whole = run(served, tok, req, "Let", " me", "plan")
    assert (whole.reasoning_content, whole.content) == ("Let me", "")
