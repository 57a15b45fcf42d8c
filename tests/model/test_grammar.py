"""decoding.grammar: constrained decoding on SmolLM2.

The processor contract is checked on the real tokenizer with hand-fed token contexts; the
decoding tests run the real model in-process: 20 sampled JSON-schema sequences batched 10
at a time next to an unconstrained one (BatchGenerator), GBNF grammars greedy
(BatchGenerator), and yes/no through mlx-lm's non-batched `generate_step`. Reading
constraints and their bounds without a model: tests/fast/test_grammar.py.
"""

from __future__ import annotations

import copy
import json
import re

import jsonschema
import mlx.core as mx
import numpy as np
import pytest
from helpers import (
    GRAMMAR_FIELD,
    PERSON,
    YES_NO,
    assert_one_clean_line,
    gbnf_alternatives,
    gen_params,
    parse_constraint,
)
from mlx_lm.generate import BatchGenerator, generate_step
from mlx_lm.models.cache import make_prompt_cache

from decoding import grammar, sampling
from decoding.grammar import make_constraint_processor
from parsing import constraint as reading
from parsing.constraint import Constraint
from seam.tokenizer import vocab_size

# LocalAI's JSON-mode grammar (pkg/functions, a port of llama.cpp's old json.gbnf).
JSON_GBNF = r"""root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F]) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]*)) ("." [0-9]+)? ([eE] [-+]? [0-9]+)? ws

ws ::= ([ \t\n] ws)?"""


# The shape of LocalAI's function-calling grammar for one tool, get_weather(city).
TOOL_GBNF = r"""space ::= " "?
string ::= "\"" (
    [^"\\] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])
  )* "\"" space
root-0-arguments-city ::= string
root-0-arguments ::= "{" space "\"city\"" space ":" space root-0-arguments-city "}" space
root-0-name ::= "\"get_weather\""
root-0 ::= "{" space "\"arguments\"" space ":" space root-0-arguments "," space "\"name\"" space ":" space root-0-name "}" space
root ::= root-0"""  # noqa: E501


@pytest.fixture(scope="module")
def tok(smol):
    return smol[1]


def chat(tok, user: str, system: str = "You are a helpful assistant.") -> list[int]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return tok.apply_chat_template(messages, add_generation_prompt=True)


def run_batch(model, tok, prompts, processors, samplers, max_tokens, caches=None, history=None):
    """Decode with one BatchGenerator; returns [(token ids, finish_reason)] in input order.

    `max_tokens`: one limit per prompt."""
    gen = BatchGenerator(
        model,
        stop_tokens=[[t] for t in sorted(tok.eos_token_ids)],
        completion_batch_size=10,
        prefill_batch_size=10,
    )
    try:
        uids = gen.insert(
            prompts,
            max_tokens=max_tokens,
            caches=caches,
            all_tokens=history,
            samplers=samplers,
            logits_processors=processors,
        )
        out = {u: [] for u in uids}
        finish = {}
        while len(finish) < len(uids):
            for r in gen.next_generated():
                out[r.uid].append(r.token)
                if r.finish_reason:
                    finish[r.uid] = r.finish_reason
    finally:
        gen.close()
    return [(out[u], finish[u]) for u in uids]


def text_of(tok, tokens: list[int]) -> str:
    return tok.decode([t for t in tokens if t not in tok.eos_token_ids])


def assert_parses(constraint: Constraint, tok, tokens: list[int]) -> None:
    """Each generated token was allowed, and the grammar is complete where EOS came."""
    assert tokens[-1] in tok.eos_token_ids, "sequence did not end with EOS"
    proc = make_constraint_processor(constraint, tok)
    context = [1]  # any "prompt": the first call only records its length
    zeros = mx.zeros((1, vocab_size(tok)))
    for t in tokens:
        masked = proc(mx.array(context), zeros)
        assert masked[0, t].item() > -np.inf, f"token {t} not allowed after {context[1:]}"
        context.append(t)


# --- the processor contract, on the real tokenizer ---------------------------------------


def allowed(logits: mx.array) -> set[int]:
    return set(np.nonzero(np.array(logits[0] > -np.inf))[0].tolist())


def test_processor_follows_the_token_context_and_ends_with_eos(tok) -> None:
    c = parse_constraint(YES_NO, {})
    proc = make_constraint_processor(c, tok)
    other = make_constraint_processor(c, tok)  # same compiled grammar, its own state
    prompt = chat(tok, "Is the sky blue?")
    vocab = vocab_size(tok)
    logits = mx.zeros((1, vocab))

    first = allowed(proc(mx.array(prompt), logits))  # generate_step: the whole prompt
    assert tok.encode("yes", add_special_tokens=False)[0] in first
    assert all(re.fullmatch("y|ye|yes|n|no", tok.decode([t])) for t in first)
    assert not first & tok.eos_token_ids

    no = tok.encode("no", add_special_tokens=False)
    assert len(no) == 1
    # (1, T) context; EOS logits banned by an earlier processor (ignore_eos) still win.
    banned = logits.at[:, sorted(tok.eos_token_ids)].add(-mx.inf)
    done = proc(mx.array([[*prompt, no[0]]]), banned)
    assert allowed(done) == tok.eos_token_ids
    assert all(done[0, e].item() == 0.0 for e in tok.eos_token_ids)
    # Model preference among EOS ids is kept when they are not banned.
    prefer = logits.at[:, 2].add(5.0)
    assert mx.argmax(proc(mx.array([*prompt, no[0]]), prefer)).item() == 2

    assert allowed(other(mx.array(prompt[:3]), logits)) == first  # untouched by proc


def test_processor_consumes_several_new_tokens_at_once(tok) -> None:
    c = parse_constraint("", {"json_schema": json.dumps(PERSON)})
    proc = make_constraint_processor(c, tok)
    body = tok.encode('{"name": "Al", "age": 7', add_special_tokens=False)
    zeros = mx.zeros((1, vocab_size(tok)))
    proc(mx.array([5, 6]), zeros)
    after = allowed(proc(mx.array([5, 6, *body]), zeros))
    assert tok.encode("}", add_special_tokens=False)[0] in after
    assert not after & tok.eos_token_ids  # the object is not closed yet


def test_padded_vocab_rows_are_banned(tok) -> None:
    proc = make_constraint_processor(parse_constraint("", {"response_format": "json_object"}), tok)
    out = proc(mx.array([1]), mx.zeros((1, vocab_size(tok) + 64)))
    assert out.shape == (1, vocab_size(tok) + 64)
    assert allowed(out) and max(allowed(out)) < vocab_size(tok)


def test_uncompilable_grammar_or_slow_tokenizer_is_a_value_error(tok) -> None:
    bad = Constraint("gbnf", "root ::= nowhere", "PredictOptions.Grammar")
    with pytest.raises(ValueError, match=re.escape("PredictOptions.Grammar")):
        make_constraint_processor(bad, tok)

    class SlowTokenizer:
        eos_token_id = 0

    good = parse_constraint(YES_NO, {})
    with pytest.raises(ValueError, match=r"PredictOptions\.Grammar: .*fast"):
        make_constraint_processor(good, SlowTokenizer())
    with pytest.raises(ValueError, match="fast"):
        grammar.warm_up(SlowTokenizer())


# --- decoding with the real model --------------------------------------------------------


def test_sampled_json_schema_outputs_validate_in_a_mixed_batch(smol) -> None:
    model, tok = smol
    c = parse_constraint("", {"json_schema": json.dumps(PERSON)})
    prompt = chat(tok, "Invent a person. Reply with JSON with keys name and age.", "Reply in JSON.")
    # Prefill the shared prompt once; every sequence starts from a copy of its KV cache.
    cache = make_prompt_cache(model)
    model(mx.array(prompt[:-1])[None], cache=cache)
    mx.eval([layer.state for layer in cache])

    n = 20
    samplers = [
        sampling.make_sampler(gen_params(temperature=1.0, seed=s + 1), tok) for s in range(n)
    ]
    processors = [[make_constraint_processor(c, tok)] for _ in range(n)]
    # One unconstrained greedy neighbour in the first batch: constraints are per sequence.
    results = run_batch(
        model,
        tok,
        [prompt[-1:]] * n + [chat(tok, "Say hello.", "Be brief.")],
        [*processors[:10], [], *processors[10:]],
        [*samplers[:10], sampling.GREEDY, *samplers[10:]],
        [60] * 10 + [6] + [60] * 10,
        caches=[copy.deepcopy(cache) for _ in range(n)] + [None],
        history=[prompt[:-1]] * n + [[]],
    )
    free_tokens, _ = results.pop(10)
    assert not text_of(tok, free_tokens).lstrip().startswith("{")

    texts = []
    for tokens, finish in results:
        assert finish == "stop", text_of(tok, tokens)
        assert_parses(c, tok, tokens)
        texts.append(text_of(tok, tokens))
        jsonschema.validate(json.loads(texts[-1]), PERSON)
    assert len(set(texts)) > 1  # seeds differ, so do the samples


def test_gbnf_grammars_constrain_greedy_output(smol) -> None:
    model, tok = smol
    cases = [
        (JSON_GBNF, "Describe a cat as a JSON object with its name and age."),
        (TOOL_GBNF, "What is the weather in Paris? Call get_weather."),
    ]
    constraints = [parse_constraint(g, {}) for g, _ in cases]
    results = run_batch(
        model,
        tok,
        [chat(tok, user) for _, user in cases],
        [[make_constraint_processor(c, tok)] for c in constraints],
        [sampling.GREEDY] * len(cases),
        [60] * len(cases),
    )
    for c, (tokens, finish) in zip(constraints, results, strict=True):
        assert finish == "stop", text_of(tok, tokens)
        assert_parses(c, tok, tokens)
    assert isinstance(json.loads(text_of(tok, results[0][0])), dict)
    call = json.loads(text_of(tok, results[1][0]))
    assert call["name"] == "get_weather" and isinstance(call["arguments"]["city"], str)


def test_yes_no_through_the_non_batched_generate_step(smol) -> None:
    model, tok = smol
    c = parse_constraint(YES_NO, {})
    tokens = []
    for token, _ in generate_step(
        mx.array(chat(tok, "Is fire hot? Answer yes or no.")),
        model,
        max_tokens=8,
        sampler=sampling.GREEDY,
        logits_processors=[make_constraint_processor(c, tok)],
    ):
        tokens.append(int(token))
        if tokens[-1] in tok.eos_token_ids:
            break
    assert text_of(tok, tokens) in ("yes", "no")
    assert_parses(c, tok, tokens)


# --- bounds on the real tokenizer ------------------------------------------------------------
def test_a_moderately_large_grammar_still_compiles_and_constrains(tok) -> None:
    text = gbnf_alternatives(1500)  # ~14 KB, under llguidance's 2,000 alternatives per rule
    c = parse_constraint(text, {})
    assert c == Constraint("gbnf", text, GRAMMAR_FIELD)
    grammar.compile_constraint(c)
    proc = make_constraint_processor(c, tok)
    first = allowed(proc(mx.array([1]), mx.zeros((1, vocab_size(tok)))))
    assert first and all(re.fullmatch(r"w\d*", tok.decode([t])) for t in first)
    last = tok.encode("w1499", add_special_tokens=False)
    context = [1]
    for t in last:
        assert t in allowed(proc(mx.array(context), mx.zeros((1, vocab_size(tok)))))
        context.append(t)
    assert allowed(proc(mx.array(context), mx.zeros((1, vocab_size(tok))))) == tok.eos_token_ids


def test_a_rule_wider_than_llguidance_parses_is_refused_before_decoding(tok) -> None:
    with pytest.raises(ValueError, match=r"^PredictOptions\.Grammar is not .*max is 2000") as err:
        parse_constraint(gbnf_alternatives(3000), {})
    assert_one_clean_line(str(err.value))


@pytest.mark.parametrize(
    "text",
    ["root ::= root", "root ::= a\na ::= b\nb ::= a", 'root ::= x "a"\nx ::= x'],
)
def test_a_grammar_matching_no_string_is_refused(tok, text) -> None:
    match = r"PredictOptions\.Grammar: the GBNF grammar matches no string"
    with pytest.raises(ValueError, match=match):
        parse_constraint(text, {})
    c = reading.read_constraint(text, {})  # reading alone does not compile
    assert c == Constraint("gbnf", text, GRAMMAR_FIELD)
    with pytest.raises(ValueError, match=match):
        grammar.compile_constraint(c)
    with pytest.raises(ValueError, match=match):
        make_constraint_processor(c, tok)
