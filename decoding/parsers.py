"""LocalAI's parser hints: vLLM tool/reasoning parser names -> mlx-lm parsers and markers.

LocalAI's importer writes `Options` `tool_parser:NAME` and `reasoning_parser:NAME` (vLLM's
names, from LocalAI's core/config/parser_defaults.json via core/gallery/importers/mlx.go)
into model files. `apply_parser_overrides` makes them override what mlx-lm inferred from the
chat template: it returns a TokenizerWrapper with their tool parser, tool-call markers, think
markers and (Harmony) response format, so that `output.OutputPipeline` routes text by them.

A name never fails the load: LocalAI passes options meant for other backends too. A vLLM name
with no MLX equivalent, or a name in no table, logs a warning and leaves what mlx-lm detected
from the chat template in place.

vLLM tool_parser (LocalAI's names in bold) -> parser, and the markers that open / close a block:

- **hermes**, **granite4**, **ernie45** -> mlx-lm json_tools: `<tool_call>` `</tool_call>`
- **qwen3_xml**, qwen3_coder -> mlx-lm qwen3_coder: `<tool_call>` `</tool_call>`
- **mistral** -> mlx-lm mistral, and ours where it reads nothing (v11 `NAME{...}`, a list
  with text around it): `[TOOL_CALLS]`, to the end
- **glm45**, **glm47** -> mlx-lm glm47: `<tool_call>` `</tool_call>`
- **gemma4** -> mlx-lm gemma4: `<|tool_call>` `<tool_call|>`
- **minimax_m2**, **kimi_k2**, pythonic, longcat, functiongemma -> the mlx-lm module of that
  name (functiongemma: function_gemma), with its markers
- **llama3_json**, **llama4_pythonic**, llama4_json -> ours: JSON objects `{"name": ...,
  "parameters"|"arguments": {...}}`, `;`-separated: `{"name"`, to the end
- **deepseek_v3**, deepseek_v31 -> ours: DeepSeek V3 / R1 and V3.1 calls:
  `<｜tool▁calls▁begin｜>` `<｜tool▁calls▁end｜>`
- **olmo3** -> ours: one pythonic call a line, parsed by mlx-lm's pythonic parser:
  `<function_calls>` `</function_calls>`
- **phi4_mini_json** -> ours: a JSON list: `functools[`, to the end
- **openai** (gpt-oss Harmony) -> ours: `NAME ... <|message|>{args}`: ` to=functions.`
  `<|call|>` (or `<|end|>`), one block per call message; plus the Harmony channels (below)
- internlm, jamba, granite -> ours: a JSON object / list between their markers
- deepseek_v32, gigachat3, granite_20b_fc, hunyuan_a13b, minimax, seed_oss, step3, step3p5,
  xlam: no MLX equivalent here (warning, mlx-lm's detection stays)

`llama4_pythonic`: vLLM's pythonic format comes from vLLM's own template; the Llama 4 chat
template this backend renders (the model's) asks for `{"name": ..., "parameters": ...}` JSON,
as Llama 3.x's does, so both read that JSON. Llama's JSON call has no opening marker (vLLM's
llama3_json looks at the output's start): the block starts at `{"name"`; a JSON object that
is no call (no `parameters` / `arguments`) comes back as content. A `<|python_tag|>` /
`<|python_start|>` before the JSON stays in content.

Reasoning (reasoning_parser): one `ReasoningFormat` per name in
`decoding.reasoning_formats` (markers, where the output starts, trimming); openai_gptoss
is the Harmony channels, the same response format as tool_parser openai.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Mapping
from typing import Any

import regex

from decoding import reasoning_formats
from decoding.reasoning_formats import HARMONY_FORMAT
from decoding.tool_calls import ToolParser
from seam import tokenizer as seam_tokenizer

__all__ = [
    "HARMONY_FORMAT",
    "RESPONSE_FORMATS",
    "TOOL_PARSERS",
    "apply_parser_overrides",
    "resolve_reasoning_markers",
    "resolve_tool_parser",
]

logger = logging.getLogger("localai.mlx." + __name__)


def _json_object_parser(text: str, tools: Any = None) -> Any:
    """A JSON object or list of {"name", "arguments"|"parameters"} between markers."""
    return json.loads(text.strip())


def _json_list_parser(text: str, tools: Any = None) -> Any:
    """A JSON list of {"name", "arguments"} objects between markers."""
    return json.loads(text.strip())


# Read by tool_calls.stream_format (a function attribute, which mypy cannot declare).
_json_object_parser.tool_stream_format = "json_tools"  # type: ignore[attr-defined]
_json_list_parser.tool_stream_format = "json_list"  # type: ignore[attr-defined]

_DECODER = json.JSONDecoder()
LLAMA_JSON_START = '{"name"'


def _call(obj: Any) -> dict[str, Any]:
    """{"name", "arguments"} of one decoded call; ValueError when it is no call."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("not a call: no name")
    if "arguments" in obj:
        return {"name": obj["name"], "arguments": obj["arguments"]}
    if "parameters" in obj:  # vLLM's llama3_json / phi4_mini_json accept either key
        return {"name": obj["name"], "arguments": obj["parameters"]}
    raise ValueError("not a call: no parameters or arguments")


# mlx-lm has no parser for this format (json_tools needs <tool_call> around one object).
def _llama_json_parser(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """Llama 3.x / 4 calls: `{"name": ..., "parameters": {...}}`, several separated by `;`
    or a newline.

    `text` follows the `{"name"` marker. The first object must be a call (else this raises
    and the block comes back as content); the calls end at the first text that is no call
    (prose, an object without a name), which is dropped, as vLLM's llama_tool_parser.py
    does (tests/tool_parsers/test_llama3_json_tool_parser.py: brace / JSON in trailing text).
    """
    body, pos = LLAMA_JSON_START + text, 0
    calls: list[dict[str, Any]] = []
    while True:
        try:
            obj, end = _DECODER.raw_decode(body, pos)
            call = _call(obj)
        except ValueError:
            if not calls:
                raise
            return calls
        calls.append(call)
        rest = body[end:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
        if not rest.startswith("{"):
            return calls
        pos = len(body) - len(rest)


_DS_CALL = regex.compile(
    r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", regex.S
)
_DS_FENCED = regex.compile(r"(?P<name>[^\n]*)\n```(?:json)?\n(?P<args>.*?)\n?```\s*$", regex.S)


# mlx-lm has no DeepSeek parser.
def _deepseek_parser(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """DeepSeek calls between `<｜tool▁calls▁begin｜>` and `<｜tool▁calls▁end｜>` (vLLM's
    deepseekv3_tool_parser.py and deepseekv31_tool_parser.py), each
    `<｜tool▁call▁begin｜>HEAD<｜tool▁sep｜>TAIL<｜tool▁call▁end｜>`: V3 / R1 have HEAD
    `function` and TAIL `NAME\\n```json\\n{args}\\n```; V3.1 has HEAD `NAME`, TAIL `{args}`."""
    calls = []
    for head, tail in _DS_CALL.findall(text):
        fenced = _DS_FENCED.match(tail)
        if fenced:  # V3: head is the type ("function"), the name opens the tail
            calls.append({"name": fenced["name"].strip(), "arguments": json.loads(fenced["args"])})
        else:
            calls.append({"name": head.strip(), "arguments": json.loads(tail)})
    if not calls:
        raise ValueError("no <｜tool▁call▁begin｜> call in the block")
    return calls


# mlx-lm's pythonic parser reads a list `[f(a=1)]`; OLMo 3 writes one call a line.
def _olmo3_parser(text: str, tools: Any = None) -> Any:
    """OLMo 3: newline-separated pythonic calls (JSON literals allowed), as vLLM's
    olmo3_tool_parser.py; each line parsed by mlx-lm's pythonic parser as a list of one
    (mlx-lm's main branch reads one call per list). A line that is no call with JSON
    arguments (bytes, 1e999) is left out while another line is one, as vLLM does
    (tests/tool_parsers/test_olmo3_tool_parser.py, bad sibling / non-finite argument)."""
    from mlx_lm.tool_parsers import pythonic

    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError("empty function_calls block")
    if len(lines) == 1 and lines[0].startswith("["):
        return pythonic.parse_tool_call(lines[0], tools)
    calls: list[dict[str, Any]] = []
    error: Exception | None = None
    for line in lines:
        try:
            parsed = pythonic.parse_tool_call(f"[{line}]", tools)
            items = parsed if isinstance(parsed, list) else [parsed]
            for item in items:
                json.dumps(item.get("arguments"), allow_nan=False)
        except (TypeError, ValueError, SyntaxError, AttributeError) as exc:
            error = exc
            continue
        calls.extend(items)
    if not calls:
        raise ValueError(f"no call in the function_calls block: {error}")
    return calls[0] if len(calls) == 1 else calls


# mlx-lm has no parser for this format.
def _phi4_mini_parser(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """Phi-4-mini: `functools[{"name", "arguments"|"parameters"}, ...]` (vLLM's
    phi4mini_tool_parser.py); `text` follows `functools[`. Text after the list is dropped,
    as vLLM does (tests/tool_parsers/test_phi4mini_tool_parser.py, surrounding text)."""
    body = "[" + text.strip()
    calls, _ = _DECODER.raw_decode(body)
    if not isinstance(calls, list) or not calls:
        raise ValueError("functools[...] holds no call")
    return [_call(c) for c in calls]


_MISTRAL_V11 = regex.compile(r"\s*(?P<name>[\w.-]+)\s*(?=\{)")


def _json_list_calls(text: str) -> list[dict[str, Any]]:
    """The calls of the first JSON list of calls in ``text``; text around it is dropped."""
    start = text.find("[")
    if start < 0:
        raise ValueError("no JSON list of calls")
    calls, _ = _DECODER.raw_decode(text, start)
    if not isinstance(calls, list) or not calls:
        raise ValueError("the JSON list holds no call")
    return [_call(c) for c in calls]


# mlx-lm's mistral parser reads `NAME[ARGS]{...}` and a bare list `[{...}]`, nothing more;
# vLLM's mistral_tool_parser.py also reads a list with text around it (pre-v11 tokenizers)
# and v11's `NAME{...}` (tests/tool_parsers/test_mistral_tool_parser.py).
def _mistral_parser(text: str, tools: Any = None) -> Any:
    """Mistral calls after `[TOOL_CALLS]`: mlx-lm's mistral parser first; else each
    `[TOOL_CALLS]`-separated part is `NAME{args}` (v11) or holds a JSON list of calls."""
    from mlx_lm.tool_parsers import mistral

    try:
        return mistral.parse_tool_call(text, tools)
    except Exception:  # mlx-lm raises ValueError / JSONDecodeError / KeyError here
        pass
    calls: list[dict[str, Any]] = []
    for part in text.split(mistral.tool_call_start):
        if not part.strip():
            continue
        head = _MISTRAL_V11.match(part)
        if head is not None:
            args, _ = _DECODER.raw_decode(part, head.end())
            calls.append({"name": head["name"], "arguments": args})
        else:
            calls.extend(_json_list_calls(part))
    if not calls:
        raise ValueError("no Mistral tool call")
    return calls


_mistral_parser.tool_stream_format = "mistral"  # type: ignore[attr-defined]


_HARMONY_NAME = regex.compile(r"\s*(?P<name>[^\s<]+)")


# mlx-lm has no Harmony (gpt-oss) support.
def _harmony_parser(text: str, tools: Any = None) -> dict[str, Any]:
    """gpt-oss: the text after ` to=functions.`: `NAME <|constrain|>json<|message|>{args}` (the
    recipient in the channel) or `NAME<|channel|>commentary json<|message|>{args}` (in the
    role), up to `<|call|>` (OpenAI's Harmony format; vLLM's openai_tool_parser.py)."""
    name = _HARMONY_NAME.match(text)
    _, sep, args = text.partition("<|message|>")
    if name is None or not sep:
        raise ValueError("no function name or no <|message|> in the Harmony call")
    args = args.split("<|call|>", 1)[0].strip()
    return {"name": name["name"], "arguments": json.loads(args) if args else {}}


HARMONY_TOOL_START = " to=functions."

# vLLM name -> mlx-lm tool parser module; (parser, start, end) for formats parsed here (or by
# mlx-lm's json_tools once the markers are known); None: a vLLM name with no MLX equivalent
# (mlx-lm's detection from the chat template stays).
TOOL_PARSERS: dict[str, str | tuple[ToolParser, str, str] | None] = {
    "hermes": "json_tools",
    "granite4": "json_tools",  # <tool_call>{"name", "arguments"}</tool_call>, as hermes
    "ernie45": "json_tools",  # <tool_call>\n{...}\n</tool_call>
    "qwen3_coder": "qwen3_coder",
    "qwen3_xml": "qwen3_coder",
    "mistral": (_mistral_parser, "[TOOL_CALLS]", ""),
    "pythonic": "pythonic",
    "kimi_k2": "kimi_k2",
    "glm45": "glm47",
    "glm47": "glm47",
    "minimax_m2": "minimax_m2",
    "longcat": "longcat",
    "functiongemma": "function_gemma",
    "gemma4": "gemma4",
    "llama3_json": (_llama_json_parser, LLAMA_JSON_START, ""),
    "llama4_json": (_llama_json_parser, LLAMA_JSON_START, ""),
    "llama4_pythonic": (_llama_json_parser, LLAMA_JSON_START, ""),
    "deepseek_v3": (_deepseek_parser, "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
    "deepseek_v31": (_deepseek_parser, "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
    "olmo3": (_olmo3_parser, "<function_calls>", "</function_calls>"),
    "phi4_mini_json": (_phi4_mini_parser, "functools[", ""),
    "openai": (_harmony_parser, HARMONY_TOOL_START, ""),
    "internlm": (_json_object_parser, "<|action_start|><|plugin|>", "<|action_end|>"),
    "jamba": (_json_list_parser, "<tool_calls>", "</tool_calls>"),
    "granite": (_json_list_parser, "<|tool_call|>", ""),
    # vLLM parsers whose formats no parser here reads yet
    "deepseek_v32": None,
    "gigachat3": None,
    "granite_20b_fc": None,
    "hunyuan_a13b": None,
    "minimax": None,
    "seed_oss": None,
    "step3": None,
    "step3p5": None,
    "xlam": None,
}

# Names (tool or reasoning) whose format is a set of channels: installed as the tokenizer's
# response format whichever of the two options names it.
RESPONSE_FORMATS: dict[str, Mapping[str, Any]] = {
    "openai": HARMONY_FORMAT,
    "openai_gptoss": HARMONY_FORMAT,
}


def _normal(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def resolve_tool_parser(name: str) -> tuple[ToolParser, str, str] | None:
    """vLLM tool parser name -> (parser(text, tools), start marker, end marker), or None.

    The end marker is "" for formats whose calls run to the end of the output. None for a
    name with no MLX equivalent and for an unknown name (see `apply_parser_overrides`).
    """
    entry = TOOL_PARSERS.get(_normal(name))
    if entry is None:
        return None
    if isinstance(entry, tuple):
        return entry
    module = importlib.import_module(f"mlx_lm.tool_parsers.{entry}")
    return module.parse_tool_call, module.tool_call_start, module.tool_call_end


def resolve_reasoning_markers(name: str) -> tuple[str, str] | None:
    """vLLM reasoning parser name -> (think start, think end) marker text, or None (no
    marker pair: a channel format, no MLX equivalent, or an unknown name)."""
    fmt = reasoning_formats.resolve(name)
    return (fmt.start, fmt.end) if fmt is not None and fmt.start and fmt.end else None


def _fallback(option: str, name: str, table: Mapping[str, Any], detected: str) -> None:
    """Warn that ``name`` changes nothing: what mlx-lm detected (``detected``) stays."""
    if _normal(name) in table and table[_normal(name)] is None:
        why = f"{option} {name!r} (a vLLM name) has no MLX equivalent here"
    else:
        usable = sorted(k for k, v in table.items() if v is not None or k in RESPONSE_FORMATS)
        why = f"unknown {option} {name!r} (the names that apply: {', '.join(usable)})"
    logger.warning("%s; keeping what mlx-lm detected from the chat template: %s", why, detected)


def _detected_tool(tokenizer: Any) -> str:
    parser = getattr(tokenizer, "tool_parser", None)
    if not parser:
        return "no tool parser"
    module = getattr(parser, "__module__", "").rsplit(".", 1)[-1]
    return f"tool parser {module} ({getattr(tokenizer, 'tool_call_start', '')!r})"


def _detected_think(tokenizer: Any) -> str:
    if not getattr(tokenizer, "has_thinking", False):
        return "no think markers"
    return f"think markers {tokenizer.think_start!r} {tokenizer.think_end!r}"


def apply_parser_overrides(
    tokenizer: Any, tool_parser: str = "", reasoning_parser: str = ""
) -> Any:
    """An mlx-lm `TokenizerWrapper` like ``tokenizer`` with LocalAI's parser hints applied.

    tool_parser / reasoning_parser: vLLM names ("" leaves that part as mlx-lm inferred it).
    The new wrapper (built by `seam.tokenizer.rebuild`, through the wrapper's constructor)
    has the hinted tool_parser, tool_call_start/end (and their token ids), think_start/end
    (and token ids), and for Harmony (openai / openai_gptoss) the response format
    (response_transitions); ``tokenizer`` itself is not changed, and is returned as it is
    when nothing applies. A name with no MLX equivalent, or unknown, logs a warning and
    leaves that part as mlx-lm inferred it; this never raises for a name.
    """
    tool = think = None
    formats = []
    if tool_parser:
        tool = resolve_tool_parser(tool_parser)
        if tool is None:
            _fallback("tool_parser", tool_parser, TOOL_PARSERS, _detected_tool(tokenizer))
        formats.append(RESPONSE_FORMATS.get(_normal(tool_parser)))
    fmt = reasoning_formats.resolve(reasoning_parser) if reasoning_parser else None
    if reasoning_parser:
        think = (fmt.start, fmt.end) if fmt is not None and fmt.start and fmt.end else None
        if fmt is None:
            table = {**reasoning_formats.FORMATS, **dict.fromkeys(reasoning_formats.NO_FORMAT)}
            _fallback("reasoning_parser", reasoning_parser, table, _detected_think(tokenizer))
        formats.append(fmt.channels if fmt is not None else None)
    channels = next((f for f in formats if f is not None), None)
    if channels is not None and not seam_tokenizer.takes_response_format():
        logger.warning(
            "this mlx-lm's tokenizer has no response formats: the %s channels are not "
            "routed (content only)",
            tool_parser if RESPONSE_FORMATS.get(_normal(tool_parser)) else reasoning_parser,
        )
        channels = None
    if tool is None and fmt is None and channels is None:
        return tokenizer
    new = seam_tokenizer.rebuild(tokenizer, tool=tool, think=think, response_format=channels)
    if fmt is not None:  # read by decoding.output (reasoning_formats.format_of)
        new._reasoning_format = fmt
    return new
