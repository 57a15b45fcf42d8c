"""pythonic, llama4_pythonic and lfm2: a Python list of keyword calls, `[f(a=1), g(b='x')]`.
llama4_pythonic also reads the JSON call the Llama 4 chat template asks for; lfm2 (LFM2 /
LFM2.5) wraps the list in `<|tool_call_start|>` ... `<|tool_call_end|>`.

vLLM (vllm/tool_parsers/pythonic_tool_parser.py, llama4_pythonic_tool_parser.py) reads the
list only where the output starts with it (Llama 4 may wrap it in `<|python_start|>` ...
`<|python_end|>`); arguments are Python literals (None, True, nested dicts and lists).

Ours, not mlx-lm's mlx_lm/tool_parsers/pythonic.py: that one reads the list between
`<|tool_call_start|>` markers (LFM2's), drops every call of a list when one call is not
convertible, and falls back to a regex that turns a broken list into a wrong call; vLLM's
tests (tests/tool_parsers/test_pythonic_tool_parser.py, bad sibling / unparsable sibling /
non-finite argument) keep the good calls and leave out only the bad one.

LFM2: vLLM's lfm2_tool_parser.py reads the list between those two markers, anywhere in the
output, and strips the content around it (tests/tool_parsers/test_lfm2_tool_parser.py).
`pythonic` reads that block too: in vLLM the markers are special tokens that decoding skips
(skip_special_tokens, the default), so vLLM's pythonic parser sees LFM2's bare list; mlx-lm
infers its pythonic parser, which reads exactly this block, for LFM2 (`_infer_tool_parser`
in mlx_lm/tokenizer_utils.py); LocalAI's importer writes no tool_parser for LFM2
(core/config/parser_defaults.json has no lfm2 family), so both names may meet it.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from decoding import call_formats
from decoding.tool_formats import Block, ToolFormat, register

_JSON_NAMES = {"true": True, "false": False, "null": None}


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        parent = _name(func.value)
        return f"{parent}.{func.attr}" if parent else None
    return None


def _value(node: ast.expr) -> Any:
    """A literal argument; JSON's true / false / null are read too (OLMo, chat templates)."""
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("** in a dict argument")
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]
    if isinstance(node, ast.List | ast.Tuple):
        return [_value(e) for e in node.elts]
    return ast.literal_eval(node)


def _call(node: ast.expr) -> dict[str, Any]:
    """{"name", "arguments"} of one call node; ValueError where it is no JSON-able call."""
    if not isinstance(node, ast.Call) or node.args:
        raise ValueError("not a call with keyword arguments only")
    name = _name(node.func)
    if name is None or any(k.arg is None for k in node.keywords):
        raise ValueError("no function name, or **kwargs")
    args = {k.arg: _value(k.value) for k in node.keywords}
    json.dumps(args, allow_nan=False)  # bytes, sets, 1e999: no JSON (raises)
    return {"name": name, "arguments": args}


def _split_top_level(inner: str) -> list[str]:
    """The comma-separated items of a list's inside, honouring brackets and quotes."""
    items, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(inner):
        c = inner[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            items.append(inner[start:i])
            start = i + 1
        i += 1
    items.append(inner[start:])
    return [s.strip() for s in items if s.strip()]


def parse(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """The calls of a pythonic list (``text``: the list). A call that is not convertible is
    left out while another is (vLLM's bad-sibling rule); no call at all raises ValueError."""
    body = text.strip()
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError:
        tree = None
    if tree is not None:
        if not isinstance(tree, ast.List) or not tree.elts:
            raise ValueError("not a list of calls")
        nodes: list[ast.expr | None] = list(tree.elts)
    else:  # one broken call makes the whole list a SyntaxError: read the calls one by one
        if not body.endswith("]"):
            raise ValueError("the call list is not closed")
        nodes = []
        for item in _split_top_level(body[1:-1]):
            try:
                nodes.append(ast.parse(item, mode="eval").body)
            except SyntaxError:
                nodes.append(None)
    calls, error = [], "no call"
    for node in nodes:
        try:
            if node is None:
                raise ValueError("a call that is no Python")
            calls.append(_call(node))
        except (ValueError, TypeError, SyntaxError) as exc:
            error = str(exc)
    if not calls:
        raise ValueError(f"no call in the list: {error}")
    return calls


def parse_llama4(text: str, tools: Any = None) -> Any:
    """llama4_pythonic: the pythonic list vLLM reads, or the `{"name": ..., "parameters": ...}`
    JSON the Llama 4 chat template asks for (as Llama 3.x's does; read as llama3_json)."""
    body = text.strip()
    if body.startswith("{"):
        from decoding.tool_formats.llama_json import LLAMA_JSON_START, _llama_json_parser

        return _llama_json_parser(body[len(LLAMA_JSON_START) :], tools)
    return parse(text, tools)


_GRAMMAR = call_formats.GRAMMARS["pythonic"]
LFM2_MARKERS = ("<|tool_call_start|>", "<|tool_call_end|>")
# vLLM drops a call that is not convertible while keeping its siblings: known only once
# the list closes.
_WHOLE = "Python literals: the list is read when it closes"
PYTHONIC = register(
    ToolFormat(
        "pythonic",
        parse,
        "[",
        at_content_start=True,
        keep=True,
        more=(Block(*LFM2_MARKERS),),
        grammar=_GRAMMAR,
        whole=_WHOLE,
    )
)
LLAMA4_PYTHONIC = register(
    ToolFormat(
        "llama4_pythonic",
        parse_llama4,
        "<|python_start|>",
        "<|python_end|>",
        more=(
            Block("[", "<|python_end|>", at_content_start=True, keep=True),
            Block('{"name"', keep=True),
        ),
        grammar=_GRAMMAR,
        whole=_WHOLE,
    )
)
LFM2 = register(
    ToolFormat("lfm2", parse, *LFM2_MARKERS, trim_content=True, grammar=_GRAMMAR, whole=_WHOLE)
)
