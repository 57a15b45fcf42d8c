"""decoding.grammar.py: reading constraints from a request, and constrained decoding on SmolLM2.

Parsing and error tests need no model. The processor contract is checked on the real
tokenizer with hand-fed token contexts; the decoding tests run the real model in-process:
20 sampled JSON-schema sequences batched 10 at a time next to an unconstrained one
(BatchGenerator), GBNF grammars greedy (BatchGenerator), and yes/no through mlx-lm's
non-batched `generate_step`.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import re

import jsonschema
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import BatchGenerator, generate_step
from mlx_lm.models.cache import make_prompt_cache

import backend_pb2 as pb
from decoding import grammar, sampling
from decoding.grammar import Constraint, make_constraint_processor, parse_constraint
from loading import cpu_fast_path, model_loader
from params import GenerationParams, generation_params

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},  # bounded so sampled runs finish
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
YES_NO = 'root ::= "yes" | "no"'

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
def smol():
    model, tok = model_loader.load_model(str(model_loader.embedded_model_path()))
    # As the engine does: float32 dense weights when a fast BLAS is preloaded (~6x faster
    # decoding here, e.g. under `eval "$(python -m loading.cpu_fast_path --exports)"`), else the
    # quantized model with float32 scales.
    cpu_fast_path.prepare_for_cpu(model, None)
    return model, tok


@pytest.fixture(scope="module")
def tok(smol):
    return smol[1]


def chat(tok, user: str, system: str = "You are a helpful assistant.") -> list[int]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return tok.apply_chat_template(messages, add_generation_prompt=True)


def params(**changes) -> GenerationParams:
    return dataclasses.replace(generation_params(pb.PredictOptions()), **changes)


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
    zeros = mx.zeros((1, len(tok)))
    for t in tokens:
        masked = proc(mx.array(context), zeros)
        assert masked[0, t].item() > -np.inf, f"token {t} not allowed after {context[1:]}"
        context.append(t)


# --- parse_constraint ---------------------------------------------------------------------


def test_no_constraint_when_fields_are_empty() -> None:
    assert parse_constraint("", {}) is None
    assert parse_constraint("  \n", {"json_schema": " ", "response_format": ""}) is None
    assert parse_constraint("", {"response_format": '{"type": "text"}'}) is None
    assert parse_constraint("", {"other": "x"}) is None


def test_grammar_field_is_gbnf_and_wins_over_metadata() -> None:
    c = parse_constraint(YES_NO, {"json_schema": "not json", "response_format": "junk"})
    assert c == Constraint("gbnf", YES_NO, "PredictOptions.Grammar")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.kind = "json_object"  # type: ignore[misc]


def test_grammar_field_holding_a_json_schema() -> None:
    c = parse_constraint(' {"type": "object", "properties": {"b": {}, "a": {}}}', {})
    assert c.kind == "json_schema" and c.field == "PredictOptions.Grammar"
    assert list(json.loads(c.source)["properties"]) == ["b", "a"]  # order kept


def test_metadata_json_schema_plain_and_openai_wrapped() -> None:
    plain = parse_constraint("", {"json_schema": json.dumps(PERSON)})
    wrapped = parse_constraint(
        "", {"json_schema": json.dumps({"name": "p", "strict": True, "schema": PERSON})}
    )
    assert plain == wrapped
    assert plain.kind == "json_schema" and plain.field == "Metadata.json_schema"
    assert json.loads(plain.source) == PERSON


def test_metadata_response_format_variants() -> None:
    obj = parse_constraint("", {"response_format": '{"type": "json_object"}'})
    assert obj == Constraint("json_object", grammar.ANY_JSON_OBJECT, "Metadata.response_format")
    assert parse_constraint("", {"response_format": "json_object"}) == obj
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    c = parse_constraint("", {"response_format": json.dumps(fmt)})
    assert c.kind == "json_schema" and json.loads(c.source) == PERSON
    c = parse_constraint(
        "", {"response_format": json.dumps({"type": "json_object", "schema": PERSON})}
    )
    assert c.kind == "json_schema"
    # The explicit json_schema key wins over response_format.
    both = {"json_schema": json.dumps(PERSON), "response_format": '{"type": "json_object"}'}
    assert parse_constraint("", both).field == "Metadata.json_schema"


@pytest.mark.parametrize(
    ("grammar_text", "metadata", "field"),
    [
        ("root ::= undefined-rule", {}, "PredictOptions.Grammar"),
        ('root ::= "a" (', {}, "PredictOptions.Grammar"),
        ("this is not a grammar", {}, "PredictOptions.Grammar"),
        ('{"type": "object",', {}, "PredictOptions.Grammar"),
        ('{"type": "no-such-type"}', {}, "PredictOptions.Grammar"),
        ("", {"json_schema": "{not json"}, "Metadata.json_schema"),
        ("", {"json_schema": "[1, 2]"}, "Metadata.json_schema"),
        ("", {"json_schema": '{"type": "no-such-type"}'}, "Metadata.json_schema"),
        ("", {"json_schema": '{"type": "string", "pattern": "(("}'}, "Metadata.json_schema"),
        ("", {"json_schema": '{"$ref": "#/$defs/missing"}'}, "Metadata.json_schema"),
        ("", {"response_format": '{"type": "xml"}'}, "Metadata.response_format"),
        ("", {"response_format": '{"type": "json_schema"}'}, "Metadata.response_format"),
        ("", {"response_format": "{oops"}, "Metadata.response_format"),
        (
            "",
            {"response_format": '{"type": "json_schema", "json_schema": {"schema": 3}}'},
            "Metadata.response_format",
        ),
    ],
)
def test_invalid_input_is_a_value_error_naming_the_field(grammar_text, metadata, field) -> None:
    with pytest.raises(ValueError, match=re.escape(field)):
        parse_constraint(grammar_text, metadata)


# --- the processor contract, on the real tokenizer ---------------------------------------


def allowed(logits: mx.array) -> set[int]:
    return set(np.nonzero(np.array(logits[0] > -np.inf))[0].tolist())


def test_processor_follows_the_token_context_and_ends_with_eos(tok) -> None:
    c = parse_constraint(YES_NO, {})
    proc = make_constraint_processor(c, tok)
    other = make_constraint_processor(c, tok)  # same compiled grammar, its own state
    prompt = chat(tok, "Is the sky blue?")
    vocab = len(tok)
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
    zeros = mx.zeros((1, len(tok)))
    proc(mx.array([5, 6]), zeros)
    after = allowed(proc(mx.array([5, 6, *body]), zeros))
    assert tok.encode("}", add_special_tokens=False)[0] in after
    assert not after & tok.eos_token_ids  # the object is not closed yet


def test_padded_vocab_rows_are_banned(tok) -> None:
    proc = make_constraint_processor(parse_constraint("", {"response_format": "json_object"}), tok)
    out = proc(mx.array([1]), mx.zeros((1, len(tok) + 64)))
    assert out.shape == (1, len(tok) + 64)
    assert allowed(out) and max(allowed(out)) < len(tok)


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
    samplers = [sampling.make_sampler(params(temperature=1.0, seed=s + 1), tok) for s in range(n)]
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


# --- bounds, validation off the event loop, clean errors ------------------------------------


def alternatives(n: int) -> str:
    return "root ::= " + " | ".join(f'"w{i}"' for i in range(n))


def assert_one_clean_line(message: str) -> None:
    assert "\n" not in message and "\r" not in message
    for junk in ("panicked", "backtrace", "stack backtrace", "<state>", "<grammar>", " | "):
        assert junk not in message.lower(), message


def test_a_1mb_grammar_of_100k_alternatives_is_refused_by_the_size_bound() -> None:
    huge = alternatives(100_000)
    assert len(huge.encode()) > 1_000_000
    expected = f"PredictOptions.Grammar is {len(huge.encode())} bytes; the limit is 65536 bytes"
    assert grammar.MAX_GRAMMAR_BYTES == 65536
    with pytest.raises(ValueError, match=re.escape(expected)):
        parse_constraint(huge, {})
    with pytest.raises(ValueError, match=re.escape(expected)):
        grammar.read_constraint(huge, {})
    # Built directly (not read from a request): the compile paths check the bound too.
    with pytest.raises(ValueError, match=re.escape(expected)):
        asyncio.run(grammar.validate_constraint(Constraint("gbnf", huge, GRAMMAR)))


GRAMMAR = "PredictOptions.Grammar"


def test_a_moderately_large_grammar_still_compiles_and_constrains(tok) -> None:
    text = alternatives(1500)  # ~14 KB, under llguidance's 2,000 alternatives per rule
    c = parse_constraint(text, {})
    assert c == Constraint("gbnf", text, GRAMMAR)
    asyncio.run(grammar.validate_constraint(c))
    proc = make_constraint_processor(c, tok)
    first = allowed(proc(mx.array([1]), mx.zeros((1, len(tok)))))
    assert first and all(re.fullmatch(r"w\d*", tok.decode([t])) for t in first)
    last = tok.encode("w1499", add_special_tokens=False)
    context = [1]
    for t in last:
        assert t in allowed(proc(mx.array(context), mx.zeros((1, len(tok)))))
        context.append(t)
    assert allowed(proc(mx.array(context), mx.zeros((1, len(tok))))) == tok.eos_token_ids


def test_a_rule_wider_than_llguidance_parses_is_refused_before_decoding(tok) -> None:
    with pytest.raises(ValueError, match=r"^PredictOptions\.Grammar is not .*max is 2000") as err:
        parse_constraint(alternatives(3000), {})
    assert_one_clean_line(str(err.value))


@pytest.mark.parametrize(
    "text",
    ["root ::= root", "root ::= a\na ::= b\nb ::= a", 'root ::= x "a"\nx ::= x'],
)
def test_a_grammar_matching_no_string_is_refused(tok, text) -> None:
    match = r"PredictOptions\.Grammar: the GBNF grammar matches no string"
    with pytest.raises(ValueError, match=match):
        parse_constraint(text, {})
    c = grammar.read_constraint(text, {})  # reading alone does not compile
    assert c == Constraint("gbnf", text, GRAMMAR)
    with pytest.raises(ValueError, match=match):
        asyncio.run(grammar.validate_constraint(c))
    with pytest.raises(ValueError, match=match):
        make_constraint_processor(c, tok)


def test_the_empty_string_grammar_is_not_refused() -> None:
    assert parse_constraint('root ::= ""', {}).kind == "gbnf"


def nested_schema(levels: int) -> str:
    """A JSON schema `levels` objects deep, as text (json.dumps recurses too deeply)."""
    return '{"type": "object", "properties": {"a": ' * levels + '{"type": "string"}' + "}}" * levels


@pytest.mark.parametrize(
    ("grammar_text", "metadata", "field", "message"),
    [
        ("", {"json_schema": nested_schema(500)}, "Metadata.json_schema", "deeper"),
        ("", {"json_schema": "[" * 5000 + "]" * 5000}, "Metadata.json_schema", "deeper than 64"),
        ("", {"json_schema": "[" * 100_000 + "]" * 100_000}, "Metadata.json_schema", "limit is"),
        (
            "",
            {"response_format": '{"type": "json_object", "schema": ' + nested_schema(80) + "}"},
            "Metadata.response_format",
            "deeper than 64",
        ),
        ('{"a":' * 3000 + "1" + "}" * 3000, {}, "PredictOptions.Grammar", "deeper than 64"),
        ("root ::= " + "(" * 150 + '"a"' + ")" * 150, {}, GRAMMAR, "deeper than 100"),
        ("root ::= " + "(" * 5000 + '"a"' + ")" * 5000, {}, GRAMMAR, "parentheses deeper"),
    ],
)
def test_deep_nesting_is_a_clean_value_error(grammar_text, metadata, field, message) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        parse_constraint(grammar_text, metadata)
    assert str(err.value).startswith(field)
    assert_one_clean_line(str(err.value))


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    schema = {"type": "string", "description": '[{"\\' * 200 + "]"}
    assert parse_constraint("", {"json_schema": json.dumps(schema)}).kind == "json_schema"
    grammar.check_json_bounds('{"a": "\\"[[[["}', "x", max_depth=1)
    with pytest.raises(ValueError, match=r"^x nests arrays/objects deeper than 1 levels"):
        grammar.check_json_bounds('{"a": ["\\\\"]}', "x", max_depth=1)
    # Parentheses in GBNF strings, classes and comments do not count either.
    text = 'root ::= "(((" [(] "a" # ((((\n' * 1 + 'x ::= "\\"((("'
    grammar._check_grammar_bounds(text.replace("(((", "(" * 300), GRAMMAR)


def test_real_llguidance_errors_come_out_as_one_line() -> None:
    # llguidance's regex error spans lines, with the converted grammar listed under it.
    with pytest.raises(ValueError, match="invalid hexadecimal digit") as err:
        parse_constraint("root ::= [\\U0010FFFF-\\U00000000]", {})
    assert str(err.value).startswith("PredictOptions.Grammar is not a valid GBNF grammar: ")
    assert_one_clean_line(str(err.value))
    with pytest.raises(ValueError, match=r"^Metadata\.json_schema") as err:
        parse_constraint("", {"json_schema": '{"type": "string", "pattern": "(("}'})
    assert_one_clean_line(str(err.value))


# What llguidance 1.9.1 returned compiling the 1 MB grammar above against SmolLM2's
# tokenizer (after 20 s), cut to its first frames.
PANIC = (
    "panic: assertion failed: grammar.symbols.len() < u16::MAX as usize - 10\n<backtrace>\n"
    "   0: <unknown>\n   1: <unknown>\n  16: type_call\n"
    "             at /tmp/Python-3.11.7/Objects/typeobject.c:1091:11\n"
)


def test_clean_error_strips_panics_backtraces_and_listings() -> None:
    assert grammar.clean_error(PANIC) == (
        "internal error: assertion failed: grammar.symbols.len() < u16::MAX as usize - 10"
    )
    rust = (
        "thread '<unnamed>' panicked at parser/src/earley/grammar.rs:12:5:\n"
        "index out of bounds\nnote: run with `RUST_BACKTRACE=1` to display a backtrace\n"
    )
    assert grammar.clean_error(rust) == "internal error: index out of bounds"
    listing = "at 3(8): bad regex\n   1 | %llguidance {}\n   3 | start: /x/\n         ^\n"
    assert grammar.clean_error(listing) == "at 3(8): bad regex"
    state = "NoExtensionBias\n<state>\nTokens: x\n</state><grammar>\nstart: start\n</grammar>"
    assert grammar.clean_error(state) == "NoExtensionBias"
    assert len(grammar.clean_error("x" * 5000)) == grammar.MAX_ERROR_CHARS
    assert grammar.clean_error("\n \n") == "unknown error"


def test_validate_constraint_runs_off_the_event_loop_with_a_time_bound() -> None:
    rules = [" | ".join(f"r{k}" for k in range(60))]
    rules += [" | ".join(f'"{k}x{i}"' for i in range(100)) for k in range(60)]
    text = "\n".join(f"r{k} ::= {rule}" for k, rule in enumerate(rules, -1)).replace("r-1", "root")
    big = grammar.read_constraint(text, {})
    assert len(big.source.encode()) < grammar.MAX_GRAMMAR_BYTES

    async def main() -> int:
        ticks = 0
        task = asyncio.ensure_future(grammar.validate_constraint(big))
        while not task.done():
            await asyncio.sleep(0.001)
            ticks += 1
        await task
        # A grammar already validated, or none: no error; an expired bound: ValueError.
        await grammar.validate_constraint(big)
        await grammar.validate_constraint(None)
        with pytest.raises(ValueError, match=r"^PredictOptions\.Grammar: .* within 0 s"):
            await grammar.validate_constraint(grammar.read_constraint(YES_NO + " ", {}), 0)
        return ticks

    # The loop kept running while ~60 KB of grammar compiled on the pool.
    assert asyncio.run(main()) >= 5
