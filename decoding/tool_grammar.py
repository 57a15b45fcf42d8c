"""Tool-call grammars: a request's calls held to its declared `Tools`, in the model's format.

Built from `PredictOptions.Tools` (OpenAI tool definitions) for the tool parser in effect
(the tokenizer's, after LocalAI's `tool_parser` hint: `decoding.parsers`) as one
llguidance Lark grammar, which then runs as any request constraint (compiled and cached by
`decoding.grammar`, masked batch-wide, dormant inside a think block by the `ReasoningGate`):

- free text until the format's call marker appears: before the first call the constraint
  is dormant (a `grammar_gate.TriggerGate` on the marker: logits untouched, no mask to
  compute), after a call the grammar's own free text (any text and EOS; no added tokens
  but EOS, llguidance never matches them as text) with the marker as a lazy lexeme
  (llguidance's `[lazy]`, as its `StructTag` sugar in `llguidance/_struct_tag.py` builds
  it), so the constraint engages again at the next marker;
- after the marker: the call object with `"name"` one of the declared tools (or the one
  ToolChoice names), its arguments valid under that tool's `parameters` JSON schema
  (llguidance's `%json`, lenient about keywords it does not implement), then the closing
  marker; back to free text, where further calls may start.
- When ToolChoice requires a call ("required") or names a function, the output must open
  with a call (up to 4 whitespace characters first), not lazily; later calls and text stay
  as above.

Formats: `GRAMMARS`, one builder per vLLM tool-parser name, given the tokenizer's markers
(a marker that is one added token of the vocabulary, special to llguidance whether or not
the tokenizer marks it special, e.g. Qwen's `<tool_call>`, is matched as that token,
`<[id]>`, or as its text). The JSON ones (`call_formats.JsonCall`, `ToolFormat` here):

| tool parser in effect            | call                                                     |
|----------------------------------|----------------------------------------------------------|
| mlx-lm json_tools (hermes,       | `<tool_call>` `\n`? `{"name": N, "arguments": {...}}`    |
| granite4, ernie45; templates     | `\n`? `</tool_call>`                                     |
| mlx-lm detects as json_tools)    |                                                          |
| llama3_json / llama4_json (ours) | `{"name": N, "parameters": {...}}` (`{"name"` is the     |
|                                  | marker; no closing marker; `; ` between calls is text)   |

the XML-parameter (qwen3_coder, glm47, minimax_m2), pythonic (pythonic, llama4_pythonic,
olmo3) and Harmony (openai) ones in `decoding.call_formats`. Each is its format's
`ToolFormat.grammar` (decoding/tool_formats/), found through the format the tokenizer
carries (`format_name`), or for a parser mlx-lm inferred from the chat template, its
module's (decoding/tool_formats/mlx_modules.py: json_tools, pythonic, minimax_m2). A
format without a grammar (jamba, granite, phi4_mini_json, mistral, ...) with a grammar
asked for is FAILED_PRECONDITION naming the field that asked; LocalAI's own function
grammar (`Grammar`) covers them.

JSON inside a call is written on one line with ", " and ": " (as `decoding.grammar`'s JSON
schemas), so a sampled small model cannot pad a call with newlines until max_tokens.

Precedence: an explicit constraint (`Grammar`, `Metadata` json_schema / response_format)
wins; LocalAI sends its function grammar unless the model file sets
`function.grammar.disable`, and then parses the output itself by that grammar's format.
The tool-call grammar is for the grammar-disabled, `tool_parser` case; it replaces a
model's lazy `GrammarTriggers` (those belong to a `Grammar`).

References: LM Studio's mlx-engine (`mlx_engine/tool_runtime.py`,
`NativeToolReasoningGuardLogitsProcessor`: an llguidance grammar once the native tool-call
marker is sampled, names limited to the declared tools); vLLM (`vllm/tool_parsers/utils.py`,
`get_json_schema_from_tools`): "required" and a named function are constrained, "auto"
is not; a named function that Tools does not declare is an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from decoding import call_formats, grammar, tool_formats, tool_schema
from decoding.call_formats import CallFormat
from errors import FailedPrecondition
from params import GenerationRequest
from parsing import constraint as constraint_mod
from parsing.constraint import MAX_GRAMMAR_BYTES, Constraint

__all__ = [
    "GRAMMARS",
    "HERMES",
    "LLAMA_JSON",
    "TOOLS_FIELD",
    "ToolFormat",
    "build_grammar",
    "declared_tools",
    "tool_format",
    "with_tool_grammar",
]

logger = logging.getLogger("localai.mlx." + __name__)

TOOLS_FIELD = constraint_mod.TOOLS_FIELD
LEAD_WHITESPACE = r"/[ \t\r\n]{0,4}/"  # before a required first call


# The JSON call formats (hermes and llama JSON), `decoding.call_formats.JsonCall`.
ToolFormat = call_formats.JsonCall
HERMES = call_formats.HERMES
LLAMA_JSON = call_formats.LLAMA_JSON


def grammars() -> dict[str, Callable[[str, str], ToolFormat | CallFormat]]:
    """vLLM tool-parser name -> the builder of its call grammar from the tokenizer's markers
    (tool_call_start, tool_call_end): each registered format's `ToolFormat.grammar`
    (decoding/tool_formats/), for the formats that have one."""
    out = {}
    for name in tool_formats.names():
        fmt = tool_formats.get(name)
        if fmt is not None and fmt.grammar is not None:
            out[name] = fmt.grammar
    return out


GRAMMARS = grammars()


def format_name(tokenizer: Any) -> str | None:
    """The name of the tool format in effect that has a call grammar, or None: the format a
    `tool_parser` hint installed (`tool_formats.of`), else the format of the mlx-lm parser
    module inferred from the chat template (decoding/tool_formats/mlx_modules.py, named as
    its module: "json_tools", "pythonic", ...); `tool_formats.in_effect` finds either."""
    fmt = tool_formats.in_effect(tokenizer)
    return fmt.name if fmt is not None and fmt.grammar is not None else None


def tool_format(tokenizer: Any) -> ToolFormat | CallFormat | None:
    """The call format of the tool parser in effect (`format_name`), with the tokenizer's
    own markers; None for a format without a tool-call grammar."""
    fmt = tool_formats.in_effect(tokenizer)
    if fmt is None or fmt.grammar is None:
        return None
    start = getattr(tokenizer, "tool_call_start", "") or ""
    end = getattr(tokenizer, "tool_call_end", "") or ""
    start, end = _model_markers(tokenizer, fmt, start, end)
    built: ToolFormat | CallFormat = fmt.grammar(start, end)
    return built


def _model_markers(
    tokenizer: Any, fmt: tool_formats.ToolFormat, start: str, end: str
) -> tuple[str, str]:
    """The markers the grammar writes: the format's main ones, unless their opening marker
    is no special token of this vocabulary and another block's pair is (the model's own:
    `pythonic` on LFM2 writes `<|tool_call_start|>[...]<|tool_call_end|>`, the block both
    vLLM, through its skipped special tokens, and mlx-lm read)."""
    others = [b for b in fmt.more if b.end and not b.keep]
    if not others:
        return start, end
    try:
        special = _special_finder(tokenizer)
    except Exception:  # no llguidance view of this tokenizer: the main markers
        return start, end
    if special(start) is not None:
        return start, end
    for block in others:
        if special(block.start) is not None and special(block.end) is not None:
            return block.start, block.end
    return start, end


def declared_tools(tools: Any) -> dict[str, dict[str, Any]]:
    """{name: parameters JSON schema} of OpenAI tool definitions, in order; a tool without
    a name is skipped (the first of a repeated name counts), a missing or non-object
    `parameters` is any JSON object."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            function = tool if isinstance(tool, dict) else {}
        name = function.get("name")
        if not isinstance(name, str) or not name or name in out:
            continue
        schema = function.get("parameters")
        out[name] = dict(schema) if isinstance(schema, dict) else {"type": "object"}
    return out


_literal = call_formats.lark_literal
# Free text that does not open a call of a `leading` format (one whose calls count only at
# the output's start): empty, blank, or text whose first non-blank character is not the
# call's first character.
_NO_CALL = "/[ \\t\\r\\n]*/ | /[ \\t\\r\\n]*[^ \\t\\r\\n{first}](.|\\n)*/"


def build_grammar(
    tools: Mapping[str, Mapping[str, Any]],
    fmt: ToolFormat | CallFormat,
    *,
    opening: str = "lazy",
    special: Callable[[str], int | None] = lambda text: None,
    single: bool = False,
) -> str:
    """The Lark grammar (llguidance dialect) of free text with calls of `tools` ({name:
    parameters schema}, at least one) in format `fmt` (module doc). `opening`: "lazy" (free
    text first, the marker a lazy lexeme), "required" (up to 4 whitespace characters, then
    a call) or "triggered" (a call at once: the text from the marker on, as a
    `TriggerGate` hands it over). `special(marker)`: the id of the special token that is
    `marker`, or None (then the marker is text). `single`: exactly one call (a named
    function, as OpenAI's tool_choice means it), no later calls in the text.

    Raises ValueError naming PredictOptions.Tools when there is no tool or the grammar
    would exceed MAX_GRAMMAR_BYTES."""
    if not tools:
        raise ValueError(f"{TOOLS_FIELD} declares no function with a name to call")
    call = fmt.call_format() if isinstance(fmt, ToolFormat) else fmt

    def marker(text: str) -> str:
        token = special(text)
        return f"<[{token}]>" if token is not None else _literal(text)

    start = marker(call.start)
    start_special = start.startswith("<[")
    text_start = _literal(call.start)
    # The first call's marker: the token, or its text (a TriggerGate re-tokenizes the text).
    first = f"({start} | {text_start})" if start_special else start
    lead = f"{call.lead(marker)} " if call.lead is not None and opening == "required" else ""
    more = "call* " if call.repeat and not single else ""
    lines = ["%llguidance {}"]
    if call.leading:  # no trigger: a call only at the start, else free text
        opened = f"{LEAD_WHITESPACE} {first} body" + ("" if call.last else f" {more}TEXT")
        if opening == "required":
            lines.append(f"start: {opened}")
        else:
            first_char = "".join("\\" + c if c in "\\]^-[" else c for c in call.start[:1])
            lines += [f"start: {opened} | NO_CALL", "NO_CALL: " + _NO_CALL.format(first=first_char)]
    else:
        openers = {
            "lazy": "",
            "required": f"{LEAD_WHITESPACE} {lead}{first} body ",
            "triggered": f"{first} body ",
        }
        lines.append(f"start: {openers[opening]}{more}TEXT")
    lines.append("TEXT: /(.|\\n)*/")
    if more:
        # The marker as text ends the free text at its first occurrence (a lazy lexeme); as
        # a special token it never occurs inside TEXT, and the text form stays a second way.
        lines += [f"call_start[lazy]: TEXT {text_start}", "call: call_start body"]
        if start_special:
            lines[-1] += f" | TEXT {start} body"
    lines += call.rules(tools, marker, single)
    source = "\n".join(lines) + "\n"
    size = len(source.encode("utf-8"))
    if size > MAX_GRAMMAR_BYTES:
        raise ValueError(
            f"{TOOLS_FIELD}: the tool-call grammar of {len(tools)} tools is {size} bytes, over "
            f"the {MAX_GRAMMAR_BYTES} byte limit: declare fewer or smaller tools, or send "
            "Metadata tool_grammar:off"
        )
    return source


def _special_finder(tokenizer: Any) -> Callable[[str], int | None]:
    """marker text -> its id when the tokenizer writes it as one special token (as
    llguidance counts them: such a token never matches text), else None."""
    llg = grammar.llg_tokenizer(tokenizer)

    def special(text: str) -> int | None:
        try:
            ids = list(tokenizer.encode(text, add_special_tokens=False))
        except Exception:  # a tokenizer that cannot encode it: the marker stays text
            return None
        if len(ids) == 1 and llg.is_special_token(int(ids[0])):
            return int(ids[0])
        return None

    return special


def with_tool_grammar(request: GenerationRequest, tokenizer: Any) -> GenerationRequest:
    """`request` with its tool-call grammar as its constraint when one applies, else
    `request` itself (the prepare step's, `engine.prepare`; any thread).

    Applies when the request has tools, ToolChoice is not "none", no explicit constraint,
    and `tool_grammar` (Metadata or option) is "on", or "required" (the default) with a
    ToolChoice that requires a call or names a function; and the tool parser in effect
    has a format here (`tool_format`). The constraint's field is PredictOptions.Tools; its
    trigger (`grammar_triggers`, replacing the model's) is the call marker when no call is
    required (the constraint sleeps until then, `grammar_gate.TriggerGate`), none when one
    is (it holds from the first token after any reasoning).

    A format without a grammar (`GRAMMARS`) when one is asked for ("on", or a call
    required) is FailedPrecondition naming the field that asked. When no call is required
    and the format's calls count only at the output's start (`CallFormat.leading`), the
    grammar masks from the first token (no trigger).

    Raises ValueError naming PredictOptions.ToolChoice when it names a function Tools
    does not declare, or PredictOptions.Tools (`build_grammar`, a schema that is no JSON
    schema)."""
    params, spec = request.params, request.prompt
    choice = spec.tool_choice
    forced = choice in ("required", "function")
    mode = params.tool_grammar
    if mode == "off" or not spec.tools or choice == "none" or params.constraint is not None:
        return request
    if not (forced or mode == "on"):
        return request
    fmt = tool_format(tokenizer)
    if fmt is None:
        # Asked for and not buildable: an error, never calls that nothing held (issue 41).
        field = "Metadata.tool_grammar" if mode == "on" else "PredictOptions.ToolChoice"
        opens = getattr(tokenizer, "tool_call_start", "") or ""
        what = f"tool-call format (opened by {opens!r})" if opens else "tokenizer (no tool parser)"
        raise FailedPrecondition(
            f"{field}: calls held to PredictOptions.Tools were asked for, but the model's "
            f"{what} has no tool-call grammar (tool_parser names with one: "
            f"{', '.join(GRAMMARS)}); send Metadata tool_grammar:off to take calls "
            "unconstrained, or a Grammar"
        )
    tools = declared_tools(spec.tools)
    if choice == "function":
        if spec.tool_name not in tools:
            known = ", ".join(tools) or "none"
            raise ValueError(
                f"PredictOptions.ToolChoice names function {spec.tool_name[:80]!r}, which "
                f"PredictOptions.Tools does not declare (declared: {known[:200]})"
            )
        tools = {spec.tool_name: tools[spec.tool_name]}
    tool_schema.check_schemas(tools, TOOLS_FIELD)
    # Not forced: dormant (no mask, logits untouched) until the marker, then the call and
    # the grammar's own lazy free text: a lazy lexeme from the first token would mask every
    # step of a reply that calls nothing (bench/bench_constrained.py: 0.8x on the tiny model).
    leading = isinstance(fmt, CallFormat) and fmt.leading
    opening = "required" if forced else ("lazy" if leading else "triggered")
    source = build_grammar(
        tools, fmt, opening=opening, special=_special_finder(tokenizer), single=choice == "function"
    )
    constraint = Constraint("lark", source, TOOLS_FIELD)
    triggers = () if forced or leading else (fmt.start,)
    return replace(
        request, params=replace(params, constraint=constraint, grammar_triggers=triggers)
    )
