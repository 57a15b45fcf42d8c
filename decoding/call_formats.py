"""One tool-call grammar per format, registered by vLLM tool-parser name (`GRAMMARS`).

Each entry builds a `CallFormat`: the text that opens a call (the lazy trigger) and the
llguidance Lark rules of one call from there through its closing marker, with names limited
to the declared tools, parameter names to each tool's schema `properties` (in their declared
order; `required` ones present, the others optional) and values held to each property's
type where Lark can say it. `decoding.tool_grammar` puts a call between free text
(`build_grammar`), and decides when it applies.

- hermes, granite4, ernie45: `<tool_call>` `{"name": N, "arguments": {...}}` `</tool_call>`
- llama3_json, llama4_json: `{"name": N, "parameters": {...}}` (no closing marker)
- qwen3_coder, qwen3_xml: `<tool_call>\\n<function=N>\\n<parameter=P>\\nV\\n</parameter>\\n`
  `</function>\\n</tool_call>`
- glm45, glm47: `<tool_call>N<arg_key>P</arg_key><arg_value>V</arg_value></tool_call>`
  (`\\n` allowed between the parts, as GLM-4.5 writes them, never inside a string value:
  vLLM's glm4_moe_tool_parser.py keeps a string value as written, `c\\n` is not `c`)
- minimax_m2: `<minimax:tool_call>\\n<invoke name="N">\\n<parameter name="P">V</parameter>`
  `\\n</invoke>\\n</minimax:tool_call>` (several invokes in one block)
- pythonic, llama4_pythonic: `[f(a=1, b='x'), g()]`, between the tokenizer's markers when it
  has some (mlx-lm's `<|tool_call_start|>`), else only at the output's start (vLLM's
  pythonic_tool_parser.py: no markers)
- olmo3: `<function_calls>\\nf(a=1)\\ng()\\n</function_calls>`
- openai (gpt-oss Harmony): ` to=functions.N <|constrain|>json<|message|>{...}<|call|>`

Formats checked against mlx-lm's parsers (`mlx_lm/tool_parsers/qwen3_coder.py`, `glm47.py`,
`minimax_m2.py`, `pythonic.py`) and vLLM's (`vllm/tool_parsers/qwen3coder_tool_parser.py`,
`glm4_moe_tool_parser.py`, `minimax_m2_tool_parser.py`, `pythonic_tool_parser.py`,
`olmo3_tool_parser.py`, `openai_tool_parser.py`; vLLM's `glm_grammar.py` builds its GLM-4.7
grammar the same way: names from the tools, values shallowly typed).

Values in XML-parameter formats: a string-typed (or untyped) parameter is raw text up to
its closing tag; any other type is JSON under the property's schema (`%json`: integers,
numbers, booleans, null, arrays, objects, enums), which is what the parsers convert (mlx-lm's
`_convert_param_value`, `_deserialize`). In pythonic calls: Python literals of the type
(quoted strings, integers, numbers, True/False, None; JSON's true/false/null too, which
mlx-lm's pythonic parser reads); arrays and objects are any Python literal list / dict.

`marker(text)` (given to each builder) writes a marker as a Lark literal, or as its special
token (`<[id]>`) when the tokenizer has it as one (GLM's `<arg_key>`, Harmony's `<|message|>`):
llguidance never matches a special token as text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "GRAMMARS",
    "HERMES",
    "LLAMA_JSON",
    "CallFormat",
    "JsonCall",
    "Marker",
    "json_value",
    "lark_literal",
]

Marker = Callable[[str], str]  # marker text -> a Lark literal, or `<[id]>` of its special token
Tools = Mapping[str, Mapping[str, Any]]  # {name: parameters JSON schema}

# llguidance's JSON options inside a call (`x-guidance`; a tool schema's own win).
JSON_STYLE = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "lenient": True,  # unknown keywords and formats are ignored (tool_schema checks the call)
}
TEXT_UNTIL = "/(.|\\n)*/"  # any text; as a lazy rule's head it stops at the first closing tag


def lark_literal(text: str) -> str:
    """A Lark string literal of `text` (JSON escapes, as llguidance's StructTag writes)."""
    return json.dumps(text, ensure_ascii=False)


def json_value(schema: Mapping[str, Any], defs: Mapping[str, Any] | None = None) -> str:
    """`%json {...}` of `schema` in JSON_STYLE, carrying the tool schema's `$defs` /
    `definitions` (a property's `$ref` points there)."""
    full = dict(schema)
    for key, value in (defs or {}).items():
        full.setdefault(key, value)
    full["x-guidance"] = {**JSON_STYLE, **(full.get("x-guidance") or {})}
    return "%json " + json.dumps(full, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class CallFormat:
    """One format's call.

    `start`: the text that opens a call (the trigger of a lazy grammar).
    `rules(tools, marker, single)`: Lark rules defining `body`, a call from after `start`
    through its closing marker (`single`: one call, where a block may hold more).
    `repeat`: calls may follow later in the free text (a new `start` opens one).
    `leading`: a call counts only at the output's start (the marker is text that prose
    also writes, e.g. `[`), so a lazy grammar masks from the first token instead of
    waiting for a trigger.
    `lead(marker)`: Lark text a required call may be preceded by (Harmony's header).
    `last`: the calls end the output (nothing after them: the parser reads the output
    from the marker to its end, as vLLM's pythonic parser reads a bare list).
    `name`: the format's name in logs."""

    name: str
    start: str
    rules: Callable[[Tools, Marker, bool], list[str]]
    repeat: bool = True
    leading: bool = False
    lead: Callable[[Marker], str] | None = field(default=None)
    last: bool = False


@dataclass(frozen=True)
class JsonCall:
    """A JSON call format. `start`: the marker that opens it (the lazy trigger); `head`:
    the text between the marker and the name's value (`\\n`? allowed before it when
    `newline`); `args_key`: the key holding the arguments; `end`: the closing marker
    ("" = none). `name`: the format's name in logs and docs."""

    name: str
    start: str
    head: str
    args_key: str
    end: str = ""
    newline: bool = False

    def call_format(self) -> CallFormat:
        """This JSON format as a `CallFormat` (what `tool_grammar.build_grammar` takes)."""
        newline = ' "\\n"?' if self.newline else ""

        def rules(tools: Tools, marker: Marker, single: bool) -> list[str]:
            close = f"{newline} {marker(self.end)}" if self.end else ""
            names = " | ".join(f"fn_{i}" for i in range(len(tools)))
            lines = [f"body:{newline} {lark_literal(self.head)} ({names}){close}"]
            for i, (name, schema) in enumerate(tools.items()):
                head = json.dumps(name, ensure_ascii=False) + ", " + json.dumps(self.args_key)
                lines.append(f'fn_{i}: {lark_literal(head + ": ")} {json_value(schema)} "}}"')
            return lines

        return CallFormat(self.name, self.start, rules)


HERMES = JsonCall("hermes", "<tool_call>", '{"name": ', "arguments", "</tool_call>", True)
# llama3_json / llama4_json: `{"name"` is the marker (decoding/tool_formats/llama_json.py's
# LLAMA_JSON_START), no closing marker.
LLAMA_JSON = JsonCall("llama_json", '{"name"', ": ", "parameters")


def json_tools(start: str, end: str) -> JsonCall:
    """hermes / granite4 / ernie45: `<tool_call>{"name": N, "arguments": {...}}</tool_call>`
    with the tokenizer's markers (mlx-lm's json_tools)."""
    return replace(HERMES, start=start or HERMES.start, end=end or HERMES.end)


def llama_json(start: str, end: str) -> JsonCall:
    """llama3_json / llama4_json: `{"name": N, "parameters": {...}}`."""
    return LLAMA_JSON


# --- parameters, in declared order ------------------------------------------------------


def _properties(schema: Mapping[str, Any]) -> tuple[list[tuple[str, Any]], set[str], dict]:
    """(properties in order, required names, $defs/definitions) of a tool's schema."""
    props = schema.get("properties")
    items = list(props.items()) if isinstance(props, dict) else []
    required = schema.get("required")
    names = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
    defs = {k: schema[k] for k in ("$defs", "definitions") if isinstance(schema.get(k), dict)}
    return items, names, defs


def _sequence(prefix: str, items: Sequence[tuple[str, bool]], sep: str) -> list[str]:
    """Rules `{prefix}` (and helpers): a subsequence of `items` ((Lark text, required)), in
    order, every required one present, joined by `sep` (Lark text, "" for none)."""
    n = len(items)
    rules: list[str] = []

    def alternatives(k: int, lead: str) -> str:
        alts = []
        for j in range(k, n):
            tail = f" {prefix}_r{j + 1}" if j + 1 < n else ""
            alts.append(f"{lead}{items[j][0]}{tail}")
            if items[j][1]:
                break  # a required item cannot be skipped
        else:
            alts.append('""')  # nothing required from k on: the list may end here
        return " | ".join(alts)

    rules.append(f"{prefix}: {alternatives(0, '')}" if n else f'{prefix}: ""')
    for k in range(1, n + 1):
        if k < n:
            rules.append(f"{prefix}_r{k}: {alternatives(k, f'{sep} ' if sep else '')}")
    return rules


def _types(schema: Any) -> set[str]:
    """The JSON types a property allows (type, type lists, enum values, anyOf/oneOf/allOf),
    as mlx-lm's minimax_m2 `_extract_types_from_schema` reads them; empty = unknown."""
    if not isinstance(schema, dict):
        return set()
    out: set[str] = set()
    kind = schema.get("type")
    if isinstance(kind, str):
        out.add(kind)
    elif isinstance(kind, list):
        out |= {k for k in kind if isinstance(k, str)}
    for value in schema.get("enum") or () if isinstance(schema.get("enum"), list) else ():
        out.add(_json_type(value))
    if "const" in schema:
        out.add(_json_type(schema["const"]))
    for key in ("anyOf", "oneOf", "allOf"):
        for choice in schema.get(key) or () if isinstance(schema.get(key), list) else ():
            out |= _types(choice)
    return out


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _xml_value(schema: Any, defs: dict, close: str, text_close: str, raw: bool) -> str:
    """Lark of one XML parameter's value followed by its closing tag. `close`: the tag as
    Lark (a literal or special token); `text_close`: the tag's text (for a lazy rule);
    `raw`: the parser keeps a string value's text as it is (GLM: vLLM's glm4_moe parser
    strips only non-string values), so no newline may pad a string value there.

    Raw text for string-typed or untyped values (ends at the first closing tag: a lazy
    lexeme, or text then the special token); JSON under the schema otherwise."""
    types = _types(schema)
    enum = schema.get("enum") if isinstance(schema, dict) else None
    pad = "" if raw else ' "\\n"?'
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return "(" + " | ".join(lark_literal(v) for v in enum) + f"){pad} {close}"
    if not types or "string" in types:
        bound = _max_length(schema) if types == {"string"} else None
        return _raw_rule(close, text_close, bound)
    return f'{json_value(schema, defs)} "\\n"? {close}'


def _max_length(schema: Any) -> int | None:
    """A string schema's `maxLength` when it bounds raw text usefully (else None)."""
    bound = schema.get("maxLength") if isinstance(schema, dict) else None
    if isinstance(bound, int) and not isinstance(bound, bool) and 0 <= bound <= MAX_RAW_BOUND:
        return bound
    return None


MAX_RAW_BOUND = 4096  # maxLength above this: unbounded raw text (a regex that size costs)


def _raw_rule(close: str, text_close: str, bound: int | None) -> str:
    """The name of the raw-text value rule for one closing tag (and `maxLength` bound, as
    text of at most that many characters, a newline on either side aside where the parser
    strips them); `_raw_rules` defines it."""
    name = "raw_" + "".join(c if c.isalnum() else "_" for c in text_close).strip("_").lower()
    return name if bound is None else f"{name}_{bound}"


def _raw_rules(close: str, text_close: str, bounds: set[int], raw: bool = False) -> list[str]:
    """The raw-text value rules `_raw_rule` names: text up to the first closing tag (a lazy
    lexeme), or text and then the closing tag's special token (never inside text)."""
    out = []
    pad = "" if raw else "\\n?"
    for bound in [None, *sorted(bounds)]:
        text = TEXT_UNTIL if bound is None else f"/{pad}(.|\\n){{0,{bound}}}{pad}/"
        rule = _raw_rule(close, text_close, bound)
        if close.startswith("<["):
            out += [f"{rule.upper()}: {text}", f"{rule}: {rule.upper()} {close}"]
        else:
            out.append(f"{rule}[lazy]: {text} {lark_literal(text_close)}")
    return out


def _xml_format(
    name: str,
    start: str,
    end: str,
    call: Callable[[int, str, str], str],
    param: Callable[[str, str], str],
    value_close: str,
    sep: str,
    repeat_in_block: bool = False,
    raw: bool = False,
) -> CallFormat:
    """An XML-parameter format. call(i, name_lark, args_rule) -> the Lark of one call;
    param(key, value) -> the Lark of one parameter; value_close: the tag that ends a value;
    sep: Lark between parameters; raw: string values are read as written (`_xml_value`)."""

    def rules(tools: Tools, marker: Marker, single: bool) -> list[str]:
        close = marker(value_close)
        out: list[str] = []
        bounds: set[int] = set()
        fns = []
        for i, (tool, schema) in enumerate(tools.items()):
            items, required, defs = _properties(schema)
            params = []
            for key, prop in items:
                value = _xml_value(prop, defs, close, value_close, raw)
                if value.startswith("raw_") and value[-1].isdigit():
                    bounds.add(int(value.rsplit("_", 1)[1]))
                params.append((param(lark_literal(key)[1:-1], value), key in required))
            out += _sequence(f"args_{i}", params, sep)
            fns.append(f"fn_{i}")
            out.append(f"fn_{i}: {call(i, lark_literal(tool), f'args_{i}')}")
        calls = " | ".join(fns)
        more = "+" if repeat_in_block and not single else ""
        out.insert(0, f"body: ({calls}){more} {marker(end)}" if end else f"body: ({calls}){more}")
        return out + _raw_rules(close, value_close, bounds, raw)

    return CallFormat(name, start, rules)


def _qwen3_coder(start: str, end: str) -> CallFormat:
    # <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
    return _xml_format(
        "qwen3_coder",
        start or "<tool_call>",
        end or "</tool_call>",
        call=lambda i, n, args: f'"\\n"? "<function=" {n} ">" "\\n"? {args} "</function>" "\\n"?',
        param=lambda key, value: f'"<parameter={key}>" "\\n"? {value} "\\n"?',
        value_close="</parameter>",
        sep="",
    )


def _glm(start: str, end: str) -> CallFormat:
    # <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>; GLM-4.5
    # writes a newline after the name and after each value.
    def build(tools: Tools, marker: Marker, single: bool) -> list[str]:
        fmt = _xml_format(
            "glm47",
            start or "<tool_call>",
            end or "</tool_call>",
            call=lambda i, n, args: f'{n} {args} "\\n"?',
            param=lambda key, value: (
                f'"\\n"? {marker("<arg_key>")} "{key}" {marker("</arg_key>")} "\\n"? '
                f"{marker('<arg_value>')} {value}"
            ),
            value_close="</arg_value>",
            sep="",
            raw=True,
        )
        return fmt.rules(tools, marker, single)

    return CallFormat("glm47", start or "<tool_call>", build)


def _minimax_m2(start: str, end: str) -> CallFormat:
    # <minimax:tool_call>\n<invoke name="N">\n<parameter name="P">V</parameter>\n</invoke>\n...
    return _xml_format(
        "minimax_m2",
        start or "<minimax:tool_call>",
        end or "</minimax:tool_call>",
        call=lambda i, n, args: (
            f'"\\n"? "<invoke name=\\"" {n} "\\">" "\\n"? {args} "</invoke>" "\\n"?'
        ),
        param=lambda key, value: f'"<parameter name=\\"{key}\\">" {value} "\\n"?',
        value_close="</parameter>",
        sep="",
        repeat_in_block=True,
    )


# --- pythonic calls -----------------------------------------------------------------------

# Python literals (what `ast.literal_eval` reads in mlx-lm's / vLLM's pythonic parsers), on
# one line; JSON's true/false/null too (mlx-lm's `_JSONLiterals`).
_PY_RULES = [
    r"PY_STR: /\"([^\"\\\n]|\\.)*\"/ | /'([^'\\\n]|\\.)*'/",
    r"PY_INT: /-?(0|[1-9][0-9]*)/",
    r"PY_NUM: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/",
    'py_bool: "True" | "False" | "true" | "false"',
    'py_none: "None" | "null"',
    'py_list: "[" (py_any (", " py_any)*)? "]"',
    'py_dict: "{" (PY_STR ": " py_any (", " PY_STR ": " py_any)*)? "}"',
    "py_any: PY_STR | PY_NUM | py_bool | py_none | py_list | py_dict",
]
_PY_TYPES = {
    "string": "PY_STR",
    "integer": "PY_INT",
    "number": "PY_NUM",
    "boolean": "py_bool",
    "null": "py_none",
    "array": "py_list",
    "object": "py_dict",
}


def _py_value(schema: Any) -> str:
    enum = schema.get("enum") if isinstance(schema, dict) else None
    if isinstance(enum, list) and enum:
        alts = []
        for value in enum:
            if isinstance(value, str):
                alts += [lark_literal(json.dumps(value)), lark_literal(repr(value))]
            elif value is None or isinstance(value, bool | int | float):
                alts += [lark_literal(repr(value)), lark_literal(json.dumps(value))]
        if alts:
            return "(" + " | ".join(dict.fromkeys(alts)) + ")"
    types = _types(schema)
    if not types or not types <= set(_PY_TYPES):
        return "py_any"
    bound = _max_length(schema) if types == {"string"} else None
    if bound is not None:  # a quoted string of at most `bound` characters
        char = r"([^\"\\\n]|\\.)"
        single = char.replace('\\"', "'")
        return f"(/\"{char}{{0,{bound}}}\"/ | /'{single}{{0,{bound}}}'/)"
    return "(" + " | ".join(sorted({_PY_TYPES[t] for t in types})) + ")"


def _py_calls(tools: Tools) -> list[str]:
    """Rules `pycall` (one call of a declared tool) and its helpers."""
    out = list(_PY_RULES)
    fns = []
    for i, (tool, schema) in enumerate(tools.items()):
        items, required, _ = _properties(schema)
        params = [(f'"{key}=" {_py_value(prop)}', key in required) for key, prop in items]
        out += _sequence(f"pargs_{i}", params, '", "')
        out.append(f'pfn_{i}: {lark_literal(tool + "(")} pargs_{i} ")"')
        fns.append(f"pfn_{i}")
    out.insert(0, "pycall: " + " | ".join(fns))
    return out


def _pythonic(start: str, end: str) -> CallFormat:
    """`[f(a=1), g()]`: between the tokenizer's markers (mlx-lm's pythonic parser,
    `<|tool_call_start|>`), or a list at the output's start (vLLM's, no markers)."""
    if start and start != "[":

        def marked(tools: Tools, marker: Marker, single: bool) -> list[str]:
            close = f" {marker(end)}" if end else ""
            more = "" if single else ' (", " pycall)*'
            return [f'body: "[" pycall{more} "]"' + close, *_py_calls(tools)]

        return CallFormat("pythonic", start, marked)

    def bare(tools: Tools, marker: Marker, single: bool) -> list[str]:
        more = "" if single else ' (", " pycall)*'
        return [f'body: pycall{more} "]"', *_py_calls(tools)]

    # vLLM's pythonic_tool_parser.py reads the output as a list only when all of it
    # parses as one (text after the `]` makes it content): the list ends the output.
    return CallFormat("pythonic", "[", bare, repeat=False, leading=True, last=True)


def _olmo3(start: str, end: str) -> CallFormat:
    # <function_calls>\nf(a=1)\ng()\n</function_calls> (vLLM's olmo3_tool_parser.py)
    def rules(tools: Tools, marker: Marker, single: bool) -> list[str]:
        close = marker(end or "</function_calls>")
        more = "" if single else ' ("\\n" pycall)*'
        return [f'body: "\\n"? pycall{more} "\\n"? {close}', *_py_calls(tools)]

    return CallFormat("olmo3", start or "<function_calls>", rules)


# --- Harmony (gpt-oss) ------------------------------------------------------------------


def _harmony(start: str, end: str) -> CallFormat:
    """` to=functions.NAME <|constrain|>json<|message|>{args}<|call|>`: the recipient in
    the channel header, or in the role (`<|start|>assistant to=functions.NAME<|channel|>
    commentary json<|message|>`), as OpenAI's Harmony format and vLLM's
    openai_tool_parser.py read them. `<|call|>` is optional: gpt-oss stops on it (an EOS
    id), which a grammar allows once the arguments are complete."""

    def rules(tools: Tools, marker: Marker, single: bool) -> list[str]:
        constrain, channel, message = (marker(m) for m in HARMONY_TOKENS[:3])
        header = (
            f'(" " {constrain} "json" | {channel} "commentary" (" json" | " " {constrain} '
            f'"json")? | " json" | "") {message}'
        )
        out = [f"header: {header}"]
        fns = []
        for i, (tool, schema) in enumerate(tools.items()):
            out.append(f"fn_{i}: {lark_literal(tool)} header {json_value(schema)}")
            fns.append(f"fn_{i}")
        call = marker("<|call|>")
        tail = f" {call}?" if call.startswith("<[") else ""
        out.insert(0, f"body: ({' | '.join(fns)}){tail}")
        return out

    def lead(marker: Marker) -> str:
        channel, message, end_, start_ = (marker(m) for m in HARMONY_TOKENS[1:5])
        analysis = f'{channel} "analysis" {message} TEXT {end_} {start_} "assistant"'
        return f'({analysis})? {channel} "commentary"'

    return CallFormat("openai", start or " to=functions.", rules, lead=lead)


HARMONY_TOKENS = ("<|constrain|>", "<|channel|>", "<|message|>", "<|end|>", "<|start|>")


# vLLM tool-parser name -> the builder of its format, given the tokenizer's call markers
# (tool_call_start, tool_call_end; "" = the format's own). Each is also its format's
# `ToolFormat.grammar` (decoding/tool_formats/), which is how `tool_grammar` finds it.
GRAMMARS: dict[str, Callable[[str, str], CallFormat | JsonCall]] = {
    "hermes": json_tools,
    "granite4": json_tools,
    "ernie45": json_tools,
    "llama3_json": llama_json,
    "llama4_json": llama_json,
    "qwen3_coder": _qwen3_coder,
    "qwen3_xml": _qwen3_coder,
    "glm45": _glm,
    "glm47": _glm,
    "minimax_m2": _minimax_m2,
    "pythonic": _pythonic,
    "llama4_pythonic": _pythonic,
    "olmo3": _olmo3,
    "openai": _harmony,
}
