"""decoding.grammar: reading constraints from a request, their bounds and clean errors.

No model here: parsing, the size / nesting / width bounds, and validation off the event
loop. The processor contract and constrained decoding on SmolLM2 are in
tests/model/test_grammar.py.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from helpers import (
    GRAMMAR_FIELD,
    PERSON,
    YES_NO,
    assert_one_clean_line,
    gbnf_alternatives,
    parse_constraint,
)

from decoding import grammar
from parsing import constraint as reading
from parsing.constraint import Constraint

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
    assert obj == Constraint("json_object", reading.ANY_JSON_OBJECT, "Metadata.response_format")
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


# --- bounds, validation off the event loop, clean errors ------------------------------------


def test_a_1mb_grammar_of_100k_alternatives_is_refused_by_the_size_bound() -> None:
    huge = gbnf_alternatives(100_000)
    assert len(huge.encode()) > 1_000_000
    expected = f"PredictOptions.Grammar is {len(huge.encode())} bytes; the limit is 65536 bytes"
    assert reading.MAX_GRAMMAR_BYTES == 65536
    with pytest.raises(ValueError, match=re.escape(expected)):
        parse_constraint(huge, {})
    with pytest.raises(ValueError, match=re.escape(expected)):
        reading.read_constraint(huge, {})
    # Built directly (not read from a request): the compile paths check the bound too.
    with pytest.raises(ValueError, match=re.escape(expected)):
        grammar.compile_constraint(Constraint("gbnf", huge, GRAMMAR_FIELD))


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
        ("root ::= " + "(" * 150 + '"a"' + ")" * 150, {}, GRAMMAR_FIELD, "deeper than 100"),
        ("root ::= " + "(" * 5000 + '"a"' + ")" * 5000, {}, GRAMMAR_FIELD, "parentheses deeper"),
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
    reading.check_json_bounds('{"a": "\\"[[[["}', "x", max_depth=1)
    with pytest.raises(ValueError, match=r"^x nests arrays/objects deeper than 1 levels"):
        reading.check_json_bounds('{"a": ["\\\\"]}', "x", max_depth=1)
    # Parentheses in GBNF strings, classes and comments do not count either.
    text = 'root ::= "(((" [(] "a" # ((((\n' * 1 + 'x ::= "\\"((("'
    reading.check_grammar_bounds(text.replace("(((", "(" * 300), GRAMMAR_FIELD)


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
