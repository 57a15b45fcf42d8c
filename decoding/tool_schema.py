"""Checks of tool calls and tool schemas against the declared `parameters` JSON schemas.

`check_calls` runs where a request's final calls are assembled (`decoding.output`,
`OutputPipeline._tool_call`) only when a tool-call grammar (`decoding.tool_grammar`) was
applied: the grammar holds the calls to the schemas while they are generated, but llguidance
ignores schema keywords it does not implement (`lenient`: `uniqueItems`, `not`, ...), so a
final call the schema rejects means the constraint failed and the request ends with an error
naming the field (issue 41 item 2). Without a grammar, calls are reported as vLLM's parsers
report them (complete JSON objects, no schema filter; tests/tool_parsers/
test_deepseekv32_tool_parser.py keeps `bad_int: "abc"` as a call): a call turned into text
is the worst outcome for an agent (issue 37).

`check_schemas` refuses a declared schema that is no JSON schema when a grammar is built from
it (INVALID_ARGUMENT naming the tool). Validation is the `jsonschema` library's (Draft 2020-12
unless the schema names its draft): our own would be a second, partial JSON-schema engine.
Calls of names no tool declares are left to the grammar (without one, vLLM reports them too).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs installed
from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]

__all__ = ["check_calls", "check_schemas", "schemas_of"]

MAX_ERROR_CHARS = 200


def schemas_of(tools: Iterable[Any] | None) -> dict[str, dict[str, Any]]:
    """{name: parameters schema} of OpenAI tool definitions (the first of a repeated name;
    a tool without an object `parameters` has none to check)."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            function = tool if isinstance(tool, dict) else {}
        name, schema = function.get("name"), function.get("parameters")
        if isinstance(name, str) and name and name not in out and isinstance(schema, dict):
            out[name] = schema
    return out


def _validator(schema: Mapping[str, Any]) -> Any:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def check_schemas(tools: Mapping[str, Mapping[str, Any]], field: str) -> None:
    """ValueError naming `field` and the tool when a `parameters` schema is no JSON schema."""
    for name, schema in tools.items():
        try:
            _validator(schema)
        except SchemaError as err:
            raise ValueError(
                f"{field}: the parameters of function {name[:80]!r} are not a valid JSON "
                f"schema: {str(err.message)[:MAX_ERROR_CHARS]}"
            ) from None


def check_calls(calls: Sequence[Any], tools: Iterable[Any] | None) -> None:
    """ValueError when a call (`.name`, `.arguments`: JSON text) of a declared tool has
    arguments that are not one complete JSON object its schema accepts."""
    schemas = schemas_of(tools)
    for call in calls:
        schema = schemas.get(call.name)
        if schema is None:
            continue
        try:
            arguments = json.loads(call.arguments)
        except json.JSONDecodeError as err:
            raise ValueError(f"tool call {call.name!r}: arguments are not JSON: {err}") from None
        try:
            validator = _validator(schema)
        except SchemaError:
            continue  # no schema to hold it to (a grammar refuses it: check_schemas)
        error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
        if error is not None:
            raise ValueError(
                f"tool call {call.name!r}: arguments break its declared schema: "
                f"{str(error.message)[:MAX_ERROR_CHARS]}"
            )
