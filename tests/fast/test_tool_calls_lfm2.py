"""LFM2 / LFM2.5 tool calls, `<|tool_call_start|>[f(a=1)]<|tool_call_end|>`, under the names
that meet them: `lfm2` (vLLM's vllm/tool_parsers/lfm2_tool_parser.py) and `pythonic` (vLLM
skips the two special tokens when decoding, so its pythonic parser sees LFM2's bare list;
mlx-lm infers its pythonic parser, which reads this block, for LFM2). Read and streamed
through the output pipeline, and held to the declared tools by the tool-call grammar, on a
tokenizer where the markers are special tokens, as in LFM2's."""

from __future__ import annotations

import json

import pytest
from helpers import feed_output, grammar_accepts
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
from toy_tokenizer import build_hf

from decoding import tool_grammar
from decoding.output import OutputPipeline
from decoding.parsers import apply_parser_overrides

START, END = "<|tool_call_start|>", "<|tool_call_end|>"


def _wrap(calls: str, after: str = "") -> str:
    return f"{START}[{calls}]{END}" + (f"\n{after}" if after else "")


SIMPLE = ("get_candidate_status(candidate_id='12345')", "get_candidate_status",
          {"candidate_id": "12345"})  # fmt: skip
MORE_TYPES = (
    "register_user(name='John Doe', age=37, address={'city': 'San Francisco', 'state': 'CA'}, "
    "role=None, passed_test=True, aliases=['John', 'Johnny'])",
    "register_user",
    {"name": "John Doe", "age": 37, "address": {"city": "San Francisco", "state": "CA"},
     "role": None, "passed_test": True, "aliases": ["John", "Johnny"]},
)  # fmt: skip
DOTTED = (
    "grocery.orderIngredients(ingredientList=[{'name': 'Lasagna noodles', 'amount': 250, "
    "'unit': 'g'}], deliveryAddress='845 Willow Lane, Springfield, IL 62704')",
    "grocery.orderIngredients",
    {"ingredientList": [{"name": "Lasagna noodles", "amount": 250, "unit": "g"}],
     "deliveryAddress": "845 Willow Lane, Springfield, IL 62704"},
)  # fmt: skip
BRACKET = ("exec(command='grep -F \"]\" log.txt')", "exec", {"command": 'grep -F "]" log.txt'})
ESCAPED = (
    r"get_weather(city='Martha\'s Vineyard', metric='\"cool units\"')",
    "get_weather",
    {"city": "Martha's Vineyard", "metric": '"cool units"'},
)
# vLLM's tests/tool_parsers/test_lfm2_tool_parser.py, test_tool_call's cases by id (and
# test_no_tool_call, test_empty_tool_call_block): (output, calls, content).
CASES = {
    "no_tool_call": ("How can I help you today?", [], "How can I help you today?"),
    "simple": (_wrap(SIMPLE[0]), [SIMPLE[1:]], ""),
    "more_types": (_wrap(MORE_TYPES[0]), [MORE_TYPES[1:]], ""),
    "parameterless": (_wrap("get_weather()"), [("get_weather", {})], ""),
    "empty_dict": (_wrap("do_something_cool(additional_data={})"),
                   [("do_something_cool", {"additional_data": {}})], ""),
    "empty_list": (_wrap("do_something_cool(steps=[])"),
                   [("do_something_cool", {"steps": []})], ""),
    "escaped_string": (_wrap(ESCAPED[0]), [ESCAPED[1:]], ""),
    "parallel_calls": (_wrap(f"{SIMPLE[0]}, {MORE_TYPES[0]}"), [SIMPLE[1:], MORE_TYPES[1:]], ""),
    "content_after_tool_call": (
        _wrap(SIMPLE[0], "Checking the current status of candidate ID 12345."),
        [SIMPLE[1:]],
        # A difference: vLLM strips the content after the block too (`content_after.strip()`
        # in lfm2_tool_parser.py); the pipeline's trim (decoding/output.py) keeps whitespace
        # after a block, so the newline stays.
        "\nChecking the current status of candidate ID 12345.",
    ),
    "dotted_name": (_wrap(DOTTED[0]), [DOTTED[1:]], ""),
    "bracket_in_string": (_wrap(BRACKET[0]), [BRACKET[1:]], ""),
    "empty_tool_call_block": (f"{START}[]{END}", [], f"{START}[]{END}"),
}  # fmt: skip
# vLLM's lfm2 parser repairs text that is no Python (a raw newline or NUL in a string,
# `month=07`, unescaped nested quotes, a set): not done here, those blocks come back as
# content (the test_tool_call ids multiline_string_arg, nul_byte_string_arg,
# leading_zero_int, nested_quote, nested_python_c, set_arg are not carried over).


@pytest.fixture(scope="module")
def hf():
    """Byte-level BPE with LFM2's two markers as special tokens (LFM2's tokenizer has them
    so) and each case's output as one token."""
    extra = [f'{START}[get_weather(city="LA")]{END}', "[get_weather()]"]
    tok = build_hf([c[0] for c in CASES.values()] + extra, markers=False)
    tok.add_special_tokens({"additional_special_tokens": [START, END]})
    return tok


def run(hf, name: str, output: str, whole: bool) -> tuple[list, str]:
    tok = apply_parser_overrides(TokenizerWrapper(hf, BPEStreamingDetokenizer), name)
    pipe = OutputPipeline(tok, tools=[{"type": "function", "function": {"name": "x"}}])
    pieces = feed_output(hf, pipe, output, whole)
    assert not any(p.dropped for p in pieces)  # nothing streamed and then withdrawn
    return [(c.name, json.loads(c.arguments)) for c in pipe.tool_calls], pipe.content


@pytest.mark.parametrize("whole", [True, False], ids=["one_piece", "byte_by_byte"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_lfm2_reads_what_vllms_lfm2_parser_reads(hf, case, whole):
    output, calls, content = CASES[case]
    assert run(hf, "lfm2", output, whole) == (calls, content)


@pytest.mark.parametrize("whole", [True, False], ids=["one_piece", "byte_by_byte"])
def test_pythonic_reads_lfm2s_block(hf, whole):
    # The failing input: `pythonic` set on an LFM2 model left this call as content.
    assert run(hf, "pythonic", f'{START}[get_weather(city="LA")]{END}', whole) == (
        [("get_weather", {"city": "LA"})],
        "",
    )
    output, calls, _ = CASES["parallel_calls"]
    assert run(hf, "pythonic", output, whole) == (calls, "")
    # the bare list vLLM's pythonic reads stays read
    assert run(hf, "pythonic", "[get_weather()]", whole) == ([("get_weather", {})], "")


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = {"get_weather": WEATHER}


def _takes(hf, source: str, text: str, ends: bool = True) -> bool:
    return grammar_accepts(TokenizerWrapper(hf, BPEStreamingDetokenizer), source, text, ends=ends)


@pytest.mark.parametrize("name", ["lfm2", "pythonic"])
def test_the_grammar_holds_lfm2s_block_to_the_declared_tools(hf, name):
    tok = apply_parser_overrides(TokenizerWrapper(hf, BPEStreamingDetokenizer), name)
    fmt = tool_grammar.tool_format(tok)
    assert fmt is not None and (fmt.start, fmt.leading) == (START, False)
    finder = tool_grammar._special_finder(tok)
    start_id = hf.convert_tokens_to_ids(START)
    assert finder(START) == start_id  # the marker is matched as LFM2's special token
    call = f'{START}[get_weather(city="LA")]{END}'
    assert hf.encode(call, add_special_tokens=False)[0] == start_id
    for opening in ("triggered", "required"):
        source = tool_grammar.build_grammar(TOOLS, fmt, opening=opening, special=finder)
        assert _takes(hf, source, call)
        assert not _takes(hf, source, f"{START}[rm_rf(", ends=False)
        assert not _takes(hf, source, f'{START}[get_weather(country="LA"', ends=False)
    lazy = tool_grammar.build_grammar(TOOLS, fmt, opening="lazy", special=finder)
    assert _takes(hf, lazy, f"Let me check.\n{call}")
    assert not _takes(hf, lazy, f"Let me check.\n{START}[rm_rf(", ends=False)


def test_pythonic_keeps_the_bare_list_where_lfm2s_markers_are_no_tokens(tok):
    # the toy vocabulary (tests/toy_tokenizer.py) has no <|tool_call_start|> token: the
    # grammar is vLLM's bare list at the output's start
    fmt = tool_grammar.tool_format(apply_parser_overrides(tok, "pythonic"))
    assert fmt is not None and (fmt.start, fmt.leading) == ("[", True)
