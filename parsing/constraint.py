"""Reading a request's output constraint: which field holds it, what kind it is, bounds.

The request side of constrained decoding, for the parsing layer (`params.py`): reading
`PredictOptions.Grammar`, `Metadata["json_schema"]` and `Metadata["response_format"]` into
a `Constraint` and the cheap size and nesting bounds every constraint obeys. Compiling and
the logits processor are `decoding/grammar.py`. Imports neither MLX nor llguidance.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from parsing import jsonfield

GRAMMAR_FIELD = "PredictOptions.Grammar"
JSON_SCHEMA_FIELD = "Metadata.json_schema"
RESPONSE_FORMAT_FIELD = "Metadata.response_format"
TOOLS_FIELD = "PredictOptions.Tools"  # the tool-call grammar (decoding/tool_grammar.py)

ANY_JSON_OBJECT = '{"type":"object"}'

# --- bounds, checked before any expensive work ---
# Largest grammar (UTF-8 bytes). 64 KiB holds LocalAI's function-calling grammar for dozens
# of tools, or ~6,000 short alternatives spread over rules (llguidance allows at most 2,000
# per rule). Validation is not all GIL-free (the GBNF converter is Python, and part of
# llguidance's build holds the GIL): at ~100 KB it paused the event loop up to ~150 ms on
# this loaded 2-core host, at 25 KB not measurably (baseline 17 ms gaps).
MAX_GRAMMAR_BYTES = 64 * 1024
# Deepest parenthesis nesting in a grammar; llguidance's GBNF converter recurses per level
# (RecursionError at ~500).
MAX_GRAMMAR_NESTING = 100
# Largest JSON text (UTF-8 bytes) of Metadata.json_schema / Metadata.response_format, or of a
# JSON schema given in PredictOptions.Grammar.
MAX_JSON_BYTES = 128 * 1024
# Deepest JSON nesting (arrays and objects) in those texts; llguidance's schema reader stops
# at 128 and Python's json at ~1000 with a RecursionError.
MAX_JSON_DEPTH = 64

ConstraintKind = Literal["gbnf", "json_schema", "json_object", "lark"]


@dataclass(frozen=True)
class Constraint:
    """What one request's output must match.

    `kind`: "gbnf" (llama.cpp GBNF; Lark syntax is accepted too), "json_schema",
    "json_object" (any JSON object) or "lark" (llguidance's Lark, as the tool-call grammar
    of `decoding.tool_grammar` is built; never read from a request). `source`: the
    grammar text, or the schema as compact JSON with its key order kept (property order
    decides output order). `field`: the request field it came from, named in every error
    about it.
    """

    kind: ConstraintKind
    source: str
    field: str

    def __post_init__(self) -> None:
        # The bounds are the type's invariant: every constraint that exists is cheap to
        # validate and compile, wherever it was built.
        if self.kind in ("gbnf", "lark"):
            check_grammar_bounds(self.source, self.field)
        else:
            check_json_bounds(self.source, self.field)


def check_json_bounds(
    raw: str, field: str, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH
) -> None:
    """`jsonfield.check_bounds` with the constraint limits (a JSON schema is smaller than
    other JSON fields). Raises ValueError naming `field` and the limit."""
    jsonfield.check_bounds(raw, field, max_bytes, max_depth)


def _json_object(raw: str, field: str) -> dict[str, Any]:
    check_json_bounds(raw, field)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ValueError(f"{field} must be a JSON object: {err}") from None
    except RecursionError:  # unreachable after the depth bound; kept as a safety net
        raise ValueError(f"{field} nests too deeply: flatten it") from None
    if not isinstance(value, dict):
        raise ValueError(f"{field} must be a JSON object, got {type(value).__name__}")
    return value


def _schema_constraint(schema: Any, field: str) -> Constraint:
    if not isinstance(schema, dict):
        raise ValueError(f"{field}: the JSON schema must be an object, got {type(schema).__name__}")
    source = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    return Constraint("json_schema", source, field)


def _response_format(raw: str) -> Constraint | None:
    field = RESPONSE_FORMAT_FIELD
    if raw in ("text", "json_object"):  # a bare type name, as some clients send it
        value: dict[str, Any] = {"type": raw}
    else:
        value = _json_object(raw, field)
    kind = value.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        # llama.cpp's server also takes {"type": "json_object", "schema": {...}}.
        if "schema" in value:
            return _schema_constraint(value["schema"], field)
        return Constraint("json_object", ANY_JSON_OBJECT, field)
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ValueError(
                f'{field} of type "json_schema" needs "json_schema": {{"schema": {{...}}}}'
            )
        return _schema_constraint(spec["schema"], field)
    raise ValueError(f'{field} "type" must be "text", "json_object" or "json_schema", got {kind!r}')


def check_grammar_bounds(text: str, field: str) -> None:
    """Size and parenthesis-nesting bounds of a GBNF/Lark grammar; ValueError naming `field`."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_GRAMMAR_BYTES:
        raise ValueError(
            f"{field} is {size} bytes; the limit is {MAX_GRAMMAR_BYTES} bytes: shorten the grammar"
        )
    # Parentheses outside "strings", [classes] and # comments; Lark's /regex/ parentheses
    # count too (they nest in the regex compiler as well).
    depth = 0
    pos = 0
    n = len(text)
    while pos < n:
        match = _GRAMMAR_STRUCTURE.search(text, pos)
        if match is None:
            break
        char = match.group()
        pos = match.end()
        if char == "(":
            depth += 1
            if depth > MAX_GRAMMAR_NESTING:
                raise ValueError(
                    f"{field} nests parentheses deeper than {MAX_GRAMMAR_NESTING} levels: "
                    "split the grammar into named rules"
                )
        elif char == ")":
            depth = max(depth - 1, 0)
        elif char == "#":
            end = text.find("\n", pos)
            pos = n if end < 0 else end + 1
        else:  # a quoted string or character class: skip to its unescaped end
            close = '"' if char == '"' else "]"
            while pos < n and text[pos] != close:
                pos += 2 if text[pos] == "\\" else 1
            pos += 1


_GRAMMAR_STRUCTURE = re.compile(r'[()"\[#]')


def read_constraint(grammar: str, metadata: Mapping[str, str]) -> Constraint | None:
    """Read a request's output constraint without compiling it; None when it has none.

    Sources, first match wins: `grammar` (PredictOptions.Grammar: GBNF as LocalAI sends
    it for JSON mode and function calling, or a JSON schema when the text is a JSON
    object); `metadata["json_schema"]` (a JSON schema, or OpenAI's wrapper
    {"name": ..., "schema": {...}}); `metadata["response_format"]` (OpenAI style:
    {"type": "json_object"}, {"type": "json_schema", "json_schema": {"schema": {...}}},
    {"type": "text"}, or the bare type name). Empty or whitespace values count as absent;
    fields after the winner are not read.

    Cheap and bounded (MAX_GRAMMAR_BYTES, MAX_GRAMMAR_NESTING, MAX_JSON_BYTES,
    MAX_JSON_DEPTH; JSON parsing), so it may run on any thread; compiling is
    `decoding.grammar.compile_constraint` (the prepare step). Raises ValueError naming
    PredictOptions.Grammar, Metadata.json_schema or Metadata.response_format, one line.
    """
    constraint: Constraint | None = None
    if grammar.strip():
        if grammar.lstrip().startswith("{"):  # no GBNF or Lark grammar starts with "{"
            constraint = _schema_constraint(_json_object(grammar, GRAMMAR_FIELD), GRAMMAR_FIELD)
        else:
            constraint = Constraint("gbnf", grammar, GRAMMAR_FIELD)
    elif metadata.get("json_schema", "").strip():
        schema = _json_object(metadata["json_schema"], JSON_SCHEMA_FIELD)
        if isinstance(schema.get("schema"), dict):  # OpenAI's {"name", "schema", "strict"}
            schema = schema["schema"]
        constraint = _schema_constraint(schema, JSON_SCHEMA_FIELD)
    elif metadata.get("response_format", "").strip():
        constraint = _response_format(metadata["response_format"].strip())
    return constraint
