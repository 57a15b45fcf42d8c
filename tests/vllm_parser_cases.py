"""vLLM's own tool- and reasoning-parser test cases, per parser name LocalAI writes, with what
vLLM's parser of that name extracts; each case names the vLLM test file it comes from
(github.com/vllm-project/vllm) and, for the files in `IDS`, the test ids it stands for.

The names. LocalAI (github.com/mudler/LocalAI @82c191afad) writes `tool_parser:` /
`reasoning_parser:` options from core/config/parser_defaults.json, in
core/gallery/importers/mlx.go and vllm.go (the gallery index, gallery/index.yaml, writes
gemma4 only): tool parsers hermes, qwen3_xml, llama3_json, llama4_pythonic, mistral,
deepseek_v3, glm45, glm47, gemma4, granite4, minimax_m2, kimi_k2, olmo3, ernie45,
phi4_mini_json, openai; reasoning parsers qwen3, deepseek_r1, mistral, deepseek_v3, glm45,
gemma4, granite, minimax_m2, kimi_k2, nemotron_v3, olmo3, ernie45, openai_gptoss. Beside
them, from vLLM's registries (vllm/tool_parsers/__init__.py and vllm/reasoning/__init__.py
@0064cc9cb1): pythonic, xlam, seed_oss, deepseek_v31, deepseek_v32, hunyuan_a13b,
functiongemma, qwen3_coder, granite, jamba, internlm (InternLM2), longcat, step3p5, mimo
(qwen3_coder's class: no file of its own), deepseek_v4, poolside_v1, granite-20b-fc, step3,
apertus (appended at the end); the reasoning names in tests/vllm_reasoning_cases.py.

Wholesale: every test id of each file in `IDS` (its commit in the source constant) is a case,
a known difference or `NOT_APPLICABLE` with the reason
(tests/fast/test_parser_references.py: test_every_vllm_test_id_is_a_case). `IDS` holds every
tests/tool_parsers/ file of the names above (test_gemma4_utils.py tests vLLM's offline
helper, no parser name); the reasoning files are in tests/vllm_reasoning_cases.py's `IDS`.
KNOWN_DIFFERENCES: cases where this backend differs for a reason, with ours and the reason.
Used by tests/fast/test_parser_references.py (the output pipeline) and
tests/fast/test_parser_references_grpc.py (Predict and PredictStream over real gRPC).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import regex

HERMES = "tests/tool_parsers/test_hermes_tool_parser.py@0eb73d6a09"
OPENAI = "tests/tool_parsers/test_openai_tool_parser.py@15c99cb111"
LLAMA3 = "tests/tool_parsers/test_llama3_json_tool_parser.py@1e499e36c5"
R1 = "tests/reasoning/test_deepseekr1_reasoning_parser.py"
QWEN3 = "tests/reasoning/test_qwen3_reasoning_parser.py"


@dataclass(frozen=True)
class Case:
    """One vLLM reference case. calls: (name, arguments decoded) in order; content /
    reasoning: vLLM's (None there is "" here). initial: the pipeline's initial state
    ("reasoning" where vLLM's parser assumes the prompt opened the think block)."""

    id: str
    source: str
    tool: str
    reasoning_parser: str
    output: str
    calls: tuple = ()
    content: str = ""
    reasoning: str = ""
    initial: str = "normal"
    why: str = field(default="", compare=False)  # known differences: the reason
    tools: tuple = ()  # the request's tool definitions (OpenAI's shape), where vLLM's has some
    # the vLLM test ids the case stands for (files in IDS): vLLM runs most outputs more than
    # once (streaming and not, several stream intervals); one case here stands for each
    ids: tuple = field(default=(), compare=False)

    @property
    def vllm_ids(self) -> tuple[str, ...]:
        """The vLLM test ids the case stands for: `ids`, else its own id."""
        return self.ids or (self.id,)


def pid(value: str) -> str:
    """A string parameter as pytest writes it in a test id (non-ASCII escaped)."""
    return value.encode("unicode_escape").decode("ascii")


def hermes(id, output, calls=(), content="", tool="hermes", ids=(), **kw):
    return Case(id, HERMES, tool, "", output, tuple(calls), content, ids=tuple(ids), **kw)


def every(test: str, *params) -> tuple[str, ...]:
    """vLLM's ids of ``test`` run with each of ``params``."""
    return tuple(f"{test}[{p}]" for p in params)


TRIGGER = ("final_answer", {"trigger": True})
SERIALIZED = '{"param": "max_connections"}'
TRIGGER_TEXT = '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}\n</tool_call>'
# test_hermes_parser_* run with each of CONFIGS' parsers: hermes ([llama]) and granite4
# ([granite4], GRANITE4_CASES below); test_hermes_streaming_* with hermes only.
HERMES_CASES = [
    hermes(
        "just_forward_text",
        "This is some prior text that has nothing to do with tool calling.",
        content="This is some prior text that has nothing to do with tool calling.",
        ids=every("test_hermes_parser_streaming_just_forward_text", "llama"),
    ),
    hermes(
        "just_forward_text_with_stream_interval",
        "This is plain text with no tool calling involved.",
        content="This is plain text with no tool calling involved.",
        ids=every("test_hermes_streaming_just_forward_text_with_stream_interval", 2, 3, 5),
    ),
    hermes(
        "no_tool_call",
        "This is not a tool call.",
        content="This is not a tool call.",
        ids=every("test_hermes_parser_non_streaming_no_tool_call", "llama"),
    ),
    hermes(
        "between_tags",
        TRIGGER_TEXT,
        [TRIGGER],
        ids=every("test_hermes_parser_non_streaming_tool_call_between_tags", "llama")
        + every("test_hermes_parser_streaming_failure_case_bug_19056", "llama")
        + every("test_hermes_streaming_boolean_args_with_stream_interval", 2, 5),
    ),
    hermes(
        "until_eos",
        '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}',
        [TRIGGER],
        ids=every("test_hermes_parser_non_streaming_tool_call_until_eos", "llama"),
    ),
    hermes(
        "streaming",
        '<tool_call>\n{"name": "get_current_temperature",\n"arguments": {"location":\n'
        '"San Francisco, California, United States", "unit": "celsius"}}\n</tool_call>',
        [
            (
                "get_current_temperature",
                {"location": "San Francisco, California, United States", "unit": "celsius"},
            )
        ],
        ids=every("test_hermes_parser_streaming", "llama"),
    ),
    hermes(
        "tool_call_with_stream_interval",
        '<tool_call>{"name": "get_current_temperature", "arguments": {"location": '
        '"San Francisco", "unit": "celsius"}}</tool_call>',
        [("get_current_temperature", {"location": "San Francisco", "unit": "celsius"})],
        ids=every("test_hermes_streaming_tool_call_with_stream_interval", 2, 3, 5, 8),
    ),
    hermes(
        "content_then_tool_call",
        'Sure, let me check the weather.<tool_call>{"name": "get_weather", '
        '"arguments": {"city": "NYC"}}</tool_call>',
        [("get_weather", {"city": "NYC"})],
        content="Sure, let me check the weather.",
        ids=every("test_hermes_streaming_content_then_tool_call_with_stream_interval", 2, 3, 5, 8),
    ),
    hermes(
        "multiple_tool_calls",
        '<tool_call>{"name": "search", "arguments": {"q": "cats"}}</tool_call>'
        '<tool_call>{"name": "search", "arguments": {"q": "dogs"}}</tool_call>',
        [("search", {"q": "cats"}), ("search", {"q": "dogs"})],
        ids=every("test_hermes_streaming_multiple_tool_calls_with_stream_interval", 1, 2, 4),
    ),
    hermes(
        "serialized_arguments",
        '<tool_call>\n{"name": "get_db_config", '
        '"arguments": "{\\"param\\": \\"max_connections\\"}"}\n</tool_call>',
        [("get_db_config", {"param": "max_connections"})],
        ids=every("test_hermes_parser_non_streaming_serialized_arguments", "llama"),
    ),
    hermes(
        "streaming_serialized_arguments",
        '<tool_call>{"name": "get_db_config", '
        '"arguments": "{\\"param\\": \\"max_connections\\"}"}</tool_call>',
        [("get_db_config", {"param": "max_connections"})],
        ids=every("test_hermes_streaming_serialized_arguments_with_stream_interval", 1, 2, 3, 5),
    ),
    hermes(
        "string_arguments_match_non_streaming",
        "<tool_call>" + json.dumps({"name": "f", "arguments": SERIALIZED}) + "</tool_call>",
        [("f", {"param": "max_connections"})],
        ids=every(
            "test_hermes_streaming_string_arguments_match_non_streaming",
            *[f"{i}-{pid(SERIALIZED)}" for i in (1, 3)],
        ),
    ),
    hermes(
        "content_and_tool_call_in_single_chunk",
        'Hi!<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>',
        [("f", {"x": 1})],
        content="Hi!",
        ids=("test_hermes_streaming_content_and_tool_call_in_single_chunk",),
    ),
]
# vLLM runs its test_hermes_parser_* tests through its granite4 parser too (CONFIGS), except
# until_eos ("The Granite4 tool parser enforces a complete response").
GRANITE4_CASES = [
    Case(
        **{
            **c.__dict__,
            "id": "granite4_" + c.id,
            "tool": "granite4",
            "ids": tuple(i.replace("[llama]", "[granite4]") for i in c.ids if "[llama]" in i),
        }
    )
    for c in HERMES_CASES
    if any("[llama]" in i for i in c.ids) and c.id != "until_eos"
]


def harmony_call(name: str, args: str, json_type: bool = True) -> str:
    """One gpt-oss call message as the model writes it (after `<|start|>assistant`)."""
    ctype = " <|constrain|>json" if json_type else ""
    head = f"<|start|>assistant to=functions.{name}<|channel|>commentary{ctype}"
    return f"{head}<|message|>{args}<|call|>"


ANALYSIS = 'User asks: "What is the weather in Tokyo?" We need to use get_current_weather tool.'
ANALYSIS_2 = (
    'User asks: "What is the weather in Tokyo?" based on their location. We need to use '
    "get_current_weather tool and get_user_location tool."
)
TOKYO = '{"location": "Tokyo"}'


def openai(id, output, calls=(), content="", reasoning="", ids=None):
    ids = (id,) if ids is None else ids
    return Case(
        id, OPENAI, "openai", "openai_gptoss", output, tuple(calls), content, reasoning, ids=ids
    )


def analysis(text: str) -> str:  # the first message: the prompt ends in <|start|>assistant
    return f"<|channel|>analysis<|message|>{text}<|end|>"


OPENAI_CASES = [
    openai(
        "test_extract_tool_calls_no_tools",
        "<|channel|>final<|message|>This is a test<|end|>",
        content="This is a test",
    ),
    *[
        openai(
            f"test_extract_tool_calls_single_tool[{pid(args)}]",
            analysis(ANALYSIS) + harmony_call("get_current_weather", args),
            [("get_current_weather", {"location": "Tokyo"})],
            reasoning=ANALYSIS,
        )
        for i, args in enumerate([TOKYO, '{\n"location": "Tokyo"\n}'])
    ],
    openai(
        "multiple_tools_json",  # test_extract_tool_calls_multiple_tools, its JSON calls
        analysis(ANALYSIS_2)
        + harmony_call("get_current_weather", TOKYO)
        + harmony_call("get_user_location", TOKYO)
        + harmony_call("no_content_type", TOKYO, json_type=False)
        + harmony_call("empty_args", "{}"),
        [
            ("get_current_weather", {"location": "Tokyo"}),
            ("get_user_location", {"location": "Tokyo"}),
            ("no_content_type", {"location": "Tokyo"}),
            ("empty_args", {}),
        ],
        reasoning=ANALYSIS_2,
        ids=("test_extract_tool_calls_multiple_tools",),
    ),
    openai(
        "test_extract_tool_calls_with_content",
        analysis(ANALYSIS_2)
        + harmony_call("get_current_weather", TOKYO)
        + "<|start|>assistant<|channel|>final<|message|>This tool call will get the weather."
        + "<|end|>",
        [("get_current_weather", {"location": "Tokyo"})],
        content="This tool call will get the weather.",
        reasoning=ANALYSIS_2,
    ),
]


def llama(id, output, calls=(), content="", ids=None):
    ids = (f"test_extract_tool_calls_{id}",) if ids is None else ids
    return Case(id, LLAMA3, "llama3_json", "", output, tuple(calls), content, ids=ids)


S1 = '{"name": "searchTool", "parameters": {"query": "test1"}}'
INC = '{"name": "getOpenIncidentsTool", "parameters": {}}'
S2 = '{"name": "searchTool", "parameters": {"query": "test2"}}'
THREE = [
    ("searchTool", {"query": "test1"}),
    ("getOpenIncidentsTool", {}),
    ("searchTool", {"query": "test2"}),
]
LLAMA3_CASES = [
    llama(
        "with_arguments",
        '{"name": "searchTool", "parameters": {"query": "test query", "limit": 10}}',
        [("searchTool", {"query": "test query", "limit": 10})],
    ),
    llama(
        "no_json",
        "This is just some text without any tool calls",
        content="This is just some text without any tool calls",
    ),
    llama(
        "invalid_json",
        '{"name": "invalidTool", "parameters": {invalid json}',
        content='{"name": "invalidTool", "parameters": {invalid json}',
    ),
    llama(
        "with_arguments_key",
        '{"name": "searchTool", "arguments": {"query": "test"}}',
        [("searchTool", {"query": "test"})],
    ),
    llama("multiple_json", f"{S1}; {INC}; {S2}", THREE),
    llama("multiple_json_with_whitespace", f"{S1} ; {INC} ; {S2}", THREE),
    llama(
        "deeply_nested_json",
        '{"name": "complexTool", "parameters": {"level1": {"level2": {"level3": '
        '{"level4": {"value": "deep"}}}}}}',
        [("complexTool", {"level1": {"level2": {"level3": {"level4": {"value": "deep"}}}}})],
    ),
    llama(
        "multiple_with_deep_nesting",
        '{"name": "simpleTool", "parameters": {"value": "test"}}; {"name": "complexTool", '
        '"parameters": {"config": {"database": {"connection": {"pool": {"size": 10}}}}}}',
        [
            ("simpleTool", {"value": "test"}),
            ("complexTool", {"config": {"database": {"connection": {"pool": {"size": 10}}}}}),
        ],
    ),
    llama(
        "with_quotes_and_brackets_in_string",
        '{"name": "searchTool", "parameters": {"query": "test {value} [complex]",'
        '"nested": {"inner": "more {brackets}"}}}',
        [
            (
                "searchTool",
                {"query": "test {value} [complex]", "nested": {"inner": "more {brackets}"}},
            )
        ],
    ),
    llama(
        "with_escaped_quotes_in_nested_json",
        '{"name": "parserTool", "parameters": {"text": "He said \\"Hello {world}\\""}}',
        [("parserTool", {"text": 'He said "Hello {world}"'})],
    ),
    llama("missing_name_key", '{"parameters": {}}', content='{"parameters": {}}'),
    llama(
        "missing_parameters_and_arguments_key",
        '{"name": "toolWithoutParams"}',
        content='{"name": "toolWithoutParams"}',
    ),
    llama(
        "brace_in_trailing_text",
        '{"name": "searchTool", "parameters": {"query": "test"}} I used {searchTool} for this.',
        [("searchTool", {"query": "test"})],
    ),
    llama(
        "json_fragment_in_trailing_text",
        '{"name": "searchTool", "parameters": {"query": "test"}} '
        'The arguments I passed were {"query": "test"}',
        [("searchTool", {"query": "test"})],
    ),
    *[
        llama(
            f"streaming_parallel_separators_{i}",
            S1 + sep + INC,
            THREE[:2],
            ids=(f"test_extract_tool_calls_streaming_parallel_separators[{pid(sep)}]",),
        )
        for i, sep in enumerate(["; ", ";", ";\n", "\n"])
    ],
    # vLLM's mocks its regex to time out: the output comes back as content
    llama(
        "regex_timeout_handling",
        "{hello world[A(A=" + "\t)A(A=,\t" * 2,
        content="{hello world[A(A=" + "\t)A(A=,\t" * 2,
        ids=("test_regex_timeout_handling",),
    ),
]


def r1(id, output, reasoning="", content=""):
    # vLLM's deepseek_r1 parser reads the output as inside the think block (R1's template
    # opens it): here the prompt opened it, so the pipeline starts in reasoning.
    return Case(id, R1, "", "deepseek_r1", output, (), content, reasoning, "reasoning")


REASONING_SECTION = "This is a reasoning section"
R1_CASES = [
    r1(
        "simple_reasoning",
        f"{REASONING_SECTION}</think>This is the rest",
        REASONING_SECTION,
        "This is the rest",
    ),
    r1("complete_reasoning", f"{REASONING_SECTION}</think>", REASONING_SECTION),
    r1("no_content_token", "This is content", "This is content"),
    r1(
        "multiple_lines",
        "This\nThat</think>This is the rest\nThat",
        "This\nThat",
        "This is the rest\nThat",
    ),
    r1("shortest", "</think>This is the rest", "", "This is the rest"),
    r1(
        "reasoning_with_think",
        f"<think>{REASONING_SECTION}</think>This is the rest",
        REASONING_SECTION,
        "This is the rest",
    ),
    r1("complete_reasoning_with_think", f"<think>{REASONING_SECTION}</think>", REASONING_SECTION),
    r1(
        "multiple_lines_with_think",
        "<think>This\nThat</think>This is the rest\nThat",
        "This\nThat",
        "This is the rest\nThat",
    ),
    r1("think_no_end", f"<think>{REASONING_SECTION}", REASONING_SECTION),
    r1("empty", ""),
    r1(  # vLLM's streaming result (NEW_LINE_STREAMING); its non-streaming one differs
        "new_line_streaming",
        f"\n<think>{REASONING_SECTION}</think>\nThis is the rest",
        "\n" + REASONING_SECTION,
        "\nThis is the rest",
    ),
]


MISTRAL_R = "tests/reasoning/test_mistral_reasoning_parser.py"


def with_markers(case: Case, source: str, name: str, start: str, end: str) -> Case:
    """An R1 case with another parser's think markers (vLLM's mistral reasoning test has
    R1's cases with [THINK] / [/THINK])."""
    swap = {"<think>": start, "</think>": end}
    output = regex.sub("</?think>", lambda m: swap[m.group(0)], case.output)
    return Case(**{**case.__dict__, "source": source, "reasoning_parser": name, "output": output})


MISTRAL_REASONING_CASES = [
    with_markers(c, MISTRAL_R, "mistral", "[THINK]", "[/THINK]") for c in R1_CASES
]


GRANITE_R = "tests/reasoning/test_granite_reasoning_parser.py"
G_START, G_END = "Here is my thought process:", "Here is my response:"


def granite_r(id, output, reasoning="", content=""):
    return Case(id, GRANITE_R, "", "granite", output, (), content, reasoning)


GRANITE_REASONING_CASES = [
    granite_r(
        "simple_reasoning",
        f"{G_START}{REASONING_SECTION}{G_END}This is the rest",
        REASONING_SECTION,
        "This is the rest",
    ),
    granite_r("complete_reasoning", f"{G_START}{REASONING_SECTION}{G_END}", REASONING_SECTION),
    granite_r("no_reasoning", "This is content", content="This is content"),
    granite_r(
        "multiple_lines",
        f"{G_START}This\nThat{G_END}This is the rest\nThat",
        "This\nThat",
        "This is the rest\nThat",
    ),
    # Streaming sub-case 9 ("Delta contains everything"): spaces around the markers stay.
    granite_r(
        "delta_contains_everything",
        f"{G_START} foo {G_END} bar",
        " foo ",
        " bar",
    ),
]

QWEN3_TOOL_BODY = (
    "<tool_call>\n<function=bash>\n<parameter=command>"
    "\ncat /etc/hosts\n</parameter>\n</function>\n</tool_call>"
)
BASH = ("bash", {"command": "cat /etc/hosts"})


def qwen3(id, output, reasoning="", content="", calls=(), initial="reasoning"):
    # vLLM's qwen3 parser: "<think> in prompt, only </think> in output (typical)"; the tool
    # body cases run with the tool parser Qwen3.5 / Qwen3-Coder models get (qwen3_coder),
    # which reads what vLLM's reasoning parser hands on as content.
    return Case(
        id, QWEN3, "qwen3_coder", "qwen3", output, tuple(calls), content, reasoning, initial
    )


QWEN3_CASES = [
    qwen3(
        "without_start_token",
        f"{REASONING_SECTION}</think>This is the rest",
        REASONING_SECTION,
        "This is the rest",
    ),
    qwen3(
        "without_start_token_complete_reasoning", f"{REASONING_SECTION}</think>", REASONING_SECTION
    ),
    qwen3(
        "with_think",
        f"<think>{REASONING_SECTION}</think>This is the rest",
        REASONING_SECTION,
        "This is the rest",
    ),
    qwen3("without_think", "This is the rest", "This is the rest"),
    qwen3("complete_reasoning", f"<think>{REASONING_SECTION}</think>", REASONING_SECTION),
    qwen3(
        "multiline_reasoning",
        "<think>This is a reasoning\nsection</think>This is the rest\nThat",
        "This is a reasoning\nsection",
        "This is the rest\nThat",
    ),
    qwen3("only_open_tag", f"<think>{REASONING_SECTION}", REASONING_SECTION),
    qwen3("truncated_no_start_token", REASONING_SECTION, REASONING_SECTION),
    qwen3(
        "tool_call_no_think_end",
        "I need to read the file.\n\n" + QWEN3_TOOL_BODY,
        "I need to read the file.\n\n",
        calls=[BASH],
    ),
    qwen3(
        "tool_call_with_think_no_end",
        "<think>I need to read the file.\n\n" + QWEN3_TOOL_BODY,
        "I need to read the file.\n\n",
        calls=[BASH],
    ),
    qwen3(
        "thinking_disabled_plain_content",
        "This is plain content",
        content="This is plain content",
        initial="normal",
    ),
    qwen3(
        "thinking_disabled_with_tool_call",
        "I need to read the file.\n\n" + QWEN3_TOOL_BODY,
        content="I need to read the file.\n\n",
        calls=[BASH],
        initial="normal",
    ),
]


DSV3 = "tests/tool_parsers/test_deepseekv3_tool_parser.py@0f17ee061e"
DSV31 = "tests/tool_parsers/test_deepseekv31_tool_parser.py@100fe7e0c1"
B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, SEP, CE = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"


def v3_call(name: str, args: str) -> str:
    return f"{CB}function{SEP}{name}\n```json\n{args}\n```{CE}"


def dsv3(id, output, calls=(), content="", ids=()):
    return Case(id, DSV3, "deepseek_v3", "", output, tuple(calls), content, ids=tuple(ids))


def dsv31(id, output, calls=(), content="", ids=None):
    ids = (f"test_extract_tool_calls_{id}",) if ids is None else ids
    return Case(id, DSV31, "deepseek_v31", "", output, tuple(calls), content, ids=ids)


def _both(test: str) -> tuple[str, str]:
    return (f"{test}[True]", f"{test}[False]")  # its `streaming` fixture's two runs


# tests/tool_parsers/common_tests.py's ToolParserTests (@1b6b3ec182), which a parser's test
# file runs with its own outputs (its ToolParserTestConfig): the ids each output stands for.
COMMON_IDS = {
    "no_tool_calls": _both("test_no_tool_calls"),
    "single_tool_call": (
        *_both("test_single_tool_call_simple_args"),
        "test_streaming_reconstruction",
        "test_streaming_split_invariance[single]",
    ),
    "parallel_tool_calls": (
        *_both("test_parallel_tool_calls"),
        "test_streaming_split_invariance[parallel]",
    ),
    "various_data_types": _both("test_various_data_types"),
    "empty_arguments": _both("test_empty_arguments"),
    "surrounding_text": _both("test_surrounding_text"),
    "escaped_strings": _both("test_escaped_strings"),
}


def common(make, malformed=(), **tests) -> list[Case]:
    """One case per output of a ToolParserTests config: tests maps COMMON_IDS' names to
    (output, calls, content); malformed: test_malformed_input's outputs (vLLM asserts only
    that they do not raise; here no call is made and each comes back as content). Outputs
    that two tests share (InternLM2's parallel output is its single one) are one case."""
    by_output: dict[str, list] = {}
    for name, (output, calls, content) in tests.items():
        entry = by_output.setdefault(output, [name, output, calls, content, ()])
        entry[4] += COMMON_IDS[name]
    cases = [make(n, o, c, t, ids=i) for n, o, c, t, i in by_output.values()]
    for i, text in enumerate(malformed):
        cases.append(
            make(f"malformed_input_{i}", text, (), text, ids=_both("test_malformed_input"))
        )
    return cases


VARIOUS = (
    '{"string_field": "hello", "int_field": 42, "float_field": 3.14, "bool_field": true, '
    '"null_field": null, "array_field": ["a", "b", "c"], "object_field": {"nested": "value"}, '
    '"empty_array": [], "empty_object": {}}'
)
ESCAPED = (
    '{"text": "He said \\"hello\\"", "path": "C:\\\\Users\\\\file", "newline": "line1\\nline2"}'
)
DEEPSEEK_CASES = [
    *common(
        dsv3,
        no_tool_calls=(
            "How can I help you today? I can check weather for you.",
            (),
            "How can I help you today? I can check weather for you.",
        ),
        single_tool_call=(
            B + v3_call("get_weather", '{"city": "Tokyo", "unit": "celsius"}') + E,
            [("get_weather", {"city": "Tokyo", "unit": "celsius"})],
            "",
        ),
        parallel_tool_calls=(
            B
            + v3_call("get_weather", '{"city": "Tokyo", "unit": "celsius"}')
            + v3_call("search_hotels", '{"location": "Tokyo", "check_in": "2025-01-15"}')
            + E,
            [
                ("get_weather", {"city": "Tokyo", "unit": "celsius"}),
                ("search_hotels", {"location": "Tokyo", "check_in": "2025-01-15"}),
            ],
            "",
        ),
        various_data_types=(
            B + v3_call("test_function", VARIOUS) + E,
            [("test_function", json.loads(VARIOUS))],
            "",
        ),
        empty_arguments=(B + v3_call("get_current_time", "{}") + E, [("get_current_time", {})], ""),
        surrounding_text=(
            "Let me check the weather for you."
            + B
            + v3_call("get_weather", '{"city": "Paris"}')
            + E,
            [("get_weather", {"city": "Paris"})],
            "Let me check the weather for you.",
        ),
        escaped_strings=(
            B + v3_call("send_message", ESCAPED) + E,
            [("send_message", json.loads(ESCAPED))],
            "",
        ),
        malformed=[
            B + v3_call("get_weather", '{"city": "Tokyo"') + E,
            f'{B}function{SEP}get_weather\n```json\n{{"city": "Tokyo"}}\n```{E}',
        ],
    ),
    dsv31(
        "with_tool",
        f'normal text{B}{CB}foo{SEP}{{"x":1}}{CE}{E}',
        [("foo", {"x": 1})],
        content="normal text",
    ),
    *[
        dsv31(
            f"unparsable_block_{i}",
            text,
            content=text,
            ids=(f"test_extract_tool_calls_unparsable_block[{pid(text)}]",),
        )
        for i, text in enumerate(
            [f"Let me look that up.{B}get_weather", f'{B}foo{SEP}{{"x":1}}{E}']
        )
    ],
]


PHI4 = "tests/tool_parsers/test_phi4mini_tool_parser.py@2471a1c143"
JAMBA = "tests/tool_parsers/test_jamba_tool_parser.py@045d757550"
INTERNLM = "tests/tool_parsers/test_internlm2_tool_parser.py@0661799351"
LONGCAT = "tests/tool_parsers/test_longcat_tool_parser.py@41c5903d04"


def phi4(id, output, calls=(), content="", ids=()):
    return Case(id, PHI4, "phi4_mini_json", "", output, tuple(calls), content, ids=tuple(ids))


PHI4_VARIOUS = """functools[{
  "name": "test_function",
  "arguments": {
    "string_field": "hello",
    "int_field": 42,
    "float_field": 3.14,
    "bool_field": true,
    "null_field": null,
    "array_field": ["a", "b", "c"],
    "object_field": {"nested": "value"},
    "empty_array": [],
    "empty_object": {}
  }
}]"""
PHI4_ESCAPED = """functools[{
  "name": "test_function",
  "arguments": {
    "quoted": "He said \\"hello\\"",
    "path": "C:\\\\Users\\\\file.txt",
    "newline": "line1\\nline2",
    "unicode": "emoji: 🎉"
  }
}]"""
VARIOUS_ARGS = json.loads(PHI4_VARIOUS[len("functools") :])[0]["arguments"]
ESCAPED_ARGS = json.loads(PHI4_ESCAPED[len("functools") :])[0]["arguments"]
NO_CALLS = "This is a regular response without any tool calls."
TOKYO_CALL = ("get_weather", {"city": "Tokyo"})
TWO_CALLS = [TOKYO_CALL, ("get_time", {"timezone": "Asia/Tokyo"})]
# phi4's surrounding_text output is a known difference (KNOWN_DIFFERENCES)
PHI4_CASES = common(
    phi4,
    no_tool_calls=(NO_CALLS, (), NO_CALLS),
    single_tool_call=(
        'functools[{"name": "get_weather", "arguments": {"city": "Tokyo"}}]',
        [TOKYO_CALL],
        "",
    ),
    parallel_tool_calls=(
        """functools[
  {"name": "get_weather", "arguments": {"city": "Tokyo"}},
  {"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}
]""",
        TWO_CALLS,
        "",
    ),
    various_data_types=(PHI4_VARIOUS, [("test_function", VARIOUS_ARGS)], ""),
    empty_arguments=('functools[{"name": "refresh", "arguments": {}}]', [("refresh", {})], ""),
    escaped_strings=(PHI4_ESCAPED, [("test_function", ESCAPED_ARGS)], ""),
    malformed=[
        'functools[{"name": "func", "arguments": {',
        'functools[{"name": "func", "arguments": "not a dict"}]',
        'functools{"name": "func"}',
        'functools[{"name": "func"}]',
        "functools[] This is just text",
        "functools[ This is just text ]",
    ],
)


def internlm(id, output, calls=(), content="", ids=(), tools=()):
    return Case(
        id, INTERNLM, "internlm", "", output, tuple(calls), content, tools=tools, ids=tuple(ids)
    )


def action(body: str) -> str:
    return f"<|action_start|><|plugin|>{body}<|action_end|>"


INTERNLM_WEATHER_TOOLS = (  # the file's _GET_WEATHER_TOOL
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
)
INTERNLM_TOKYO = action('{"name": "get_weather", "parameters": {"city": "Tokyo"}}')
INTERNLM_CASES = [
    *common(
        internlm,
        no_tool_calls=(NO_CALLS, (), NO_CALLS),
        single_tool_call=(INTERNLM_TOKYO, [TOKYO_CALL], ""),
        parallel_tool_calls=(INTERNLM_TOKYO, [TOKYO_CALL], ""),  # one call: no parallel calls
        various_data_types=(
            action(PHI4_VARIOUS[len("functools[") : -1].replace('"arguments"', '"parameters"')),
            [("test_function", VARIOUS_ARGS)],
            "",
        ),
        empty_arguments=(
            action('{"name": "refresh", "parameters": {}}'),
            [("refresh", {})],
            "",
        ),
        surrounding_text=(
            "Let me check the weather for you. " + INTERNLM_TOKYO,
            [TOKYO_CALL],
            "Let me check the weather for you. ",
        ),
        escaped_strings=(
            action(PHI4_ESCAPED[len("functools[") : -1].replace('"arguments"', '"parameters"')),
            [("test_function", ESCAPED_ARGS)],
            "",
        ),
        malformed=[
            '<|action_start|><|plugin|>{"name": "func", "parameters": {',
            action('{"name": "func", "parameters": "not a dict"}'),
            action("not json"),
            "<|action_start|><|plugin|>",
            '<|action_start|>{"name": "func"}',
        ],
    ),
    # A name the request's tools do not offer is no call (vLLM asserts only that no call is
    # made; here the block comes back as content as the model wrote it).
    internlm(
        "unknown_tool_name_not_emitted",
        action('{"name": "delete_everything", "parameters": {"city": "Tokyo"}}'),
        content=action('{"name": "delete_everything", "parameters": {"city": "Tokyo"}}'),
        ids=("test_extract_unknown_tool_name_not_emitted",),
        tools=INTERNLM_WEATHER_TOOLS,
    ),
    internlm(
        "known_tool_name_emitted",
        INTERNLM_TOKYO,
        [TOKYO_CALL],
        ids=("test_extract_known_tool_name_emitted",),
        tools=INTERNLM_WEATHER_TOOLS,
    ),
    internlm(
        "without_tools_not_over_rejected",
        INTERNLM_TOKYO,
        [TOKYO_CALL],
        ids=("test_extract_without_tools_not_over_rejected",),
    ),
]


def longcat(id, output, calls=(), content="", ids=()):
    return Case(id, LONGCAT, "longcat", "", output, tuple(calls), content, ids=tuple(ids))


def lc(body: str) -> str:
    return f"<longcat_tool_call>{body}</longcat_tool_call>"


LC_TOKYO = lc('{"name": "get_weather", "arguments": {"city": "Tokyo"}}')
LONGCAT_CASES = common(
    longcat,
    no_tool_calls=(NO_CALLS, (), NO_CALLS),
    single_tool_call=(LC_TOKYO, [TOKYO_CALL], ""),
    parallel_tool_calls=(
        LC_TOKYO + "\n" + lc('{"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}'),
        TWO_CALLS,
        "",
    ),
    various_data_types=(
        lc(PHI4_VARIOUS[len("functools[") : -1]),
        [("test_function", VARIOUS_ARGS)],
        "",
    ),
    empty_arguments=(lc('{"name": "refresh", "arguments": {}}'), [("refresh", {})], ""),
    # vLLM asserts only the call; the text around it stays content here
    surrounding_text=(
        "Let me check the weather for you.\n" + LC_TOKYO + "\nHere is the result.",
        [TOKYO_CALL],
        "Let me check the weather for you.\n\nHere is the result.",
    ),
    escaped_strings=(
        lc(PHI4_ESCAPED[len("functools[") : -1]),
        [("test_function", ESCAPED_ARGS)],
        "",
    ),
    malformed=[
        '<longcat_tool_call>{"name": "func", "arguments": {',
        lc('{"name": "func", "arguments": "not a dict"}'),
        "Some text with <longcat_tool_call>invalid json",
    ],
)

JAMBA_CALL = (
    '<tool_calls>[\n    {"name": "get_current_weather", "arguments": '
    '{"city": "Dallas", "state": "TX", "unit": "fahrenheit"}}\n]</tool_calls>'
)
DALLAS = ("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})
ORLANDO = ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"})


def jamba(id, output, calls=(), content="", ids=()):
    return Case(id, JAMBA, "jamba", "", output, tuple(calls), content, ids=tuple(ids))


JAMBA_PARALLEL = (
    ' <tool_calls>[\n    {"name": "get_current_weather", "arguments": {"city": "Dallas", '
    '"state": "TX", "unit": "fahrenheit"}},\n    {"name": "get_current_weather", '
    '"arguments": {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}}\n]</tool_calls>'
)
# vLLM's streaming result where its two paths differ (the leading space stays content; its
# non-streaming path returns None there: KNOWN_DIFFERENCES)
JAMBA_CASES = [
    jamba(
        "no_tools",
        "This is a test",
        content="This is a test",
        ids=("test_extract_tool_calls_no_tools", "test_extract_tool_calls_streaming[no_tools]"),
    ),
    jamba(
        "single_tool",
        " " + JAMBA_CALL,
        [DALLAS],
        content=" ",
        ids=("test_extract_tool_calls_streaming[single_tool]",),
    ),
    jamba(
        "single_tool_with_content",
        " Sure! let me call the tool for you." + JAMBA_CALL,
        [DALLAS],
        content=" Sure! let me call the tool for you.",
        ids=every("test_extract_tool_calls", "single_tool_with_content")
        + every("test_extract_tool_calls_streaming", "single_tool_with_content"),
    ),
    jamba(
        "parallel_tools",
        JAMBA_PARALLEL,
        [DALLAS, ORLANDO],
        content=" ",
        ids=("test_extract_tool_calls_streaming[parallel_tools]",),
    ),
    jamba(
        "streaming_arguments_in_single_delta",
        '<tool_calls>[{"name": "get_current_weather", "arguments": {"city": "Dallas", '
        '"state": "TX"}}]</tool_calls>',
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
        ids=("test_extract_tool_calls_streaming_arguments_in_single_delta",),
    ),
]


MISTRAL = "tests/tool_parsers/test_mistral_tool_parser.py@002d5731d3"


def mistral(id, output, calls=(), content="", ids=()):
    return Case(id, MISTRAL, "mistral", "", output, tuple(calls), content, ids=tuple(ids))


SF = ("get_current_weather", {"city": "San Francisco", "state": "CA", "unit": "celsius"})
SF_JSON = '{"city": "San Francisco", "state": "CA", "unit": "celsius"}'
BASH_CMD = '{"command": "print(\\"hello world!\\")\\nre.compile(r\'{}\')"}'
PRE11 = "test_extract_tool_calls_pre_v11_tokenizer"
PRE11_STREAM = "test_extract_tool_calls_streaming_pre_v11_tokenizer"
ONE_CHUNK = "test_extract_tool_calls_streaming_one_chunk"
# vLLM's pre-v11 tokenizer reads `[TOOL_CALLS] [{...}]`, its v11 one `[TOOL_CALLS]NAME{...}`;
# here the one mistral format reads both (decoding/tool_formats/mistral.py).
MISTRAL_CASES = [
    mistral(
        "no_tools",
        "This is a test",
        content="This is a test",
        ids=every("test_extract_tool_calls_no_tools", "pre_v11", "v11")
        + every(PRE11_STREAM, "no_tools")
        + every(ONE_CHUNK, "pre_v11-no_tools")
        + ("test_extract_tool_calls_streaming_v11_no_tools",),
    ),
    mistral(
        "pre_v11_single_tool_add",
        '[TOOL_CALLS][{"name": "add", "arguments":{"a": 3.5, "b": 4}}]',
        [("add", {"a": 3.5, "b": 4})],
        ids=every(PRE11, "single_tool_add"),
    ),
    mistral(
        "pre_v11_single_tool_weather",
        '[TOOL_CALLS] [{"name": "get_current_weather", "arguments":' + SF_JSON + "}]",
        [SF],
        ids=every(PRE11, "single_tool_weather"),
    ),
    mistral(
        "pre_v11_single_tool_weather_spaced",
        '[TOOL_CALLS] [{"name": "get_current_weather", "arguments": ' + SF_JSON + "}]",
        [SF],
        ids=every(PRE11_STREAM, "single_tool_weather")
        + every(ONE_CHUNK, "pre_v11-single_tool_weather"),
    ),
    mistral(
        "pre_v11_argument_before_name",
        '[TOOL_CALLS] [{"arguments":' + SF_JSON + ', "name": "get_current_weather"}]',
        [SF],
        ids=every(PRE11, "argument_before_name"),
    ),
    mistral(
        "pre_v11_argument_before_name_spaced",
        '[TOOL_CALLS] [{"arguments": ' + SF_JSON + ', "name": "get_current_weather"}]',
        [SF],
        ids=every(PRE11_STREAM, "argument_before_name")
        + every(ONE_CHUNK, "pre_v11-argument_before_name"),
    ),
    mistral(
        "pre_v11_argument_before_name_and_name_in_argument",
        '[TOOL_CALLS] [{"arguments":{"name": "John Doe"}, "name": "get_age"}]',
        [("get_age", {"name": "John Doe"})],
        ids=every(PRE11, "argument_before_name_and_name_in_argument"),
    ),
    mistral(
        "pre_v11_argument_before_name_and_name_in_argument_spaced",
        '[TOOL_CALLS] [{"arguments": {"name": "John Doe"}, "name": "get_age"}]',
        [("get_age", {"name": "John Doe"})],
        ids=every(PRE11_STREAM, "argument_before_name_and_name_in_argument")
        + every(ONE_CHUNK, "pre_v11-argument_before_name_and_name_in_argument"),
    ),
    mistral(
        "pre_v11_multiple_tools",
        '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 3.5, "b": 4}}, '
        '{"name": "get_current_weather", "arguments":' + SF_JSON + "}]",
        [("add", {"a": 3.5, "b": 4}), SF],
        ids=every(PRE11, "multiple_tools") + every(PRE11_STREAM, "multiple_tools"),
    ),
    mistral(
        "pre_v11_multiple_tools_arguments_first",
        '[TOOL_CALLS] [{"arguments": {"a": 3.5, "b": 4}, "name": "add"}, '
        '{"arguments":' + SF_JSON + ', "name": "get_current_weather"}]',
        [("add", {"a": 3.5, "b": 4}), SF],
        ids=every(ONE_CHUNK, "pre_v11-multiple_tools"),
    ),
    mistral(
        "pre_v11_content_before_tool",
        'Hello[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1, "b": 2}}]',
        [("add", {"a": 1, "b": 2})],
        content="Hello",
        ids=every(PRE11, "content_before_tool"),
    ),
    mistral(
        "pre_v11_content_before_tool_some_text",
        'Some text[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1, "b": 2}}]',
        [("add", {"a": 1, "b": 2})],
        content="Some text",
        ids=every(ONE_CHUNK, "pre_v11-content_before_tool"),
    ),
    mistral(  # vLLM's non-streaming result (its streaming one keeps the text: KNOWN_DIFFERENCES)
        "pre_v11_trailing_data_after_json",
        '[TOOL_CALLS] [{"name": "get_current_weather", "arguments":{"city": "Dallas", '
        '"state": "TX", "unit": "fahrenheit"}}]\nextra trailing data',
        [("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})],
        ids=every(PRE11, "trailing_data_after_json"),
    ),
    mistral(
        "pre_v11_regex_fallback",
        '[TOOL_CALLS]  junk [{"name": "add", "arguments":{"a": 1, "b": 2}}] trail',
        [("add", {"a": 1, "b": 2})],
        ids=("test_extract_tool_calls_pre_v11_regex_fallback",),
    ),
    mistral(
        "pre_v11_streaming_single_tool_add",
        '[TOOL_CALLS]  [ {"name":"add" , "arguments" : {"a": 3, "b": 4} } ]',
        [("add", {"a": 3, "b": 4})],
        ids=every(PRE11_STREAM, "single_tool_add") + every(ONE_CHUNK, "pre_v11-single_tool_add"),
    ),
    mistral(
        "pre_v11_streaming_single_tool_add_strings",
        '[TOOL_CALLS] [{"name": "add", "arguments":{"a": "3", "b": "4"}}]',
        [("add", {"a": "3", "b": "4"})],
        ids=every(PRE11_STREAM, "single_tool_add_strings")
        + every(ONE_CHUNK, "pre_v11-single_tool_add_strings"),
    ),
    mistral(
        "pre_v11_fast_detokenization",
        '[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1, "b": 2}}]',
        [("add", {"a": 1, "b": 2})],
        ids=every("test_fast_detokenization_text_detection", "pre_v11"),
    ),
    # test_extract_tool_calls (v11 tokenizer: NAME{args})
    mistral(
        "v11_single_tool_add",
        '[TOOL_CALLS]add_this_and_that{"a": 3.5, "b": 4}',
        [("add_this_and_that", {"a": 3.5, "b": 4})],
        ids=every("test_extract_tool_calls", "single_tool_add")
        + every(ONE_CHUNK, "v11-single_tool_add"),
    ),
    mistral(
        "v11_single_tool_weather",
        "[TOOL_CALLS]get_current_weather" + SF_JSON,
        [SF],
        ids=every("test_extract_tool_calls", "single_tool_weather")
        + every(ONE_CHUNK, "v11-single_tool_weather"),
    ),
    mistral(
        "v11_multiple_tool_calls",
        '[TOOL_CALLS]add{"a": 3.5, "b": 4}[TOOL_CALLS]multiply{"a": 3, "b": 6}',
        [("add", {"a": 3.5, "b": 4}), ("multiply", {"a": 3, "b": 6})],
        ids=every("test_extract_tool_calls", "multiple_tool_calls")
        + every(ONE_CHUNK, "v11-multiple_tool_calls"),
    ),
    mistral(
        "v11_wrong_json",
        "hi{hi[TOOL_CALLS]bash" + BASH_CMD,
        [("bash", json.loads(BASH_CMD))],
        content="hi{hi",
        ids=every("test_extract_tool_calls", "wrong_json") + every(ONE_CHUNK, "v11-complex"),
    ),
    mistral(
        "v11_content_before_tool",
        'bla[TOOL_CALLS]add_this_and_that{"a": 3.5, "b": 4}',
        [("add_this_and_that", {"a": 3.5, "b": 4})],
        content="bla",
        ids=every(ONE_CHUNK, "v11-content_before_tool"),
    ),
    # test_extract_tool_calls_streaming: the v11 tokens mistral_common renders for its calls
    mistral(
        "v11_streaming_single_tool_add",
        '[TOOL_CALLS]add{"a": 3, "b": 4}',
        [("add", {"a": 3, "b": 4})],
        ids=every("test_extract_tool_calls_streaming", "single_tool_add"),
    ),
    mistral(
        "v11_streaming_single_tool_add_strings",
        '[TOOL_CALLS]add_two_strings{"a": "3", "b": "4"}',
        [("add_two_strings", {"a": "3", "b": "4"})],
        ids=every("test_extract_tool_calls_streaming", "single_tool_add_strings"),
    ),
    mistral(
        "v11_streaming_multiple_tools",
        '[TOOL_CALLS]add{"a": 3.5, "b": 4}[TOOL_CALLS]get_current_weather' + SF_JSON,
        [("add", {"a": 3.5, "b": 4}), SF],
        ids=every("test_extract_tool_calls_streaming", "multiple_tools"),
    ),
    mistral(
        "v11_fast_detokenization",
        'Hello[TOOL_CALLS]add{"a": 1, "b": 2}',
        [("add", {"a": 1, "b": 2})],
        content="Hello",
        ids=every("test_fast_detokenization_text_detection", "v11"),
    ),
]


OLMO3 = "tests/tool_parsers/test_olmo3_tool_parser.py@2aac44dc3f"


def olmo3(id, body, calls=(), content="", ids=None):
    output = f"<function_calls>{body}</function_calls>" if calls else body
    if ids is None:  # test_tool_call's ids: each output streaming and not
        ids = every("test_tool_call", f"{id}_streaming", f"{id}_nonstreaming")
    return Case(id, OLMO3, "olmo3", "", output, tuple(calls), content, ids=tuple(ids))


OLMO_SIMPLE = "get_weather(city='San Francisco', metric='celsius')"
OLMO_SIMPLE_CALL = ("get_weather", {"city": "San Francisco", "metric": "celsius"})
OLMO_MORE = (
    "register_user(name='John Doe', age=37, address={'city': 'San Francisco', 'state': 'CA'}, "
    "role=None, passed_test=True, aliases=['John', 'Johnny'])"
)
OLMO_MORE_CALL = (
    "register_user",
    {
        "name": "John Doe",
        "age": 37,
        "address": {"city": "San Francisco", "state": "CA"},
        "role": None,
        "passed_test": True,
        "aliases": ["John", "Johnny"],
    },
)
OLMO_TIMEOUT = "hello world[A(A=" + "\t)A(A=,\t" * 2
OLMO_BRACKETS = "<function_calls>foo(x=1])</function_calls>"
OLMO3_CASES = [
    olmo3(
        "no_tool_call",
        "How can I help you today?",
        content="How can I help you today?",
        ids=every("test_no_tool_call", "True", "False"),
    ),
    olmo3(
        "simple",
        OLMO_SIMPLE,
        [OLMO_SIMPLE_CALL],
        ids=(
            *every("test_tool_call", "simple_streaming", "simple_nonstreaming"),
            "test_streaming_healthy_call_logs_nothing",
        ),
    ),
    olmo3("more_types", OLMO_MORE, [OLMO_MORE_CALL]),
    olmo3(
        "more_types_json_literals",
        OLMO_MORE.replace("None", "null").replace("True", "true"),
        [OLMO_MORE_CALL],
        ids=every(
            "test_tool_call",
            "more_types_streaming_json_literals",
            "more_types_nonstreaming_json_literals",
        ),
    ),
    olmo3("parameterless", "get_weather()", [("get_weather", {})]),
    olmo3(
        "empty_dict",
        "do_something_cool(additional_data={})",
        [("do_something_cool", {"additional_data": {}})],
    ),
    olmo3("empty_list", "do_something_cool(steps=[])", [("do_something_cool", {"steps": []})]),
    olmo3(
        "escaped_string",
        r"get_weather(city='Martha\'s Vineyard', metric='\"cool units\"')",
        [("get_weather", {"city": "Martha's Vineyard", "metric": '"cool units"'})],
    ),
    olmo3("parallel_calls", OLMO_SIMPLE + "\n" + OLMO_MORE, [OLMO_SIMPLE_CALL, OLMO_MORE_CALL]),
    olmo3(
        "streaming_tool_call_with_large_steps",
        OLMO_SIMPLE + "\nget_weather()\ndo_something_cool(steps=[])",
        [OLMO_SIMPLE_CALL, ("get_weather", {}), ("do_something_cool", {"steps": []})],
        ids=("test_streaming_tool_call_with_large_steps",),
    ),
    olmo3(
        "bad_sibling_call_does_not_drop_good_calls",
        "bad(x=b'z')\n" + OLMO_SIMPLE,
        [OLMO_SIMPLE_CALL],
        ids=every("test_bad_sibling_call_does_not_drop_good_calls", "True", "False"),
    ),
    olmo3(
        "non_finite_argument_rejected",
        "calc(x=1e999)\n" + OLMO_SIMPLE,
        [OLMO_SIMPLE_CALL],
        ids=("test_non_finite_argument_rejected",),
    ),
    # vLLM mocks its regex to time out: the output comes back as content
    olmo3(
        "regex_timeout_handling",
        OLMO_TIMEOUT,
        content=OLMO_TIMEOUT,
        ids=every("test_regex_timeout_handling", "False"),
    ),
    # vLLM asserts only that no call is made; here the block comes back as content
    olmo3(
        "mismatched_brackets",
        OLMO_BRACKETS,
        content=OLMO_BRACKETS,
        ids=("test_streaming_mismatched_brackets_reported_once",),
    ),
]


QWEN3XML = "tests/tool_parsers/test_qwen3xml_tool_parser.py@1cbe721380"


def qwen3xml(id, output, calls=(), content="", ids=()):
    return Case(id, QWEN3XML, "qwen3_xml", "", output, tuple(calls), content, ids=tuple(ids))


def xml_call(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


QWEN3XML_CASES = common(
    qwen3xml,
    no_tool_calls=(NO_CALLS, (), NO_CALLS),
    single_tool_call=(xml_call("get_weather", ("city", "Tokyo")), [TOKYO_CALL], ""),
    parallel_tool_calls=(
        xml_call("get_weather", ("city", "Tokyo"))
        + xml_call("get_time", ("timezone", "Asia/Tokyo")),
        TWO_CALLS,
        "",
    ),
    # vLLM's test checks the fields only (supports_typed_arguments=False): without a tool
    # schema the values stay text, null is None.
    various_data_types=(
        xml_call(
            "test_function",
            ("string_field", "hello"),
            ("int_field", "42"),
            ("float_field", "3.14"),
            ("bool_field", "true"),
            ("null_field", "null"),
            ("array_field", '["a", "b", "c"]'),
            ("object_field", '{"nested": "value"}'),
        ),
        [
            (
                "test_function",
                {
                    "string_field": "hello",
                    "int_field": "42",
                    "float_field": "3.14",
                    "bool_field": "true",
                    "null_field": None,
                    "array_field": '["a", "b", "c"]',
                    "object_field": '{"nested": "value"}',
                },
            )
        ],
        "",
    ),
    empty_arguments=(xml_call("refresh"), [("refresh", {})], ""),
    # vLLM's test asserts at least one call (content unchecked); the text around the call
    # stays content here.
    surrounding_text=(
        "Let me check the weather for you.\n\n"
        + xml_call("get_weather", ("city", "Tokyo"))
        + "\n\nI will get that information.",
        [TOKYO_CALL],
        "Let me check the weather for you.\n\n\n\nI will get that information.",
    ),
    escaped_strings=(
        xml_call(
            "test_function",
            ("quoted", 'He said "hello"'),
            ("path", "C:\\Users\\file.txt"),
            ("newline", "line1\nline2"),
        ),
        [
            (
                "test_function",
                {
                    "quoted": 'He said "hello"',
                    "path": "C:\\Users\\file.txt",
                    "newline": "line1\nline2",
                },
            )
        ],
        "",
    ),
    # the cut-off one is never announced on the stream: no parameter opened
    malformed=["<tool_call><function=func>", "<tool_call><function=></function></tool_call>"],
)


KIMI = "tests/tool_parsers/test_kimi_k2_tool_parser.py@0825a6c362"
K_SECTION = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")


def kimi_tool(tool_id: str, args: str) -> str:
    return f"<|tool_call_begin|>{tool_id} <|tool_call_argument_begin|>{args}<|tool_call_end|>"


def kimi(id, prefix, tools, calls=(), content=None):
    output = prefix + K_SECTION[0] + "".join(tools) + K_SECTION[1] if tools else prefix
    return Case(
        id, KIMI, "kimi_k2", "", output, tuple(calls), prefix if content is None else content
    )


KIMI_CASES = [
    kimi("no_tools", "This is a test", []),
    kimi(
        "single_tool_call",
        "I'll check. ",
        [kimi_tool("functions.get_weather:0", '{"city": "Beijing"}')],
        [("get_weather", {"city": "Beijing"})],
    ),
    kimi(
        "parallel_tool_calls",
        "Compare weather. ",
        [
            kimi_tool("functions.get_weather:0", '{"city": "Beijing"}'),
            kimi_tool("functions.get_weather:1", '{"city": "Shanghai"}'),
        ],
        [("get_weather", {"city": "Beijing"}), ("get_weather", {"city": "Shanghai"})],
    ),
    kimi(
        "three_tool_calls",
        "Multiple tasks. ",
        [
            kimi_tool("functions.get_weather:0", '{"city": "New York"}'),
            kimi_tool("functions.get_news:1", '{"topic": "technology"}'),
            kimi_tool(
                "functions.send_email:2", '{"to": "user@example.com", "subject": "Daily Update"}'
            ),
        ],
        [
            ("get_weather", {"city": "New York"}),
            ("get_news", {"topic": "technology"}),
            ("send_email", {"to": "user@example.com", "subject": "Daily Update"}),
        ],
    ),
    kimi(
        "angle_brackets_in_json",
        "Process HTML. ",
        [kimi_tool("functions.process_html:0", '{"html": "<div>content</div>"}')],
        [("process_html", {"html": "<div>content</div>"})],
    ),
    kimi(
        "multiline_json",
        "Formatted. ",
        [kimi_tool("functions.process_data:0", '{\n  "name": "test",\n  "value": 123\n}')],
        [("process_data", {"name": "test", "value": 123})],
    ),
    kimi(
        "no_functions_prefix",
        "No prefix. ",
        [kimi_tool("get_weather:0", '{"city": "Tokyo"}')],
        [("get_weather", {"city": "Tokyo"})],
    ),
    kimi("empty_arguments", "Empty args. ", [kimi_tool("functions.test:0", "{}")], [("test", {})]),
]


GLM45 = "tests/tool_parsers/test_glm4_moe_tool_parser.py@024364d669"


def glm(id, output, calls=(), content=""):
    return Case(id, GLM45, "glm45", "", output, tuple(calls), content)


def glm_call(name: str, *params: tuple[str, str], indent: str = "    ") -> str:
    body = "".join(
        f"{indent}<arg_key>{k}</arg_key>\n{indent}<arg_value>{v}</arg_value>\n" for k, v in params
    )
    return f"<tool_call>{name}\n{body}{indent}</tool_call>"


def weather(city: str, state: str, unit: str) -> tuple:
    return ("get_current_weather", {"city": city, "state": state, "unit": unit})


GLM_TWO = (
    glm_call("get_current_weather", ("city", "Dallas"), ("state", "TX"), ("unit", "fahrenheit"))
    + "\n    "
    + glm_call("get_current_weather", ("city", "Orlando"), ("state", "FL"), ("unit", "fahrenheit"))
)
GLM45_CASES = [
    glm("no_tools", "This is a test", content="This is a test"),
    glm(
        "multiple_tool_calls",
        GLM_TWO,
        [weather("Dallas", "TX", "fahrenheit"), weather("Orlando", "FL", "fahrenheit")],
    ),
    glm(
        "single_tool_call",
        glm_call(
            "get_current_weather", ("city", "Dallas"), ("state", "TX"), ("unit", "fahrenheit")
        ),
        [weather("Dallas", "TX", "fahrenheit")],
    ),
    glm(
        "tool_call_with_content_before",
        "I'll help you check the weather. "
        + glm_call(
            "get_current_weather", ("city", "Seattle"), ("state", "WA"), ("unit", "celsius")
        ),
        [weather("Seattle", "WA", "celsius")],
        content="I'll help you check the weather. ",
    ),
    glm(
        "tool_call_with_mixed_args",
        glm_call("get_current_weather", ("city", "New York"), ("state", "NY"), ("unit", "celsius")),
        [weather("New York", "NY", "celsius")],
    ),
    glm(
        "tool_call_with_chinese_content",
        "I will help you get the weather."
        + glm_call("get_weather", ("city", "Beijing"), ("date", "2025-08-01")),
        [("get_weather", {"city": "Beijing", "date": "2025-08-01"})],
        content="I will help you get the weather.",
    ),
    glm(
        "empty_arguments",
        "<tool_call>get_current_time\n</tool_call>",
        [("get_current_time", {})],
    ),
    glm(
        "special_characters",
        glm_call(
            "send_message",
            ("recipient", "Amy"),
            ("message", "It is a nice day"),
            ("priority", "high"),
            indent="",
        ),
        [("send_message", {"recipient": "Amy", "message": "It is a nice day", "priority": "high"})],
    ),
]


PYTHONIC = "tests/tool_parsers/test_pythonic_tool_parser.py@0716d268c7"
LLAMA4P = "tests/tool_parsers/test_llama4_pythonic_tool_parser.py@0716d268c7"


def pythonic(id, output, calls=(), content="", tool="pythonic", source=PYTHONIC):
    return Case(id, source, tool, "", output, tuple(calls), content)


PY_SIMPLE = "get_weather(city='San Francisco', metric='celsius')"
PY_SIMPLE_CALL = ("get_weather", {"city": "San Francisco", "metric": "celsius"})
PY_MORE = (
    "register_user(name='John Doe', age=37, address={'city': 'San Francisco', 'state': 'CA'}, "
    "role=None, passed_test=True, aliases=['John', 'Johnny'])"
)
PY_MORE_CALL = (
    "register_user",
    {
        "name": "John Doe",
        "age": 37,
        "address": {"city": "San Francisco", "state": "CA"},
        "role": None,
        "passed_test": True,
        "aliases": ["John", "Johnny"],
    },
)
PY_ESCAPED = r"get_weather(city='Martha\'s Vineyard', metric='\"cool units\"')"
PY_ESCAPED_CALL = ("get_weather", {"city": "Martha's Vineyard", "metric": '"cool units"'})
PY_FORMS = [  # test_tool_call's TEST_CASES, each id with _streaming and _nonstreaming
    ("simple", PY_SIMPLE, [PY_SIMPLE_CALL]),
    ("more_types", PY_MORE, [PY_MORE_CALL]),
    ("parameterless", "get_weather()", [("get_weather", {})]),
    (
        "empty_dict",
        "do_something_cool(additional_data={})",
        [("do_something_cool", {"additional_data": {}})],
    ),
    ("empty_list", "do_something_cool(steps=[])", [("do_something_cool", {"steps": []})]),
    ("escaped_string", PY_ESCAPED, [PY_ESCAPED_CALL]),
    ("parallel_calls", f"{PY_SIMPLE}, {PY_MORE}", [PY_SIMPLE_CALL, PY_MORE_CALL]),
]
PY_TIMEOUT_INPUT = "hello world[A(A=" + "\t)A(A=,\t" * 2
PYTHONIC_CASES = [
    pythonic("test_no_tool_call", "How can I help you today?", content="How can I help you today?"),
    *[pythonic(f"test_tool_call[{i}_(non)streaming]", f"[{o}]", c) for i, o, c in PY_FORMS],
    pythonic(
        "test_streaming_tool_call_with_large_steps",
        "[get_weather(city='San Francisco', metric='celsius'), get_weather(), "
        "do_something_cool(steps=[])]",
        [PY_SIMPLE_CALL, ("get_weather", {}), ("do_something_cool", {"steps": []})],
    ),
    pythonic("test_regex_timeout_handling", PY_TIMEOUT_INPUT, content=PY_TIMEOUT_INPUT),
    pythonic(
        "test_bad_sibling_call_does_not_drop_good_calls",
        f"[bad(x=b'z'), {PY_SIMPLE}]",
        [PY_SIMPLE_CALL],
    ),
    pythonic(
        "test_non_finite_argument_rejected", f"[calc(x=1e999), {PY_SIMPLE}]", [PY_SIMPLE_CALL]
    ),
    pythonic(
        "test_good_call_survives_unparsable_sibling",
        f"[{PY_SIMPLE}, f(a='x 'y', b='z')]",
        [PY_SIMPLE_CALL],
    ),
    pythonic(
        "test_unrecoverable_block_still_reports_no_tool_call",
        "[f(a='x 'y' 'z), g(b='p 'q' 'r)]",
        content="[f(a='x 'y' 'z), g(b='p 'q' 'r)]",
    ),
    # vLLM asserts no call (its content unchecked): the text comes back as content here.
    pythonic(
        "test_streaming_mismatched_brackets_reported_once", "[foo(x=1])]", content="[foo(x=1])]"
    ),
]


def llama4p(id, output, calls=(), content=""):
    return pythonic(id, output, calls, content, "llama4_pythonic", LLAMA4P)


L4_SIMPLE_CALL = ("get_weather", {"city": "LA", "metric": "C"})
L4_MORE = (
    "[register_user(name='Doe', age=9, address={'city': 'LA', 'state': 'CA'}, role=None, "
    "passed_test=True, aliases=['John', 'Johnny'])]"
)
L4_MORE_CALL = (
    "register_user",
    {
        "name": "Doe",
        "age": 9,
        "address": {"city": "LA", "state": "CA"},
        "role": None,
        "passed_test": True,
        "aliases": ["John", "Johnny"],
    },
)
L4_DOE = ("register_user", {"name": "Doe", "age": 9})
L4_INNER = "get_weather(city='LA', metric='C')"
LLAMA4_PYTHONIC_CASES = [
    llama4p("test_no_tool_call", "How can I help you today?", content="How can I help you today?"),
    # test_tool_call's TEST_CASES (simple_streaming is the escaped-string output there)
    llama4p("test_tool_call[simple_streaming]", f"[{PY_ESCAPED}]", [PY_ESCAPED_CALL]),
    llama4p("test_tool_call[simple_nonstreaming]", f"[{L4_INNER}]", [L4_SIMPLE_CALL]),
    llama4p("test_tool_call[more_types_(non)streaming]", L4_MORE, [L4_MORE_CALL]),
    llama4p(
        "test_tool_call[parameterless_(non)streaming]", "[get_weather()]", [("get_weather", {})]
    ),
    llama4p(
        "test_tool_call[empty_dict_(non)streaming]",
        "[do_something_cool(additional_data={})]",
        [("do_something_cool", {"additional_data": {}})],
    ),
    llama4p(
        "test_tool_call[empty_list_(non)streaming]",
        "[do_something_cool(steps=[])]",
        [("do_something_cool", {"steps": []})],
    ),
    llama4p("test_tool_call[escaped_string_(non)streaming]", f"[{PY_ESCAPED}]", [PY_ESCAPED_CALL]),
    llama4p(
        "test_tool_call[parallel_calls_(non)streaming]",
        "[get_weather(city='LA',metric='C'),register_user(name='Doe',age=9)]",
        [L4_SIMPLE_CALL, L4_DOE],
    ),
    llama4p(
        "test_tool_call[python_tag_(non)streaming]",
        f"<|python_start|>[{L4_INNER}]<|python_end|>",
        [L4_SIMPLE_CALL],
    ),
    llama4p(
        "test_tool_call[parallel_calls_streaming, python_start]",
        "<|python_start|>[get_weather(city='LA', metric='C'),register_user(name='Doe', age=9)]",
        [L4_SIMPLE_CALL, L4_DOE],
    ),
    llama4p(
        "test_tool_call[parallel_calls_nonstreaming, python_start]",
        "<|python_start|>[get_weather(city='LA', metric='C'), register_user(name='Doe', age=9)]",
        [L4_SIMPLE_CALL, L4_DOE],
    ),
    llama4p(
        "test_streaming_tool_call_with_large_steps",
        "<|python_start|>[get_weather(city='LA', metric='C'), get_weather(), "
        "do_something_cool(steps=[])]<|python_end|>",
        [L4_SIMPLE_CALL, ("get_weather", {}), ("do_something_cool", {"steps": []})],
    ),
    llama4p("test_regex_timeout_handling", PY_TIMEOUT_INPUT, content=PY_TIMEOUT_INPUT),
    llama4p(
        "test_bad_sibling_call_does_not_drop_good_calls",
        f"<|python_start|>[bad(x=b'z'), {L4_INNER}]<|python_end|>",
        [L4_SIMPLE_CALL],
    ),
    llama4p(
        "test_non_finite_argument_rejected",
        f"<|python_start|>[calc(x=1e999), {L4_INNER}]<|python_end|>",
        [L4_SIMPLE_CALL],
    ),
    # vLLM asserts no call (content unchecked): the block comes back as content here.
    llama4p(
        "test_streaming_mismatched_brackets_reported_once",
        "<|python_start|>[foo(x=1])]<|python_end|>",
        content="<|python_start|>[foo(x=1])]<|python_end|>",
    ),
]


def _pythonic_ids(case: Case) -> Case:
    """The vLLM test ids of a pythonic / llama4_pythonic case: "(non)streaming" stands for
    both of test_tool_call's ids; tests run with `streaming` True and False name both."""
    name = case.id
    if "(non)streaming" in name:
        ids = tuple(name.replace("(non)streaming", m) for m in ("streaming", "nonstreaming"))
    elif name in ("test_no_tool_call", "test_bad_sibling_call_does_not_drop_good_calls"):
        ids = every(name, "True", "False")
    elif name == "test_regex_timeout_handling":
        ids = every(name, "False")
    else:
        ids = (name,)
    return Case(**{**case.__dict__, "ids": ids})


PYTHONIC_CASES = [_pythonic_ids(c) for c in PYTHONIC_CASES]
# test_tool_call's ids repeat there (parallel_calls_streaming twice): pytest numbers them 0, 1
_L4_IDS = {
    "test_tool_call[parallel_calls_(non)streaming]": every(
        "test_tool_call", "parallel_calls_streaming0", "parallel_calls_nonstreaming0"
    ),
    "test_tool_call[parallel_calls_streaming, python_start]": (
        "test_tool_call[parallel_calls_streaming1]",
    ),
    "test_tool_call[parallel_calls_nonstreaming, python_start]": (
        "test_tool_call[parallel_calls_nonstreaming1]",
    ),
}
LLAMA4_PYTHONIC_CASES = [
    Case(**{**c.__dict__, "ids": _L4_IDS[c.id]}) if c.id in _L4_IDS else _pythonic_ids(c)
    for c in LLAMA4_PYTHONIC_CASES
]


XLAM = "tests/tool_parsers/test_xlam_tool_parser.py@10a6751520"


def xlam(id, output, calls=(), content=""):
    return Case(id, XLAM, "xlam", "", output, tuple(calls), content)


def xlam_list(*calls: tuple[str, dict]) -> str:
    return json.dumps([{"name": n, "arguments": a} for n, a in calls])


X_DALLAS = ("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})
X_ORLANDO = ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"})
X_SEATTLE = ("get_current_weather", {"city": "Seattle", "state": "WA", "unit": "celsius"})
X_ONE = xlam_list(X_DALLAS)
XLAM_CASES = [
    xlam("test_extract_tool_calls_no_tools", "This is a test", content="This is a test"),
    # test_extract_tool_calls (non-streaming) and test_extract_tool_calls_streaming_incremental
    xlam(
        "test_extract_tool_calls[parallel_tool_calls]",
        xlam_list(X_DALLAS, X_ORLANDO),
        [X_DALLAS, X_ORLANDO],
    ),
    xlam(
        "test_extract_tool_calls[single_tool_with_think_tag]",
        "<think>I'll help you with that.</think>" + X_ONE,
        [X_DALLAS],
        content="<think>I'll help you with that.</think>",
    ),
    xlam(
        "test_extract_tool_calls[single_tool_with_json_code_block]",
        "I'll help you with that.\n```json\n" + X_ONE + "\n```",
        [X_DALLAS],
        content="I'll help you with that.",
    ),
    xlam(
        "test_extract_tool_calls[single_tool_with_tool_calls_tag]",
        "I'll check the weather for you.[TOOL_CALLS]" + X_ONE,
        [X_DALLAS],
        content="I'll check the weather for you.",
    ),
    xlam(
        "test_extract_tool_calls[single_tool_with_tool_call_xml_tags]",
        "I'll help you check the weather.<tool_call>" + X_ONE + "</tool_call>",
        [X_DALLAS],
        content="I'll help you check the weather.",
    ),
    xlam(
        "test_extract_tool_calls_list_structure[list_structured_tool_call]",
        xlam_list(X_SEATTLE),
        [X_SEATTLE],
    ),
    xlam(
        "test_preprocess_model_output[list]",
        xlam_list(("get_current_weather", {"city": "Seattle"})),
        [("get_current_weather", {"city": "Seattle"})],
    ),
    xlam(
        "test_extract_tool_calls_streaming_incremental[single_tool_with_json_code_block]",
        "```json\n" + X_ONE + "\n```",
        [X_DALLAS],
    ),
    xlam(
        "test_extract_tool_calls_streaming_incremental[single_tool_with_tool_calls_tag]",
        "[TOOL_CALLS]" + X_ONE,
        [X_DALLAS],
    ),
    xlam(
        "test_extract_tool_calls_streaming_incremental[single_tool_with_tool_call_xml_tags]",
        "I can help with that.<tool_call>" + X_ONE + "</tool_call>",
        [X_DALLAS],
        content="I can help with that.",
    ),
    xlam(
        "test_extract_tool_calls_non_ascii",
        '[{"name": "get_current_weather", "arguments": {"city": "北京"}}, '
        '{"name": "get_current_weather", "arguments": {"city": "上海"}}]',
        [("get_current_weather", {"city": "北京"}), ("get_current_weather", {"city": "上海"})],
    ),
    xlam(
        "test_extract_tool_calls_streaming_one_empty_args_tool[first]",
        '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 42}}]',
        [("a", {}), ("b", {"x": 42})],
    ),
    xlam(
        "test_extract_tool_calls_streaming_one_empty_args_tool[last]",
        '[{"name": "a", "arguments": {"x": 42}}, {"name": "b", "arguments": {}}]',
        [("a", {"x": 42}), ("b", {})],
    ),
]


SEED = "tests/tool_parsers/test_seed_oss_tool_parser.py@0f12075134"
SEED_TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get current temperature for a given location.",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string"},
                    "unit": {"type": "string"},
                },
                "required": ["location"],
            },
        },
    },
)


def seed(id, output, calls=(), content="", tools=SEED_TOOLS):
    return Case(id, SEED, "seed_oss", "", output, tuple(calls), content, tools=tools)


SEED_CALL = (
    "<seed:tool_call>\n<function=get_weather>\n<parameter=location>Barcelona, Spain</parameter>"
    "\n</function>\n</seed:tool_call>"
)
SEED_CALL_UNIT = (
    "<seed:tool_call>\n<function=get_weather>\n<parameter=location>Barcelona, Spain</parameter>"
    "\n<parameter=unit>celsius</parameter>\n</function>\n</seed:tool_call>"
)
BARCELONA = ("get_weather", {"location": "Barcelona, Spain"})
BARCELONA_C = ("get_weather", {"location": "Barcelona, Spain", "unit": "celsius"})
SEED_THINK_512 = (
    "<seed:think>The user's current thinking budget is 512.</seed:cot_budget_reflect>\nLet me "
    "analyze the question.\n<seed:cot_budget_reflect>I have used 131 tokens, and there are 381 "
    "tokens remaining for use.</seed:cot_budget_reflect>\n The unit parameter can be omitted "
    "since it's optional.</seed:think>\n"
)
SEED_THINK_UNLIMITED = (
    "<seed:think>\nGot it, let's see. The format is <seed:tool_call>\n<function=get_weather>\n"
    "<parameter=location>Barcelona, Spain</parameter>\n<parameter=unit>celsius</parameter>\n"
    "</function>\n</seed:tool_call>. Let me go with that.</seed:think>"
)
SEED_OSS_CASES = [
    seed(
        "test_extract_tool_calls_no_tools",
        "This is a test response without any tool calls",
        content="This is a test response without any tool calls",
        tools=(),
    ),
    seed("test_extract_tool_calls[tool_call_0_thinking_budget]", SEED_CALL, [BARCELONA]),
    seed(
        "test_extract_tool_calls[tool_call_512_thinkg_budget] (reasoning shortened)",
        SEED_THINK_512 + SEED_CALL,
        [BARCELONA],
        content=SEED_THINK_512,
    ),
    seed(
        "test_streaming_tool_calls[tool_call_0_thinking_budget]",
        "<seed:think>\n</seed:cot_budget_reflect>\n</seed:cot_budget_reflect>\nThe current "
        "thinking budget is 0, so I will directly start answering the question.\n</seed:think>\n"
        + SEED_CALL,
        [BARCELONA],
        content="<seed:think>\n</seed:cot_budget_reflect>\n</seed:cot_budget_reflect>\nThe "
        "current thinking budget is 0, so I will directly start answering the question.\n"
        "</seed:think>\n",
    ),
]


GEMMA4 = "tests/tool_parsers/test_gemma4_tool_parser.py@027004de37"
Q = '<|"|>'


def gemma4(id, output, calls=(), content=""):
    return Case(id, GEMMA4, "gemma4", "", output, tuple(calls), content)


def g4(name: str, args: str) -> str:
    return f"<|tool_call>call:{name}{{{args}}}<tool_call|>"


# TestParseGemma4Args / TestParseGemma4Array: the argument reader's cases, each as the one
# call f{ARGS} (an array's as f{a:[ITEMS]}); their partial (streaming-internal) modes and
# the malformed-array ones have no call form (NOT_APPLICABLE).
G4_ARGS = [
    ("test_empty_string", "", {}),
    ("test_whitespace_only", "   ", {}),
    ("test_single_string_value", f"location:{Q}Paris{Q}", {"location": "Paris"}),
    (
        "test_string_value_with_comma",
        f"location:{Q}Paris, France{Q}",
        {"location": "Paris, France"},
    ),
    (
        "test_multiple_string_values",
        f"location:{Q}San Francisco{Q},unit:{Q}celsius{Q}",
        {"location": "San Francisco", "unit": "celsius"},
    ),
    ("test_integer_value", "count:42", {"count": 42}),
    ("test_float_value", "score:3.14", {"score": 3.14}),
    ("test_boolean_true", "flag:true", {"flag": True}),
    ("test_boolean_false", "flag:false", {"flag": False}),
    ("test_null_value", "param:null", {"param": None}),
    (
        "test_mixed_types",
        f"name:{Q}test{Q},count:42,active:true,score:3.14",
        {"name": "test", "count": 42, "active": True, "score": 3.14},
    ),
    ("test_nested_object", f"nested:{{inner:{Q}value{Q}}}", {"nested": {"inner": "value"}}),
    (
        "test_string_delimited_dict_key",
        f"record_map:{{{Q}3{Q}:{Q}new text{Q}}}",
        {"record_map": {"3": "new text"}},
    ),
    (
        "test_nested_string_delimited_dict_key",
        f"outer:{{inner:{{{Q}3{Q}:{Q}new text{Q}}}}}",
        {"outer": {"inner": {"3": "new text"}}},
    ),
    ("test_array_of_strings", f"items:[{Q}a{Q},{Q}b{Q}]", {"items": ["a", "b"]}),
    ("test_unterminated_string", f"key:{Q}unterminated", {"key": "unterminated"}),
    ("test_empty_value", "key:", {"key": ""}),
    (
        "test_trailing_dot_float_partial_withheld (non-partial)",
        "left:108.,right:22.8",
        {"left": 108.0, "right": 22.8},
    ),
    ("Array.test_string_array", f"a:[{Q}a{Q},{Q}b{Q}]", {"a": ["a", "b"]}),
    ("Array.test_empty_array", "a:[]", {"a": []}),
    ("Array.test_bare_values", "a:[42,true,3.14]", {"a": [42, True, 3.14]}),
    (
        "Array.test_string_element_with_closing_bracket",
        f"a:[[{Q}a]b{Q},{Q}c{Q}],{Q}tail{Q}]",
        {"a": [["a]b", "c"], "tail"]},
    ),
]
G4_LONDON = g4("get_weather", f"location:{Q}London{Q}")
G4_HTML = (
    '<!DOCTYPE html>\n<html lang="zh-CN">\n<head>\n    <meta charset="UTF-8">\n'
    '    <meta name="viewport" content="width=device-width">\n'
)
GEMMA4_CASES = [
    *[gemma4(f"TestParseGemma4Args.{i}", g4("f", a), [("f", want)]) for i, a, want in G4_ARGS],
    gemma4(
        "TestExtractToolCalls.test_no_tool_calls",
        "Hello, how can I help you today?",
        content="Hello, how can I help you today?",
    ),
    gemma4(
        "TestExtractToolCalls.test_single_tool_call",
        G4_LONDON,
        [("get_weather", {"location": "London"})],
    ),
    gemma4(
        "TestExtractToolCalls.test_multiple_arguments",
        g4("get_weather", f"location:{Q}San Francisco{Q},unit:{Q}celsius{Q}"),
        [("get_weather", {"location": "San Francisco", "unit": "celsius"})],
    ),
    gemma4(
        "TestExtractToolCalls.test_text_before_tool_call",
        "Let me check the weather for you. " + g4("get_weather", f"location:{Q}Paris{Q}"),
        [("get_weather", {"location": "Paris"})],
        content="Let me check the weather for you.",
    ),
    gemma4(
        "TestExtractToolCalls.test_multiple_tool_calls",
        G4_LONDON + g4("get_time", f"location:{Q}London{Q}"),
        [("get_weather", {"location": "London"}), ("get_time", {"location": "London"})],
    ),
    gemma4(
        "TestExtractToolCalls.test_nested_arguments",
        g4("complex_function", f"nested:{{inner:{Q}value{Q}}},list:[{Q}a{Q},{Q}b{Q}]"),
        [("complex_function", {"nested": {"inner": "value"}, "list": ["a", "b"]})],
    ),
    gemma4(
        "TestExtractToolCalls.test_tool_call_with_number_and_boolean",
        g4("set_status", "is_active:true,count:42,score:3.14"),
        [("set_status", {"is_active": True, "count": 42, "score": 3.14})],
    ),
    gemma4(
        "TestExtractToolCalls.test_incomplete_tool_call",
        f"<|tool_call>call:get_weather{{location:{Q}London",
        content=f"<|tool_call>call:get_weather{{location:{Q}London",
    ),
    gemma4(
        "TestExtractToolCalls.test_hyphenated_function_name",
        g4("get-weather", f"location:{Q}London{Q}"),
        [("get-weather", {"location": "London"})],
    ),
    gemma4(
        "TestExtractToolCalls.test_dotted_function_name",
        g4("weather.get", f"location:{Q}London{Q}"),
        [("weather.get", {"location": "London"})],
    ),
    gemma4("TestExtractToolCalls.test_no_arguments", g4("get_status", ""), [("get_status", {})]),
    # TestStreamingExtraction: the chunks joined (split at every byte here)
    gemma4(
        "TestStreamingExtraction.test_basic_streaming_single_tool",
        g4("get_weather", f"location:{Q}Paris, France{Q}"),
        [("get_weather", {"location": "Paris, France"})],
    ),
    gemma4(
        "TestStreamingExtraction.test_streaming_multi_arg",
        g4("get_weather", f"location:{Q}Tokyo{Q},unit:{Q}celsius{Q}"),
        [("get_weather", {"location": "Tokyo", "unit": "celsius"})],
    ),
    *[
        gemma4(
            f"TestStreamingExtraction.{i}",
            g4("get_weather", f"location:{Q}{city}{Q}"),
            [("get_weather", {"location": city})],
        )
        for i, city in [
            ("test_streaming_no_extra_brace", "London"),
            ("test_streaming_no_unquoted_keys", "Paris"),
            ("test_streaming_name_no_call_prefix", "Paris"),
        ]
    ],
    gemma4(
        "TestStreamingExtraction.test_streaming_text_before_tool_call",
        "Let me check the weather. " + G4_LONDON,
        [("get_weather", {"location": "London"})],
        content="Let me check the weather.",
    ),
    gemma4(
        "TestStreamingExtraction.test_streaming_numeric_args",
        g4("set_config", "count:42,active:true"),
        [("set_config", {"count": 42, "active": True})],
    ),
    gemma4(
        "TestStreamingExtraction.test_streaming_boolean_split_across_chunks",
        g4("search", "input:{all:true}"),
        [("search", {"input": {"all": True}})],
    ),
    gemma4(
        "TestStreamingExtraction.test_streaming_false_split_across_chunks",
        g4("set", "flag:false"),
        [("set", {"flag": False})],
    ),
    gemma4(
        "TestStreamingExtraction.test_streaming_number_split_across_chunks",
        g4("set", "count:42"),
        [("set", {"count": 42})],
    ),
    gemma4(
        "TestStreamingExtraction.test_streaming_empty_args",
        g4("get_status", ""),
        [("get_status", {})],
    ),
    gemma4(
        "TestStreamingExtraction.test_streaming_split_delimiter_no_invalid_json",
        g4("todowrite", f"content:{Q}Buy milk{Q}"),
        [("todowrite", {"content": "Buy milk"})],
    ),
    gemma4(
        "TestStreamingExtraction.test_streaming_does_not_duplicate_plain_text_after_tool_call",
        g4("get_weather", f"location:{Q}Paris{Q}") + "<div>",
        [("get_weather", {"location": "Paris"})],
        content="<div>",
    ),
    gemma4(
        "TestStreamingExtraction.test_streaming_html_argument_does_not_duplicate_tag_prefixes",
        g4("write_file", f"path:{Q}index.html{Q},content:{Q}{G4_HTML}{Q}"),
        [("write_file", {"path": "index.html", "content": G4_HTML})],
    ),
    gemma4(
        "TestStreamingExtraction.test_streaming_trailing_bare_bool_not_duplicated",
        g4(
            "Edit",
            f"file_path:{Q}src/env.py{Q},old_string:{Q}old_val{Q},"
            f"new_string:{Q}new_val{Q},replace_all:false",
        ),
        [
            (
                "Edit",
                {
                    "file_path": "src/env.py",
                    "old_string": "old_val",
                    "new_string": "new_val",
                    "replace_all": False,
                },
            )
        ],
    ),
]


QWEN3CODER = "tests/tool_parsers/test_qwen3coder_tool_parser.py@049d8df27d"


def fn_tool(name: str, properties: dict, **extra) -> dict:
    params = {"type": "object", "properties": properties, **extra}
    return {"type": "function", "function": {"name": name, "parameters": params}}


QC_TOOLS = (  # the file's sample_tools
    fn_tool(
        "get_current_weather",
        {
            "city": {"type": "string"},
            "state": {"type": "string"},
            "unit": {"type": "string", "enum": ["fahrenheit", "celsius"]},
        },
        required=["city", "state"],
    ),
    fn_tool(
        "calculate_area",
        {
            "shape": {"type": "string"},
            "dimensions": {"type": "object"},
            "precision": {"type": "integer"},
        },
    ),
)


def qcoder(id, output, calls=(), content="", tools=QC_TOOLS, tool="qwen3_coder"):
    return Case(id, QWEN3CODER, tool, "", output, tuple(calls), content, tools=tuple(tools))


def qc_call(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


QC_DALLAS = qc_call(
    "get_current_weather", ("city", "Dallas"), ("state", "TX"), ("unit", "fahrenheit")
)
QC_DALLAS_CALL = ("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})
QC_RECT = qc_call(
    "calculate_area",
    ("shape", "rectangle"),
    ("dimensions", '{"width": 10, \n "height": 20}'),
    ("precision", "2"),
)
QC_RECT_CALL = (
    "calculate_area",
    {"shape": "rectangle", "dimensions": {"width": 10, "height": 20}, "precision": 2},
)
QC_CIRCLE = qc_call(
    "calculate_area", ("shape", "circle"), ("dimensions", '{"radius": 15.5}'), ("precision", "3")
)
QC_CIRCLE_CALL = (
    "calculate_area",
    {"shape": "circle", "dimensions": {"radius": 15.5}, "precision": 3},
)
QC_TYPES_TOOLS = (
    fn_tool(
        "test_types",
        {
            "int_param": {"type": "integer"},
            "float_param": {"type": "float"},
            "bool_param": {"type": "boolean"},
            "str_param": {"type": "string"},
            "obj_param": {"type": "object"},
        },
    ),
)
QC_ANYOF_TOOLS = (
    fn_tool(
        "test_anyof",
        {
            "anyof_int": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": 5},
            "anyof_str": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "anyof_array": {
                "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]
            },
            "anyof_obj": {"anyOf": [{"type": "object"}, {"type": "null"}]},
            "type_as_array": {"type": ["integer", "null"]},
            "multi_non_null": {
                "anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]
            },
        },
    ),
)
QC_SEARCH_TOOLS = (
    fn_tool(
        "search_web",
        {
            "query": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "count": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": 5},
            "verbose": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
        },
    ),
)
QC_MISSING_CLOSE = (
    "Let me check the weather for you:\n<tool_call>\n<function=get_current_weather>\n"
    "<parameter=city>\nDallas\n<parameter=state>\nTX\n</parameter>\n<parameter=unit>\n"
    "fahrenheit\n</parameter>\n</function>\n</tool_call>"
)
QC_NONE_FILTERED_BAD = "<tool_call>\n<function=bad_func_no_gt\n</function>\n</tool_call>"
QC_NO_GT = (
    "<tool_call>\n<function=get_current_weather\n<parameter=city>Dallas</parameter>\n"
    "</function>\n</tool_call>"
)
QWEN3CODER_CASES = [
    qcoder(
        "test_extract_tool_calls_no_tools",
        "This is a test response without any tool calls",
        content="This is a test response without any tool calls",
    ),
    # test_extract_tool_calls and test_extract_tool_calls_streaming (same ids, same outputs
    # but parallel_tools' second unit: celsius in the streaming test)
    qcoder("test_extract_tool_calls[single_tool]", QC_DALLAS, [QC_DALLAS_CALL]),
    qcoder(
        "test_extract_tool_calls[single_tool_with_content]",
        "Sure! Let me check the weather for you." + QC_DALLAS,
        [QC_DALLAS_CALL],
        content="Sure! Let me check the weather for you.",
    ),
    qcoder("test_extract_tool_calls[single_tool_multiline_param]", QC_RECT, [QC_RECT_CALL]),
    qcoder(
        "test_extract_tool_calls[parallel_tools]",
        QC_DALLAS
        + "\n"
        + qc_call(
            "get_current_weather", ("city", "Orlando"), ("state", "FL"), ("unit", "fahrenheit")
        ),
        [
            QC_DALLAS_CALL,
            ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}),
        ],
        content="\n",
    ),
    qcoder(
        "test_extract_tool_calls[tool_with_typed_params]",
        "Let me calculate that area for you." + QC_CIRCLE,
        [QC_CIRCLE_CALL],
        content="Let me calculate that area for you.",
    ),
    qcoder(
        "test_extract_tool_calls_streaming[no_tools]",
        "This is a test without tools",
        content="This is a test without tools",
    ),
    qcoder(
        "test_extract_tool_calls_streaming[parallel_tools]",
        QC_DALLAS
        + "\n"
        + qc_call("get_current_weather", ("city", "Orlando"), ("state", "FL"), ("unit", "celsius")),
        [
            QC_DALLAS_CALL,
            ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "celsius"}),
        ],
        content="\n",
    ),
    # vLLM asserts the name only; the arguments are the block's
    qcoder(
        "test_extract_tool_calls_fallback_no_tags",
        "<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n"
        "<parameter=state>\nTX\n</parameter>\n</function>",
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
    ),
    qcoder(
        "test_extract_tool_calls_type_conversion",
        qc_call(
            "test_types",
            ("int_param", "42"),
            ("float_param", "3.14"),
            ("bool_param", "true"),
            ("str_param", "hello world"),
            ("obj_param", '{"key": "value"}'),
        ),
        [
            (
                "test_types",
                {
                    "int_param": 42,
                    "float_param": 3.14,
                    "bool_param": True,
                    "str_param": "hello world",
                    "obj_param": {"key": "value"},
                },
            )
        ],
        tools=QC_TYPES_TOOLS,
    ),
    qcoder(
        "test_extract_tool_calls_anyof_type_conversion",
        qc_call(
            "test_anyof",
            ("anyof_int", "5"),
            ("anyof_str", "hello"),
            ("anyof_array", '["a", "b", "c"]'),
            ("anyof_obj", '{"key": "value"}'),
            ("type_as_array", "42"),
            ("multi_non_null", "some text"),
        ),
        [
            (
                "test_anyof",
                {
                    "anyof_int": 5,
                    "anyof_str": "hello",
                    "anyof_array": ["a", "b", "c"],
                    "anyof_obj": {"key": "value"},
                    "type_as_array": 42,
                    "multi_non_null": "some text",
                },
            )
        ],
        tools=QC_ANYOF_TOOLS,
    ),
    qcoder(
        "test_extract_tool_calls_anyof_type_conversion_streaming",
        qc_call("search_web", ("query", "vllm tool parser"), ("count", "10"), ("verbose", "true")),
        [("search_web", {"query": "vllm tool parser", "count": 10, "verbose": True})],
        tools=QC_SEARCH_TOOLS,
    ),
    # vLLM asserts the content contains the text before the call
    *[
        qcoder(
            i,
            QC_MISSING_CLOSE,
            [QC_DALLAS_CALL],
            content="Let me check the weather for you:\n",
        )
        for i in (
            "test_extract_tool_calls_missing_closing_parameter_tag",
            "test_extract_tool_calls_streaming_missing_closing_tag",
        )
    ],
    qcoder(
        "test_extract_tool_calls_streaming_incremental",
        "I'll check the weather."
        + qc_call("get_current_weather", ("city", "Dallas"), ("state", "TX")),
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
        content="I'll check the weather.",
    ),
    qcoder(  # vLLM asserts the content contains the text before the call
        "test_extract_tool_calls_streaming_missing_opening_tag",
        "I'll check the weather for you.\n\n<function=get_current_weather>\n<parameter=city>\n"
        "Dallas\n</parameter>\n<parameter=state>\nTX\n</parameter>\n<parameter=unit>\n"
        "fahrenheit\n</parameter>\n</function>\n</tool_call>",
        [QC_DALLAS_CALL],
        content="I'll check the weather for you.\n\n\n",
    ),
    # vLLM asserts no crash and no None call: the malformed block is content here
    qcoder("test_malformed_xml_no_gt_delimiter", QC_NO_GT, content=QC_NO_GT),
    qcoder(  # vLLM asserts the one valid call; the malformed block is content here
        "test_none_tool_calls_filtered",
        QC_NONE_FILTERED_BAD
        + "\n<tool_call>\n<function=get_current_weather>\n<parameter=city>Dallas</parameter>\n"
        "<parameter=state>TX</parameter>\n</function>\n</tool_call>",
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
        content=QC_NONE_FILTERED_BAD + "\n",
    ),
    qcoder(
        "test_anyof_parameter_not_double_encoded",
        '<tool_call>\n<function=update_record>\n<parameter=data>{"key": "value", "count": 42}'
        "</parameter>\n</function>\n</tool_call>",
        [("update_record", {"data": {"key": "value", "count": 42}})],
        tools=(
            fn_tool("update_record", {"data": {"anyOf": [{"type": "object"}, {"type": "null"}]}}),
        ),
    ),
    qcoder(
        "test_streaming_multi_param_single_chunk",
        "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>"
        "\n<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>"
        "\n</function>\n</tool_call>",
        [QC_DALLAS_CALL],
    ),
    qcoder(
        "test_no_double_serialization_string_args",
        "<tool_call>\n<function=greet>\n<parameter=message>hello world</parameter>\n"
        "</function>\n</tool_call>",
        [("greet", {"message": "hello world"})],
        tools=(fn_tool("greet", {"message": {"type": "string"}}),),
    ),
]


QSHARED = "tests/tool_parsers/test_qwen3_xml_coder_shared.py@00d0a333ba"


def qshared(id, output, calls=(), content="", tools=QC_TOOLS):
    """One case of the shared file, for both parsers it runs (xml and coder)."""
    return [
        Case(f"{id}[{tag}]", QSHARED, name, "", output, tuple(calls), content, tools=tuple(tools))
        for tag, name in (("xml", "qwen3_xml"), ("coder", "qwen3_coder"))
    ]


QS_WEATHER_TOOLS = (fn_tool("get_weather", {"city": {"type": "string"}}),)
QS_TWO = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
    "London\n</parameter>\n</function>\n</tool_call>"
)
QS_PARIS_LONDON = [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "London"})]
QS_PROCESS_TOOLS = (fn_tool("process", {"name": {"type": "string"}, "data": {"type": "object"}}),)
QS_TYPES_TOOLS = QC_TYPES_TOOLS
QS_JINJA_BAD = (
    "<tool_call>\n<function={{ tc.name }}>\n<parameter={{ k }}>\n{{ v }}\n</parameter>\n"
    "</function>\n</tool_call>"
)
QS_WRITE_TOOLS = (
    fn_tool("write_file", {"path": {"type": "string"}, "content": {"type": "string"}}),
)


def qs_one(name: str, key: str, value: str) -> str:
    return (
        f"<tool_call>\n<function={name}>\n<parameter={key}>{value}</parameter>\n"
        "</function>\n</tool_call>"
    )


QSHARED_CASES = [
    *qshared(
        "test_extract_tool_calls_no_tools",
        "This is a test response without any tool calls",
        content="This is a test response without any tool calls",
    ),
    # test_extract_tool_calls and test_extract_tool_calls_streaming (_EXTRACT_CASES)
    *qshared("test_extract_tool_calls[single_tool]", QC_DALLAS, [QC_DALLAS_CALL]),
    *qshared(
        "test_extract_tool_calls[single_tool_with_content]",
        "Sure! Let me check the weather for you." + QC_DALLAS,
        [QC_DALLAS_CALL],
        content="Sure! Let me check the weather for you.",
    ),
    *qshared(
        "test_extract_tool_calls[single_tool_multiline_param]",
        qc_call(
            "calculate_area",
            ("shape", "rectangle"),
            ("dimensions", '{"width": 10,\n "height": 20}'),
            ("precision", "2"),
        ),
        [QC_RECT_CALL],
    ),
    *qshared(
        "test_extract_tool_calls[parallel_tools]",
        QC_DALLAS
        + "\n"
        + qc_call(
            "get_current_weather", ("city", "Orlando"), ("state", "FL"), ("unit", "fahrenheit")
        ),
        [
            QC_DALLAS_CALL,
            ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}),
        ],
        content="\n",
    ),
    *qshared(
        "test_extract_tool_calls[tool_with_typed_params]",
        "Let me calculate that area for you." + QC_CIRCLE,
        [QC_CIRCLE_CALL],
        content="Let me calculate that area for you.",
    ),
    *qshared(
        "test_extract_tool_calls_streaming[no_tools]",
        "This is a test without tools",
        content="This is a test without tools",
    ),
    *qshared(
        "test_extract_tool_calls_fallback_no_tags",
        "<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n"
        "<parameter=state>\nTX\n</parameter>\n</function>",
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
    ),
    *qshared(
        "test_extract_tool_calls_type_conversion",
        qc_call(
            "test_types",
            ("int_param", "42"),
            ("float_param", "3.14"),
            ("bool_param", "true"),
            ("str_param", "hello world"),
            ("obj_param", '{"key": "value"}'),
        ),
        [
            (
                "test_types",
                {
                    "int_param": 42,
                    "float_param": 3.14,
                    "bool_param": True,
                    "str_param": "hello world",
                    "obj_param": {"key": "value"},
                },
            )
        ],
        tools=QS_TYPES_TOOLS,
    ),
    *qshared(
        "test_extract_tool_calls_complex_type_with_single_quote",
        qc_call("test_types", ("obj_param", "{'key': 'value'}")),
        [("test_types", {"obj_param": {"key": "value"}})],
        tools=QS_TYPES_TOOLS,
    ),
    *[
        c
        for i in (
            "test_extract_tool_calls_missing_closing_parameter_tag",
            "test_extract_tool_calls_streaming_missing_closing_tag",
        )
        for c in qshared(
            i, QC_MISSING_CLOSE, [QC_DALLAS_CALL], content="Let me check the weather for you:\n"
        )
    ],
    *qshared(
        "test_extract_tool_calls_streaming_incremental",
        "I'll check the weather."
        + qc_call("get_current_weather", ("city", "Dallas"), ("state", "TX")),
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
        content="I'll check the weather.",
    ),
    *qshared("test_malformed_xml_no_gt_delimiter", QC_NO_GT, content=QC_NO_GT),
    *qshared(  # vLLM asserts the one valid call; the malformed block is content here
        "test_none_tool_calls_filtered",
        QC_NONE_FILTERED_BAD
        + "\n<tool_call>\n<function=get_current_weather>\n<parameter=city>Dallas</parameter>\n"
        "<parameter=state>TX</parameter>\n</function>\n</tool_call>",
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
        content=QC_NONE_FILTERED_BAD + "\n",
    ),
    *qshared(
        "test_streaming_multi_param_single_chunk",
        "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>"
        "\n<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>"
        "\n</function>\n</tool_call>",
        [QC_DALLAS_CALL],
    ),
    *qshared(
        "test_no_double_serialization_string_args",
        qs_one("greet", "message", "hello world"),
        [("greet", {"message": "hello world"})],
        tools=(fn_tool("greet", {"message": {"type": "string"}}),),
    ),
    *qshared(
        "test_extract_tool_calls_streaming_speculative_decode_loss",
        "<tool_call>\n<function=test>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
        "</tool_call>",
        [("test", {"city": "Paris"})],
    ),
    *qshared(
        "test_string_null_value_preserved",
        qs_one("search", "query", "null"),
        [("search", {"query": "null"})],
        tools=(fn_tool("search", {"query": {"type": "string"}}),),
    ),
    *qshared(
        "test_anyof_string_null_keeps_value_as_string",
        qs_one("set_code", "code", "42"),
        [("set_code", {"code": "42"})],
        tools=(fn_tool("set_code", {"code": {"anyOf": [{"type": "string"}, {"type": "null"}]}}),),
    ),
    *qshared(
        "test_anyof_integer_null_parses_as_int",
        qs_one("set_count", "count", "42"),
        [("set_count", {"count": 42})],
        tools=(
            fn_tool("set_count", {"count": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}),
        ),
    ),
    *[
        c
        for i in (
            "test_anyof_object_param_not_double_encoded_nonstreaming",
            "test_anyof_object_param_not_double_encoded_streaming",
        )
        for c in qshared(
            i,
            qs_one("update_record", "data", '{"key": "value", "count": 42}'),
            [("update_record", {"data": {"key": "value", "count": 42}})],
            tools=(
                fn_tool(
                    "update_record", {"data": {"anyOf": [{"type": "object"}, {"type": "null"}]}}
                ),
            ),
        )
    ],
    *[
        c
        for i in (
            "test_double_encoded_object_param_nonstreaming",
            "test_double_encoded_object_param_streaming",
        )
        for c in qshared(
            i,
            "<tool_call>\n<function=process>\n<parameter=name>\nhello\n</parameter>\n"
            "<parameter=data>\n\"{'key': 'value', 'n': 1}\"\n</parameter>\n</function>\n"
            "</tool_call>\n",
            [("process", {"name": "hello", "data": {"key": "value", "n": 1}})],
            content="\n",
            tools=QS_PROCESS_TOOLS,
        )
    ],
    *qshared(
        "test_array_with_json_bool",
        '<tool_call>\n<function=pick>\n<parameter=items>\n["a", "b", 1, true]\n</parameter>\n'
        "</function>\n</tool_call>",
        [("pick", {"items": ["a", "b", 1, True]})],
        tools=(fn_tool("pick", {"items": {"type": "array"}}),),
    ),
    *qshared(
        "test_two_tool_calls_in_one_streaming_chunk",
        QS_TWO,
        QS_PARIS_LONDON,
        content="\n",
        tools=QS_WEATHER_TOOLS,
    ),
    *qshared(
        "test_python_none_value_for_nullable_int",
        qs_one("set_count", "count", "None"),
        [("set_count", {"count": None})],
        tools=(
            fn_tool("set_count", {"count": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}),
        ),
    ),
    *qshared(  # vLLM asserts the trailing text is in the content
        "test_streaming_two_tool_calls_plus_trailing_text_one_delta",
        QS_TWO + "\nAll done!",
        QS_PARIS_LONDON,
        content="\n\nAll done!",
        tools=QS_WEATHER_TOOLS,
    ),
    *qshared(  # vLLM asserts the trailing text is in the content
        "test_streaming_trailing_text_with_final_close_in_same_delta",
        "<tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n</function>"
        "\n</tool_call>\nI hope this helps!",
        [("get_weather", {"city": "Paris"})],
        content="\nI hope this helps!",
        tools=QS_WEATHER_TOOLS,
    ),
    *qshared(  # vLLM asserts the real call only; the phantom block is content here
        "test_jinja_template_phantom_tool_call_is_rejected_nonstreaming",
        QS_JINJA_BAD
        + "\n\n<tool_call>\n<function=write_file>\n<parameter=path>\nout.txt\n</parameter>\n"
        "<parameter=content>\nhello\n</parameter>\n</function>\n</tool_call>",
        [("write_file", {"path": "out.txt", "content": "hello"})],
        content=QS_JINJA_BAD + "\n\n",
        tools=QS_WRITE_TOOLS,
    ),
    *qshared(  # vLLM asserts both texts are in the content
        "test_inline_empty_tool_call_preserves_content_before_real_call",
        "I'll show: <tool_call>example</tool_call>. Now real:\n<tool_call>\n<function=log>\n"
        "<parameter=msg>\nhi\n</parameter>\n</function>\n</tool_call>",
        [("log", {"msg": "hi"})],
        content="I'll show: <tool_call>example</tool_call>. Now real:\n",
        tools=(fn_tool("log", {"msg": {"type": "string"}}),),
    ),
    *[
        c
        for literal in ("null", "None")
        for c in qshared(
            f"test_anyof_string_null_with_null_literal_returns_none ({literal})",
            qs_one("set_value", "optional", literal),
            [("set_value", {"optional": None})],
            tools=(
                fn_tool(
                    "set_value", {"optional": {"anyOf": [{"type": "string"}, {"type": "null"}]}}
                ),
            ),
        )
    ],
]


DSV32 = "tests/tool_parsers/test_deepseekv32_tool_parser.py@00816550e7"
FC_START, FC_END = "<｜DSML｜function_calls>", "</｜DSML｜function_calls>"
INV_START, INV_END = '<｜DSML｜invoke name="', "</｜DSML｜invoke>"
PARAM_START, PARAM_END = '<｜DSML｜parameter name="', "</｜DSML｜parameter>"


def dsv32(id, output, calls=(), content="", tools=()):
    return Case(id, DSV32, "deepseek_v32", "", output, tuple(calls), content, tools=tuple(tools))


def dsml_call(name: str, params: dict[str, str]) -> str:
    """vLLM's build_tool_call: every parameter string="true"."""
    body = "".join(f'{PARAM_START}{k}" string="true">{v}{PARAM_END}' for k, v in params.items())
    return f'{FC_START}\n{INV_START}{name}">\n{body}\n{INV_END}\n{FC_END}'


def dsml(*invokes: tuple[str, list[tuple[str, str, str]]]) -> str:
    """A function_calls block of invokes, each (name, [(key, string attr, value)])."""
    body = "".join(
        f'{INV_START}{name}">\n'
        + "".join(f'{PARAM_START}{k}" string="{a}">{v}{PARAM_END}\n' for k, a, v in params)
        + f"{INV_END}\n"
        for name, params in invokes
    )
    return f"{FC_START}\n{body}{FC_END}"


D32_TOGGLE = (fn_tool("toggle", {"enabled": {"type": "boolean"}, "count": {"type": "integer"}}),)
D32_SCORE = (fn_tool("score", {"value": {"type": "integer"}}),)
D32_TIMER = (
    fn_tool(
        "set_timer",
        {
            "wait": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {"type": {"const": "until"}, "date": {"type": "string"}},
                    },
                    {
                        "type": "object",
                        "properties": {"type": {"const": "for"}, "minutes": {"type": "number"}},
                    },
                ]
            },
            "patches": {
                "oneOf": [{"type": "array", "items": {"type": "object"}}, {"type": "null"}]
            },
        },
    ),
)
D32_TIMER_SIMPLE = (
    fn_tool(
        "set_timer",
        {
            "wait": {"anyOf": [{"type": "object"}, {"type": "null"}]},
            "patches": {
                "oneOf": [{"type": "array", "items": {"type": "object"}}, {"type": "null"}]
            },
        },
    ),
)
D32_WEATHER = (fn_tool("get_weather", {"location": {"type": "string"}}),)
D32_UPDATE = (fn_tool("update", {"tags": {"type": "array"}, "meta": {"type": "object"}}),)
D32_TIMER_ARGS = ("wait", "false", '{"type":"for","minutes":2880}')
D32_PATCHES = ("patches", "false", '[{"op":"replace","path":"/schedule","value":"quiet"}]')
D32_TIMER_CALL = (
    "set_timer",
    {
        "wait": {"type": "for", "minutes": 2880},
        "patches": [{"op": "replace", "path": "/schedule", "value": "quiet"}],
    },
)
D32_AB = dsml(("func_a", [("p", "true", "v1")]), ("func_b", [("q", "true", "v2")]))
D32_AB_CALLS = [("func_a", {"p": "v1"}), ("func_b", {"q": "v2"})]
DEEPSEEK_V32_CASES = [
    dsv32("TestExtractToolCalls.test_no_tool_call", "just some text", content="just some text"),
    dsv32(
        "TestExtractToolCalls.test_single_tool_no_params",
        f'{FC_START}\n{INV_START}get_time">\n{INV_END}\n{FC_END}',
        [("get_time", {})],
    ),
    dsv32(
        "TestExtractToolCalls.test_single_tool_with_params",
        dsml_call("get_weather", {"location": "SF", "date": "2024-01-16"}),
        [("get_weather", {"location": "SF", "date": "2024-01-16"})],
    ),
    dsv32(
        "TestExtractToolCalls.test_content_before_tool_call",
        "Sure, let me check! " + dsml_call("get_weather", {"location": "NYC"}),
        [("get_weather", {"location": "NYC"})],
        content="Sure, let me check! ",
    ),
    dsv32(
        "TestExtractToolCalls.test_no_content_prefix_returns_none",
        dsml_call("get_weather", {"location": "NYC"}),
        [("get_weather", {"location": "NYC"})],
    ),
    dsv32(
        "TestExtractToolCalls.test_multiple_tools",
        dsml(
            ("get_weather", [("location", "true", "SF")]),
            ("get_weather", [("location", "true", "NYC")]),
        ),
        [("get_weather", {"location": "SF"}), ("get_weather", {"location": "NYC"})],
    ),
    *[
        dsv32(
            i,
            dsml(("toggle", [("enabled", "false", "true"), ("count", "false", "42")])),
            [("toggle", {"enabled": True, "count": 42})],
            tools=D32_TOGGLE,
        )
        for i in (
            "TestExtractToolCalls.test_type_conversion_in_non_streaming",
            "TestExtractToolCallsStreaming.test_responses_function_tool_schema_in_streaming",
        )
    ],
    *[
        dsv32(i, dsml(("score", [("value", a, "42")])), [("score", {"value": 42})], tools=D32_SCORE)
        for i, a in (
            ("TestExtractToolCalls.test_string_attr_true_coerced_by_schema", "true"),
            ("TestExtractToolCalls.test_string_attr_false_allows_schema_conversion", "false"),
            (
                "TestExtractToolCallsStreaming.test_string_attr_true_coerced_by_schema_streaming",
                "true",
            ),
        )
    ],
    dsv32(
        "TestExtractToolCalls.test_composed_schema_converts_object_and_array_params",
        dsml(("set_timer", [D32_TIMER_ARGS, D32_PATCHES])),
        [D32_TIMER_CALL],
        tools=D32_TIMER,
    ),
    dsv32(
        "TestExtractToolCallsStreaming.test_composed_schema_conversion_in_streaming",
        dsml(("set_timer", [D32_TIMER_ARGS, D32_PATCHES])),
        [D32_TIMER_CALL],
        tools=D32_TIMER_SIMPLE,
    ),
    dsv32(
        "TestExtractToolCalls.test_string_attr_true_coerced_by_composed_schema",
        dsml(("set_timer", [("wait", "true", '{"type":"for","minutes":2880}')])),
        [("set_timer", {"wait": {"type": "for", "minutes": 2880}})],
        tools=(fn_tool("set_timer", {"wait": {"anyOf": [{"type": "object"}, {"type": "null"}]}}),),
    ),
    *[
        dsv32(
            f"TestExtractToolCalls.test_{key}_wrapper_repaired",
            dsml(("get_weather", [(key, a, '{"location":"Beijing"}')])),
            [("get_weather", {"location": "Beijing"})],
            tools=D32_WEATHER,
        )
        for key, a in (("arguments", "false"), ("input", "true"))
    ],
    *[
        dsv32(
            i,
            dsml(("update", [("tags", "false", '["a", "b"]'), ("meta", "false", '{"k": 1}')])),
            [("update", {"tags": ["a", "b"], "meta": {"k": 1}})],
            tools=D32_UPDATE,
        )
        for i in (
            "TestExtractToolCalls.test_object_and_array_params",
            "TestExtractToolCallsStreaming.test_object_and_array_params_streaming",
        )
    ],
    dsv32(
        "TestExtractToolCalls.test_number_param",
        dsml(("measure", [("ratio", "false", "3.14"), ("whole", "false", "5.0")])),
        [("measure", {"ratio": 3.14, "whole": 5})],
        tools=(fn_tool("measure", {"ratio": {"type": "number"}, "whole": {"type": "number"}}),),
    ),
    dsv32(
        "TestExtractToolCalls.test_multi_typed_schema",
        dsml(("set_val", [("count", "false", "42"), ("label", "false", "hello")])),
        [("set_val", {"count": 42, "label": "hello"})],
        tools=(
            fn_tool(
                "set_val",
                {"count": {"type": ["integer", "null"]}, "label": {"type": ["string", "null"]}},
            ),
        ),
    ),
    *[
        dsv32(
            i,
            dsml(("clear", [("value", "false", "null")])),
            [("clear", {"value": None})],
            tools=(fn_tool("clear", {"value": {"type": ["integer", "null"]}}),),
        )
        for i in (
            "TestExtractToolCalls.test_multi_typed_null_value",
            "TestExtractToolCallsStreaming.test_multi_typed_null_streaming",
        )
    ],
    dsv32(
        "TestExtractToolCalls.test_null_coerced_back_to_string_by_schema",
        dsml(("echo", [("text", "false", "null")])),
        [("echo", {"text": "null"})],
        tools=(fn_tool("echo", {"text": {"type": "string"}}),),
    ),
    dsv32(
        "TestExtractToolCalls.test_no_schema_parses_json",
        dsml(("unknown_fn", [("count", "false", "42"), ("flag", "false", "true")])),
        [("unknown_fn", {"count": 42, "flag": True})],
    ),
    dsv32(
        "TestExtractToolCallsStreaming.test_plain_content_no_tool",
        "Hello, world!",
        content="Hello, world!",
    ),
    *[
        dsv32(i, dsml_call(n, a), [(n, a)])
        for i, n, a in (
            (
                "TestExtractToolCallsStreaming.test_single_tool_streaming",
                "get_weather",
                {"location": "SF"},
            ),
            ("TestExtractToolCallsStreaming.test_tool_name_emitted", "my_func", {"x": "1"}),
            ("TestExtractToolCallsStreaming.test_state_reset_on_new_stream", "fn", {"k": "v"}),
            (
                "TestExtractToolCallsStreaming.test_streaming_matches_non_streaming",
                "get_weather",
                {"location": "SF", "date": "2024-01-16"},
            ),
            (
                "TestExtractToolCallsStreaming.test_single_tool_chunked_stream_interval",
                "get_weather",
                {"location": "SF"},
            ),
            ("TestExtractToolCallsStreaming.test_no_marker_leak_chunked", "fn", {"k": "v"}),
            ("TestExtractToolCallsStreaming.test_no_marker_leak_char_by_char", "fn", {"k": "v"}),
            (
                "TestExtractToolCallsStreaming.test_no_marker_leak_all_split_points",
                "fn",
                {"k": "v"},
            ),
        )
    ],
    *[
        dsv32(
            i,
            "Thinking... " + dsml_call("fn", {"a": "b"}),
            [("fn", {"a": "b"})],
            content="Thinking... ",
        )
        for i in (
            "TestExtractToolCallsStreaming.test_content_before_tool_call_streaming",
            "TestExtractToolCallsStreaming.test_content_before_tool_chunked",
        )
    ],
    dsv32(
        "TestExtractToolCallsStreaming.test_type_conversion_in_streaming",
        dsml(("add", [("x", "false", "3"), ("y", "false", "4")])),
        [("add", {"x": 3, "y": 4})],
        tools=(fn_tool("add", {"x": {"type": "integer"}, "y": {"type": "integer"}}),),
    ),
    dsv32(
        "TestExtractToolCallsStreaming.test_streaming_matches_non_streaming_conversion_fallbacks",
        dsml(
            (
                "coerce",
                [
                    ("union_value", "false", "hello"),
                    ("bad_int", "false", "abc"),
                    ("nullable_string", "false", "null"),
                    ("null_string", "false", "null"),
                    ("whole_number", "false", "3.0"),
                ],
            )
        ),
        [
            (
                "coerce",
                {
                    "union_value": "hello",
                    "bad_int": "abc",
                    "nullable_string": None,
                    "null_string": "null",
                    "whole_number": 3,
                },
            )
        ],
        tools=(
            fn_tool(
                "coerce",
                {
                    "union_value": {"type": ["null", "string"]},
                    "bad_int": {"type": "integer"},
                    "nullable_string": {"type": ["null", "string"]},
                    "null_string": {"type": "string"},
                    "whole_number": {"type": "number"},
                },
            ),
        ),
    ),
    *[
        dsv32(i, D32_AB, D32_AB_CALLS)
        for i in (
            "TestExtractToolCallsStreaming.test_multiple_tools_streaming",
            "TestExtractToolCallsStreaming.test_multiple_tools_chunked",
        )
    ],
    dsv32(
        "TestExtractToolCallsStreaming.test_unique_tool_call_ids",
        dsml(("fn_a", [("x", "true", "1")]), ("fn_b", [("y", "true", "2")])),
        [("fn_a", {"x": "1"}), ("fn_b", {"y": "2"})],
    ),
    dsv32(
        "TestExtractToolCallsStreaming.test_long_string_argument_streams_before_close",
        dsml(("emit", [("text", "true", "A" * 4096)])),
        [("emit", {"text": "A" * 4096})],
        tools=(fn_tool("emit", {"text": {"type": "string"}}),),
    ),
    dsv32(
        "TestExtractToolCallsStreaming.test_no_marker_leak_with_prefix_chunked",
        "Hello!" + dsml_call("fn", {"a": "b"}),
        [("fn", {"a": "b"})],
        content="Hello!",
    ),
    dsv32(
        "TestExtractToolCallsStreaming.test_false_partial_marker_emitted",
        "<｜DSM some regular text",
        content="<｜DSM some regular text",
    ),
    dsv32(
        "TestExtractToolCallsStreaming.test_multi_typed_schema_streaming",
        dsml(("set_val", [("count", "false", "42")])),
        [("set_val", {"count": 42})],
        tools=(fn_tool("set_val", {"count": {"type": ["integer", "null"]}}),),
    ),
    dsv32(
        "TestExtractToolCallsStreaming.test_number_param_streaming",
        dsml(("measure", [("ratio", "false", "3.14")])),
        [("measure", {"ratio": 3.14})],
        tools=(fn_tool("measure", {"ratio": {"type": "number"}}),),
    ),
    dsv32(
        "TestDelimiterPreservation.test_delimiter_preserved_fast_detokenization",
        dsml(("get_weather", [("location", "true", "Tokyo")])),
        [("get_weather", {"location": "Tokyo"})],
    ),
    dsv32(
        "TestDelimiterPreservation.test_delimiter_preserved_fast_detokenization (prefixed)",
        "Here is the weather: " + dsml(("get_weather", [("location", "true", "Tokyo")])),
        [("get_weather", {"location": "Tokyo"})],
        content="Here is the weather: ",
    ),
    dsv32(
        "TestDelimiterPreservation.test_tool_detection_skip_special_tokens_false",
        dsml_call("search", {"query": "vllm documentation"}),
        [("search", {"query": "vllm documentation"})],
        tools=(fn_tool("search", {"query": {"type": "string"}}),),
    ),
]


HUNYUAN = "tests/tool_parsers/test_hunyuan_a13b_tool_parser.py@10a6751520"


def hunyuan(id, output, calls=(), content=""):
    return Case(id, HUNYUAN, "hunyuan_a13b", "", output, tuple(calls), content)


def hy_block(*calls: tuple[str, dict]) -> str:
    return (
        "<tool_calls>"
        + json.dumps([{"name": n, "arguments": a} for n, a in calls])
        + "</tool_calls>"
    )


HY_SF = ("get_weather", {"city": "San Francisco", "metric": "celsius"})
HY_BOSTON = ("get_weather", {"city": "Boston"})
HY_COMPLEX = ("complex_tool", {"level1": {"level2": {"level3": {"value": 123}}}})
HUNYUAN_CASES = [
    hunyuan(
        "test_hunyuan_a13b_tool_parser_extract[no_tool_call]",
        "How can I help you today?",
        content="How can I help you today?",
    ),
    hunyuan("test_hunyuan_a13b_tool_parser_extract[single]", hy_block(HY_SF), [HY_SF]),
    hunyuan(
        "test_hunyuan_a13b_tool_parser_extract[multiple]",
        hy_block(HY_SF, PY_MORE_CALL),
        [HY_SF, PY_MORE_CALL],
    ),
    hunyuan(
        "test_hunyuan_a13b_tool_parser_extract[content_before]",
        "I will call the tool now. " + hy_block(HY_BOSTON),
        [HY_BOSTON],
        content="I will call the tool now. ",
    ),
    hunyuan("test_hunyuan_a13b_tool_parser_extract[complex]", hy_block(HY_COMPLEX), [HY_COMPLEX]),
    hunyuan("test_hunyuan_a13b_tool_parser_streaming[0]", hy_block(HY_SF), [HY_SF]),
    hunyuan("test_hunyuan_a13b_tool_parser_streaming[1]", hy_block(HY_BOSTON), [HY_BOSTON]),
    # vLLM's streaming test checks the calls only; the trailing text is content here
    hunyuan(
        "test_hunyuan_a13b_tool_parser_streaming[2]",
        hy_block(HY_BOSTON) + "\n</answer>",
        [HY_BOSTON],
        content="\n</answer>",
    ),
    hunyuan(
        "test_hunyuan_a13b_tool_parser_streaming[3] (xfail there)",
        hy_block(HY_COMPLEX),
        [HY_COMPLEX],
    ),
    hunyuan(
        "test_hunyuan_a13b_tool_parser_non_ascii",
        hy_block(("get_weather", {"city": "北京"})),
        [("get_weather", {"city": "北京"})],
    ),
    hunyuan(
        "test_hunyuan_a13b_tool_parser_streaming_one_empty_args_tool[first]",
        hy_block(("a", {}), ("b", {"x": 42})),
        [("a", {}), ("b", {"x": 42})],
    ),
    hunyuan(
        "test_hunyuan_a13b_tool_parser_streaming_one_empty_args_tool[last]",
        hy_block(("a", {"x": 42}), ("b", {})),
        [("a", {"x": 42}), ("b", {})],
    ),
]


FUNCTIONGEMMA = "tests/tool_parsers/test_functiongemma_tool_parser.py@26c3628ca8"


def fgemma(id, output, calls=(), content=""):
    return Case(id, FUNCTIONGEMMA, "functiongemma", "", output, tuple(calls), content)


def fg(body: str) -> str:
    return f"<start_function_call>call:{body}<end_function_call>"


ESC = "<escape>"
FUNCTIONGEMMA_CASES = [
    fgemma(
        "TestExtractToolCalls.test_no_tool_calls",
        "Hello, how can I help you today?",
        content="Hello, how can I help you today?",
    ),
    fgemma(
        "TestExtractToolCalls.test_single_tool_call",
        fg(f"get_weather{{location:{ESC}London{ESC}}}"),
        [("get_weather", {"location": "London"})],
    ),
    fgemma(
        "TestExtractToolCalls.test_multiple_arguments",
        fg(f"get_weather{{location:{ESC}San Francisco{ESC},unit:{ESC}celsius{ESC}}}"),
        [("get_weather", {"location": "San Francisco", "unit": "celsius"})],
    ),
    fgemma(
        "TestExtractToolCalls.test_text_before_tool_call",
        "Let me check the weather for you. " + fg(f"get_weather{{location:{ESC}Paris{ESC}}}"),
        [("get_weather", {"location": "Paris"})],
        content="Let me check the weather for you.",
    ),
    fgemma(
        "TestExtractToolCalls.test_multiple_tool_calls",
        fg(f"get_weather{{location:{ESC}London{ESC}}}") + fg(f"get_time{{timezone:{ESC}UTC{ESC}}}"),
        [("get_weather", {"location": "London"}), ("get_time", {"timezone": "UTC"})],
    ),
    # TestParseArguments: the argument reader's cases, each as the one call f{ARGS}
    *[
        fgemma(f"TestParseArguments.{i}", fg(f"f{{{a}}}"), [("f", want)])
        for i, a, want in [
            ("test_empty_arguments", "", {}),
            ("test_single_string_argument", f"city:{ESC}Tokyo{ESC}", {"city": "Tokyo"}),
            (
                "test_multiple_arguments",
                f"city:{ESC}Tokyo{ESC},country:{ESC}Japan{ESC}",
                {"city": "Tokyo", "country": "Japan"},
            ),
            ("test_numeric_argument", f"count:{ESC}42{ESC}", {"count": 42}),
            ("test_boolean_argument", f"enabled:{ESC}true{ESC}", {"enabled": True}),
            (
                "test_argument_with_spaces",
                f"message:{ESC}Hello World{ESC}",
                {"message": "Hello World"},
            ),
        ]
    ],
    fgemma(
        "TestExtractToolCallsStreaming.test_streamed_arguments_form_valid_json_with_two_keys",
        fg(f"get_weather{{city:{ESC}NYC{ESC}unit:{ESC}celsius{ESC}}}"),
        [("get_weather", {"city": "NYC", "unit": "celsius"})],
    ),
    fgemma(
        "TestExtractToolCallsStreaming.test_streamed_arguments_form_valid_json_with_three_keys",
        fg(f"search{{query:{ESC}python{ESC}limit:{ESC}10{ESC}sort:{ESC}relevance{ESC}}}"),
        [("search", {"query": "python", "limit": 10, "sort": "relevance"})],
    ),
]


MINIMAX_M2 = "tests/tool_parsers/test_minimax_m2_tool_parser.py@0c927c3451"


def minimax(id, output, calls=(), content="", tools=()):
    return Case(id, MINIMAX_M2, "minimax_m2", "", output, tuple(calls), content, tools=tuple(tools))


def mm_invoke(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f'<parameter name="{k}">{v}</parameter>' for k, v in params)
    return f'<invoke name="{name}">{body}</invoke>'


def mm(*invokes: str) -> str:
    return "<minimax:tool_call>" + "".join(invokes) + "</minimax:tool_call>"


MM_SEATTLE = mm_invoke("get_weather", ("city", "Seattle"))
MM_PROFILE = (
    fn_tool("update_profile", {"nickname": {"anyOf": [{"type": "string"}, {"type": "null"}]}}),
)
MINIMAX_M2_CASES = [
    minimax("TestContentStreaming.test_plain_content", "Hello world", content="Hello world"),
    minimax(
        "TestContentStreaming.test_content_before_tool_call",
        "Let me check. " + mm(MM_SEATTLE),
        [("get_weather", {"city": "Seattle"})],
        content="Let me check. ",
    ),
    *[
        minimax(i, mm(MM_SEATTLE), [("get_weather", {"city": "Seattle"})])
        for i in (
            "TestSingleInvoke.test_incremental_chunks",
            "TestSingleInvoke.test_single_chunk_complete",
        )
    ],
    *[
        minimax(
            i,
            mm(mm_invoke("get_weather", ("city", "Seattle"), ("days", "5"))),
            [("get_weather", {"city": "Seattle", "days": "5"})],
        )
        for i in (
            "TestSingleInvoke.test_multiple_params",
            "TestLargeChunks.test_header_and_params_in_separate_chunks",
        )
    ],
    minimax(
        "TestMultipleInvokes.test_two_invokes_incremental",
        mm(
            mm_invoke("search_web", ("query", "OpenAI")),
            mm_invoke("search_web", ("query", "Gemini")),
        ),
        [("search_web", {"query": "OpenAI"}), ("search_web", {"query": "Gemini"})],
    ),
    minimax(
        "TestMultipleInvokes.test_two_invokes_in_single_delta",
        mm(mm_invoke("fn_a", ("x", "1")), mm_invoke("fn_b", ("y", "2"))),
        [("fn_a", {"x": "1"}), ("fn_b", {"y": "2"})],
    ),
    minimax(
        "TestMultipleInvokes.test_different_functions",
        mm(mm_invoke("get_weather", ("city", "NYC")), mm_invoke("get_stock", ("ticker", "AAPL"))),
        [("get_weather", {"city": "NYC"}), ("get_stock", {"ticker": "AAPL"})],
    ),
    minimax(
        "TestInternalState.test_prev_tool_call_arr_single",
        mm(mm_invoke("fn", ("a", "1"))),
        [("fn", {"a": "1"})],
    ),
    minimax(
        "TestInternalState.test_prev_tool_call_arr_multiple",
        mm(mm_invoke("search", ("q", "hello")), mm_invoke("search", ("q", "world"))),
        [("search", {"q": "hello"}), ("search", {"q": "world"})],
    ),
    minimax(
        "TestDeltaMessageFormat.test_tool_call_fields",
        mm(mm_invoke("fn", ("k", "v"))),
        [("fn", {"k": "v"})],
    ),
    minimax(
        "TestDeltaMessageFormat.test_multi_invoke_indices",
        mm(mm_invoke("a", ("x", "1")), mm_invoke("b", ("x", "2"))),
        [("a", {"x": "1"}), ("b", {"x": "2"})],
    ),
    minimax(
        "TestEOSHandling.test_eos_after_tool_calls",
        mm(mm_invoke("fn", ("k", "v"))),
        [("fn", {"k": "v"})],
    ),
    # the end marker as a special token: the block ends with the output
    minimax(
        "TestEOSHandling.test_end_token_ignored",
        "<minimax:tool_call>" + mm_invoke("fn", ("k", "v")),
        [("fn", {"k": "v"})],
    ),
    minimax(
        "TestAnyOfNullableParam.test_anyof_nullable_param_non_null_value",
        mm(mm_invoke("update_profile", ("nickname", "Alice"))),
        [("update_profile", {"nickname": "Alice"})],
        tools=MM_PROFILE,
    ),
    minimax(
        "TestAnyOfNullableParam.test_anyof_nullable_param_null_value",
        mm(mm_invoke("update_profile", ("nickname", "null"))),
        [("update_profile", {"nickname": None})],
        tools=MM_PROFILE,
    ),
    minimax(
        "TestAnyOfNullableParam.test_anyof_nullable_param_object_value",
        mm(mm_invoke("update_settings", ("config", '{"theme": "dark", "fontSize": 14}'))),
        [("update_settings", {"config": {"theme": "dark", "fontSize": 14}})],
        tools=(
            fn_tool(
                "update_settings", {"config": {"anyOf": [{"type": "object"}, {"type": "null"}]}}
            ),
        ),
    ),
]


GRANITE_T = "tests/tool_parsers/test_granite_tool_parser.py@2ab4733ef9"


def granite(id, output, calls=(), content=""):
    return Case(id, GRANITE_T, "granite", "", output, tuple(calls), content)


GR_TOKYO = '<|tool_call|> [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]'
GR_VARIOUS = {
    "string_field": "hello",
    "int_field": 42,
    "float_field": 3.14,
    "bool_field": True,
    "null_field": None,
    "array_field": ["a", "b", "c"],
    "object_field": {"nested": "value"},
    "empty_array": [],
    "empty_object": {},
}
GR_ESCAPED = {
    "quoted": 'He said "hello"',
    "path": "C:\\Users\\file.txt",
    "newline": "line1\nline2",
    "unicode": "emoji: 🎉",
}
GRANITE_CASES = [
    # common_tests.py ToolParserTests, with this file's config (content checked where set)
    granite(
        "test_no_tool_calls",
        "This is a regular response without any tool calls.",
        content="This is a regular response without any tool calls.",
    ),
    *[
        granite(i, GR_TOKYO, [("get_weather", {"city": "Tokyo"})])
        for i in (
            "test_single_tool_call_simple_args",
            "test_streaming_reconstruction",
            "test_granite_token_prefix_format",
        )
    ],
    granite(
        "test_parallel_tool_calls",
        '<|tool_call|> [\n  {"name": "get_weather", "arguments": {"city": "Tokyo"}},\n'
        '  {"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}\n]',
        [("get_weather", {"city": "Tokyo"}), ("get_time", {"timezone": "Asia/Tokyo"})],
    ),
    granite(
        "test_various_data_types",
        "<tool_call> " + PHI4_VARIOUS.removeprefix("functools"),  # the same JSON text there
        [("test_function", GR_VARIOUS)],
    ),
    granite(
        "test_empty_arguments",
        '<|tool_call|> [{"name": "refresh", "arguments": {}}]',
        [("refresh", {})],
    ),
    # xfail there in both modes; the text after the list is left out here too
    granite(
        "test_surrounding_text",
        'Let me check the weather for you.\n<|tool_call|> [{"name": "get_weather", '
        '"arguments": {"city": "Tokyo"}}]\nI\'ll get that information.',
        [("get_weather", {"city": "Tokyo"})],
        content="Let me check the weather for you.\n",
    ),
    granite(
        "test_escaped_strings",
        "<tool_call> " + PHI4_ESCAPED.removeprefix("functools"),
        [("test_function", GR_ESCAPED)],
    ),
    # vLLM asserts only that these do not raise; here they are content (the cut-off one is
    # never announced on the stream: its arguments show no first key)
    *[
        granite(f"test_malformed_input[{i}]", text, content=text)
        for i, text in enumerate(
            [
                '<|tool_call|> [{"name": "func", "arguments": {',
                '<|tool_call|> {"name": "func", "arguments": {}}',
                '[{"name": "func", "arguments": "not a dict"}]',
                'Some text [{"name": "func"}]',
            ]
        )
    ],
    granite(
        "test_granite_string_prefix_format",
        '<tool_call> [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]',
        [("get_weather", {"city": "Tokyo"})],
    ),
    granite(
        "test_streaming_parallel_calls_batched_deltas",
        '<|tool_call|> [{"arguments": {"city": "Tokyo"}, "name": "get_weather"}, '
        '{"arguments": {"timezone": "Asia/Tokyo"}, "name": "get_time"}]',
        [("get_weather", {"city": "Tokyo"}), ("get_time", {"timezone": "Asia/Tokyo"})],
    ),
    granite(
        "test_streaming_parallel_calls_single_delta",
        '<|tool_call|>[{"name": "get_weather", "arguments": {"x": 42}}, '
        '{"name": "b", "arguments": {"y": 7}}]',
        [("get_weather", {"x": 42}), ("b", {"y": 7})],
    ),
]


GRANITE4_T = "tests/tool_parsers/test_granite4_tool_parser.py@34f830e958"
G4_COORD = {"coordinates": [[23.54, 43.1], [-12.2, 54.3], [4, 5]], "coordinate_type": "latlong"}
G4_STOCK = {"symbol": "AAPL", "start_date": "2021-01-01", "end_date": "2021-12-31"}
G4_TEXTS = [
    "Here goes the bbox call: \n",
    " Now the stock price call: \n ",
    " Now another bbox call: \n ",
    " See? I'm a helpful assistant.",
]
G4_COMPLEX = (
    G4_TEXTS[0]
    + "<tool_call> "
    + json.dumps({"name": "find_bbox", "arguments": json.dumps(G4_COORD)})
    + " </tool_call>"
    + G4_TEXTS[1]
    + "<tool_call> "
    + json.dumps({"name": "get_stock_price", "arguments": G4_STOCK})
    + " </tool_call>"
    + G4_TEXTS[2]
    + "<tool_call> "
    + json.dumps({"name": "find_bbox", "arguments": json.dumps(G4_COORD)})
    + " </tool_call>"
    + G4_TEXTS[3]
)
GRANITE4_FILE_CASES = [
    Case(
        "test_tool_call_parser_complex",
        GRANITE4_T,
        "granite4",
        "",
        G4_COMPLEX,
        (("find_bbox", G4_COORD), ("get_stock_price", G4_STOCK), ("find_bbox", G4_COORD)),
        "".join(G4_TEXTS),
        ids=every("test_tool_call_parser_complex", "1-1", "1-2", "5-7", "6-20"),
    ),
    Case(  # vLLM asserts "some explanation" is in the content
        "test_streaming_preserves_content_between_complete_tool_calls",
        GRANITE4_T,
        "granite4",
        "",
        '<tool_call> {"name": "find_bbox", "arguments": {}} </tool_call>some explanation '
        '<tool_call> {"name": "get_stock_price", "arguments": {}} </tool_call>',
        (("find_bbox", {}), ("get_stock_price", {})),
        "some explanation ",
        ids=("test_streaming_preserves_content_between_complete_tool_calls",),
    ),
]


ERNIE45 = "tests/tool_parsers/test_ernie45_moe_tool_parser.py@0a26f84cc2"
ER_BEIJING = (
    '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": "Beijing"}}'
    "\n</tool_call>\n"
)
ER_GZ = (
    '<tool_call>\n{"name": "get_temperature_unit", "arguments": {"location": "Guangzhou", '
    '"unit": "c"}}\n</tool_call>\n'
)
ER_CALLS = [
    ("get_current_temperature", {"location": "Beijing"}),
    ("get_temperature_unit", {"location": "Guangzhou", "unit": "c"}),
]
ER_BEFORE = "I need to call two tools to handle these two issues separately.\n</think>"
ERNIE45_CASES = [
    Case(
        "test_extract_tool_calls_no_tools",
        ERNIE45,
        "ernie45",
        "",
        "This is a test",
        (),
        "This is a test",
    ),
    *[
        c
        for kind in ("test_extract_tool_calls", "test_extract_tool_calls_streaming_incremental")
        for c in (
            Case(
                f"{kind}[single_tool_call]", ERNIE45, "ernie45", "", ER_BEIJING, tuple(ER_CALLS[:1])
            ),
            Case(
                f"{kind}[multiple_tool_calls]",
                ERNIE45,
                "ernie45",
                "",
                ER_BEIJING + ER_GZ,
                tuple(ER_CALLS),
            ),
            Case(
                f"{kind}[tool_call_with_content_before]",
                ERNIE45,
                "ernie45",
                "",
                ER_BEFORE + "\n\n" + ER_BEIJING + ER_GZ,
                tuple(ER_CALLS),
                ER_BEFORE,
            ),
        )
    ],
]


GLM47 = "tests/tool_parsers/test_glm47_moe_tool_parser.py@0ce879769d"
GLM47_TOOLS = (
    {"type": "function", "function": {"name": "get_current_date", "parameters": {}}},
    fn_tool("get_weather", {"city": {"type": "string"}, "date": {"type": "string"}}),
)


def glm47(id, output, calls=(), content=""):
    return Case(id, GLM47, "glm47", "", output, tuple(calls), content, tools=GLM47_TOOLS)


G47_DATE = "<tool_call>get_current_date</tool_call>"
G47_BEIJING = (
    "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value></tool_call>"
)
GLM47_CASES = [
    glm47(
        "TestGlm47ExtractToolCalls.test_no_tool_call",
        "This is a plain response.",
        content="This is a plain response.",
    ),
    *[
        glm47(f"TestGlm47ExtractToolCalls.{i}", G47_DATE, [("get_current_date", {})])
        for i in ("test_zero_arg_inline", "test_empty_content_none")
    ],
    glm47(
        "TestGlm47ExtractToolCalls.test_zero_arg_newline",
        "<tool_call>get_current_date\n</tool_call>",
        [("get_current_date", {})],
    ),
    glm47(
        "TestGlm47ExtractToolCalls.test_args_same_line",
        G47_BEIJING,
        [("get_weather", {"city": "Beijing"})],
    ),
    glm47(
        "TestGlm47ExtractToolCalls.test_args_with_newlines",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n</tool_call>",
        [("get_weather", {"city": "Beijing"})],
    ),
    glm47(
        "TestGlm47ExtractToolCalls.test_content_before",
        "Checking." + G47_DATE,
        [("get_current_date", {})],
        content="Checking.",
    ),
    glm47(
        "TestGlm47ExtractToolCalls.test_multiple",
        G47_BEIJING + "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Shanghai</arg_value>"
        "</tool_call>",
        [("get_weather", {"city": "Beijing"}), ("get_weather", {"city": "Shanghai"})],
    ),
    glm47(
        "TestGlm47ExtractToolCalls.test_whitespace_content_none",
        "  \n  " + G47_DATE,
        [("get_current_date", {})],
    ),
    glm47("TestGlm47Streaming.test_no_args", G47_DATE, [("get_current_date", {})]),
    glm47(
        "TestGlm47Streaming.test_with_args",
        "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Beijing</arg_value></tool_call>",
        [("get_weather", {"city": "Beijing"})],
    ),
    *[
        glm47(f"TestGlm47Streaming.{i}", G47_BEIJING, [("get_weather", {"city": "Beijing"})])
        for i in (
            "test_delays_prefix_only_tool_name_until_exact_match",
            "test_delays_prefix_only_tool_name_with_function_tools",
        )
    ],
]


GLM45_TOOLS = (fn_tool("get_weather", {"city": {"type": "string"}}),)


def glm4(id, output, calls=(), content="", tools=GLM45_TOOLS):
    return Case(id, GLM45, "glm45", "", output, tuple(calls), content, tools=tuple(tools))


G4M_BEIJING = (
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n</tool_call>"
)
G4M_BJ = "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Beijing</arg_value></tool_call>"
G4M_SH = (
    "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Shanghai</arg_value></tool_call>"
)
G4M_CALC_TOOLS = (
    fn_tool(
        "calculate",
        {"operation": {"type": "string"}, "a": {"type": "number"}, "b": {"type": "number"}},
    ),
)
G4M_FN_TOOLS = (
    fn_tool("get_weather", {"city": {"type": "string"}, "unit": {"type": "string"}}),
    *G4M_CALC_TOOLS,
)
G4M_BUBBLE = (
    '#!/usr/bin/env python3\n# -*- coding: utf-8 -*-\n"""\nBubble Sort Implementation\n"""\n\n'
    "def bubble_sort(arr):\n    n = len(arr)\n    for i in range(n):\n        swapped = False\n"
    "        for j in range(0, n - i - 1):\n            if arr[j] > arr[j + 1]:\n"
    "                arr[j], arr[j + 1] = arr[j + 1], arr[j]\n                swapped = True\n"
    "        if not swapped:\n            break\n    return arr\n\n"
    'if __name__ == "__main__":\n    test_arr = [64, 34, 25, 12, 22, 11, 90]\n'
    '    print(f"Original: {test_arr}")\n    sorted_arr = bubble_sort(test_arr.copy())\n'
    '    print(f"Sorted: {sorted_arr}")'
)
GLM4_MORE_CASES = [
    glm4(
        "test_extract_tool_calls_with_thinking_tags",
        "<think>I want to get the weather.</think>\n\nI will help you get the weather.\n"
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
        "<arg_key>date</arg_key>\n<arg_value>2025-08-01</arg_value>\n</tool_call>",
        [("get_weather", {"city": "Beijing", "date": "2025-08-01"})],
        content="<think>I want to get the weather.</think>\n\nI will help you get the weather.\n",
    ),
    *[
        glm4(i, G4M_BEIJING, [("get_weather", {"city": "Beijing"})])
        for i in ("test_streaming_basic_functionality", "test_streaming_prev_tool_call_arr_updates")
    ],
    glm4(
        "test_streaming_no_tool_calls",
        "This is just regular text without any tool calls.",
        content="This is just regular text without any tool calls.",
    ),
    # vLLM's streaming test checks the content streamed before the (unfinished) block; the
    # block, cut off at the end, holds no call and comes back as content here
    glm4(
        "test_streaming_with_content_before_tool_calls",
        "I will help you get the weather.<tool_call>",
        content="I will help you get the weather.<tool_call>",
    ),
    glm4(
        "test_streaming_incremental_string_value",
        "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Beijing</arg_value></tool_call>",
        [("get_weather", {"city": "Beijing"})],
    ),
    # vLLM asserts that it does not hang: no call, content here
    glm4(
        "test_streaming_empty_tool_call",
        "<tool_call></tool_call>",
        content="<tool_call></tool_call>",
    ),
    *[
        glm4(
            i,
            G4M_BJ + G4M_SH,
            [("get_weather", {"city": "Beijing"}), ("get_weather", {"city": "Shanghai"})],
        )
        for i in (
            "test_streaming_multiple_tool_calls_sequential",
            "test_stream_interval_multiple_tool_calls",
        )
    ],
    glm4(
        "test_streaming_json_escape_in_string",
        '<tool_call>send_message\n<arg_key>message</arg_key><arg_value>Hello "world"\nNew line'
        "</arg_value></tool_call>",
        [("send_message", {"message": 'Hello "world"\nNew line'})],
    ),
    glm4(
        "test_streaming_long_content_incremental",
        "<tool_call>write_to_file\n<arg_key>file_path</arg_key><arg_value>/tmp/bubble_sort.py"
        "</arg_value><arg_key>content</arg_key><arg_value>"
        + G4M_BUBBLE
        + "\n</arg_value></tool_call>",
        [("write_to_file", {"file_path": "/tmp/bubble_sort.py", "content": G4M_BUBBLE + "\n"})],
        tools=(
            fn_tool(
                "write_to_file", {"file_path": {"type": "string"}, "content": {"type": "string"}}
            ),
        ),
    ),
    glm4(
        "test_extract_tool_calls_numeric_deserialization",
        "<tool_call>calculate\n<arg_key>operation</arg_key>\n<arg_value>add</arg_value>\n"
        "<arg_key>a</arg_key>\n<arg_value>42</arg_value>\n<arg_key>b</arg_key>\n<arg_value>3.14"
        "</arg_value>\n<arg_key>enabled</arg_key>\n<arg_value>true</arg_value>\n</tool_call>",
        [("calculate", {"operation": "add", "a": 42, "b": 3.14, "enabled": True})],
    ),
    glm4(
        "test_whitespace_preserved_in_arg_values",
        "<tool_call>apply_diff\n<arg_key>s</arg_key>\n"
        "<arg_value>    indented code    </arg_value>\n"
        "</tool_call>",
        [("apply_diff", {"s": "    indented code    "})],
        tools=(fn_tool("apply_diff", {"s": {"type": "string"}}, required=["s"]),),
    ),
    glm4("test_zero_argument_tool_call", "<tool_call>get_time\n</tool_call>", [("get_time", {})]),
    glm4("test_malformed_tool_call_no_regex_match", "<tool_call>   ", content="<tool_call>   "),
    glm4(
        "test_unicode_characters_preserved",
        "<tool_call>send_message\n<arg_key>greeting</arg_key>\n<arg_value>你好世界</arg_value>\n"
        "<arg_key>emoji</arg_key>\n<arg_value>🎉</arg_value>\n</tool_call>",
        [("send_message", {"greeting": "你好世界", "emoji": "🎉"})],
    ),
    *[
        glm4(i, G4M_BJ, [("get_weather", {"city": "Beijing"})])
        for i in (
            "test_streaming_multi_token_chunks",
            "test_streaming_entire_tool_call_at_once",
            "test_stream_interval_single_tool_call",
        )
    ],
    # vLLM's streaming result (both texts are content); its non-streaming path keeps the
    # text before the first call only (glm45 mixed_content)
    *[
        glm4(
            i,
            f"{prefix}\n{G4M_BJ}\nAlso Shanghai.\n{G4M_SH}",
            [("get_weather", {"city": "Beijing"}), ("get_weather", {"city": "Shanghai"})],
            content=f"{prefix}\n\nAlso Shanghai.\n",
        )
        for i, prefix in (
            ("test_streaming_content_between_tool_calls_multi_token", "I will check."),
            ("test_stream_interval_content_between_tool_calls", "Checking Beijing."),
        )
    ],
    glm4(
        "test_streaming_multi_token_with_multiple_args",
        "<tool_call>calculate\n<arg_key>operation</arg_key><arg_value>add</arg_value><arg_key>a"
        "</arg_key><arg_value>42</arg_value><arg_key>b</arg_key><arg_value>3.14</arg_value></tool_call>",
        [("calculate", {"operation": "add", "a": 42, "b": 3.14})],
        tools=G4M_CALC_TOOLS,
    ),
    *[
        glm4(
            i, f"{prefix}\n{G4M_BJ}", [("get_weather", {"city": "Beijing"})], content=f"{prefix}\n"
        )
        for i, prefix in (
            ("test_stream_interval_content_then_tool_call", "I will check the weather for you."),
            ("test_stream_interval_extreme_single_chunk", "Here is the weather."),
        )
    ],
    glm4(
        "test_extract_tool_calls_with_function_tool",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Dallas</arg_value>\n"
        "<arg_key>unit</arg_key>\n<arg_value>fahrenheit</arg_value>\n</tool_call>",
        [("get_weather", {"city": "Dallas", "unit": "fahrenheit"})],
        tools=G4M_FN_TOOLS,
    ),
    glm4(
        "test_extract_tool_calls_with_function_tool_mixed_types",
        "<tool_call>calculate\n<arg_key>operation</arg_key>\n<arg_value>add</arg_value>\n"
        "<arg_key>a</arg_key>\n<arg_value>42</arg_value>\n<arg_key>b</arg_key>\n<arg_value>3.14"
        "</arg_value>\n</tool_call>",
        [("calculate", {"operation": "add", "a": 42, "b": 3.14})],
        tools=G4M_FN_TOOLS,
    ),
    glm4(
        "test_streaming_with_function_tool",
        G4M_BJ,
        [("get_weather", {"city": "Beijing"})],
        tools=G4M_FN_TOOLS,
    ),
    glm4(
        "test_extract_tool_call_without_newline_after_name",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Seattle</arg_value></tool_call>",
        [("get_weather", {"city": "Seattle"})],
    ),
    glm4(
        "test_string_type_detection_with_anyof",
        "<tool_call>configure<arg_key>api_key</arg_key><arg_value>sk-12345678</arg_value></tool_call>",
        [("configure", {"api_key": "sk-12345678"})],
        tools=(
            fn_tool("configure", {"api_key": {"anyOf": [{"type": "string"}, {"type": "null"}]}}),
        ),
    ),
    glm4(
        "test_string_type_detection_with_list_types",
        "<tool_call>log<arg_key>message</arg_key><arg_value>test message</arg_value></tool_call>",
        [("log", {"message": "test message"})],
        tools=(fn_tool("log", {"message": {"type": ["string", "null"]}}),),
    ),
    glm4(
        "test_streaming_no_corruption_for_boolean_values",
        "<tool_call>configure<arg_key>enabled</arg_key><arg_value>true</arg_value></tool_call>",
        [("configure", {"enabled": True})],
        tools=(fn_tool("configure", {"enabled": {"type": "boolean"}}),),
    ),
]


KIMI_WEATHER = fn_tool("get_weather", {"city": {"type": "string"}, "unit": {"type": "string"}})
KIMI_READ = fn_tool("read_file", {"path": {"type": "string"}})
KIMI_FLIGHT = fn_tool("book_flight", {"city": {"type": "string"}})


def kimi_t(id, prefix, tools_out, calls=(), content=None, tools=()):
    c = kimi(id, prefix, tools_out, calls, content)
    return Case(**{**c.__dict__, "tools": tuple(tools)})


KIMI_MORE_CASES = [
    kimi(
        "test_invalid_funcall_id_skipped",
        "Help. ",
        [
            kimi_tool("functions.invalid.0", '{"city": "Beijing"}'),
            kimi_tool("functions.valid:1", '{"city": "Shanghai"}'),
        ],
        [("valid", {"city": "Shanghai"})],
    ),
    kimi(
        "test_native_id_extracted",
        "Checking weather. ",
        [kimi_tool("functions.get_weather:0", '{"city": "Tokyo"}')],
        [("get_weather", {"city": "Tokyo"})],
    ),
    kimi(
        "test_multi_turn_native_id_continuity (turn 1)",
        "Let me check. ",
        [kimi_tool("functions.get_weather:0", '{"city": "Beijing"}')],
        [("get_weather", {"city": "Beijing"})],
    ),
    kimi(
        "test_multi_turn_native_id_continuity (turn 2)",
        "Now let me get news. ",
        [kimi_tool("functions.get_news:0", '{"topic": "weather in Beijing"}')],
        [("get_news", {"topic": "weather in Beijing"})],
    ),
    kimi_t(
        "test_bare_counter",
        "Let me check. ",
        [kimi_tool("0", '{"city": "Tokyo", "unit": "celsius"}')],
        [("get_weather", {"city": "Tokyo", "unit": "celsius"})],
        tools=(KIMI_WEATHER,),
    ),
    kimi_t(
        "test_bare_counter_multiple_tools_infers_by_args",
        "Let me check. ",
        [kimi_tool("0", '{"city": "Tokyo", "unit": "celsius"}')],
        [("get_weather", {"city": "Tokyo", "unit": "celsius"})],
        tools=(KIMI_READ, KIMI_WEATHER),
    ),
    kimi_t(  # no call: the section comes back as content here
        "test_bare_counter_multiple_tools_skips_unsafe_inference[ambiguous]",
        "Let me check. ",
        [kimi_tool("0", '{"city": "Tokyo"}')],
        content="Let me check. "
        + K_SECTION[0]
        + kimi_tool("0", '{"city": "Tokyo"}')
        + K_SECTION[1],
        tools=(KIMI_WEATHER, KIMI_FLIGHT),
    ),
    kimi_t(
        "test_bare_counter_multiple_tools_skips_unsafe_inference[malformed_json]",
        "Let me check. ",
        [kimi_tool("0", '{"city": "Tokyo"')],
        content="Let me check. " + K_SECTION[0] + kimi_tool("0", '{"city": "Tokyo"') + K_SECTION[1],
        tools=(KIMI_WEATHER, KIMI_FLIGHT),
    ),
    kimi(
        "TestStreamingHappyPath.test_single_tool_call",
        "I'll help. ",
        [kimi_tool("functions.get_weather:0", '{"city": "Beijing"} ')],
        [("get_weather", {"city": "Beijing"})],
    ),
    kimi(
        "TestStreamingHappyPath.test_multiple_tool_calls",
        "Compare weather. ",
        [
            kimi_tool("functions.get_weather:0", '{"city": "Tokyo"} '),
            kimi_tool("functions.get_weather:1", '{"city": "NYC"} '),
        ],
        [("get_weather", {"city": "Tokyo"}), ("get_weather", {"city": "NYC"})],
    ),
    kimi_t(
        "TestStreamingHappyPath.test_bare_counter",
        "I'll help. ",
        [kimi_tool("0", '{"city": "Beijing"} ')],
        [("get_weather", {"city": "Beijing"})],
        tools=(KIMI_WEATHER,),
    ),
    kimi_t(
        "TestStreamingHappyPath.test_bare_counter_multiple_tools_infers_by_args",
        "I'll help. ",
        [kimi_tool("0", '{"city": "Beijing", "unit": "celsius"} ')],
        [("get_weather", {"city": "Beijing", "unit": "celsius"})],
        tools=(KIMI_READ, KIMI_WEATHER),
    ),
    kimi(
        "TestStreamingHappyPath.test_content_before_tools",
        "I'll check the weather. ",
        [kimi_tool("functions.get_weather:0", '{"city": "Tokyo"} ')],
        [("get_weather", {"city": "Tokyo"})],
    ),
    kimi(
        "TestStreamingHappyPath.test_no_tool_calls",
        "This is just regular text without tools.",
        [],
    ),
    kimi(
        "TestStreamingHappyPath.test_incremental_arguments",
        "Help. ",
        [kimi_tool("functions.get_weather:0", '{"city": "Beijing"} ')],
        [("get_weather", {"city": "Beijing"})],
    ),
    kimi(
        "TestStreamingHappyPath.test_streaming_matches_nonstreaming[single_tool]",
        "Single. ",
        [kimi_tool("functions.get_weather:0", '{"city": "Beijing"}')],
        [("get_weather", {"city": "Beijing"})],
    ),
    kimi(
        "TestStreamingHappyPath.test_streaming_matches_nonstreaming[parallel_tools]",
        "Multi. ",
        [
            kimi_tool("functions.get_weather:0", '{"city": "Tokyo"}'),
            kimi_tool("functions.get_news:1", '{"topic": "tech"}'),
        ],
        [("get_weather", {"city": "Tokyo"}), ("get_news", {"topic": "tech"})],
    ),
    kimi(
        "TestStreamingHappyPath.test_streaming_matches_nonstreaming[no_functions_prefix]",
        "No prefix id. ",
        [kimi_tool("get_weather:0", '{"city": "NYC"}')],
        [("get_weather", {"city": "NYC"})],
    ),
    kimi(
        "TestStreamingEdgeCases.test_marker_suppression",
        "I'll check. ",
        [kimi_tool("functions.get_weather:0", '{"city": "Tokyo"} ')],
        [("get_weather", {"city": "Tokyo"})],
    ),
    kimi(
        "TestStreamingEdgeCases.test_noise_between_markers_suppressed",
        "Reasoning. ",
        [" spurious noise " + kimi_tool("functions.test:0", '{"k": "v"} ')],
        [("test", {"k": "v"})],
    ),
    kimi(
        "TestStreamingEdgeCases.test_three_different_tools",
        "Multiple tasks. ",
        [
            kimi_tool("functions.get_weather:0", '{"city": "NYC"} '),
            kimi_tool("functions.get_news:1", '{"topic": "tech"} '),
            kimi_tool("functions.send_email:2", '{"to": "a@b.com"} '),
        ],
        [
            ("get_weather", {"city": "NYC"}),
            ("get_news", {"topic": "tech"}),
            ("send_email", {"to": "a@b.com"}),
        ],
    ),
    *[
        kimi(
            f"TestStreamingIntervals.{i}",
            prefix,
            [kimi_tool("functions.get_weather:0", args)],
            [("get_weather", json.loads(args))],
        )
        for i, prefix, args in (
            ("test_single_tool_call_at_interval", "Help. ", '{"city": "Beijing"}'),
            (
                "test_content_then_tool_call_at_interval",
                "Sure, let me check. ",
                '{"city": "Tokyo"}',
            ),
            ("test_content_and_tool_call_in_single_chunk", "Hi! ", '{"city": "Beijing"}'),
        )
    ],
    kimi(
        "TestStreamingIntervals.test_multiple_tool_calls_at_interval",
        "Compare. ",
        [
            kimi_tool("functions.search:0", '{"q": "cats"}'),
            kimi_tool("functions.search:1", '{"q": "dogs"}'),
        ],
        [("search", {"q": "cats"}), ("search", {"q": "dogs"})],
    ),
    kimi(
        "TestStreamingIntervals.test_plain_text_at_interval",
        "This is plain text with no tool calling involved.",
        [],
    ),
]


QS_XML_TAGS = (
    'char_deltas = [\n    "<tool_call>\\n",\n    "<parameter=query>\\n",\n'
    '    "\\n</parameter>\\n",\n    "</function>\\n",\n]\n'
)
QS_PARAM_LINES = (
    'TOOL_CALL_TEMPLATE = """\n</parameter>\n<parameter=new_string>\n#!/usr/bin/env python3\n'
    '</parameter>\n"""\n'
)
QS_REAL_NAME = 'doc = """\n<parameter=path>\nliteral/value\n</parameter>\n"""\n'
QS_NESTED = (
    'doc = """\n<tool_call>\n<function=write_file>\n<parameter=path>\nliteral/value.txt\n'
    "</parameter>\n<parameter=content>\nhello\n</parameter>\n</function>\n</tool_call>\n" + '"""\n'
)
QS_OUT_OF_SCHEMA = (
    'template = """\n<tool_call>\n<function=foo>\n<parameter=bar>baz</parameter>\n'
    '</function>\n</tool_call>\n"""\n'
)


def qs_write(path: str, content: str, tail: str = "\n") -> str:
    return (
        "<tool_call>\n<function=write_file>\n<parameter=path>\n" + path + "\n</parameter>\n"
        "<parameter=content>\n" + content + "</parameter>\n</function>\n</tool_call>" + tail
    )


QS_OOS_OUTPUT = (
    "<tool_call>\n<function=foo>\n<parameter=bar>baz</parameter>\n</function>\n</tool_call>"
    "\n\n" + qs_write("fixture.py", QS_OUT_OF_SCHEMA, "")
)
QSHARED_LITERAL_CASES = [
    # vLLM checks the calls (content unchecked); the newline after the block is content here
    *[
        c
        for kind in ("nonstreaming", "streaming")
        for i, path, content in (
            ("test_content_with_xml_structural_tags", "test.py", QS_XML_TAGS),
            ("test_content_with_param_like_lines", "test_template.py", QS_PARAM_LINES),
            ("test_content_with_real_param_name_literal", "fixture.py", QS_REAL_NAME),
        )
        for c in qshared(
            f"{i}_{kind}",
            qs_write(path, content, "" if i.endswith("literal") else "\n"),
            [("write_file", {"path": path, "content": content.rstrip("\n")})],
            content="" if i.endswith("literal") else "\n",
            tools=QS_WRITE_TOOLS,
        )
    ],
]

GEMMA4_BARE = "tests/tool_parsers/test_gemma4_regex_and_bare_calls.py@33a7f0986a"
G4_BARE = "<|channel>thought\nListing directory files.\n<channel|>" + g4(
    "bash", f"command:{Q}ls -la /work{Q}"
).removeprefix("<|tool_call>").removesuffix("<tool_call|>")
# The file's other tests call vLLM's offline gemma4_utils.parse_tool_calls (NOT_APPLICABLE);
# this one its gemma4 engine parser (vLLM asserts the call only).
GEMMA4_BARE_CASES = [
    Case(
        "bare_call_after_channel",
        GEMMA4_BARE,
        "gemma4",
        "",
        G4_BARE,
        (("bash", {"command": "ls -la /work"}),),
        "<|channel>thought\nListing directory files.\n<channel|>",
        ids=("TestGemma4EngineBareCallIntegration.test_engine_tool_parser_bare_call_extraction",),
    ),
    Case(  # with LocalAI's gemma-4 pairing, the thought channel is reasoning
        "bare_call_after_channel_with_reasoning_parser",
        GEMMA4_BARE,
        "gemma4",
        "gemma4",
        G4_BARE,
        (("bash", {"command": "ls -la /work"}),),
        "",
        "Listing directory files.\n",
        ids=("TestGemma4EngineBareCallIntegration.test_engine_tool_parser_bare_call_extraction",),
    ),
]


GEMMA4_REQUIRED = "tests/tool_parsers/test_gemma4_required_enforcement.py@98608a2379"
GEMMA4_NAMED = "tests/tool_parsers/test_gemma4_named_tool_choice.py@17aad5e833"
G4_PROSE = "I cannot call a tool right now, so here is a plain answer."
G4_LONDON_CALL = (("get_weather", {"location": "London"}),)
# Gemma4Parser (vLLM's path when the reasoning parser is gemma4 too, thinking off) and its
# gemma4 tool parser alone; tool_choice "required" with prose only is NOT_APPLICABLE here.
GEMMA4_REQUIRED_CASES = [
    Case(
        "required_tool_call",
        GEMMA4_REQUIRED,
        "gemma4",
        "gemma4",
        G4_LONDON,
        G4_LONDON_CALL,
        ids=(
            "TestGemma4ParserParseRequiredEnforcement.test_required_tool_call_accepted",
            "TestGemma4ParserStreamingRequiredEnforcement.test_required_tool_call_stream_accepted",
        ),
    ),
    Case(
        "auto_prose",
        GEMMA4_REQUIRED,
        "gemma4",
        "gemma4",
        G4_PROSE,
        content=G4_PROSE,
        ids=("TestGemma4ParserParseRequiredEnforcement.test_auto_prose_only_passes_through",),
    ),
    Case(
        "required_tool_call_tool_parser_only",
        GEMMA4_REQUIRED,
        "gemma4",
        "",
        G4_LONDON,
        G4_LONDON_CALL,
        ids=("TestGemma4ToolParserRequiredEnforcement.test_required_tool_call_accepted",),
    ),
    Case(
        "auto_prose_tool_parser_only",
        GEMMA4_REQUIRED,
        "gemma4",
        "",
        G4_PROSE,
        content=G4_PROSE,
        ids=("TestGemma4ToolParserRequiredEnforcement.test_auto_prose_only_passes_through",),
    ),
]

CASES = (
    GEMMA4_BARE_CASES
    + GEMMA4_REQUIRED_CASES
    + QSHARED_LITERAL_CASES
    + KIMI_MORE_CASES
    + GLM4_MORE_CASES
    + GLM47_CASES
    + ERNIE45_CASES
    + GRANITE4_FILE_CASES
    + GRANITE_CASES
    + MINIMAX_M2_CASES
    + FUNCTIONGEMMA_CASES
    + HUNYUAN_CASES
    + DEEPSEEK_V32_CASES
    + QSHARED_CASES
    + QWEN3CODER_CASES
    + GEMMA4_CASES
    + PYTHONIC_CASES
    + LLAMA4_PYTHONIC_CASES
    + XLAM_CASES
    + SEED_OSS_CASES
    + HERMES_CASES
    + GRANITE4_CASES
    + OPENAI_CASES
    + LLAMA3_CASES
    + DEEPSEEK_CASES
    + PHI4_CASES
    + INTERNLM_CASES
    + LONGCAT_CASES
    + JAMBA_CASES
    + MISTRAL_CASES
    + OLMO3_CASES
    + QWEN3XML_CASES
    + KIMI_CASES
    + GLM45_CASES
    + R1_CASES
    + MISTRAL_REASONING_CASES
    + GRANITE_REASONING_CASES
    + QWEN3_CASES
)

KIMI_BAD = (
    "Help. "
    + K_SECTION[0]
    + kimi_tool("functions.bad:0", '{"city": "Beijing"')
    + kimi_tool("functions.good:1", '{"city": "Shanghai"}')
    + K_SECTION[1]
)
KIMI_BAD_ID = (
    "Help. "
    + K_SECTION[0]
    + kimi_tool("functions.invalid.0", '{"city": "Beijing"}')
    + kimi_tool("functions.valid:1", '{"city": "Shanghai"}')
    + K_SECTION[1]
)

GLM_INCOMPLETE = (
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
    "<arg_key>date</arg_key>\n<arg_value>2025-08-01</arg_value>"
)


def known(case: Case, ours: dict, why: str) -> tuple[Case, dict]:
    return Case(**{**case.__dict__, "why": why}), ours


KNOWN_DIFFERENCES = [
    *[
        known(
            c,
            {
                "calls": [("write_file", {"path": "fixture.py", "content": "hello"})],
                "content": '\n"""\n</parameter>\n</function>\n',
                "withdrawn": True,
            },
            "a block ends at the first `</tool_call>` the model writes, also one inside a "
            "value (a file holding a tool call): the router finds blocks by their markers, "
            "before any parse; vLLM's qwen3 parsers disambiguate by the schema",
        )
        for kind in ("nonstreaming", "streaming")
        for c in qshared(
            f"test_content_with_full_nested_tool_call_{kind}",
            qs_write("fixture.py", QS_NESTED, ""),
            [("write_file", {"path": "fixture.py", "content": QS_NESTED.rstrip("\n")})],
            tools=QS_WRITE_TOOLS,
        )
    ],
    *[
        known(
            c,
            {
                "calls": [
                    ("foo", {"bar": "baz"}),
                    (
                        "write_file",
                        {
                            "path": "fixture.py",
                            "content": 'template = """\n<tool_call>\n<function=foo>\n'
                            "<parameter=bar>baz",
                        },
                    ),
                ],
                "content": '\n\n\n"""\n</parameter>\n</function>\n',
            },
            "as test_content_with_full_nested_tool_call: the `</tool_call>` inside the "
            "second call's value ends its block",
        )
        for kind in ("nonstreaming", "streaming")
        for c in qshared(
            f"test_two_tools_second_with_out_of_schema_nested_literal_{kind}",
            QS_OOS_OUTPUT,
            [
                ("foo", {"bar": "baz"}),
                ("write_file", {"path": "fixture.py", "content": QS_OUT_OF_SCHEMA.rstrip("\n")}),
            ],
            content="\n\n",
            tools=QS_WRITE_TOOLS,
        )
    ],
    known(
        seed(
            "test_extract_tool_calls[tool_call_unlimited_thinking_budget] (reasoning shortened)",
            SEED_THINK_UNLIMITED + SEED_CALL_UNIT,
            [BARCELONA_C],
            content=SEED_THINK_UNLIMITED,
        ),
        {
            "calls": [BARCELONA_C, BARCELONA_C],
            "content": "<seed:think>\nGot it, let's see. The format is . Let me go with that."
            "</seed:think>",
        },
        "with tool_parser seed_oss and no reasoning_parser, a call the model writes inside "
        "its <seed:think> block is read as a call; vLLM's seed_oss reads calls after the "
        "think block only (with reasoning_parser seed_oss the block is reasoning)",
    ),
    known(
        kimi_t(
            "test_bare_counter_single_tool_invalid_json_still_extracted",
            "Let me check. ",
            [kimi_tool("0", '{"city": "Tokyo"')],
            [("get_weather", '{"city": "Tokyo"')],
            tools=(KIMI_WEATHER,),
        ),
        {
            "calls": [],
            "content": "Let me check. "
            + K_SECTION[0]
            + kimi_tool("0", '{"city": "Tokyo"')
            + K_SECTION[1],
        },
        "vLLM passes the malformed arguments on as they are; here arguments are a JSON "
        "object's text, and a section whose only call is malformed comes back as content",
    ),
    known(
        Case(
            "TestStreamingEdgeCases.test_truncated_tool_call_no_end_marker",
            KIMI,
            "kimi_k2",
            "",
            "I'll check. " + K_SECTION[0] + "<|tool_call_begin|>functions.get_weather:0 "
            '<|tool_call_argument_begin|>{"city": "Bei',
            (("get_weather", '{"city": "Bei'),),
            "I'll check. ",
        ),
        {
            "calls": [],
            "content": "I'll check. " + K_SECTION[0] + "<|tool_call_begin|>functions.get_weather:0 "
            '<|tool_call_argument_begin|>{"city": "Bei',
            "withdrawn": True,
        },
        "vLLM's stream ends with the cut-off arguments as they are; here a call whose "
        "arguments are no JSON object is no call: the cut-off section comes back as content "
        "(the stream had announced the call: LocalAI's proto cannot withdraw it)",
    ),
    known(
        kimi(
            "TestStreamingEdgeCases.test_empty_tool_section",
            "Reasoning. ",
            [""],
            content="Reasoning. ",
        ),
        {"content": "Reasoning. " + K_SECTION[0] + K_SECTION[1]},
        "a tool-call section that holds no call comes back as content as the model wrote "
        "it, markers included, for every format here (vLLM asserts only that no call is made)",
    ),
    known(
        kimi(
            "TestStreamingEdgeCases.test_content_after_tool_section",
            "Before. ",
            [kimi_tool("functions.get_weather:0", '{"city": "Tokyo"} ')],
            [("get_weather", {"city": "Tokyo"})],
        ).__class__(
            **{
                **kimi(
                    "TestStreamingEdgeCases.test_content_after_tool_section",
                    "Before. ",
                    [kimi_tool("functions.get_weather:0", '{"city": "Tokyo"} ')],
                    [("get_weather", {"city": "Tokyo"})],
                ).__dict__,
                "output": "Before. "
                + K_SECTION[0]
                + kimi_tool("functions.get_weather:0", '{"city": "Tokyo"} ')
                + K_SECTION[1]
                + " After tools.",
            }
        ),
        {"content": "Before.  After tools."},
        "vLLM's kimi_k2 drops the text after the tool-call section; here it stays content "
        "(the model wrote it; every format here keeps text outside its blocks)",
    ),
    known(
        hunyuan(
            "test_hunyuan_a13b_tool_parser_extract[content_after]",
            hy_block(("get_weather", {"city": "Seattle"})) + "\nThank you!",
            [("get_weather", {"city": "Seattle"})],
        ),
        {"content": "\nThank you!"},
        "vLLM's hunyuan_a13b drops the text after the tool-call block; here it stays content "
        "(the model wrote it; every format here keeps text outside its blocks)",
    ),
    known(
        glm(
            "mixed_content",
            "I will help you get the weather info.\n\n"
            + glm_call("get_weather", ("city", "Beijing"), ("date", "2025-08-01"), indent="")
            + "\n\nmeaningwhile, I will also check the weather in Shanghai.\n\n"
            + glm_call("get_weather", ("city", "Shanghai"), ("date", "2025-08-01"), indent=""),
            [
                ("get_weather", {"city": "Beijing", "date": "2025-08-01"}),
                ("get_weather", {"city": "Shanghai", "date": "2025-08-01"}),
            ],
            content="I will help you get the weather info.\n\n",
        ),
        {
            "content": "I will help you get the weather info.\n\n\n\nmeaningwhile, I will "
            "also check the weather in Shanghai.\n\n"
        },
        "vLLM's glm45 keeps only the text before the first call as content; here text "
        "between calls stays content too (the model wrote it; vLLM's own streaming path "
        "keeps it too: test_stream_interval_content_between_tool_calls)",
    ),
    known(
        glm(
            "incomplete_tool_call",
            GLM_INCOMPLETE,
            content=GLM_INCOMPLETE,
        ),
        {"calls": [("get_weather", {"city": "Beijing", "date": "2025-08-01"})], "content": ""},
        "vLLM's glm45 leaves out a call cut off before </tool_call>, after its streaming path "
        "has sent it; here a block still open at the end is parsed as it stands (vLLM's "
        "hermes rule), so Predict and the stream give the same call",
    ),
    known(
        kimi(
            "invalid_json_still_extracted",
            "Help. ",
            [
                kimi_tool("functions.bad:0", '{"city": "Beijing"'),
                kimi_tool("functions.good:1", '{"city": "Shanghai"}'),
            ],
            [("bad", '{"city": "Beijing"'), ("good", {"city": "Shanghai"})],
        ),
        {"calls": [], "content": KIMI_BAD, "withdrawn": True},
        "vLLM passes the malformed arguments on as they are; here arguments are a JSON "
        "object's text, and a block with a malformed call comes back whole as content; the "
        "stream had announced the first call (LocalAI's proto cannot withdraw it)",
    ),
    known(
        mistral(
            "pre_v11_regex_fallback_fails",
            "[TOOL_CALLS] not json at all",
            content="not json at all",
            ids=("test_extract_tool_calls_pre_v11_regex_fallback_fails",),
        ),
        {"content": "[TOOL_CALLS] not json at all"},
        "a block that holds no call comes back as content as the model wrote it, marker "
        "included, for every format here; vLLM's mistral drops the marker",
    ),
    known(
        mistral(
            "v11_complex",
            "hi{hi[TOOL_CALLS]bash" + BASH_CMD[:-1],
            [("bash", json.dumps(json.loads(BASH_CMD))[:-2])],
            content="hi{hi",
            ids=every("test_extract_tool_calls", "complex"),
        ),
        {"calls": [], "content": "hi{hi[TOOL_CALLS]bash" + BASH_CMD[:-1]},
        "the arguments were cut off; vLLM passes the truncated text on as arguments (no "
        "JSON); here a call whose arguments are no JSON object comes back as content",
    ),
    known(
        phi4(
            "surrounding_text",
            'Let me check the weather for you.\nfunctools[{"name": "get_weather", '
            '"arguments": {"city": "Tokyo"}}]\nWould you like to know more?',
            [("get_weather", {"city": "Tokyo"})],
            ids=COMMON_IDS["surrounding_text"],
        ),
        {"content": "Let me check the weather for you.\n"},
        "vLLM's phi4_mini_json drops all content once it finds a call; here the text before "
        "the call stays content, as for every other format",
    ),
    known(
        dsv31(
            "with_multiple_tools",
            f'some prefix text{B}{CB}foo{SEP}{{"x":1}}{CE}{CB}bar{SEP}{{"y":2}}{CE}{E}'
            " some suffix text",
            [("foo", {"x": 1}), ("bar", {"y": 2})],
            content="some prefix text",
        ),
        {"content": "some prefix text some suffix text"},
        "vLLM's deepseek_v31 drops the text after the tool-call block; here it stays "
        "content (the model wrote it, and every format here keeps text outside its block)",
    ),
    known(
        hermes(
            "bare_string_arguments",
            '<tool_call>\n{"name": "do_thing", "arguments": "hello"}\n</tool_call>',
            [("do_thing", "hello")],
            ids=every("test_hermes_parser_non_streaming_bare_string_arguments", "llama"),
        ),
        {
            "calls": [],
            "content": '<tool_call>\n{"name": "do_thing", "arguments": "hello"}\n</tool_call>',
        },
        "vLLM passes json.dumps('hello') on as the arguments; OpenAI's function.arguments is "
        "a JSON object's text (LocalAI and clients decode it into a map), so a call whose "
        "arguments are no object is malformed here and its text comes back as content",
    ),
    known(
        openai(
            "multiple_tools_not_json",  # the rest of test_extract_tool_calls_multiple_tools
            analysis(ANALYSIS_2)
            + harmony_call("not_json_no_content_type", "foo", json_type=False)
            + harmony_call("no_args", ""),
            [("not_json_no_content_type", "foo"), ("no_args", "")],
            reasoning=ANALYSIS_2,
            ids=("test_extract_tool_calls_multiple_tools",),
        ),
        {
            "calls": [("no_args", {})],
            "content": " to=functions.not_json_no_content_type<|channel|>commentary"
            "<|message|>foo<|call|>",
        },
        "vLLM passes the message text on as the arguments as it is ('foo', ''); here "
        "arguments are a JSON object's text: empty arguments are {}, and a message that "
        "is no JSON object is a malformed call whose text comes back as content",
    ),
    known(
        llama(
            "simple",
            'Here is the result: {"name": "getOpenIncidentsTool", "parameters": {}} '
            "Would you like to know more?",
            [("getOpenIncidentsTool", {})],
        ),
        {"calls": [("getOpenIncidentsTool", {})], "content": "Here is the result: "},
        "vLLM's llama3_json drops all content once it finds a call; here the text before a "
        "call stays content, as for every other format (vLLM's hermes does the same)",
    ),
    known(
        llama(
            "multiple_json_with_surrounding_text",
            f"Here are the results: {S1}; {INC}; {S2} Would you like to know more?",
            THREE,
        ),
        {"calls": THREE, "content": "Here are the results: "},
        "as llama3_json 'simple': the text before the calls stays content",
    ),
    known(
        r1(
            "new_line",
            f"\n<think>{REASONING_SECTION}</think>\nThis is the rest",
            REASONING_SECTION,
            "\nThis is the rest",
        ),
        {"calls": [], "content": "\nThis is the rest", "reasoning": "\n" + REASONING_SECTION},
        "vLLM's two paths disagree here (its NEW_LINE_STREAMING keeps the newline in the "
        "reasoning); this backend has one path and gives vLLM's streaming result",
    ),
    known(
        hermes(
            "invalid_json",
            '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}',
            content='<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}',
            ids=every("test_hermes_parser_non_streaming_tool_call_invalid_json", "llama"),
        ),
        {
            "calls": [],
            "content": '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}',
            "withdrawn": True,
        },
        'same result as vLLM, but the stream announced final_answer {"trigger": true} '
        "before the missing closing brace showed the call malformed; LocalAI's proto "
        "cannot withdraw a streamed call, so PredictStream shows it and Predict does not "
        "(vLLM's own streaming path announces it too)",
    ),
]


HERMES_KNOWN = [k for k in KNOWN_DIFFERENCES if k[0].source == HERMES]
STRING_ARGUMENTS = ["hello", "{hello world}", "[oops", '{"a": 1} tail text']
NO_OBJECT = (
    "OpenAI's function.arguments is a JSON object's text (LocalAI and clients decode it into "
    "a map): a call whose arguments are no object is malformed here and its text comes back "
    "as content; vLLM passes json.dumps of the string on as the arguments"
)
KNOWN_DIFFERENCES += [
    known(
        hermes(
            "bare_string_arguments_with_stream_interval",
            '<tool_call>{"name": "do_thing", "arguments": "hello"}</tool_call>',
            [("do_thing", "hello")],
            ids=every("test_hermes_streaming_bare_string_arguments_with_stream_interval", 1, 3),
        ),
        {
            "calls": [],
            "content": '<tool_call>{"name": "do_thing", "arguments": "hello"}</tool_call>',
        },
        NO_OBJECT,
    ),
    *[
        known(
            hermes(
                f"string_arguments_match_non_streaming_{i}",
                "<tool_call>" + json.dumps({"name": "f", "arguments": value}) + "</tool_call>",
                [("f", value)],
                ids=every(
                    "test_hermes_streaming_string_arguments_match_non_streaming",
                    *[f"{n}-{pid(value)}" for n in (1, 3)],
                ),
            ),
            {
                "calls": [],
                "content": "<tool_call>"
                + json.dumps({"name": "f", "arguments": value})
                + "</tool_call>",
            },
            NO_OBJECT,
        )
        for i, value in enumerate(STRING_ARGUMENTS)
    ],
    # the hermes differences through vLLM's granite4 parser too (its CONFIGS)
    *[
        (
            Case(
                **{
                    **c.__dict__,
                    "id": "granite4_" + c.id,
                    "tool": "granite4",
                    "ids": tuple(i.replace("[llama]", "[granite4]") for i in c.ids),
                }
            ),
            ours,
        )
        for c, ours in HERMES_KNOWN
    ],
    known(
        mistral(
            "pre_v11_multiple_bot_tokens",
            '[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1}}]'
            '[TOOL_CALLS] [{"name": "sub", "arguments":{"b": 2}}]',
            ids=("test_extract_tool_calls_pre_v11_multiple_bot_tokens_raises",),
        ),
        {"calls": [("add", {"a": 1}), ("sub", {"b": 2})]},
        "vLLM's pre-v11 mistral parser raises ValueError ('Only one BOT token') for a second "
        "[TOOL_CALLS] list, failing the request; here each block's calls are read, as for "
        "the v11 form where every call has its own [TOOL_CALLS]",
    ),
    known(
        mistral(
            "v11_without_args_skipped",
            "[TOOL_CALLS]toolname_no_args",
            ids=("test_extract_tool_calls_v11_without_args_skipped",),
        ),
        {"content": "[TOOL_CALLS]toolname_no_args"},
        "a block that holds no call comes back as content as the model wrote it, marker "
        "included, for every format here; vLLM's mistral drops it (no call, no content)",
    ),
    known(
        mistral(
            "pre_v11_streaming_trailing_data_after_json",
            '[TOOL_CALLS] [{"name": "get_current_weather", "arguments":{"city": "Dallas", '
            '"state": "TX", "unit": "fahrenheit"}}]\nextra trailing data',
            [("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})],
            content="\nextra trailing data",
            ids=every(PRE11_STREAM, "trailing_data_after_json"),
        ),
        {"content": ""},
        "vLLM's two paths disagree here (its non-streaming path drops the text after the "
        "list: test_extract_tool_calls_pre_v11_tokenizer[trailing_data_after_json]); this "
        "backend has one path and gives vLLM's non-streaming result",
    ),
    *[
        known(
            jamba(
                f"nonstreaming_{name}",
                output,
                calls,
                ids=every("test_extract_tool_calls", name),
            ),
            {"content": " "},
            "vLLM's two paths disagree here (its streaming path keeps the leading space as "
            "content: test_extract_tool_calls_streaming); this backend has one path and gives "
            "vLLM's streaming result",
        )
        for name, output, calls in [
            ("single_tool", " " + JAMBA_CALL, [DALLAS]),
            ("parallel_tools", JAMBA_PARALLEL, [DALLAS, ORLANDO]),
        ]
    ],
]


_KIMI_PARAMS = (
    "single_tool_call",
    "parallel_tool_calls",
    "three_tool_calls",
    "angle_brackets_in_json",
    "multiline_json",
    "no_functions_prefix",
    "empty_arguments",
)


def _kimi_ids(case: Case) -> Case:
    """The vLLM test ids of a kimi_k2 case (its early cases have short names; the module-level
    tests there are TestExtractToolCalls' methods)."""
    name = case.id.split(" (")[0]
    if name in _KIMI_PARAMS:
        ids: tuple[str, ...] = (f"TestExtractToolCalls.test_extract_tool_calls[{name}]",)
    elif name in ("no_tools", "invalid_json_still_extracted"):
        ids = (f"TestExtractToolCalls.test_{name}",)
    elif name.startswith("test_"):
        ids = (f"TestExtractToolCalls.{name}",)
    elif name.endswith("_at_interval"):
        ids = every(name, 1, 2, 3, 5, 8)
    else:
        ids = (name,)
    return Case(**{**case.__dict__, "ids": ids})


CASES = [_kimi_ids(c) if c.source == KIMI else c for c in CASES]
KNOWN_DIFFERENCES = [
    (_kimi_ids(c), o) if c.source == KIMI else (c, o) for c, o in KNOWN_DIFFERENCES
]


_GLM45_PARAMS = (
    "single_tool_call",
    "multiple_tool_calls",
    "tool_call_with_content_before",
    "tool_call_with_mixed_args",
    "tool_call_with_chinese_content",
)
_GLM45_INTERVALS = {
    "test_stream_interval_single_tool_call": (1, 2, 3, 5, 8),
    "test_stream_interval_multiple_tool_calls": (1, 2, 3, 5, 8),
    "test_stream_interval_content_then_tool_call": (1, 2, 3, 5, 8),
    "test_stream_interval_content_between_tool_calls": (1, 2, 5),
}


def _glm45_ids(case: Case) -> Case:
    """The vLLM test ids of a glm45 case (its early cases have short names)."""
    name = case.id
    if name in _GLM45_PARAMS:
        ids: tuple[str, ...] = (f"test_extract_tool_calls[{name}]",)
    elif name in _GLM45_INTERVALS:
        ids = every(name, *_GLM45_INTERVALS[name])
    elif not name.startswith("test_"):
        ids = (f"test_extract_tool_calls_{name}",)
    else:
        ids = (name,)
    return Case(**{**case.__dict__, "ids": ids})


CASES.append(  # vLLM asserts only that it returns; its argument regex skips the pair whose
    # </arg_key> is missing, as the whole parse and the stream here do
    glm(
        "test_extract_tool_calls_malformed_xml",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Seattle</arg_value>\n"
        "<arg_key>incomplete_arg\n<arg_value>value</arg_value>\n</tool_call>",
        [("get_weather", {"city": "Seattle"})],
    )
)
CASES = [_glm45_ids(c) if c.source == GLM45 else c for c in CASES]
KNOWN_DIFFERENCES = [
    (_glm45_ids(c), o) if c.source == GLM45 else (c, o) for c, o in KNOWN_DIFFERENCES
]


def _gemma4_ids(case: Case) -> Case:
    """The vLLM test id of a gemma4 case (its array reader's cases are TestParseGemma4Array's)."""
    name = case.id.replace("TestParseGemma4Args.Array.", "TestParseGemma4Array.")
    return Case(**{**case.__dict__, "ids": (name.removesuffix(" (non-partial)"),)})


CASES = [_gemma4_ids(c) if c.source == GEMMA4 else c for c in CASES]


_X_PARAMS = (
    "parallel_tool_calls",
    "single_tool_with_think_tag",
    "single_tool_with_json_code_block",
    "single_tool_with_tool_calls_tag",
    "single_tool_with_tool_call_xml_tags",
)
_X_EMPTY = [
    '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 42}}]-expected0',
    '[{"name": "a", "arguments": {"x": 42}}, {"name": "b", "arguments": {}}]-expected1',
]
_XLAM_IDS = {
    "test_extract_tool_calls[parallel_tool_calls]": every(
        "test_extract_tool_calls", "parallel_tool_calls"
    )
    + every("test_extract_tool_calls_streaming_incremental", "parallel_tool_calls"),
    "test_extract_tool_calls[single_tool_with_think_tag]": every(
        "test_extract_tool_calls", "single_tool_with_think_tag"
    )
    + every("test_extract_tool_calls_streaming_incremental", "single_tool_with_think_tag"),
    "test_preprocess_model_output[list]": (
        "test_preprocess_model_output",
        "test_streaming_with_list_structure",
    ),
    "test_extract_tool_calls_non_ascii": every(
        "test_extract_tool_calls_non_ascii", "False", "True"
    ),
    "test_extract_tool_calls_streaming_one_empty_args_tool[first]": every(
        "test_extract_tool_calls_streaming_one_empty_args_tool", _X_EMPTY[0]
    ),
    "test_extract_tool_calls_streaming_one_empty_args_tool[last]": every(
        "test_extract_tool_calls_streaming_one_empty_args_tool", _X_EMPTY[1]
    ),
}
CASES = [
    Case(**{**c.__dict__, "ids": _XLAM_IDS[c.id]}) if c.source == XLAM and c.id in _XLAM_IDS else c
    for c in CASES
]


_HY_EXTRACT = ("no_tool_call", "single", "multiple", "content_before", "content_after", "complex")


def _hunyuan_ids(case: Case) -> Case:
    """The pytest ids of a hunyuan_a13b case: its parameters are the output strings, the
    expected lists numbered (`expected_tool_calls3`), None as "None"."""
    name = case.id.removesuffix(" (xfail there)")
    test, _, param = name.partition("[")
    param = param.rstrip("]")
    if test == "test_hunyuan_a13b_tool_parser_extract":
        i = _HY_EXTRACT.index(param)
        content = pid(case.content) if case.content and param != "content_after" else "None"
        ids: tuple[str, ...] = (f"{test}[{pid(case.output)}-expected_tool_calls{i}-{content}]",)
    elif test == "test_hunyuan_a13b_tool_parser_streaming":
        ids = (f"{test}[model_deltas{param}-expected_tool_calls{param}]",)
    elif test == "test_hunyuan_a13b_tool_parser_streaming_one_empty_args_tool":
        i = ("first", "last").index(param)
        ids = (f"{test}[{pid(case.output)}-expected_tool_calls{i}]",)
    else:
        ids = (name,)
    return Case(**{**case.__dict__, "ids": ids})


CASES = [_hunyuan_ids(c) if c.source == HUNYUAN else c for c in CASES]
KNOWN_DIFFERENCES = [
    (_hunyuan_ids(c), o) if c.source == HUNYUAN else (c, o) for c, o in KNOWN_DIFFERENCES
]
# Its ids hold each output, so they are spelled from the cases; the file has 6 extraction
# outputs, 4 streaming ones (numbered), one non-ASCII test and 2 empty-argument outputs.
_HY_IDS = sorted(
    {
        i
        for c in CASES + [k for k, _ in KNOWN_DIFFERENCES]
        if c.source == HUNYUAN
        for i in c.vllm_ids
    }
)
assert [
    sum(i.startswith(t + "[") or i == t for i in _HY_IDS)
    for t in (
        "test_hunyuan_a13b_tool_parser_extract",
        "test_hunyuan_a13b_tool_parser_streaming",
        "test_hunyuan_a13b_tool_parser_non_ascii",
        "test_hunyuan_a13b_tool_parser_streaming_one_empty_args_tool",
    )
] == [6, 4, 1, 2], _HY_IDS


_SEED_IDS = {
    "test_extract_tool_calls_no_tools": (
        "test_extract_tool_calls_no_tools",
        "test_streaming_tool_calls_no_tools",
    ),
    "test_extract_tool_calls[tool_call_512_thinkg_budget] (reasoning shortened)": every(
        "test_extract_tool_calls", "tool_call_512_thinkg_budget"
    )
    + every("test_streaming_tool_calls", "tool_call_512_thinkg_budget"),
    "test_extract_tool_calls[tool_call_unlimited_thinking_budget] (reasoning shortened)": every(
        "test_extract_tool_calls", "tool_call_unlimited_thinking_budget"
    )
    + every("test_streaming_tool_calls", "tool_call_unlimited_thinking_budget"),
}
CASES = [
    Case(**{**c.__dict__, "ids": _SEED_IDS[c.id]}) if c.source == SEED and c.id in _SEED_IDS else c
    for c in CASES
]
KNOWN_DIFFERENCES = [
    (Case(**{**c.__dict__, "ids": _SEED_IDS[c.id]}), o)
    if c.source == SEED and c.id in _SEED_IDS
    else (c, o)
    for c, o in KNOWN_DIFFERENCES
]


_GR_IDS = {
    "test_single_tool_call_simple_args": (
        *_both("test_single_tool_call_simple_args"),
        "test_streaming_split_invariance[single]",
    ),
    "test_granite_token_prefix_format": _both("test_granite_token_prefix_format"),
    "test_granite_string_prefix_format": _both("test_granite_string_prefix_format"),
    "test_parallel_tool_calls": COMMON_IDS["parallel_tool_calls"],
    "test_streaming_parallel_calls_batched_deltas": every(
        "test_streaming_parallel_calls_batched_deltas", 2, 3, 4, 5
    ),
}


def _granite_ids(case: Case) -> Case:
    name = case.id
    if name in _GR_IDS:
        ids: tuple[str, ...] = _GR_IDS[name]
    elif name.startswith("test_malformed_input["):
        ids = _both("test_malformed_input")
    elif name in ("test_streaming_reconstruction", "test_streaming_parallel_calls_single_delta"):
        ids = (name,)
    else:  # the other ToolParserTests, run streaming and not
        ids = _both(name)
    return Case(**{**case.__dict__, "ids": ids})


CASES = [_granite_ids(c) if c.source == GRANITE_T else c for c in CASES]
KNOWN_DIFFERENCES = [
    (_granite_ids(c), o) if c.source == GRANITE_T else (c, o) for c, o in KNOWN_DIFFERENCES
]


def _dsv32_ids(case: Case) -> Case:
    name = case.id.removesuffix(" (prefixed)")
    ids: tuple[str, ...] = (name,)
    if name == "TestExtractToolCalls.test_single_tool_no_params":  # the same output there
        ids += ("TestExtractToolCallsStreaming.test_empty_arguments_streaming",)
    return Case(**{**case.__dict__, "ids": ids})


CASES = [_dsv32_ids(c) if c.source == DSV32 else c for c in CASES]
KNOWN_DIFFERENCES = [
    (_dsv32_ids(c), o) if c.source == DSV32 else (c, o) for c, o in KNOWN_DIFFERENCES
]


_QC_TOOLS_P = ("chat_completion", "responses_api")  # its sample_tools fixture
_QC_P4 = tuple(f"{p}-{t}" for p in ("coder", "engine") for t in _QC_TOOLS_P)
_QC_ONLY_CODER = (  # tests given the Qwen3Coder parser alone (sample_tools' two runs)
    "test_malformed_xml_no_gt_delimiter",
    "test_none_tool_calls_filtered",
    "test_streaming_multi_param_single_chunk",
    "test_no_double_serialization_string_args",
)
_QC_TOKENIZER_ONLY = (  # their own tools: one run each
    "test_extract_tool_calls_type_conversion",
    "test_extract_tool_calls_anyof_type_conversion",
    "test_extract_tool_calls_anyof_type_conversion_streaming",
    "test_anyof_parameter_not_double_encoded",
)
_QC_EXTRACT = (
    "single_tool",
    "single_tool_with_content",
    "single_tool_multiline_param",
    "parallel_tools",
    "tool_with_typed_params",
)


def _qc_runs(name: str, param: str = "") -> tuple[str, ...]:
    """The pytest ids of a test_qwen3coder_tool_parser.py test: its parser fixtures'
    runs (coder / engine parser x chat-completion / Responses tools), then its own param."""
    tail = f"-{param}" if param else ""
    if name in _QC_TOKENIZER_ONLY:
        return (name,)
    if name in _QC_ONLY_CODER:
        return every(name, *_QC_TOOLS_P)
    if name == "test_extract_tool_calls_streaming_missing_opening_tag":  # the engine parser
        return every(name, *_QC_TOOLS_P)
    return tuple(f"{name}[{r}{tail}]" for r in _QC_P4)


def _qwen3coder_ids(case: Case) -> Case:
    test, _, param = case.id.partition("[")
    param = param.rstrip("]")
    ids = _qc_runs(test, param)
    if test == "test_extract_tool_calls" and param != "parallel_tools":  # the same outputs
        ids += _qc_runs("test_extract_tool_calls_streaming", param)
    return Case(**{**case.__dict__, "ids": ids})


CASES = [_qwen3coder_ids(c) if c.source == QWEN3CODER else c for c in CASES]
KNOWN_DIFFERENCES = [
    (_qwen3coder_ids(c), o) if c.source == QWEN3CODER else (c, o) for c, o in KNOWN_DIFFERENCES
]


_QS_PARSER_TESTS = (  # given the `parser` fixture: xml / coder x chat-completion / Responses tools
    "test_extract_tool_calls_no_tools",
    "test_extract_tool_calls",
    "test_extract_tool_calls_fallback_no_tags",
    "test_extract_tool_calls_streaming",
    "test_extract_tool_calls_missing_closing_parameter_tag",
    "test_extract_tool_calls_streaming_missing_closing_tag",
    "test_extract_tool_calls_streaming_incremental",
    "test_malformed_xml_no_gt_delimiter",
    "test_none_tool_calls_filtered",
    "test_streaming_multi_param_single_chunk",
    "test_extract_tool_calls_streaming_speculative_decode_loss",
)
_QS_CLS_TESTS = (  # given `parser_cls` (xml / coder) and their own tools
    "test_extract_tool_calls_type_conversion",
    "test_extract_tool_calls_complex_type_with_single_quote",
    "test_no_double_serialization_string_args",
    "test_string_null_value_preserved",
    "test_anyof_string_null_keeps_value_as_string",
    "test_anyof_integer_null_parses_as_int",
    "test_anyof_object_param_not_double_encoded_nonstreaming",
    "test_anyof_object_param_not_double_encoded_streaming",
    "test_double_encoded_object_param_nonstreaming",
    "test_double_encoded_object_param_streaming",
    "test_content_with_xml_structural_tags_nonstreaming",
    "test_content_with_xml_structural_tags_streaming",
    "test_content_with_param_like_lines_nonstreaming",
    "test_content_with_param_like_lines_streaming",
    "test_array_with_json_bool",
    "test_two_tool_calls_in_one_streaming_chunk",
    "test_python_none_value_for_nullable_int",
    "test_streaming_two_tool_calls_plus_trailing_text_one_delta",
    "test_streaming_trailing_text_with_final_close_in_same_delta",
    "test_content_with_real_param_name_literal_nonstreaming",
    "test_content_with_real_param_name_literal_streaming",
    "test_content_with_full_nested_tool_call_nonstreaming",
    "test_content_with_full_nested_tool_call_streaming",
    "test_two_tools_second_with_out_of_schema_nested_literal_nonstreaming",
    "test_two_tools_second_with_out_of_schema_nested_literal_streaming",
    "test_jinja_template_phantom_tool_call_is_rejected_nonstreaming",
    "test_inline_empty_tool_call_preserves_content_before_real_call",
    "test_anyof_string_null_with_null_literal_returns_none",
)


def _qs_runs(test: str, tag: str, param: str = "") -> tuple[str, ...]:
    """The pytest ids of a shared-file test for parser `tag` (xml / coder)."""
    if test in _QS_CLS_TESTS:
        return (f"{test}[{tag}]",)
    tail = f"-{param}" if param else ""
    return tuple(f"{test}[{tag}-{t}{tail}]" for t in _QC_TOOLS_P)


def _qshared_ids(case: Case) -> Case:
    name, _, tag = case.id.rpartition("[")
    test, _, param = name.split(" (")[0].partition("[")
    param, tag = param.rstrip("]"), tag.rstrip("]")
    ids = _qs_runs(test, tag, param)
    if test == "test_extract_tool_calls":  # its streaming test reads the same outputs
        ids += _qs_runs("test_extract_tool_calls_streaming", tag, param)
    return Case(**{**case.__dict__, "ids": ids})


CASES = [_qshared_ids(c) if c.source == QSHARED else c for c in CASES]
KNOWN_DIFFERENCES = [
    (_qshared_ids(c), o) if c.source == QSHARED else (c, o) for c, o in KNOWN_DIFFERENCES
]


QWEN36 = "tests/tool_parsers/test_qwen36_bugs.py@c164555e41"
# Its outputs are the shared file's (array with a JSON true; two calls in one delta), read
# by the XML and the Coder parser.
_QWEN36_FROM_SHARED = {
    "test_array_with_json_bool[xml]": "test_xml_array_with_json_bool_nonstreaming",
    "test_array_with_json_bool[coder]": "test_coder_array_with_json_bool_nonstreaming",
    "test_two_tool_calls_in_one_streaming_chunk[coder]": (
        "test_coder_two_tool_calls_in_one_streaming_chunk"
    ),
    "test_two_tool_calls_in_one_streaming_chunk[xml]": (
        "test_xml_two_tool_calls_in_one_streaming_chunk"
    ),
}
CASES += [
    Case(**{**c.__dict__, "source": QWEN36, "ids": (_QWEN36_FROM_SHARED[c.id],)})
    for c in CASES
    if c.source == QSHARED and c.id in _QWEN36_FROM_SHARED
]


GLM47_DELTA = "tests/tool_parsers/test_glm47_final_delta_bug.py@5637b791b2"
CASES.append(  # streamed byte by byte here, the argument pieces joining to the call
    Case(
        "final_delta_not_cumulative",
        GLM47_DELTA,
        "glm47",
        "",
        "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Beijing</arg_value>"
        "<arg_key>date</arg_key><arg_value>2025-08-01</arg_value></tool_call>",
        (("get_weather", {"city": "Beijing", "date": "2025-08-01"}),),
        tools=(fn_tool("get_weather", {"city": {"type": "string"}, "date": {"type": "string"}}),),
        ids=("test_streaming_final_delta_not_cumulative",),
    )
)


# Every test id of each vLLM file re-read case for case (the file at the commit named), for
# test_every_vllm_test_id_is_a_case (tests/fast/test_parser_references.py): each is a
# case's id (`Case.ids`), a known difference's, or NOT_APPLICABLE with the reason.
_MODES = ("streaming", "nonstreaming")
_COMMON = [i for ids in COMMON_IDS.values() for i in ids] + list(_both("test_malformed_input"))
_HERMES_SHARED = [  # run with both of CONFIGS' parsers
    "test_hermes_parser_streaming_just_forward_text",
    "test_hermes_parser_streaming_failure_case_bug_19056",
    "test_hermes_parser_streaming",
    "test_hermes_parser_non_streaming_no_tool_call",
    "test_hermes_parser_non_streaming_tool_call_between_tags",
    "test_hermes_parser_non_streaming_tool_call_until_eos",
    "test_hermes_parser_non_streaming_tool_call_invalid_json",
    "test_hermes_parser_non_streaming_serialized_arguments",
    "test_hermes_parser_non_streaming_bare_string_arguments",
]
_MISTRAL_PRE11 = [
    "single_tool_add",
    "single_tool_weather",
    "argument_before_name",
    "argument_before_name_and_name_in_argument",
    "multiple_tools",
    "content_before_tool",
    "trailing_data_after_json",
]
IDS: dict[str, list[str]] = {
    HERMES: [
        *[i for t in _HERMES_SHARED for i in every(t, "llama", "granite4")],
        *every("test_hermes_streaming_tool_call_with_stream_interval", 2, 3, 5, 8),
        *every("test_hermes_streaming_content_then_tool_call_with_stream_interval", 2, 3, 5, 8),
        *every("test_hermes_streaming_multiple_tool_calls_with_stream_interval", 1, 2, 4),
        *every("test_hermes_streaming_boolean_args_with_stream_interval", 2, 5),
        *every("test_hermes_streaming_just_forward_text_with_stream_interval", 2, 3, 5),
        *every("test_hermes_streaming_serialized_arguments_with_stream_interval", 1, 2, 3, 5),
        *every("test_hermes_streaming_bare_string_arguments_with_stream_interval", 1, 3),
        *every(
            "test_hermes_streaming_string_arguments_match_non_streaming",
            *[f"{n}-{pid(v)}" for v in [SERIALIZED, *STRING_ARGUMENTS] for n in (1, 3)],
        ),
        "test_hermes_streaming_content_and_tool_call_in_single_chunk",
    ],
    OPENAI: [
        "test_extract_tool_calls_no_tools",
        *every(
            "test_extract_tool_calls_single_tool", *map(pid, [TOKYO, '{\n"location": "Tokyo"\n}'])
        ),
        "test_extract_tool_calls_multiple_tools",
        "test_extract_tool_calls_with_content",
        "test_get_xgrammar_builtin_structural_tag_returns_structural_tag",
        *every("test_adjust_request_auto_structural_tag_is_json_string", "True", "False"),
        "test_adjust_request_required_uses_json_schema_not_structural_tag",
    ],
    LLAMA3: [
        *[
            f"test_extract_tool_calls_{t}"
            for t in (
                "simple",
                "with_arguments",
                "no_json",
                "invalid_json",
                "with_arguments_key",
                "multiple_json",
                "multiple_json_with_whitespace",
                "multiple_json_with_surrounding_text",
                "deeply_nested_json",
                "multiple_with_deep_nesting",
                "with_quotes_and_brackets_in_string",
                "with_escaped_quotes_in_nested_json",
                "missing_name_key",
                "missing_parameters_and_arguments_key",
                "brace_in_trailing_text",
                "json_fragment_in_trailing_text",
            )
        ],
        *every(
            "test_extract_tool_calls_streaming_parallel_separators",
            *map(pid, ["; ", ";", ";\n", "\n"]),
        ),
        "test_regex_timeout_handling",
    ],
    DSV3: _COMMON,
    DSV31: [
        "test_extract_tool_calls_with_tool",
        "test_extract_tool_calls_with_multiple_tools",
        *every(
            "test_extract_tool_calls_unparsable_block",
            pid(f"Let me look that up.{B}get_weather"),
            pid(f'{B}foo{SEP}{{"x":1}}{E}'),
        ),
    ],
    PHI4: _COMMON,
    INTERNLM: [
        "test_extract_unknown_tool_name_not_emitted",
        "test_extract_known_tool_name_emitted",
        "test_extract_without_tools_not_over_rejected",
        *_COMMON,
    ],
    LONGCAT: _COMMON,
    JAMBA: [
        "test_extract_tool_calls_no_tools",
        *every(
            "test_extract_tool_calls", "single_tool", "single_tool_with_content", "parallel_tools"
        ),
        *every(
            "test_extract_tool_calls_streaming",
            "no_tools",
            "single_tool",
            "single_tool_with_content",
            "parallel_tools",
        ),
        "test_extract_tool_calls_streaming_arguments_in_single_delta",
    ],
    MISTRAL: [
        *every("test_extract_tool_calls_no_tools", "pre_v11", "v11"),
        *every(PRE11, *_MISTRAL_PRE11),
        "test_extract_tool_calls_pre_v11_multiple_bot_tokens_raises",
        "test_extract_tool_calls_pre_v11_regex_fallback",
        "test_extract_tool_calls_pre_v11_regex_fallback_fails",
        *every(
            "test_extract_tool_calls",
            "single_tool_add",
            "single_tool_weather",
            "multiple_tool_calls",
            "complex",
            "wrong_json",
        ),
        "test_extract_tool_calls_v11_without_args_skipped",
        *every(
            PRE11_STREAM,
            "no_tools",
            "single_tool_add",
            "single_tool_add_strings",
            *[t for t in _MISTRAL_PRE11 if t not in ("single_tool_add", "content_before_tool")],
        ),
        *every(
            "test_extract_tool_calls_streaming",
            "single_tool_add",
            "single_tool_add_strings",
            "multiple_tools",
        ),
        "test_extract_tool_calls_streaming_v11_no_tools",
        *every(
            ONE_CHUNK,
            *[
                f"v11-{t}"
                for t in (
                    "single_tool_add",
                    "single_tool_weather",
                    "multiple_tool_calls",
                    "content_before_tool",
                    "complex",
                )
            ],
            "pre_v11-no_tools",
            *[
                f"pre_v11-{t}"
                for t in (
                    "single_tool_add",
                    "single_tool_add_strings",
                    "single_tool_weather",
                    "argument_before_name",
                    "argument_before_name_and_name_in_argument",
                    "multiple_tools",
                    "content_before_tool",
                )
            ],
        ),
        *every("test_fast_detokenization_text_detection", "v11", "pre_v11"),
        *every("test_extract_tool_calls_streaming_exception_returns_none", "v11", "pre_v11"),
        *every(
            "test_adjust_request_grammar_factory",
            "auto",
            "none",
            "required",
            "null_tool_choice",
            "named_tool_choice",
            "parallel_false",
            "response_format_text",
        ),
        "test_adjust_request_unsupported_grammar_for_tokenizer",
        *every("test_adjust_request_non_mistral_tokenizer", "auto_skip_false", "none_skip_true"),
        *every(
            "test_adjust_request_unsupported_structured_outputs",
            "regex",
            "choice",
            "structural_tag",
            "grammar",
        ),
        "test_adjust_request_unsupported_response_format",
        *every(
            "test_adjust_request_structured_outputs_generates_grammar",
            "json_object",
            "json_str",
            "json_dict",
        ),
        *every(
            "test_adjust_request_response_format_generates_grammar",
            "json_object",
            "json_schema_with_schema",
        ),
        *every(
            "test_adjust_request_tool_choice_with_json_schema_factory_routing",
            "none_uses_json_schema_factory",
            "auto_uses_jinja_factory",
        ),
        "test_grammar_from_tool_parser_default_false",
        "test_grammar_from_tool_parser_set_by_adjust_request",
        *every(
            "test_build_non_streaming_tool_calls", "none", "empty", "with_id", "without_id", "mixed"
        ),
        *[
            f"TestExtractMaybeReasoningAndToolStreaming.{t}"
            for t in (
                "test_no_reasoning_tools_called",
                "test_no_reasoning_no_tools",
                "test_mistral_reasoning_parser_no_think_token",
                "test_mistral_reasoning_parser_with_think_token",
                "test_non_mistral_reasoning_parser_always_expects_thinking",
                "test_reasoning_already_ended_no_reset",
                "test_pre_v15_ignores_prompt_reasoning_end",
                "test_non_pre_v15_prompt_reasoning_end",
                "test_reasoning_end_transition_with_content",
                "test_reasoning_end_transition_without_content",
            )
        ],
    ],
    QWEN3XML: [
        *_COMMON,
        *every(
            "test_convert_param_value_invalid_emits_warning",
            *[f"not_a_number-{t}" for t in ("int", "integer", "uint", "long", "short", "unsigned")],
            "not_a_float-num",
            "not_a_float-float",
        ),
    ],
    GRANITE4_T: [
        *every("test_tool_call_parser_complex", "1-1", "1-2", "5-7", "6-20"),
        "test_streaming_preserves_content_between_complete_tool_calls",
    ],
    ERNIE45: [
        "test_extract_tool_calls_no_tools",
        *[
            f"{test}[{name}]"
            for test in ("test_extract_tool_calls", "test_extract_tool_calls_streaming_incremental")
            for name in ("single_tool_call", "multiple_tool_calls", "tool_call_with_content_before")
        ],
    ],
    PYTHONIC: [
        *every("test_no_tool_call", "True", "False"),
        *every("test_tool_call", *[f"{f}_{m}" for f, _, _ in PY_FORMS for m in _MODES]),
        "test_streaming_tool_call_with_large_steps",
        *every("test_regex_timeout_handling", "False"),
        *every("test_bad_sibling_call_does_not_drop_good_calls", "True", "False"),
        "test_non_finite_argument_rejected",
        "test_good_call_survives_unparsable_sibling",
        "test_unrecoverable_block_still_reports_no_tool_call",
        "test_streaming_mismatched_brackets_reported_once",
    ],
    LLAMA4P: [
        *every("test_no_tool_call", "True", "False"),
        *every(
            "test_tool_call",
            *[
                f"{f}_{m}"
                for f in (
                    "simple",
                    "more_types",
                    "parameterless",
                    "empty_dict",
                    "empty_list",
                    "escaped_string",
                    "python_tag",
                )
                for m in _MODES
            ],
            *[f"parallel_calls_{m}{n}" for n in (0, 1) for m in _MODES],
        ),
        "test_streaming_tool_call_with_large_steps",
        *every("test_regex_timeout_handling", "False"),
        *every("test_bad_sibling_call_does_not_drop_good_calls", "True", "False"),
        "test_non_finite_argument_rejected",
        "test_streaming_mismatched_brackets_reported_once",
    ],
    MINIMAX_M2: [
        f"{cls}.{t}"
        for cls, tests in {
            "TestContentStreaming": (
                "test_plain_content",
                "test_content_before_tool_call",
                "test_empty_delta_no_crash",
            ),
            "TestSingleInvoke": (
                "test_incremental_chunks",
                "test_single_chunk_complete",
                "test_multiple_params",
            ),
            "TestMultipleInvokes": (
                "test_two_invokes_incremental",
                "test_two_invokes_in_single_delta",
                "test_different_functions",
            ),
            "TestInternalState": (
                "test_prev_tool_call_arr_single",
                "test_prev_tool_call_arr_multiple",
            ),
            "TestDeltaMessageFormat": ("test_tool_call_fields", "test_multi_invoke_indices"),
            "TestEOSHandling": ("test_eos_after_tool_calls", "test_end_token_ignored"),
            "TestSpecialTokenDetection": ("test_start_token_via_id",),
            "TestLargeChunks": ("test_header_and_params_in_separate_chunks",),
            "TestAnyOfNullableParam": (
                "test_anyof_nullable_param_non_null_value",
                "test_anyof_nullable_param_null_value",
                "test_anyof_nullable_param_object_value",
            ),
        }.items()
        for t in tests
    ],
    GLM47: [
        *[
            f"TestGlm47ExtractToolCalls.{t}"
            for t in (
                "test_no_tool_call",
                "test_zero_arg_inline",
                "test_zero_arg_newline",
                "test_args_same_line",
                "test_args_with_newlines",
                "test_content_before",
                "test_multiple",
                "test_empty_content_none",
                "test_whitespace_content_none",
            )
        ],
        *[
            f"TestGlm47Streaming.{t}"
            for t in (
                "test_no_args",
                "test_with_args",
                "test_delays_prefix_only_tool_name_until_exact_match",
                "test_delays_prefix_only_tool_name_with_function_tools",
            )
        ],
    ],
    KIMI: [
        *[
            f"TestExtractToolCalls.{t}"
            for t in (
                "test_no_tools",
                *[f"test_extract_tool_calls[{p}]" for p in _KIMI_PARAMS],
                "test_invalid_json_still_extracted",
                "test_invalid_funcall_id_skipped",
                "test_native_id_extracted",
                "test_multi_turn_native_id_continuity",
                "test_bare_counter",
                "test_bare_counter_single_tool_invalid_json_still_extracted",
                "test_bare_counter_multiple_tools_infers_by_args",
                "test_bare_counter_multiple_tools_skips_unsafe_inference[ambiguous]",
                "test_bare_counter_multiple_tools_skips_unsafe_inference[malformed_json]",
            )
        ],
        *[
            f"TestStreamingHappyPath.{t}"
            for t in (
                "test_single_tool_call",
                "test_multiple_tool_calls",
                "test_bare_counter",
                "test_bare_counter_multiple_tools_infers_by_args",
                "test_content_before_tools",
                "test_no_tool_calls",
                "test_incremental_arguments",
                "test_streaming_matches_nonstreaming[single_tool]",
                "test_streaming_matches_nonstreaming[parallel_tools]",
                "test_streaming_matches_nonstreaming[no_functions_prefix]",
            )
        ],
        *[
            f"TestStreamingEdgeCases.{t}"
            for t in (
                "test_marker_suppression",
                "test_noise_between_markers_suppressed",
                "test_empty_tool_section",
                "test_three_different_tools",
                "test_truncated_tool_call_no_end_marker",
                "test_content_after_tool_section",
            )
        ],
        *[
            f"TestAdjustRequest.{t}"
            for t in (
                "test_sets_skip_special_tokens_false",
                "test_no_change_when_tool_choice_none",
                "test_no_change_when_no_tools",
            )
        ],
        *[
            f"TestStreamingIntervals.{t}[{n}]"
            for t in (
                "test_single_tool_call_at_interval",
                "test_content_then_tool_call_at_interval",
                "test_multiple_tool_calls_at_interval",
                "test_plain_text_at_interval",
            )
            for n in (1, 2, 3, 5, 8)
        ],
        "TestStreamingIntervals.test_content_and_tool_call_in_single_chunk",
    ],
    GLM45: [
        "test_extract_tool_calls_no_tools",
        *every("test_extract_tool_calls", *_GLM45_PARAMS),
        *[
            f"test_extract_tool_calls_{t}"
            for t in (
                "with_thinking_tags",
                "malformed_xml",
                "empty_arguments",
                "mixed_content",
                "special_characters",
                "incomplete_tool_call",
                "numeric_deserialization",
                "with_function_tool",
                "with_function_tool_mixed_types",
            )
        ],
        *[
            f"test_streaming_{t}"
            for t in (
                "basic_functionality",
                "no_tool_calls",
                "with_content_before_tool_calls",
                "incremental_string_value",
                "empty_tool_call",
                "prev_tool_call_arr_updates",
                "multiple_tool_calls_sequential",
                "json_escape_in_string",
                "long_content_incremental",
                "multi_token_chunks",
                "entire_tool_call_at_once",
                "content_between_tool_calls_multi_token",
                "multi_token_with_multiple_args",
                "with_function_tool",
                "no_corruption_for_boolean_values",
            )
        ],
        "test_whitespace_preserved_in_arg_values",
        "test_zero_argument_tool_call",
        "test_malformed_tool_call_no_regex_match",
        "test_delimiter_preserved_transformers_5x",
        "test_unicode_characters_preserved",
        *[i for t, ns in _GLM45_INTERVALS.items() for i in every(t, *ns)],
        "test_stream_interval_extreme_single_chunk",
        "test_extract_tool_call_without_newline_after_name",
        "test_string_type_detection_with_anyof",
        "test_string_type_detection_with_list_types",
        "test_format_nonstring_value_preserves_json",
    ],
    GEMMA4: [
        *[
            f"TestParseGemma4Args.{t}"
            for t in (
                "test_empty_string",
                "test_whitespace_only",
                "test_single_string_value",
                "test_string_value_with_comma",
                "test_multiple_string_values",
                "test_integer_value",
                "test_float_value",
                "test_boolean_true",
                "test_boolean_false",
                "test_null_value",
                "test_mixed_types",
                "test_nested_object",
                "test_string_delimited_dict_key",
                "test_nested_string_delimited_dict_key",
                "test_array_of_strings",
                "test_unterminated_string",
                "test_empty_value",
                "test_empty_value_partial_withheld",
                "test_empty_value_after_other_keys_partial_withheld",
                "test_trailing_dot_float_partial_withheld",
                "test_malformed_partial_array",
            )
        ],
        *[
            f"TestParseGemma4Array.{t}"
            for t in (
                "test_string_array",
                "test_empty_array",
                "test_bare_values",
                "test_string_element_with_closing_bracket",
                "test_stray_closing_bracket",
                "test_trailing_dot_float_partial_withheld",
            )
        ],
        *[
            f"TestExtractToolCalls.{t}"
            for t in (
                "test_no_tool_calls",
                "test_single_tool_call",
                "test_multiple_arguments",
                "test_text_before_tool_call",
                "test_multiple_tool_calls",
                "test_nested_arguments",
                "test_tool_call_with_number_and_boolean",
                "test_incomplete_tool_call",
                "test_hyphenated_function_name",
                "test_dotted_function_name",
                "test_no_arguments",
            )
        ],
        *[
            f"TestStreamingExtraction.{t}"
            for t in (
                "test_basic_streaming_single_tool",
                "test_streaming_multi_arg",
                "test_streaming_no_extra_brace",
                "test_streaming_no_unquoted_keys",
                "test_streaming_name_no_call_prefix",
                "test_streaming_text_before_tool_call",
                "test_streaming_numeric_args",
                "test_streaming_boolean_split_across_chunks",
                "test_streaming_false_split_across_chunks",
                "test_streaming_number_split_across_chunks",
                "test_streaming_empty_args",
                "test_streaming_split_delimiter_no_invalid_json",
                "test_streaming_does_not_duplicate_plain_text_after_tool_call",
                "test_streaming_html_argument_does_not_duplicate_tag_prefixes",
                "test_streaming_trailing_bare_bool_not_duplicated",
            )
        ],
    ],
    GEMMA4_BARE: [
        *[
            f"TestGemma4CanonicalFormats.{t}"
            for t in (
                "test_canonical_tag_wrapped_call",
                "test_turn_end_closure_instead_of_tool_call_end",
                "test_multiple_sequential_canonical_calls",
                "test_strict_mode_ignores_fallback_formats",
            )
        ],
        *[
            f"TestGemma4FallbackFormats.{t}"
            for t in (
                "test_bare_call_after_thought_channel",
                "test_colon_prefixed_tool_call",
                "test_bare_call_with_leading_whitespace",
                "test_fragmented_call_tag_from_multimodal",
                "test_hyphenated_tool_name",
                "test_dotted_tool_name",
                "test_no_tool_call_returns_empty",
            )
        ],
        "TestGemma4EngineBareCallIntegration.test_offline_utils_bare_call_after_channel",
        "TestGemma4EngineBareCallIntegration.test_engine_tool_parser_bare_call_extraction",
    ],
    GEMMA4_REQUIRED: [
        "TestGemma4ParserParseRequiredEnforcement.test_required_prose_only_rejected",
        "TestGemma4ParserParseRequiredEnforcement.test_required_tool_call_accepted",
        "TestGemma4ParserParseRequiredEnforcement.test_auto_prose_only_passes_through",
        "TestGemma4ParserStreamingRequiredEnforcement.test_required_prose_only_rejected_at_finish",
        "TestGemma4ParserStreamingRequiredEnforcement.test_required_tool_call_stream_accepted",
        "TestGemma4ToolParserRequiredEnforcement.test_required_prose_only_rejected",
        "TestGemma4ToolParserRequiredEnforcement.test_required_tool_call_accepted",
        "TestGemma4ToolParserRequiredEnforcement.test_auto_prose_only_passes_through",
    ],
    XLAM: [
        "test_extract_tool_calls_no_tools",
        *every("test_extract_tool_calls", *_X_PARAMS),
        "test_extract_tool_calls_list_structure[list_structured_tool_call]",
        "test_preprocess_model_output",
        "test_streaming_with_list_structure",
        *every("test_extract_tool_calls_streaming_incremental", *_X_PARAMS),
        *every("test_extract_tool_calls_non_ascii", "False", "True"),
        *every("test_extract_tool_calls_streaming_one_empty_args_tool", *_X_EMPTY),
    ],
    HUNYUAN: _HY_IDS,
    SEED: [
        "test_extract_tool_calls_no_tools",
        "test_streaming_tool_calls_no_tools",
        *[
            f"{t}[{p}]"
            for t in ("test_extract_tool_calls", "test_streaming_tool_calls")
            for p in (
                "tool_call_0_thinking_budget",
                "tool_call_512_thinkg_budget",
                "tool_call_unlimited_thinking_budget",
            )
        ],
    ],
    GRANITE_T: [
        *_COMMON,
        *_both("test_granite_token_prefix_format"),
        *_both("test_granite_string_prefix_format"),
        *every("test_streaming_parallel_calls_batched_deltas", 2, 3, 4, 5),
        "test_streaming_parallel_calls_single_delta",
    ],
    FUNCTIONGEMMA: [
        *[
            f"TestExtractToolCalls.{t}"
            for t in (
                "test_no_tool_calls",
                "test_single_tool_call",
                "test_multiple_arguments",
                "test_text_before_tool_call",
                "test_multiple_tool_calls",
            )
        ],
        *[
            f"TestParseArguments.{t}"
            for t in (
                "test_empty_arguments",
                "test_single_string_argument",
                "test_multiple_arguments",
                "test_numeric_argument",
                "test_boolean_argument",
                "test_argument_with_spaces",
            )
        ],
        "TestExtractToolCallsStreaming.test_streamed_arguments_form_valid_json_with_two_keys",
        "TestExtractToolCallsStreaming.test_streamed_arguments_form_valid_json_with_three_keys",
        "TestAdjustRequest.test_skip_special_tokens_disabled",
        "TestAdjustRequest.test_skip_special_tokens_when_tool_choice_none",
        "TestBufferDeltaText.test_regular_text_not_buffered",
        "TestBufferDeltaText.test_complete_tag_flushed",
    ],
    DSV32: [
        *[
            f"TestExtractToolCalls.{t}"
            for t in (
                "test_no_tool_call",
                "test_single_tool_no_params",
                "test_single_tool_with_params",
                "test_content_before_tool_call",
                "test_no_content_prefix_returns_none",
                "test_multiple_tools",
                "test_type_conversion_in_non_streaming",
                "test_string_attr_true_coerced_by_schema",
                "test_string_attr_false_allows_schema_conversion",
                "test_composed_schema_converts_object_and_array_params",
                "test_string_attr_true_coerced_by_composed_schema",
                "test_arguments_wrapper_repaired",
                "test_input_wrapper_repaired",
                "test_object_and_array_params",
                "test_number_param",
                "test_multi_typed_schema",
                "test_multi_typed_null_value",
                "test_null_coerced_back_to_string_by_schema",
                "test_no_schema_parses_json",
            )
        ],
        *[
            f"TestExtractToolCallsStreaming.{t}"
            for t in (
                "test_plain_content_no_tool",
                "test_single_tool_streaming",
                "test_tool_name_emitted",
                "test_content_before_tool_call_streaming",
                "test_type_conversion_in_streaming",
                "test_string_attr_true_coerced_by_schema_streaming",
                "test_composed_schema_conversion_in_streaming",
                "test_responses_function_tool_schema_in_streaming",
                "test_streaming_matches_non_streaming_conversion_fallbacks",
                "test_multiple_tools_streaming",
                "test_state_reset_on_new_stream",
                "test_empty_arguments_streaming",
                "test_unique_tool_call_ids",
                "test_streaming_matches_non_streaming",
                "test_single_tool_chunked_stream_interval",
                "test_content_before_tool_chunked",
                "test_multiple_tools_chunked",
                "test_emits_arguments_before_invoke_completes",
                "test_long_string_argument_streams_before_close",
                "test_no_marker_leak_chunked",
                "test_no_marker_leak_with_prefix_chunked",
                "test_no_marker_leak_char_by_char",
                "test_no_marker_leak_all_split_points",
                "test_false_partial_marker_emitted",
                "test_object_and_array_params_streaming",
                "test_multi_typed_schema_streaming",
                "test_multi_typed_null_streaming",
                "test_number_param_streaming",
            )
        ],
        "TestDelimiterPreservation.test_delimiter_preserved_fast_detokenization",
        "TestDelimiterPreservation.test_tool_detection_skip_special_tokens_false",
    ],
    QWEN3CODER: [
        *_qc_runs("test_extract_tool_calls_no_tools"),
        *[i for p in _QC_EXTRACT for i in _qc_runs("test_extract_tool_calls", p)],
        *_qc_runs("test_extract_tool_calls_fallback_no_tags"),
        *_QC_TOKENIZER_ONLY,
        *[
            i
            for p in ("no_tools", *_QC_EXTRACT)
            for i in _qc_runs("test_extract_tool_calls_streaming", p)
        ],
        *_qc_runs("test_extract_tool_calls_missing_closing_parameter_tag"),
        *_qc_runs("test_extract_tool_calls_streaming_missing_closing_tag"),
        *_qc_runs("test_extract_tool_calls_streaming_incremental"),
        *_qc_runs("test_extract_tool_calls_streaming_missing_opening_tag"),
        *[i for t in _QC_ONLY_CODER for i in _qc_runs(t)],
        *every("test_get_vllm_registry_structural_tag_returns_structural_tag", *_QC_TOOLS_P),
        *every(
            "test_adjust_request_auto_uses_vllm_registry_structural_tag",
            *[f"{t}-{r}" for t in _QC_TOOLS_P for r in ("True", "False")],
        ),
        *every("test_adjust_request_required_prefers_structural_tag", *_QC_TOOLS_P),
    ],
    QSHARED: [
        *[
            i
            for tag in ("xml", "coder")
            for test, params in (
                ("test_extract_tool_calls_no_tools", ("",)),
                ("test_extract_tool_calls", _QC_EXTRACT),
                ("test_extract_tool_calls_fallback_no_tags", ("",)),
                ("test_extract_tool_calls_streaming", ("no_tools", *_QC_EXTRACT)),
                *[(t, ("",)) for t in _QS_PARSER_TESTS[4:]],
                *[(t, ("",)) for t in _QS_CLS_TESTS],
            )
            for p in params
            for i in _qs_runs(test, tag, p)
        ],
    ],
    GEMMA4_NAMED: [
        "test_named_choice_rejected",
        "test_required_choice_still_skips_structured_outputs",
    ],
    QWEN36: list(_QWEN36_FROM_SHARED.values()),
    GLM47_DELTA: ["test_streaming_final_delta_not_cumulative"],
    OLMO3: [
        *every("test_no_tool_call", "True", "False"),
        *every(
            "test_tool_call",
            *[
                f"{t}_{mode}"
                for t in (
                    "simple",
                    "more_types",
                    "parameterless",
                    "empty_dict",
                    "empty_list",
                    "escaped_string",
                    "parallel_calls",
                )
                for mode in ("streaming", "nonstreaming")
            ],
            "more_types_streaming_json_literals",
            "more_types_nonstreaming_json_literals",
        ),
        "test_streaming_tool_call_with_large_steps",
        *every("test_regex_timeout_handling", "False"),
        *every("test_bad_sibling_call_does_not_drop_good_calls", "True", "False"),
        "test_non_finite_argument_rejected",
        "test_streaming_healthy_call_logs_nothing",
        "test_streaming_mismatched_brackets_reported_once",
    ],
}
# Tests with no model output to extract from (request adjustment, grammar building, mocked
# internals): what they check has no counterpart in an output's extraction.
_NO_OUTPUT = {
    "test_delimiter_preserved_transformers_5x": "checks adjust_request's "
    "skip_special_tokens (no model output)",
    "test_format_nonstring_value_preserves_json": "calls the parser's value formatter "
    "directly (no model output); the values it formats are typed here by "
    "test_extract_tool_calls_numeric_deserialization and the schema cases",
    "test_get_vllm_registry_structural_tag": "builds an xgrammar structural tag for a "
    "request (no model output); this backend's tool grammars: tests/fast/test_tool_grammar.py",
    "test_get_xgrammar": "builds an xgrammar structural tag for a request (no model output)",
    "TestBufferDeltaText": "calls the parser's delta buffer directly (no model output); "
    "markers split across tokens are the byte-by-byte run of every case here",
    "TestAdjustRequest": "checks how the parser adjusts a request's skip_special_tokens "
    "(no model output)",
    "test_adjust_request": "checks how the parser adjusts a request's structured output / "
    "special-token settings (no model output); this backend's tool grammars: "
    "tests/fast/test_tool_grammar.py",
    "test_grammar_from_tool_parser": "a request flag set by adjust_request (no model output)",
    "test_build_non_streaming_tool_calls": "builds mistral_common call objects from given "
    "calls (no model output)",
    "test_convert_param_value_invalid_emits_warning": "the format of a warning vLLM's "
    "StreamingXMLToolCallParser logs for a value it cannot convert, called directly (no "
    "model output)",
    "test_extract_tool_calls_streaming_exception_returns_none": "patches the parser's "
    "internals to raise and checks the wrapper returns None (no model output)",
    "TestExtractMaybeReasoningAndToolStreaming": "drives vLLM's reasoning/tool streaming "
    "hand-off with mocked parsers and token ids (no model output); here the reasoning "
    "and tool parsers share one router (tests/vllm_reasoning_cases.py has mistral's cases)",
}
NOT_APPLICABLE: dict[tuple[str, str], str] = {
    (source, i): why
    for source, ids in IDS.items()
    for i in ids
    for prefix, why in _NO_OUTPUT.items()
    if i.startswith(prefix)
}
NOT_APPLICABLE[MINIMAX_M2, "TestContentStreaming.test_empty_delta_no_crash"] = (
    "an empty delta with no token id handed to the streaming parser (no model output)"
)
NOT_APPLICABLE[MINIMAX_M2, "TestSpecialTokenDetection.test_start_token_via_id"] = (
    "the start marker as a token id with empty text, checked in the parser's state; here "
    "markers are found in the detokenized text (the toy tokenizers split them anywhere)"
)
_PARTIAL = (
    "the argument reader's partial mode, which vLLM's streaming path calls on a cut-off "
    "argument text (no call form: here a call streams from the text the model wrote)"
)
NOT_APPLICABLE.update(
    {
        (GEMMA4, "TestParseGemma4Args.test_empty_value_partial_withheld"): _PARTIAL,
        (GEMMA4, "TestParseGemma4Args.test_empty_value_after_other_keys_partial_withheld"): (
            _PARTIAL
        ),
        (GEMMA4, "TestParseGemma4Array.test_trailing_dot_float_partial_withheld"): _PARTIAL,
        (GEMMA4, "TestParseGemma4Args.test_malformed_partial_array"): (
            "a time limit on the argument reader given ':[t:[]' (it asserts only that a dict "
            "comes back); no call form"
        ),
        (GEMMA4, "TestParseGemma4Array.test_stray_closing_bracket"): (
            "the array reader given '42,]trailing' directly; inside a call that text is no "
            "call here (the block comes back as content)"
        ),
    }
)
NOT_APPLICABLE.update(
    {
        (GEMMA4_BARE, i): "vLLM's offline helper gemma4_utils.parse_tool_calls (for "
        "LLM.generate output), not its gemma4 tool parser the name selects: the `<turn|>` "
        "close, `<|tool_call>:call:`, `<call>` and a bare call after prose are its fallbacks "
        "only; the gemma4 parser's canonical and bare-after-`<channel|>` calls are cases here"
        for i in IDS[GEMMA4_BARE]
        if "test_engine_tool_parser" not in i
    }
)
NOT_APPLICABLE.update(
    {
        (GEMMA4_REQUIRED, i): "tool_choice 'required' with a format that has no tool-call "
        "grammar (gemma4) is refused before generation here: FAILED_PRECONDITION naming "
        "PredictOptions.ToolChoice (decoding/tool_grammar.py; tests/fast/test_tool_grammar.py), "
        "so no prose-only reply reaches the parser"
        for i in IDS[GEMMA4_REQUIRED]
        if "prose_only_rejected" in i
    }
)
NOT_APPLICABLE[
    DSV32, "TestExtractToolCallsStreaming.test_emits_arguments_before_invoke_completes"
] = (
    "checks that arguments stream before the invoke closes, on a text cut off there (no "
    "final result); deepseek_v32's calls are sent whole here when the block closes "
    "(ToolFormat.whole: values are typed by the schema then)"
)
NOT_APPLICABLE.update(
    {
        (GEMMA4_NAMED, i): "how vLLM adjusts a request whose tool_choice names a function or "
        "requires a call (no model output); here either is refused before generation for "
        "gemma4, which has no tool-call grammar: FAILED_PRECONDITION naming "
        "PredictOptions.ToolChoice (decoding/tool_grammar.py)"
        for i in IDS[GEMMA4_NAMED]
    }
)
NOT_APPLICABLE[HERMES, "test_hermes_parser_non_streaming_tool_call_until_eos[granite4]"] = (
    "vLLM skips it: 'The Granite4 tool parser enforces a complete response'"
)


def expected(case: Case) -> dict:
    return {"calls": list(case.calls), "content": case.content, "reasoning": case.reasoning}


# --- step3p5 (vLLM's Step3p5ToolParser: its own copy of the streaming XML parser) ---
# Qwen3-Coder's XML; the text between calls is content only where it is more than
# whitespace (decoding/tool_formats/step3p5.py). Where vLLM asserts only that a text is
# `in` the content, the content here is the whole text outside the calls.
STEP3P5 = "tests/tool_parsers/test_step3p5_tool_parser.py@0847a95f7f"


def step3p5(id, output, calls=(), content="", tools=QC_TOOLS, ids=()):
    return Case(
        id, STEP3P5, "step3p5", "", output, tuple(calls), content, tools=tuple(tools), ids=ids
    )


_S35_HELLO_HI = (
    "hello"
    + qc_call("get_current_weather", ("city", "Dallas"), ("state", "TX"))
    + "hi"
    + qc_call(
        "calculate_area", ("shape", "rectangle"), ("dimensions", '{"width": 10, "height": 5}')
    )
)
_S35_HELLO_HI_CALLS = [
    ("get_current_weather", {"city": "Dallas", "state": "TX"}),
    ("calculate_area", {"shape": "rectangle", "dimensions": {"width": 10, "height": 5}}),
]
_S35_ORLANDO = qc_call(
    "get_current_weather", ("city", "Orlando"), ("state", "FL"), ("unit", "celsius")
)
_S35_ORLANDO_CALL = ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "celsius"})


def _s35_both(param: str) -> tuple[str, ...]:
    """test_extract_tool_calls and its streaming twin read the same output."""
    return every("test_extract_tool_calls", param) + every(
        "test_extract_tool_calls_streaming", param
    )


STEP3P5_CASES = [
    step3p5(
        "no_tools",
        "This is a test response without any tool calls",
        content="This is a test response without any tool calls",
        ids=("test_extract_tool_calls_no_tools",),
    ),
    step3p5(
        "streaming_no_tools",
        "This is a test without tools",
        content="This is a test without tools",
        ids=every("test_extract_tool_calls_streaming", "no_tools"),
    ),
    step3p5("single_tool", QC_DALLAS, [QC_DALLAS_CALL], ids=_s35_both("single_tool")),
    step3p5(
        "single_tool_with_content",
        "Sure! Let me check the weather for you." + QC_DALLAS,
        [QC_DALLAS_CALL],
        content="Sure! Let me check the weather for you.",
        ids=_s35_both("single_tool_with_content"),
    ),
    step3p5(
        "single_tool_multiline_param",
        QC_RECT,
        [QC_RECT_CALL],
        ids=_s35_both("single_tool_multiline_param"),
    ),
    step3p5(  # the newline between the calls is no content (vLLM's None)
        "parallel_tools",
        QC_DALLAS
        + "\n"
        + qc_call(
            "get_current_weather", ("city", "Orlando"), ("state", "FL"), ("unit", "fahrenheit")
        ),
        [
            QC_DALLAS_CALL,
            ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}),
        ],
        ids=every("test_extract_tool_calls", "parallel_tools"),
    ),
    step3p5(  # the streaming test's second call says celsius; the MTP test streams it too
        "streaming_parallel_tools",
        QC_DALLAS + "\n" + _S35_ORLANDO,
        [QC_DALLAS_CALL, _S35_ORLANDO_CALL],
        ids=(
            *every("test_extract_tool_calls_streaming", "parallel_tools"),
            "test_streaming_multi_token_per_step",
        ),
    ),
    step3p5(
        "tool_with_typed_params",
        "Let me calculate that area for you." + QC_CIRCLE,
        [QC_CIRCLE_CALL],
        content="Let me calculate that area for you.",
        ids=_s35_both("tool_with_typed_params"),
    ),
    step3p5(
        "fallback_no_tags",
        "<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n"
        "<parameter=state>\nTX\n</parameter>\n</function>",
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
        ids=("test_extract_tool_calls_fallback_no_tags",),
    ),
    step3p5(
        "type_conversion",
        qc_call(
            "test_types",
            ("int_param", "42"),
            ("float_param", "3.14"),
            ("bool_param", "true"),
            ("str_param", "hello world"),
            ("obj_param", '{"key": "value"}'),
        ),
        [
            (
                "test_types",
                {
                    "int_param": 42,
                    "float_param": 3.14,
                    "bool_param": True,
                    "str_param": "hello world",
                    "obj_param": {"key": "value"},
                },
            )
        ],
        tools=QC_TYPES_TOOLS,
        ids=("test_extract_tool_calls_type_conversion",),
    ),
    step3p5(
        "complex_type_with_single_quote",
        qc_call("test_types", ("obj_param", "{'key': 'value'}")),
        [("test_types", {"obj_param": {"key": "value"}})],
        tools=QC_TYPES_TOOLS,
        ids=("test_extract_tool_calls_complex_type_with_single_quote",),
    ),
    step3p5(  # an unclosed parameter ends at the next one
        "missing_closing_parameter_tag",
        QC_MISSING_CLOSE,
        [QC_DALLAS_CALL],
        content="Let me check the weather for you:\n",
        ids=(
            "test_extract_tool_calls_missing_closing_parameter_tag",
            "test_extract_tool_calls_streaming_missing_closing_tag",
        ),
    ),
    step3p5(
        "streaming_incremental",
        "I'll check the weather."
        + qc_call("get_current_weather", ("city", "Dallas"), ("state", "TX")),
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
        content="I'll check the weather.",
        ids=("test_extract_tool_calls_streaming_incremental",),
    ),
    step3p5(  # "hi" between the calls is content (more than whitespace)
        "mixed_content_and_multiple_tool_calls",
        _S35_HELLO_HI,
        _S35_HELLO_HI_CALLS,
        content="hellohi",
        ids=(
            "test_extract_tool_calls_streaming_mixed_content_and_multiple_tool_calls",
            "test_extract_tool_calls_non_streaming_mixed_content_and_multiple_tool_calls",
            "test_extract_tool_calls_streaming_full_input_mixed_content_and_multiple_tool_calls",
        ),
    ),
    step3p5(
        "multiple_tool_calls_no_content_between",
        _S35_HELLO_HI.replace("</tool_call>hi<tool_call>", "</tool_call><tool_call>"),
        _S35_HELLO_HI_CALLS,
        content="hello",
        ids=(
            "test_extract_tool_calls_streaming_multiple_tool_calls_no_content_between",
            "test_extract_tool_calls_non_streaming_multiple_tool_calls_no_content_between",
        ),
    ),
    step3p5(  # vLLM's chunks joined; here it streams byte by byte and whole
        "multi_token_chunk_boundary",
        "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nSys\n</parameter>\n"
        "</function>\n</tool_call><tool_call>\n<function=calculate_area>\n"
        "<parameter=shape>\nrectangle</parameter>\n</function>\n</tool_call>",
        [("get_current_weather", {"city": "Sys"}), ("calculate_area", {"shape": "rectangle"})],
        ids=("test_extract_tool_calls_streaming_multi_token_chunk_boundary",),
    ),
    step3p5(  # vLLM's MTP chunks joined: the Dallas call
        "mtp_variable_chunks",
        QC_DALLAS,
        [QC_DALLAS_CALL],
        ids=("test_streaming_mtp_variable_chunks",),
    ),
]
CASES += STEP3P5_CASES
IDS[STEP3P5] = [
    "test_extract_tool_calls_no_tools",
    *(
        f"{t}[{p}]"
        for t in ("test_extract_tool_calls", "test_extract_tool_calls_streaming")
        for p in (
            *(("no_tools",) if t.endswith("streaming") else ()),
            "single_tool",
            "single_tool_with_content",
            "single_tool_multiline_param",
            "parallel_tools",
            "tool_with_typed_params",
        )
    ),
    "test_extract_tool_calls_fallback_no_tags",
    "test_extract_tool_calls_type_conversion",
    "test_extract_tool_calls_missing_closing_parameter_tag",
    "test_extract_tool_calls_streaming_missing_closing_tag",
    "test_extract_tool_calls_streaming_incremental",
    "test_extract_tool_calls_complex_type_with_single_quote",
    "test_extract_tool_calls_streaming_mixed_content_and_multiple_tool_calls",
    "test_extract_tool_calls_non_streaming_mixed_content_and_multiple_tool_calls",
    "test_extract_tool_calls_streaming_full_input_mixed_content_and_multiple_tool_calls",
    "test_extract_tool_calls_streaming_multiple_tool_calls_no_content_between",
    "test_extract_tool_calls_streaming_multi_token_chunk_boundary",
    "test_extract_tool_calls_non_streaming_multiple_tool_calls_no_content_between",
    "test_streaming_mtp_variable_chunks",
    "test_streaming_multi_token_per_step",
]


# --- deepseek_v4: DeepSeek V3.2's DSML invokes in a `<｜DSML｜tool_calls>` block ---
DSV4 = "tests/tool_parsers/test_deepseekv4_tool_parser.py@023f36c62e"


def dsv4_call(name: str, params: dict[str, str]) -> str:
    """The file's build_tool_call: string="true" parameters, one invoke."""
    body = "".join(
        f'<｜DSML｜parameter name="{k}" string="true">{v}</｜DSML｜parameter>\n'
        for k, v in params.items()
    )
    return (
        f'<｜DSML｜tool_calls>\n<｜DSML｜invoke name="{name}">\n{body}</｜DSML｜invoke>\n'
        "</｜DSML｜tool_calls>"
    )


_DSV4_FUNCTION_CALLS = dsv4_call("search", {"query": "vllm"}).replace(
    "tool_calls", "function_calls"
)
CASES += [
    Case(
        "extract_tool_calls",
        DSV4,
        "deepseek_v4",
        "",
        "Let me check. " + dsv4_call("get_weather", {"location": "Beijing", "unit": "celsius"}),
        (("get_weather", {"location": "Beijing", "unit": "celsius"}),),
        "Let me check. ",
        ids=("test_extract_tool_calls",),
    ),
    Case(  # V3.2's function_calls block is no call for V4: content, as it came
        "function_calls_block_is_not_accepted",
        DSV4,
        "deepseek_v4",
        "",
        _DSV4_FUNCTION_CALLS,
        (),
        _DSV4_FUNCTION_CALLS,
        ids=("test_function_calls_block_is_not_accepted",),
    ),
    Case(
        "streaming_extracts_complete_invokes",
        DSV4,
        "deepseek_v4",
        "",
        dsv4_call("search", {"query": "deepseek v4"}),
        (("search", {"query": "deepseek v4"}),),
        ids=("test_streaming_extracts_complete_invokes",),
    ),
]
IDS[DSV4] = [
    "test_registered",
    "test_extract_tool_calls",
    "test_function_calls_block_is_not_accepted",
    "test_streaming_extracts_complete_invokes",
    "test_get_vllm_registry_structural_tag_returns_structural_tag",
]
NOT_APPLICABLE[DSV4, "test_registered"] = (
    "checks vLLM's registry maps the name to its class (no model output); the name is "
    "registered here: decoding/tool_formats/deepseek_v4.py"
)


# The ids of the files appended above that a _NO_OUTPUT test stands for (request adjustment,
# grammar building: no model output), as NOT_APPLICABLE for the files before them.
NOT_APPLICABLE.update(
    {
        (source, i): why
        for source in (STEP3P5, DSV4)
        for i in IDS[source]
        for prefix, why in _NO_OUTPUT.items()
        if i.startswith(prefix)
    }
)


# --- poolside_v1: GLM-4's arg_key / arg_value calls (vLLM's PoolsideV1ToolParser) ---
POOLSIDE = "tests/tool_parsers/test_poolside_v1_tool_parser.py@2a8137f637"
_PS_WRITE = (fn_tool("write_file", {"content": {"type": "string"}, "mode": {"type": "integer"}}),)
_PS_WEATHER = (fn_tool("get_weather", {"city": {"type": "string"}}),)
_PS_INDENTED = "    def f():\n        return 1\n"
_PS_PADDED = "<tool_call>" + " " * 4096 + "<x</tool_call>"


def poolside(id, output, calls=(), content="", tools=_PS_WEATHER, ids=None):
    return Case(
        id,
        POOLSIDE,
        "poolside_v1",
        "",
        output,
        tuple(calls),
        content,
        tools=tuple(tools),
        ids=ids or (f"test_{id}",),
    )


def _ps_write(value: str) -> str:
    return (
        f"<tool_call>write_file\n<arg_key>content</arg_key>\n<arg_value>{value}</arg_value>\n"
        "</tool_call>"
    )


_PS_PARIS = "<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
CASES += [
    poolside(
        "string_arg_preserves_whitespace",
        _ps_write(_PS_INDENTED),
        [("write_file", {"content": _PS_INDENTED})],
        tools=_PS_WRITE,
    ),
    poolside(
        "non_string_arg_still_deserialized",
        "<tool_call>write_file\n<arg_key>content</arg_key>\n<arg_value>hi</arg_value>\n"
        "<arg_key>mode</arg_key>\n<arg_value> 420 </arg_value>\n</tool_call>",
        [("write_file", {"content": "hi", "mode": 420})],
        tools=_PS_WRITE,
    ),
    poolside(  # vLLM's Responses tool is flat ({"name", "parameters"}); LocalAI sends the
        # chat-completions shape, which holds the same declaration
        "responses_extract_tool_calls_with_flat_tools",
        _ps_write("  x = 1\n"),
        [("write_file", {"content": "  x = 1\n"})],
        tools=_PS_WRITE,
    ),
    poolside(
        "no_newline_after_name",
        "<tool_call>get_weather" + _PS_PARIS,
        [("get_weather", {"city": "Paris"})],
        ids=(
            "test_no_newline_after_name_non_streaming",
            "test_no_newline_after_name_streaming",
        ),
    ),
    poolside(
        "newline_after_name_still_parses_non_streaming",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "</tool_call>",
        [("get_weather", {"city": "Paris"})],
    ),
    poolside(  # no call: the block comes back as the content it was
        "whitespace_padded_tool_call_is_not_quadratic", _PS_PADDED, content=_PS_PADDED
    ),
    poolside(
        "whitespace_only_tool_call_name_is_rejected",
        "<tool_call>   </tool_call>",
        content="<tool_call>   </tool_call>",
    ),
    poolside(
        "function_name_with_internal_whitespace_still_parses",
        "<tool_call>  get weather  " + _PS_PARIS,
        [("get weather", {"city": "Paris"})],
    ),
]
IDS[POOLSIDE] = [
    "test_required_skips_structured_outputs_chatcompletion",
    "test_named_skips_structured_outputs_chatcompletion",
    "test_required_skips_structured_outputs_responses",
    "test_named_skips_structured_outputs_responses",
    "test_auto_still_keeps_special_tokens",
    "test_string_arg_preserves_whitespace",
    "test_non_string_arg_still_deserialized",
    "test_responses_extract_tool_calls_with_flat_tools",
    "test_no_newline_after_name_non_streaming",
    "test_newline_after_name_still_parses_non_streaming",
    "test_no_newline_after_name_streaming",
    "test_streaming_responses_request_without_logprobs",
    "test_streaming_responses_request_with_logprobs_emits_empty_delta",
    "test_whitespace_padded_tool_call_is_not_quadratic",
    "test_whitespace_only_tool_call_name_is_rejected",
    "test_function_name_with_internal_whitespace_still_parses",
]
NOT_APPLICABLE.update(
    {
        (POOLSIDE, i): "how vLLM adjusts a request for tool_choice required / named / auto "
        "(structured outputs, skip_special_tokens; no model output); here tool_choice is "
        "PredictOptions.ToolChoice and markers are matched on the decoded text"
        for i in IDS[POOLSIDE][:5]
    }
)
NOT_APPLICABLE.update(
    {
        (POOLSIDE, i): "what vLLM's streaming parser returns for a lone '<' delta of a "
        "Responses request, with and without logprobs (an empty delta or None; no model "
        "output to extract): a marker cut at any byte is the byte-by-byte run of every "
        "case here"
        for i in IDS[POOLSIDE][11:13]
    }
)


# --- granite-20b-fc: `<function_call>` and a JSON object per call, to the output's end.
# Run under the name's `_` spelling (LocalAI's `granite-20b-fc` resolves to it) ---
GRANITE20B = "tests/tool_parsers/test_granite_20b_fc_tool_parser.py@41c5903d04"


def granite20b(id, output, calls=(), content="", ids=()):
    return Case(id, GRANITE20B, "granite_20b_fc", "", output, tuple(calls), content, ids=ids)


_G20_TOKYO = '<function_call> {"name": "get_weather", "arguments": {"city": "Tokyo"}}'
_G20_ESCAPED = (
    '<function_call> {\n  "name": "test_function",\n  "arguments": {\n'
    '    "quoted": "He said \\"hello\\"",\n    "path": "C:\\\\Users\\\\file.txt",\n'
    '    "newline": "line1\\nline2",\n    "unicode": "emoji: 🎉"\n  }\n}'
)
CASES += common(
    granite20b,
    malformed=(
        '<function_call> {"name": "func", "arguments": {',
        '<function_call> [{"name": "func", "arguments": {}}]',
        '{"name": "func", "arguments": {}}',
        '<function_call> {"name": 123}',
    ),
    no_tool_calls=(
        "This is a regular response without any tool calls.",
        (),
        "This is a regular response without any tool calls.",
    ),
    single_tool_call=(_G20_TOKYO, [("get_weather", {"city": "Tokyo"})], ""),
    parallel_tool_calls=(
        _G20_TOKYO
        + '\n<function_call> {"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}',
        [("get_weather", {"city": "Tokyo"}), ("get_time", {"timezone": "Asia/Tokyo"})],
        "",
    ),
    various_data_types=(
        '<function_call> {\n  "name": "test_function",\n  "arguments": ' + VARIOUS + "\n}",
        [("test_function", json.loads(VARIOUS))],
        "",
    ),
    empty_arguments=(
        '<function_call> {"name": "refresh", "arguments": {}}',
        [("refresh", {})],
        "",
    ),
    # vLLM's non-streaming result (its streaming test is an xfail: "requires
    # <function_call> at start"); the content keeps its newline, as vLLM's
    surrounding_text=(
        "Let me check the weather for you.\n" + _G20_TOKYO,
        [("get_weather", {"city": "Tokyo"})],
        "Let me check the weather for you.\n",
    ),
    escaped_strings=(
        _G20_ESCAPED,
        [
            (
                "test_function",
                {
                    "quoted": 'He said "hello"',
                    "path": "C:\\Users\\file.txt",
                    "newline": "line1\nline2",
                    "unicode": "emoji: 🎉",
                },
            )
        ],
        "",
    ),
)
IDS[GRANITE20B] = _COMMON


# --- step3: steptml invokes in a `<｜tool_calls_begin｜>` block; vLLM's streaming results
# (its non-streaming path is an xfail for these outputs: "Step3 parser non-streaming has
# bugs"); vLLM asserts the calls' names and arguments, the content is ours: the text
# around the block as written, as vLLM's streaming path gives it ---
STEP3 = "tests/tool_parsers/test_step3_tool_parser.py@04b590e613"
_S3B, _S3E = "<｜tool_calls_begin｜>", "<｜tool_calls_end｜>"
_S3CB, _S3CE = "<｜tool_call_begin｜>", "<｜tool_call_end｜>"


def step3(id, output, calls=(), content="", ids=(), tools=()):
    return Case(id, STEP3, "step3", "", output, tuple(calls), content, tools=tools, ids=ids)


def s3_call(name: str, *params: tuple[str, str], prefix: str = "") -> str:
    body = "".join(f'<steptml:parameter name="{k}">{v}</steptml:parameter>' for k, v in params)
    return f'{_S3CB}{prefix}<steptml:invoke name="{name}">{body}</steptml:invoke>{_S3CE}'


_S3_TOKYO = s3_call("get_weather", ("city", "Tokyo"))
CASES += common(
    step3,
    malformed=(
        # cut off before its <｜tool_call_end｜>: no call (vLLM's non-streaming result)
        f'{_S3B}{_S3CB}<steptml:invoke name="func">',
        f'{_S3CB}<steptml:invoke name="func"></steptml:invoke>{_S3CE}',
    ),
    no_tool_calls=(
        "This is a regular response without any tool calls.",
        (),
        "This is a regular response without any tool calls.",
    ),
    single_tool_call=(_S3B + _S3_TOKYO + _S3E, [("get_weather", {"city": "Tokyo"})], ""),
    parallel_tool_calls=(
        _S3B
        + _S3_TOKYO
        + "<｜tool_sep｜>"
        + s3_call("get_time", ("timezone", "Asia/Tokyo"))
        + _S3E,
        [("get_weather", {"city": "Tokyo"}), ("get_time", {"timezone": "Asia/Tokyo"})],
        "",
    ),
    # no tools declared: every value stays text (supports_typed_arguments=False)
    various_data_types=(
        _S3B
        + s3_call(
            "test_function",
            ("string_field", "hello"),
            ("int_field", "42"),
            ("float_field", "3.14"),
            ("bool_field", "true"),
            ("null_field", "null"),
            ("array_field", '["a", "b", "c"]'),
            ("object_field", '{"nested": "value"}'),
        )
        + _S3E,
        [
            (
                "test_function",
                {
                    "string_field": "hello",
                    "int_field": "42",
                    "float_field": "3.14",
                    "bool_field": "true",
                    "null_field": "null",
                    "array_field": '["a", "b", "c"]',
                    "object_field": '{"nested": "value"}',
                },
            )
        ],
        "",
    ),
    empty_arguments=(_S3B + s3_call("refresh") + _S3E, [("refresh", {})], ""),
    surrounding_text=(
        "Let me check the weather for you.\n\n"
        + _S3B
        + _S3_TOKYO
        + _S3E
        + "\n\nI'll get that information.",
        [("get_weather", {"city": "Tokyo"})],
        "Let me check the weather for you.\n\n\n\nI'll get that information.",
    ),
    escaped_strings=(
        _S3B
        + s3_call(
            "test_function",
            ("quoted", 'He said "hello"'),
            ("path", "C:\\Users\\file.txt"),
            ("newline", "line1\nline2"),
        )
        + _S3E,
        [
            (
                "test_function",
                {
                    "quoted": 'He said "hello"',
                    "path": "C:\\Users\\file.txt",
                    "newline": "line1\nline2",
                },
            )
        ],
        "",
    ),
)
_S3_WS_TOOLS = (
    fn_tool(
        "edit_file",
        {
            "old_string": {"type": "string"},
            "indent": {"type": "integer"},
            "enabled": {"type": "boolean"},
        },
    ),
)
_S3_WS_VALUES = (
    "    if x:",
    "return 1\n",
    "    if x:\n        return 1\n",
    "hello ",
    "hello\u00a0",
    "hello",
)
CASES += [
    step3(
        f"string_value_preserved_{i}",
        _S3B
        + s3_call(
            "edit_file",
            ("old_string", v),
            ("indent", " 4 "),
            ("enabled", " true "),
            prefix="function<｜tool_sep｜>edit_file\n",
        )
        + _S3E,
        [("edit_file", {"old_string": v, "indent": 4, "enabled": True})],
        ids=(f"TestStep3ParameterWhitespace.test_string_value_preserved[{pid(v)}]",),
        tools=_S3_WS_TOOLS,
    )
    for i, v in enumerate(_S3_WS_VALUES)
]
IDS[STEP3] = [
    *_COMMON,
    *(f"TestStep3ParameterWhitespace.test_string_value_preserved[{pid(v)}]" for v in _S3_WS_VALUES),
]


# --- apertus: a JSON list of one-key objects between <|tools_prefix|> and <|tools_suffix|>
# (vLLM's ApertusToolParser); the text around the list is content as written ---
APERTUS = "tests/tool_parsers/test_apertus_tool_parser.py@266c3ccc1d"
_AP_B, _AP_E = "<|tools_prefix|>", "<|tools_suffix|>"


def apertus(id, output, calls=(), content="", ids=None):
    return Case(id, APERTUS, "apertus", "", output, tuple(calls), content, ids=ids or (id,))


_AP_LONDON = ("get_weather", {"location": "London"})
_AP_SF = '[{"get_weather": {"location": "San Francisco", "unit": "celsius"}}]'
_AP_SF_CALL = ("get_weather", {"location": "San Francisco", "unit": "celsius"})
_AP_PARIS_CHUNKS = '[{"get_weather": {"location": "Paris, France"}}]'
_AP_TC = "TestExtractToolCalls."
_AP_TS = "TestStreamingExtraction."
CASES += [
    apertus(
        _AP_TC + "test_no_tool_calls",
        "Hello, how can I help you today?",
        content="Hello, how can I help you today?",
    ),
    apertus(
        _AP_TC + "test_single_tool_call",
        _AP_B + '[{"get_weather": {"location": "London"}}]' + _AP_E,
        [_AP_LONDON],
    ),
    apertus(_AP_TC + "test_multiple_arguments", _AP_B + _AP_SF + _AP_E, [_AP_SF_CALL]),
    apertus(
        _AP_TC + "test_multiple_tool_calls",
        _AP_B
        + '[{"get_weather": {"location": "London"}}, {"get_time": {"location": "London"}}]'
        + _AP_E,
        [_AP_LONDON, ("get_time", {"location": "London"})],
    ),
    apertus(
        _AP_TC + "test_nested_arguments",
        _AP_B
        + '[{"complex_function": {"nested": {"inner": "value"}, "list": ["a", "b"]}}]'
        + _AP_E,
        [("complex_function", {"nested": {"inner": "value"}, "list": ["a", "b"]})],
    ),
    apertus(  # cut off: its open brackets closed
        _AP_TC + "test_incomplete_tool_call",
        _AP_B + '[{"get_weather": {"location": "London"}',
        [_AP_LONDON],
    ),
    apertus(_AP_TC + "test_missing_tool_suffix", _AP_B + _AP_SF, [_AP_SF_CALL]),
    apertus(
        _AP_TS + "test_basic_streaming_single_tool",
        _AP_B + _AP_PARIS_CHUNKS + _AP_E,
        [("get_weather", {"location": "Paris, France"})],
    ),
    apertus(
        _AP_TS + "test_streaming_missing_tool_suffix",
        _AP_B + _AP_PARIS_CHUNKS,
        [("get_weather", {"location": "Paris, France"})],
    ),
    apertus(
        _AP_TS + "test_streaming_partial_tag_buffering_missing_tool_suffix",
        "Content" + _AP_B + '[{"f": {"a": 1}}]',
        [("f", {"a": 1})],
        "Content",
    ),
    apertus(
        _AP_TS + "test_streaming_multi_tool",
        _AP_B
        + '[{"get_weather": {"location": "Tokyo"}}, {"get_time": {"location": "Tokyo"}}]'
        + _AP_E,
        [("get_weather", {"location": "Tokyo"}), ("get_time", {"location": "Tokyo"})],
    ),
    apertus(  # the streaming result: the space before the list is content
        _AP_TS + "test_streaming_text_before_tool_call",
        "Let me check the weather. " + _AP_B + '[{"get_weather": {"location": "London"}}]' + _AP_E,
        [_AP_LONDON],
        "Let me check the weather. ",
    ),
    apertus(
        _AP_TS + "test_streaming_partial_tag_buffering",
        "Content" + _AP_B + '[{"f": {"a": 1}}]' + _AP_E,
        [("f", {"a": 1})],
        "Content",
    ),
    apertus(
        _AP_TS + "test_mtp_streaming_massive_chunk",
        "Sure! " + _AP_B + '[{"get_weather": {"location": "London"}}]' + _AP_E,
        [_AP_LONDON],
        "Sure! ",
    ),
    apertus(
        _AP_TS + "test_mtp_streaming_multiple_tools_burst",
        _AP_B
        + '[{"get_weather": {"location": "London"}}, {"get_time": {"location": "Paris"}}]'
        + _AP_E,
        [_AP_LONDON, ("get_time", {"location": "Paris"})],
    ),
    apertus(
        _AP_TS + "test_mtp_streaming_skip_and_catch_up",
        _AP_B + '[{"t1": {"a": 1}}, {"t2": {"b": 2}}, {"t3": {"c": 3}}]' + _AP_E,
        [("t1", {"a": 1}), ("t2", {"b": 2}), ("t3", {"c": 3})],
    ),
    apertus(
        _AP_TS + "test_vllm_streaming_character_by_character",
        "Hi " + _AP_B + '[{"get_weather": {"location": "London"}}]' + _AP_E + " ",
        [_AP_LONDON],
        "Hi  ",
    ),
    apertus(
        _AP_TS + "test_vllm_streaming_empty_deltas",
        "Wait" + _AP_B + '[{"get_weather": {"location": "London"}}]' + _AP_E,
        [_AP_LONDON],
        "Wait",
    ),
]
KNOWN_DIFFERENCES.append(
    (
        Case(
            "TestExtractToolCalls.test_text_before_tool_call",
            APERTUS,
            "apertus",
            "",
            "Let me check the weather for you. "
            + _AP_B
            + '[{"get_weather": {"location": "Paris"}}]'
            + _AP_E,
            (("get_weather", {"location": "Paris"}),),
            "Let me check the weather for you.",
            why="vLLM's non-streaming path strips the text before the list, its streaming "
            "path keeps it (test_streaming_text_before_tool_call, "
            "test_mtp_streaming_massive_chunk: 'Sure! '); Predict and PredictStream give "
            "the streaming result",
            ids=("TestExtractToolCalls.test_text_before_tool_call",),
        ),
        {"content": "Let me check the weather for you. "},
    )
)
IDS[APERTUS] = [
    *(
        _AP_TC + t
        for t in (
            "test_no_tool_calls",
            "test_single_tool_call",
            "test_multiple_arguments",
            "test_text_before_tool_call",
            "test_multiple_tool_calls",
            "test_nested_arguments",
            "test_incomplete_tool_call",
            "test_missing_tool_suffix",
        )
    ),
    *(
        _AP_TS + t
        for t in (
            "test_basic_streaming_single_tool",
            "test_streaming_missing_tool_suffix",
            "test_streaming_partial_tag_buffering_missing_tool_suffix",
            "test_streaming_multi_tool",
            "test_streaming_text_before_tool_call",
            "test_streaming_partial_tag_buffering",
            "test_mtp_streaming_massive_chunk",
            "test_mtp_streaming_multiple_tools_burst",
            "test_mtp_streaming_skip_and_catch_up",
            "test_vllm_streaming_character_by_character",
            "test_vllm_streaming_empty_deltas",
        )
    ),
]


# --- gigachat3: one JSON call after `<|message_sep|>\n\nfunction call<|role_sep|>\n`
# (GigaChat 3) or `<|function_call|>` (3.1), a trailing `</s>` left out; the content is the
# text before the marker. test_streaming_tool_call_with_large_steps and
# test_streaming_split_special_tokens split the same outputs into larger deltas than the
# byte-by-byte stream here ---
GIGACHAT3 = "tests/tool_parsers/test_gigachat3_tool_parser.py@9188f3f458"
_G3_HEAD = "<|message_sep|>\n\nfunction call<|role_sep|>\n"
_G31_HEAD = "<|function_call|>"
_G3_SIMPLE = {"action": "create", "id": "preferences"}
_G3_COMPLEX = {
    "action": "create",
    "id": "preferences",
    "content": {
        "short_answers": True,
        "hate_emojis": True,
        "english_ui": False,
        "russian_math_explanations": True,
    },
}
_G3_TEXT = "I'll check that for you."


def gigachat3(id, output, calls=(), content="", ids=()):
    return Case(id, GIGACHAT3, "gigachat3", "", output, tuple(calls), content, ids=ids)


def _g3_json(args: dict) -> str:
    return json.dumps({"name": "manage_user_memory", "arguments": args}, ensure_ascii=False)


_G3_SPLIT = {  # test_streaming_split_special_tokens's ids by (version, kind)
    ("gigachat3", "mixed_content"): "gigachat3",
    ("gigachat31", "mixed_content"): "gigachat31",
    ("gigachat3", "simple"): "gigachat3_no_content",
    ("gigachat31", "simple"): "gigachat31_no_content",
    ("gigachat31", "mixed_content_with_eos"): "gigachat31_eos",
    ("gigachat31", "parameterless"): "gigachat31_parameterless",
}
CASES.append(
    gigachat3(
        "no_tool_call",
        "How can I help you today?",
        content="How can I help you today?",
        ids=("test_no_tool_call[True]", "test_no_tool_call[False]"),
    )
)
for _version, _head in (("gigachat3", _G3_HEAD), ("gigachat31", _G31_HEAD)):
    for _kind, _args, _prefix, _suffix in (
        ("simple", _G3_SIMPLE, "", ""),
        ("parameterless", {}, "", ""),
        ("complex", _G3_COMPLEX, "", ""),
        ("mixed_content", _G3_SIMPLE, _G3_TEXT, ""),
        ("mixed_content_with_eos", _G3_SIMPLE, _G3_TEXT, "</s>"),
    ):
        _split = _G3_SPLIT.get((_version, _kind))
        _base = _kind.removesuffix("_with_eos")
        _tail = "_with_eos" if _kind.endswith("_with_eos") else ""
        CASES.append(
            gigachat3(
                f"{_kind}_{_version}",
                _prefix + _head + _g3_json(_args) + _suffix,
                [("manage_user_memory", _args)],
                _prefix,
                ids=tuple(
                    f"test_tool_call[{_base}_{mode}{_tail}_{_version}]"
                    for mode in ("streaming", "nonstreaming")
                )
                + ((f"test_streaming_split_special_tokens[{_split}]",) if _split else ()),
            )
        )
    CASES.append(
        gigachat3(
            f"large_steps_{_version}",
            _G3_TEXT + _head + _g3_json(_G3_COMPLEX),
            [("manage_user_memory", _G3_COMPLEX)],
            _G3_TEXT,
            ids=(f"test_streaming_tool_call_with_large_steps[{_version}]",),
        )
    )
IDS[GIGACHAT3] = [
    "test_no_tool_call[True]",
    "test_no_tool_call[False]",
    *(
        f"test_tool_call[{kind}_{mode}_{version}]"
        for version in ("gigachat3", "gigachat31")
        for kind in ("simple", "parameterless", "complex", "mixed_content")
        for mode in ("streaming", "nonstreaming")
    ),
    *(
        f"test_tool_call[mixed_content_{mode}_with_eos_{version}]"
        for version in ("gigachat3", "gigachat31")
        for mode in ("streaming", "nonstreaming")
    ),
    *every("test_streaming_tool_call_with_large_steps", "gigachat3", "gigachat31"),
    *(f"test_streaming_split_special_tokens[{i}]" for i in _G3_SPLIT.values()),
]


# --- hy_v3: `<tool_call>NAME<tool_sep><arg_key>K</arg_key><arg_value>V</arg_value>
# </tool_call>` calls in a `<tool_calls>` block, values typed by the declared schema; the
# content is the text before the block. The streaming tests feed the same outputs in
# larger deltas than the byte-by-byte stream here ---
HY_V3 = "tests/tool_parsers/test_hy_v3_tool_parser.py@41c5903d04"
_HY_TOOLS = (
    fn_tool("get_current_date", {}),
    fn_tool("get_weather", {"city": {"type": "string"}, "date": {"type": "string"}}),
)
_HY_EXTRACT, _HY_STREAM = "TestHYV3ExtractToolCalls.", "TestHYV3ExtractToolCallsStreaming."


def hy_v3(id, output, calls=(), content="", ids=()):
    return Case(id, HY_V3, "hy_v3", "", output, tuple(calls), content, tools=_HY_TOOLS, ids=ids)


def _hy_call(name: str, *args: tuple[str, str], nl: str = "\n") -> str:
    pairs = "".join(f"{nl}<arg_key>{k}</arg_key>{nl}<arg_value>{v}</arg_value>" for k, v in args)
    return f"{nl}<tool_call>{name}<tool_sep>{pairs}{nl}</tool_call>"


_HY_DATE = "<tool_calls>" + _hy_call("get_current_date") + "\n</tool_calls>"
_HY_BEIJING = ("get_weather", {"city": "Beijing", "date": "2026-03-30"})
_HY_BEIJING_XML = _hy_call("get_weather", ("city", "Beijing"), ("date", "2026-03-30"))
CASES += [
    hy_v3(
        "no_tool_call",
        "This is a plain response.",
        content="This is a plain response.",
        ids=(_HY_EXTRACT + "test_no_tool_call", _HY_STREAM + "test_no_tool_call_streaming"),
    ),
    hy_v3(
        "zero_arg_inline",
        "<tool_calls>" + _hy_call("get_current_date", nl="") + "</tool_calls>",
        [("get_current_date", {})],
        ids=(_HY_EXTRACT + "test_zero_arg_inline",),
    ),
    hy_v3(
        "zero_arg_newline",
        _HY_DATE,
        [("get_current_date", {})],
        ids=(
            _HY_EXTRACT + "test_zero_arg_newline",
            _HY_EXTRACT + "test_empty_content_none",
            _HY_STREAM + "test_zero_arg_streaming",
            _HY_STREAM + "test_all_in_one_delta_streaming",
        ),
    ),
    hy_v3(
        "args_same_line",
        "<tool_calls>"
        + _hy_call("get_weather", ("city", "Beijing"), ("date", "2026-03-30"), nl="")
        + "</tool_calls>",
        [_HY_BEIJING],
        ids=(_HY_EXTRACT + "test_args_same_line",),
    ),
    hy_v3(
        "args_with_newlines",
        "<tool_calls>" + _HY_BEIJING_XML + "\n</tool_calls>",
        [_HY_BEIJING],
        ids=(_HY_EXTRACT + "test_args_with_newlines", _HY_STREAM + "test_args_streaming"),
    ),
    hy_v3(
        "content_before",
        "Checking." + _HY_DATE,
        [("get_current_date", {})],
        "Checking.",
        ids=(_HY_EXTRACT + "test_content_before", _HY_STREAM + "test_content_before_streaming"),
    ),
    # vLLM's non-streaming test asserts two calls; its streaming one, their cities
    hy_v3(
        "multiple",
        "<tool_calls>"
        + _HY_BEIJING_XML
        + _hy_call("get_weather", ("city", "Hangzhou"), ("date", "2026-03-30"))
        + "\n</tool_calls>",
        [_HY_BEIJING, ("get_weather", {"city": "Hangzhou", "date": "2026-03-30"})],
        ids=(_HY_EXTRACT + "test_multiple", _HY_STREAM + "test_multiple_streaming"),
    ),
]
IDS[HY_V3] = [
    *(
        _HY_EXTRACT + t
        for t in (
            "test_no_tool_call",
            "test_zero_arg_inline",
            "test_zero_arg_newline",
            "test_args_same_line",
            "test_args_with_newlines",
            "test_content_before",
            "test_multiple",
            "test_empty_content_none",
        )
    ),
    *(
        _HY_STREAM + t
        for t in (
            "test_no_tool_call_streaming",
            "test_zero_arg_streaming",
            "test_args_streaming",
            "test_content_before_streaming",
            "test_multiple_streaming",
            "test_all_in_one_delta_streaming",
        )
    ),
]


# --- kimi_k3: XTML channels; vLLM's test file checks the content only (the end-of-turn
# `<|close|>message<|sep|>` left out, whole and split at 1, 3 and 7 characters); the calls
# are the example of vLLM's parser docstring (vllm/tool_parsers/kimi_k3_tool_parser.py) ---
KIMI_K3 = "tests/tool_parsers/test_kimi_k3_tool_parser.py@b635426178"
KIMI_K3_DOC = "vllm/tool_parsers/kimi_k3_tool_parser.py@2d9567486f (its docstring)"
CASES += [
    Case(
        "content_stops_at_message_close",
        KIMI_K3,
        "kimi_k3",
        "",
        "Hello<|close|>message<|sep|>",
        content="Hello",
        ids=(
            "test_streaming_content_stops_at_message_close",
            "test_streaming_content_holds_split_message_close",
        ),
    ),
    Case(
        "docstring_tools_channel",
        KIMI_K3_DOC,
        "kimi_k3",
        "",
        "<|open|>response<|sep|>Running it.<|close|>response<|sep|>"
        "<|open|>tools<|sep|>\n"
        '  <|open|>call tool="python" index="1"<|sep|>\n'
        '    <|open|>argument key="code" type="string"<|sep|>print(1)<|close|>argument<|sep|>\n'
        '    <|open|>argument key="opts" type="object"<|sep|>{"a":1}<|close|>argument<|sep|>\n'
        "  <|close|>call<|sep|>\n"
        "<|close|>tools<|sep|>",
        (("python", {"code": "print(1)", "opts": {"a": 1}}),),
        "Running it.",
    ),
]
IDS[KIMI_K3] = [
    "test_streaming_content_stops_at_message_close",
    "test_streaming_content_holds_split_message_close",
]


# --- minimax_m3: `]<]minimax[>[`-prefixed tags, nested parameters typed by the schema ---
MINIMAX_M3 = "tests/tool_parsers/test_minimax_m3_tool_parser.py@06726266c0"
_M3 = "]<]minimax[>["
_M3_TOOLS = (
    fn_tool(
        "create_order",
        {
            "user_id": {"type": "integer"},
            "urgent": {"type": "boolean"},
            "note": {"type": "string"},
            "shipping": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
            },
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                },
            },
            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
            "duplicate_demo": {"type": "object"},
        },
    ),
)


def minimax_m3(id, output, calls=(), content="", ids=(), **kw):
    return Case(
        id, MINIMAX_M3, "minimax_m3", "", output, tuple(calls), content, tools=_M3_TOOLS,
        ids=ids, **kw,
    )  # fmt: skip


def _m3(key: str, value: str) -> str:
    return f"{_M3}<{key}>{value}{_M3}</{key}>"


def _m3_invoke(body: str) -> str:
    return f'{_M3}<invoke name="create_order">{body}{_M3}</invoke>'


_M3_ORDER = (
    f"{_M3}<tool_call>\n"
    + _m3_invoke(
        _m3("user_id", "42")
        + _m3("urgent", "true")
        + _m3("note", "Please leave at front desk.")
        + _m3("shipping", _m3("city", "Singapore") + _m3("zip", "018956"))
        + _m3(
            "items",
            _m3("item", _m3("sku", "book-001") + _m3("qty", "2"))
            + _m3("item", _m3("sku", "pen-007") + _m3("qty", "5")),
        )
        + _m3("metadata", _m3("source", "mobile") + _m3("campaign", "may-launch"))
        + _m3("duplicate_demo", _m3("tag", "a") + _m3("tag", "b"))
    )
    + f"\n{_M3}</tool_call>"
)
_M3_ORDER_ARGS = {
    "user_id": 42,
    "urgent": True,
    "note": "Please leave at front desk.",
    "shipping": {"city": "Singapore", "zip": 18956},
    "items": [{"sku": "book-001", "qty": 2}, {"sku": "pen-007", "qty": 5}],
    "metadata": {"source": "mobile", "campaign": "may-launch"},
    "duplicate_demo": {"tag": ["a", "b"]},
}
_M3_PARTIAL = f"plain {_M3}<tool_ca"
_M3_SECOND = f'\n{_M3}<invoke name="create_order">{_M3}<user_id>2'
CASES += [
    minimax_m3(
        "nested_tool_call",
        "I will create it.\n" + _M3_ORDER,
        [("create_order", _M3_ORDER_ARGS)],
        "I will create it.\n",
        ids=("test_non_streaming_nested_tool_call", "test_streaming_nested_tool_call"),
    ),
    minimax_m3(
        "without_tool_call",
        "plain response",
        content="plain response",
        ids=(
            "test_non_streaming_without_tool_call_keeps_content",
            "test_streaming_without_tool_call_emits_text",
        ),
    ),
    minimax_m3(
        "multiple_tool_calls",
        f"{_M3}<tool_call>\n"
        + _m3_invoke(_m3("user_id", "1"))
        + "\n"
        + _m3_invoke(_m3("user_id", "2"))
        + f"\n{_M3}</tool_call>",
        [("create_order", {"user_id": 1}), ("create_order", {"user_id": 2})],
        ids=("test_non_streaming_multiple_tool_calls",),
    ),
    minimax_m3(
        "partial_tool_start",
        _M3_PARTIAL,
        content=_M3_PARTIAL,
        ids=(
            "test_streaming_flushes_partial_tool_start_as_text",
            "test_delegating_parser_flushes_partial_tool_start_on_finish",
        ),
    ),
    minimax_m3(
        "reuse_after_parse_error",
        "next request text",
        content="next request text",
        ids=("test_streaming_parser_reuse_after_parse_error",),
    ),
]
KNOWN_DIFFERENCES += [
    known(
        minimax_m3(
            "error_recovery_keeps_committed_tool_call",
            f"plain {_M3}<tool_call>\n" + _m3_invoke(_m3("user_id", "1")) + _M3_SECOND,
            [("create_order", {"user_id": 1})],
            "plain " + _M3_SECOND,
            ids=("test_streaming_error_recovery_keeps_committed_tool_call_structured",),
        ),
        {"content": "plain "},
        "a block cut off is read as it stands: its closed calls are calls, and the rest "
        "of the block is dropped, not handed back as content (vLLM's stream sends the "
        "unclosed invoke as text)",
    ),
    known(
        minimax_m3(
            "parse_error_emits_buffer",
            f"{_M3}<tool_call>\n{_M3}</user_id> after error",
            (),
            f"\n{_M3}</user_id> after error",
            ids=("test_streaming_parse_error_emits_buffer_and_later_deltas",),
        ),
        {"content": f"{_M3}<tool_call>\n{_M3}</user_id> after error"},
        "a block that holds no call comes back as content as the model wrote it, its "
        "opening marker included (vLLM's stream drops the marker)",
    ),
]
IDS[MINIMAX_M3] = [
    "test_minimax_m3_parser_registered",
    "test_non_streaming_nested_tool_call",
    "test_non_streaming_without_tool_call_keeps_content",
    "test_non_streaming_multiple_tool_calls",
    "test_streaming_without_tool_call_emits_text",
    "test_streaming_flushes_partial_tool_start_as_text",
    "test_streaming_error_recovery_keeps_committed_tool_call_structured",
    "test_streaming_parse_error_emits_buffer_and_later_deltas",
    "test_streaming_parser_reuse_after_parse_error",
    "test_delegating_parser_flushes_partial_tool_start_on_finish",
    "test_streaming_nested_tool_call",
]
NOT_APPLICABLE[MINIMAX_M3, "test_minimax_m3_parser_registered"] = (
    "vLLM's ToolParserManager class lookup (no model output)"
)


# --- minicpm5: `<function name="NAME"><param name="K">V</param></function>` calls checked
# against the request's tools. vLLM's non-streaming path gives no content once a call is
# read, its stream the text around the calls (test_extract_tool_calls_streaming_single /
# _multiple): the content here is the stream's (vLLM's tests assert it only where named) ---
MINICPM5 = "tests/tool_parsers/test_minicpm5xml_tool_parser.py@08eaf4cf00"
_MC_WEATHER = fn_tool(
    "get_weather", {"city": {"type": "string"}, "date": {"type": "string"}}, required=["city"]
)
_MC_SUM = fn_tool(
    "sum_values", {"nums": {"type": "array"}, "exact": {"type": "boolean"}}, required=["nums"]
)
_MC_NOOP = fn_tool("noop", {"note": {"type": "string"}}, required=[])
_MC_CURRENT = fn_tool(
    "get_current_weather",
    {"city": {"type": "string"}, "state": {"type": "string"}, "unit": {"type": "string"}},
    required=["city", "state", "unit"],
)
_MC_PHONE = fn_tool(
    "get_customer_by_phone", {"phone_number": {"type": "string"}}, required=["phone_number"]
)
_MC_SH = {"city": "上海", "date": "2024-06-27"}
_MC_DALLAS = {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}


def minicpm5(id, output, calls=(), content="", ids=(), tools=(_MC_WEATHER,), **kw):
    return Case(
        id, MINICPM5, "minicpm5", "", output, tuple(calls), content, tools=tools,
        ids=ids, **kw,
    )  # fmt: skip


def _mc(name: str, *params: tuple[str, str], sp: str = " ", end: str = "</function>\n") -> str:
    body = "".join(f'<param{sp}name="{k}">{v}</param>' for k, v in params)
    return f'<function{sp}name="{name}">{body}{end}'


_MC_SH_PARAMS = (("city", "上海"), ("date", "2024-06-27"))
_MC_TWO = (
    "Head\n"
    + _mc("get_weather", ("city", "北京"))
    + "TXT\n"
    + _mc("sum_values", ("nums", "[7,8,9]"), ("exact", "false"))
    + "Tail\n"
)
_MC_INCOMPLETE = '<function name="get_weather"><param name="city">北京</param>'
_MC_NO_NAME = '<function name="get_weather"><param>北京</param><param name="date">2024-06-27</param></function>\n'  # noqa: E501
_MC_DUPLICATE = _mc("get_weather", ("city", "北京"), ("city", "上海"))
_MC_CASE = _mc("get_weather", ("City", "北京"))
_MC_WRAPPED_BAD = _mc("get_weather", ("properties", '{"unknown": "x"}'), end="</function>")
_MC_EXTRA_ONLY = _mc("get_weather", ("unknown", "ignored"), end="</function>")
_MC_UNKNOWN = _mc("unknown", ("x", "1"))
_MC_SP = "\u010aFirst,\u0120I\u0120need\u0120to\u0120check\u0120the\u0120weather."
_MC_XXE = '<!DOCTYPE test [ <!ENTITY xxe SYSTEM "file:///etc/passwd"> ]>'
CASES += [
    minicpm5(
        "no_tool_call",
        "How can I help you?",
        content="How can I help you?",
        ids=("test_no_tool_call",),
    ),
    minicpm5(
        "single_call_with_surrounding_text",
        "Intro before.\n" + _mc("get_weather", *_MC_SH_PARAMS) + "Outro after.\n",
        [("get_weather", _MC_SH)],
        "Intro before.\n\nOutro after.\n",
        ids=("test_single_call_with_surrounding_text", "test_extract_tool_calls_streaming_single"),
    ),
    minicpm5(
        "cdata_multiline",
        _mc("get_weather", ("city", "<![CDATA[北\n京]]>"), ("date", "2024-06-27")),
        [("get_weather", {"city": "北\n京", "date": "2024-06-27"})],
        "\n",
        ids=("test_cdata_multiline",),
    ),
    minicpm5(
        "tokenizer_space_marker",
        _mc("get_weather", *_MC_SH_PARAMS, sp="\u0120"),
        [("get_weather", _MC_SH)],
        "\n",
        ids=(
            "test_tokenizer_space_marker",
            "test_extract_tool_calls_streaming_tokenizer_space_marker",
        ),
    ),
    minicpm5(
        "collapsed_function_and_param_tags",
        _mc("get_weather", *_MC_SH_PARAMS, sp=""),
        [("get_weather", _MC_SH)],
        "\n",
        ids=(
            "test_collapsed_function_and_param_tags",
            "test_extract_tool_calls_streaming_collapsed_tags_weather",
        ),
    ),
    minicpm5(
        "collapsed_param_tags_with_tokenizer_space_function",
        '<function\u0120name="get_weather"><paramname="city">上海</param>'
        '<paramname="date">2024-06-27</param></function>\n',
        [("get_weather", _MC_SH)],
        "\n",
        ids=("test_collapsed_param_tags_with_tokenizer_space_function",),
    ),
    minicpm5(
        "streaming_partial_chunks",
        _mc("get_weather", *_MC_SH_PARAMS),
        [("get_weather", _MC_SH)],
        "\n",
        ids=("test_extract_tool_calls_streaming_partial_chunks",),
    ),
    minicpm5(
        "collapsed_tags_current_weather",
        _mc("get_current_weather", *_MC_DALLAS.items(), sp="", end="</function>"),
        [("get_current_weather", _MC_DALLAS)],
        tools=(_MC_CURRENT,),
        ids=("test_collapsed_tags_current_weather",),
    ),
    minicpm5(
        "streaming_incremental_arguments",
        _mc("get_current_weather", *_MC_DALLAS.items(), end="</function>"),
        [("get_current_weather", _MC_DALLAS)],
        tools=(_MC_CURRENT,),
        ids=("test_extract_tool_calls_streaming_incremental_arguments",),
    ),
    # an undeclared tool, a cut-off block and invalid parameters: no call, the text stays
    minicpm5(
        "unknown_tool_block_preserved",
        _MC_UNKNOWN,
        content=_MC_UNKNOWN,
        ids=("test_unknown_tool_block_preserved",),
    ),
    minicpm5(
        "incomplete_missing_function_end",
        _MC_INCOMPLETE,
        content=_MC_INCOMPLETE,
        ids=("test_incomplete_missing_function_end",),
    ),
    minicpm5(
        "param_missing_name_invalid",
        _MC_NO_NAME,
        content=_MC_NO_NAME,
        ids=("test_param_missing_name_invalid",),
    ),
    minicpm5(
        "duplicate_param_names_invalid",
        _MC_DUPLICATE,
        content=_MC_DUPLICATE,
        ids=("test_duplicate_param_names_invalid",),
    ),
    minicpm5(
        "case_sensitive_param_name_invalid",
        _MC_CASE,
        content=_MC_CASE,
        ids=("test_case_sensitive_param_name_invalid",),
    ),
    minicpm5(
        "wrapped_arguments_still_validate_schema",
        _MC_WRAPPED_BAD,
        content=_MC_WRAPPED_BAD,
        ids=("test_wrapped_arguments_still_validate_schema",),
    ),
    minicpm5(
        "extra_arguments_do_not_satisfy_required",
        _MC_EXTRA_ONLY,
        content=_MC_EXTRA_ONLY,
        ids=("test_extra_arguments_do_not_satisfy_required",),
    ),
    minicpm5(
        "non_string_types",
        _mc("sum_values", ("nums", "[1, 2, 3]"), ("exact", "true")),
        [("sum_values", {"nums": [1, 2, 3], "exact": True})],
        "\n",
        tools=(_MC_SUM,),
        ids=("test_non_string_types",),
    ),
    minicpm5(
        "multiple_calls_interleaved_text",
        _MC_TWO,
        [("get_weather", {"city": "北京"}), ("sum_values", {"nums": [7, 8, 9], "exact": False})],
        "Head\n\nTXT\n\nTail\n",
        tools=(_MC_WEATHER, _MC_SUM),
        ids=("test_multiple_calls_interleaved_text", "test_extract_tool_calls_streaming_multiple"),
    ),
    minicpm5(
        "no_required_and_zero_param_valid",
        '<function name="noop"></function>\n',
        [("noop", {})],
        "\n",
        tools=(_MC_NOOP,),
        ids=("test_no_required_and_zero_param_valid",),
    ),
    minicpm5(
        "properties_wrapped_arguments",
        _mc(
            "get_customer_by_phone",
            ("properties", "{'phone_number': '555-123-2002'}"),
            end="</function>",
        ),
        [("get_customer_by_phone", {"phone_number": "555-123-2002"})],
        tools=(_MC_PHONE,),
        ids=("test_properties_wrapped_arguments",),
    ),
    minicpm5(
        "arguments_wrapped_arguments",
        _mc(
            "get_weather",
            ("arguments", '{"city": "上海", "date": "2024-06-27"}'),
            end="</function>",
        ),
        [("get_weather", _MC_SH)],
        ids=("test_arguments_wrapped_arguments",),
    ),
    minicpm5(
        "extra_arguments_ignored_when_required_present",
        _mc("get_weather", ("city", "上海"), ("unknown", "ignored"), end="</function>"),
        [("get_weather", {"city": "上海"})],
        ids=("test_extra_arguments_ignored_when_required_present",),
    ),
    minicpm5(
        "zero_arg_tool_ignores_extra_arguments",
        _mc("noop", ("note", "ignored"), ("extra", "ignored"), end="</function>"),
        [("noop", {"note": "ignored"})],
        tools=(_MC_NOOP,),
        ids=("test_zero_arg_tool_ignores_extra_arguments",),
    ),
    minicpm5(
        "alias_get_details_by_phone",
        _mc("get_details_by_phone", ("phone_number", "555-123-2002"), end="</function>"),
        [("get_customer_by_phone", {"phone_number": "555-123-2002"})],
        tools=(_MC_PHONE,),
        ids=("test_alias_get_details_by_phone",),
    ),
    minicpm5(
        "alias_get_line_details",
        _mc("get_line_details", ("customer_id", "C1001"), ("line_id", "L1001"), end="</function>"),
        [("get_details_by_id", {"id": "L1001"})],
        tools=(fn_tool("get_details_by_id", {"id": {"type": "string"}}, required=["id"]),),
        ids=("test_alias_get_line_details",),
    ),
    minicpm5(
        "alias_enable_roaming",
        _mc("enable_roaming", ("line_id", "L1001"), end="</function>"),
        [("toggle_roaming", {"line_id": "L1001", "enabled": True})],
        tools=(
            fn_tool(
                "toggle_roaming",
                {"line_id": {"type": "string"}, "enabled": {"type": "boolean"}},
                required=["line_id", "enabled"],
            ),
        ),
        ids=("test_alias_enable_roaming",),
    ),
    # vLLM asserts only that the entity is not resolved ("&xxe;" kept)
    minicpm5(
        "xml_external_entity_prevention",
        _MC_XXE + _mc("get_weather", ("city", "&xxe;"), ("date", "2024-06-27")),
        [("get_weather", {"city": "&xxe;", "date": "2024-06-27"})],
        _MC_XXE + "\n",
        ids=("test_xml_external_entity_prevention",),
    ),
]
KNOWN_DIFFERENCES += [
    known(
        minicpm5(
            "thinking_only_sentencepiece_normalized_in_content",
            _MC_SP,
            content="\nFirst, I need to check the weather.",
            ids=("test_thinking_only_sentencepiece_normalized_in_content",),
        ),
        {"content": _MC_SP},
        "content is the text as decoded: this backend's detokenizer maps byte-level "
        "tokens back to their bytes, so a Ġ / Ċ left in the text is one the model wrote "
        "as a character, and it stays (vLLM replaces them in content when no call is read)",
    ),
]
IDS[MINICPM5] = [
    "test_registered_in_tool_parser_manager",
    "test_adjust_request_skip_special_tokens",
    "test_adjust_request_tool_choice_none",
    *(
        f"test_{t}"
        for t in (
            "no_tool_call",
            "single_call_with_surrounding_text",
            "cdata_multiline",
            "tokenizer_space_marker",
            "collapsed_function_and_param_tags",
            "collapsed_param_tags_with_tokenizer_space_function",
            "extract_tool_calls_streaming_partial_chunks",
            "extract_tool_calls_streaming_tokenizer_space_marker",
            "extract_tool_calls_streaming_collapsed_tags_weather",
            "collapsed_tags_current_weather",
            "extract_tool_calls_streaming_incremental_arguments",
            "unknown_tool_block_preserved",
            "non_string_types",
            "multiple_calls_interleaved_text",
            "incomplete_missing_function_end",
            "param_missing_name_invalid",
            "duplicate_param_names_invalid",
            "case_sensitive_param_name_invalid",
            "no_required_and_zero_param_valid",
            "thinking_only_sentencepiece_normalized_in_content",
            "properties_wrapped_arguments",
            "arguments_wrapped_arguments",
            "wrapped_arguments_still_validate_schema",
            "extra_arguments_ignored_when_required_present",
            "extra_arguments_do_not_satisfy_required",
            "zero_arg_tool_ignores_extra_arguments",
            "alias_get_details_by_phone",
            "alias_get_line_details",
            "alias_enable_roaming",
            "extract_tool_calls_streaming_single",
            "extract_tool_calls_streaming_multiple",
            "xml_external_entity_prevention",
        )
    ),
]
NOT_APPLICABLE.update(
    {
        (MINICPM5, "test_registered_in_tool_parser_manager"): "vLLM's ToolParserManager "
        "class lookup (no model output)",
        (MINICPM5, "test_adjust_request_skip_special_tokens"): "vLLM's skip_special_tokens "
        "request flag: here markers are matched on the decoded text, special tokens included",
        (MINICPM5, "test_adjust_request_tool_choice_none"): "as "
        "test_adjust_request_skip_special_tokens",
    }
)


# --- cohere_command3 / cohere_command4: a JSON list of {"tool_call_id", "tool_name",
# "parameters"} in <|START_ACTION|> ... <|END_ACTION|>; vLLM's tool parser also splits the
# THINKING / RESPONSE blocks and drops `<co>` citations, which here is the reasoning format
# of the same name, applied with the tool parser's name alone. Each output runs through
# vLLM's five TestExtractToolCalls tests (one byte per delta, as the stream here). vLLM
# also checks the call id ("0", "1"); ids here are the backend's own (no part of a Case) ---
COHERE = "tests/tool_parsers/test_cohere_command_tool_parser.py@6bcd488866"
_CO_FOO = ("foo", {"query": "query1"})
_CO_ONE = (
    "<|START_THINKING|> i will call foo with query1<|END_THINKING|><|START_ACTION|>\n[\n"
    '    {"tool_call_id": "0", "tool_name": "foo", "parameters": {"query": "query1"}}\n]\n'
    "<|END_ACTION|>"
)
_CO_TWO = (
    "<|START_THINKING|>first I think about foo<|END_THINKING|><|START_ACTION|>\n[\n"
    '    {"tool_call_id": "0", "tool_name": "foo", "parameters": {"query": "query1"}},\n'
    '    {"tool_call_id": "1", "tool_name": "bar", "parameters": {"x": 42}}\n]\n'
    "<|END_ACTION|>"
)
_CO_CITE = (
    "<|START_THINKING|>This is a rainbow <co>emoji: 🌈</co: 0:[1]><|END_THINKING|>\n"
    "<|START_RESPONSE|>foo <co>bar</co: 0:[1,2],1:[3,4]><|END_RESPONSE|>"
)
_CO_TESTS = (
    "test_streaming",
    "test_streaming_reasoning",
    "test_streaming_content",
    "test_nonstreaming",
    "test_streaming_nonstreaming_agree",
)
_CO_SPLIT = (
    "TestSpeculativeDecodingMultiTokenDelta.test_no_special_token_leak_in_streaming_deltas",
    "TestSpeculativeDecodingMultiTokenDelta.test_multi_token_chunks_still_produce_correct_tool_call",
)
for _v, _name in (("cmd3", "cohere_command3"), ("cmd4", "cohere_command4")):
    for _kind, _output, _calls, _content, _reasoning in (
        ("single_tool_call", _CO_ONE, [_CO_FOO], "", "i will call foo with query1"),
        ("citations_no_tool_calls", _CO_CITE, [], "foo bar", "This is a rainbow emoji: 🌈"),
        (
            "multiple_tool_calls",
            _CO_TWO,
            [_CO_FOO, ("bar", {"x": 42})],
            "",
            "first I think about foo",
        ),
        (
            "reasoning_only",
            "<|START_THINKING|>just think, no response<|END_THINKING|>",
            [],
            "",
            "just think, no response",
        ),
    ):
        _ids = tuple(f"TestExtractToolCalls.{t}[{_v}-{_kind}]" for t in _CO_TESTS)
        if _kind == "single_tool_call":  # the same output split 2, 3, 4 and 6 bytes a delta
            _ids = (
                *_ids,
                *(f"{t}[{n}-{_v}]" for t in _CO_SPLIT for n in (2, 3, 4, 6)),
                f"TestStreamingDeltaShape.test_reasoning_and_tool_calls_are_separate_deltas[{_v}]",
            )
        CASES.append(
            Case(
                f"cohere_{_v}_{_kind}",
                COHERE,
                _name,
                "",  # the tool parser's name brings its reasoning format (TOOL_REASONING)
                _output,
                tuple(_calls),
                _content,
                _reasoning,
                ids=_ids,
            )
        )
IDS[COHERE] = [
    *(
        f"TestExtractToolCalls.{t}[{v}-{kind}]"
        for kind in (
            "single_tool_call",
            "citations_no_tool_calls",
            "multiple_tool_calls",
            "reasoning_only",
        )
        for v in ("cmd3", "cmd4")
        for t in _CO_TESTS
    ),
    *(f"{t}[{n}-{v}]" for t in _CO_SPLIT for n in (2, 3, 4, 6) for v in ("cmd3", "cmd4")),
    *every(
        "TestStreamingDeltaShape.test_reasoning_and_tool_calls_are_separate_deltas", "cmd3", "cmd4"
    ),
]


# --- inkling: typed blocks closed by <|end_message|> (or <|content_model_end_sampling|>),
# later ones after <|message_model|>; a call is <|content_invoke_tool_json|>{"name", "args"};
# the tool parser's name brings the reasoning format of the same name (vLLM's Inkling parser
# reads both). vLLM streams each output in several chunk sizes (by tokens and by
# characters); one case here stands for them all, byte by byte ---
INKLING = "tests/parser/engine/test_inkling.py@019dd4b7db"
_IK_MSG, _IK_TEXT, _IK_THINK = "<|message_model|>", "<|content_text|>", "<|content_thinking|>"
_IK_TOOL, _IK_TOOL_TEXT = "<|content_invoke_tool_json|>", "<|content_invoke_tool_text|>"
_IK_ERROR, _IK_END = "<|content_tool_error|>", "<|end_message|>"
_IK_SAMPLING = "<|content_model_end_sampling|>"


def _ik(name: str, args: str) -> str:
    return f'{_IK_TOOL}{{"name":"{name}","args":{args}}}{_IK_END}'


def inkling(ids, output, calls=(), content="", reasoning=""):
    ids = (ids,) if isinstance(ids, str) else tuple(ids)
    case_id = "inkling_" + ids[0].split("[")[0].rsplit(".", 1)[-1] + str(len(CASES))
    return Case(case_id, INKLING, "inkling", "", output, tuple(calls), content, reasoning, ids=ids)


_IK_SF = ("get_weather", {"city": "SF"})
_IK_SEATTLE = ("get_weather", {"city": "Seattle"})
_IK_42 = f"{_IK_TEXT}The answer is 42.{_IK_END}"
_IK_WRAP = "TestArgConverter."
CASES += [
    *(
        inkling(
            f"TestNonStreaming.test_bare_text_after_model_opener[{suffix}]",
            f"hello world{suffix}",
            content="hello world",
        )
        for suffix in ("", _IK_END, _IK_SAMPLING)
    ),
    inkling(
        "TestNonStreaming.test_plain_text", f"{_IK_TEXT}hello world{_IK_END}", content="hello world"
    ),
    inkling(
        "TestNonStreaming.test_reasoning_text_tool",
        f"{_IK_THINK}I should check the weather.{_IK_END}{_IK_MSG}{_IK_TEXT}Let me check."
        f"{_IK_END}{_IK_MSG}" + _ik("get_weather", '{"city":"SF"}'),
        [_IK_SF],
        "Let me check.",
        "I should check the weather.",
    ),
    inkling(
        "TestNonStreaming.test_parallel_tool_calls",
        _ik("a", "{}") + _IK_MSG + _ik("b", '{"x":[1,2]}'),
        [("a", {}), ("b", {"x": [1, 2]})],
    ),
    inkling(
        "TestNonStreaming.test_nested_args",
        _ik("f", '{"q":{"deep":{"list":[{"k":"v"}]}},"s":"a}b"}'),
        [("f", {"q": {"deep": {"list": [{"k": "v"}]}}, "s": "a}b"})],
    ),
    inkling(
        "TestNonStreaming.test_invoke_tool_text_is_visible_text",
        f"{_IK_TOOL_TEXT}do something{_IK_END}",
        content="do something",
    ),
    inkling(
        "TestNonStreaming.test_tool_error_is_visible_text",
        f"{_IK_ERROR}boom{_IK_END}",
        content="boom",
    ),
    inkling(
        "TestNonStreaming.test_end_sampling_closes_blocks",
        f"{_IK_THINK}hm{_IK_END}{_IK_MSG}{_IK_TEXT}hi{_IK_SAMPLING}",
        content="hi",
        reasoning="hm",
    ),
    inkling(
        "TestNonStreaming.test_multiple_reasoning_blocks_concatenate",
        f"{_IK_THINK}one{_IK_END}{_IK_MSG}{_IK_TEXT}mid{_IK_END}{_IK_MSG}{_IK_THINK}two{_IK_END}",
        content="mid",
        reasoning="onetwo",
    ),
    inkling(
        ("TestNonStreaming.test_text_after_tool_call", "TestDelegatingTwoPass.test_tool_then_text"),
        _ik("f", "{}") + f"{_IK_MSG}{_IK_TEXT}done{_IK_END}",
        [("f", {})],
        "done",
    ),
    inkling(
        "TestNonStreaming.test_prose_marker_without_token_ids_is_structural",
        f"{_IK_TEXT}see {_IK_TEXT} token{_IK_END}",
        content="see  token",
    ),
    inkling(
        (
            *every("TestStreaming.test_chunk_invariance_tool_call", 1, 3, 7, 64, 4096),
            *every("TestStreaming.test_chunk_invariance_tool_call_text_only", 1, 3, 7, 64),
        ),
        f"{_IK_TEXT}Check this.{_IK_END}{_IK_MSG}" + _ik("get_weather", '{"city":"San Francisco"}'),
        [("get_weather", {"city": "San Francisco"})],
        "Check this.",
    ),
    inkling(
        every("TestStreaming.test_chunk_invariance_reasoning", 1, 5, 11),
        f"{_IK_THINK}thinking...{_IK_END}{_IK_MSG}{_IK_TEXT}answer{_IK_END}",
        content="answer",
        reasoning="thinking...",
    ),
    inkling(
        "TestStreaming.test_split_marker_held_across_chunks",
        f"{_IK_TEXT}hello{_IK_END}",
        content="hello",
    ),
    inkling(
        (
            "TestStreaming.test_streamed_args_are_object_only",
            "TestRegisteredAdapters.test_adapter_round_trip",
        ),
        _ik("f", '{"a":1}'),
        [("f", {"a": 1})],
    ),
    inkling(
        every("TestStreaming.test_parallel_calls_streaming", 1, 9),
        _ik("a", '{"i":1}') + _IK_MSG + _ik("b", '{"i":2}'),
        [("a", {"i": 1}), ("b", {"i": 2})],
    ),
    inkling(
        "TestPromptSeededState.test_generation_prompt_header_flushes_bare_text_at_finish",
        "plain answer",
        content="plain answer",
    ),
    inkling(
        "TestToolCallFiltering.test_skip_tool_parsing_round_trip",
        f"{_IK_THINK}plan{_IK_END}{_IK_MSG}"
        + _ik("f", '{"a":1}')
        + _IK_MSG
        + _ik("g", '{"b":[2]}'),
        [("f", {"a": 1}), ("g", {"b": [2]})],
        reasoning="plan",
    ),
    inkling(
        (
            "TestDelegatingTwoPass.test_plain_text_non_streaming",
            *every("TestDelegatingTwoPass.test_plain_text_streaming", 1, 3, 7, 64),
            "TestToolParserWithoutReasoningParser.test_plain_text_non_streaming",
            *every("TestToolParserWithoutReasoningParser.test_plain_text_streaming", 1, 3, 64),
        ),
        _IK_42,
        content="The answer is 42.",
    ),
    inkling(
        (
            "TestDelegatingTwoPass.test_reasoning_then_text",
            "TestToolParserWithoutReasoningParser.test_thinking_then_text_keeps_structure",
        ),
        f"{_IK_THINK}plan{_IK_END}{_IK_MSG}{_IK_TEXT}Let me look.{_IK_END}",
        content="Let me look.",
        reasoning="plan",
    ),
    inkling(
        "TestDelegatingTwoPass.test_multi_tool_round_trip",
        _ik("f", '{"a":1}') + _IK_MSG + _ik("g", '{"b":2}'),
        [("f", {"a": 1}), ("g", {"b": 2})],
    ),
    inkling(
        "TestDelegatingTwoPass.test_text_then_tool",
        f"{_IK_TEXT}intro{_IK_END}{_IK_MSG}" + _ik("f", "{}"),
        [("f", {})],
        "intro",
    ),
    inkling(
        "TestDelegatingTwoPass.test_two_tools_then_text",
        _ik("f", "{}") + _IK_MSG + _ik("g", "{}") + f"{_IK_MSG}{_IK_TEXT}after{_IK_END}",
        [("f", {}), ("g", {})],
        "after",
    ),
    inkling(
        "TestDelegatingTwoPass.test_reasoning_then_tool_non_streaming",
        f"{_IK_THINK}think{_IK_END}{_IK_MSG}" + _ik("f", '{"x":1}'),
        [("f", {"x": 1})],
        reasoning="think",
    ),
    inkling(
        "TestDelegatingTwoPass.test_end_sampling_text_closer_consumed",
        f"{_IK_TEXT}hi{_IK_SAMPLING}",
        content="hi",
    ),
    inkling(
        "TestDelegatingTwoPass.test_end_sampling_tool_closer_round_trips",
        f'{_IK_TOOL}{{"name":"f","args":{{}}}}{_IK_SAMPLING}',
        [("f", {})],
    ),
    inkling(
        "TestDelegatingTwoPass.test_reset_reuse_after_incomplete_span",
        f"{_IK_TEXT}fresh{_IK_END}",
        content="fresh",
    ),
    inkling(
        every("TestDelegatingTwoPass.test_reasoning_then_tool_streaming", 1, 3, 64),
        f"{_IK_THINK}plan{_IK_END}{_IK_MSG}" + _ik("get_weather", '{"city":"SF"}'),
        [_IK_SF],
        reasoning="plan",
    ),
    *(
        inkling(
            every(
                "TestDelegatingTwoPass.test_visible_text_then_tool_streaming",
                *(f"{n}-{opener}" for n in (1, 3, 64)),
            ),
            f"{opener}let me check{_IK_END}{_IK_MSG}" + _ik("get_weather", '{"city":"SF"}'),
            [_IK_SF],
            "let me check",
        )
        for opener in (_IK_TEXT, _IK_TOOL_TEXT, _IK_ERROR)
    ),
    inkling(
        every("TestDelegatingTwoPass.test_tool_start_from_message_header_streaming", 1, 3, 7, 64),
        _ik("get_weather", '{"city":"Seattle"}'),
        [_IK_SEATTLE],
    ),
    inkling(
        "TestDelegatingTwoPass.test_content_state_tool_start_streaming",
        f"{_IK_TEXT}intro{_IK_END}" + _ik("get_weather", '{"city":"Seattle"}'),
        [_IK_SEATTLE],
        "intro",
    ),
    inkling(
        "test_skip_reasoning_parsing_inert_for_shared_markers",
        _ik("f", "{}") + "after",
        [("f", {})],
        "after",
    ),
    inkling(
        (
            "TestToolParserWithoutReasoningParser.test_tool_block_non_streaming",
            *every("TestToolParserWithoutReasoningParser.test_tool_block_streaming", 1, 3, 64),
        ),
        _ik("get_weather", '{"city":"SF"}'),
        [_IK_SF],
    ),
    inkling(
        "TestToolParserWithoutReasoningParser.test_thinking_then_tool_still_promotes",
        f"{_IK_THINK}think{_IK_END}{_IK_MSG}" + _ik("get_weather", '{"x":1}'),
        [("get_weather", {"x": 1})],
        reasoning="think",
    ),
    # vLLM's arg converter, each raw call in its block
    inkling(
        _IK_WRAP + "test_complete_wrapper",
        f'{_IK_TOOL}{{"name":"get_weather","args":{{"city":"SF"}}}}{_IK_END}',
        [_IK_SF],
    ),
    inkling(
        _IK_WRAP + "test_args_value_appearing_in_name",
        f'{_IK_TOOL}{{"name":"args","args":{{"k":1}}}}{_IK_END}',
        [("args", {"k": 1})],
    ),
    inkling(
        _IK_WRAP + "test_whitespace_tolerated",
        f'{_IK_TOOL}{{ "name" : "x" , "args" : {{"a": 1}} }}{_IK_END}',
        [("x", {"a": 1})],
    ),
    inkling(
        _IK_WRAP + "test_missing_args_defaults_empty",
        f'{_IK_TOOL}{{"name":"x"}}{_IK_END}',
        [("x", {})],
    ),
]
_IK_HEADER = (
    "the function name the model may write between <|message_model|> and the call's "
    "marker stays content here (vLLM's Inkling parser holds a block's header text and "
    "drops it before a call); this backend routes text by markers only, holding no text "
    "for what follows it"
)
_IK_CUT = (
    "a call cut off before its JSON closes comes back as content as the model wrote it, "
    "markers included (this backend's rule for every format, docs/LOCALAI.md); vLLM's "
    "engine emits the name it read (its test checks the name only)"
)
_IK_SEARCH = "search_documents_by_keyword"
KNOWN_DIFFERENCES += [
    known(
        inkling(
            (
                "TestNonStreaming.test_tool_header_name_is_not_visible_content",
                "TestPromptSeededState.test_generation_prompt_header_hides_tool_name",
            ),
            "get_weather" + _ik("get_weather", '{"city":"SF"}'),
            [_IK_SF],
        ),
        {"content": "get_weather"},
        _IK_HEADER,
    ),
    known(
        inkling(
            "TestDelegatingTwoPass.test_function_name_header_before_tool_start_streaming",
            "someFn" + _ik("get_weather", '{"city":"Seattle"}'),
            [_IK_SEATTLE],
        ),
        {"content": "someFn"},
        _IK_HEADER,
    ),
    known(
        inkling(
            "TestDelegatingTwoPass.test_function_name_not_in_content_after_reasoning",
            f"{_IK_THINK} context.{_IK_END}{_IK_MSG}{_IK_SEARCH}" + _ik(_IK_SEARCH, "{}"),
            [(_IK_SEARCH, {})],
            reasoning=" context.",
        ),
        {"content": _IK_SEARCH},
        _IK_HEADER,
    ),
    known(
        inkling(
            (
                "TestNonStreaming.test_incomplete_tool_call_at_eos",
                "TestDelegatingTwoPass.test_incomplete_tool_at_eos",
            ),
            f'{_IK_TOOL}{{"name":"d","args":{{"k":"v"',
            [("d", {"k": "v"})],
        ),
        {"calls": [], "content": f'{_IK_TOOL}{{"name":"d","args":{{"k":"v"'},
        _IK_CUT,
    ),
    known(
        inkling(
            "TestStreaming.test_name_streams_before_args_complete",
            f'{_IK_TOOL}{{"name":"get_weather",',
            [("get_weather", {})],
        ),
        {"calls": [], "content": f'{_IK_TOOL}{{"name":"get_weather",'},
        _IK_CUT,
    ),
]
# the file's ids: its cases' and known differences', and the not-applicable ones below,
# 102 in all (counted from the file: a typo in an id above would change the count)
IDS[INKLING] = sorted(
    {i for c in CASES if c.source == INKLING for i in c.vllm_ids}
    | {i for c, _ in KNOWN_DIFFERENCES if c.source == INKLING for i in c.vllm_ids}
    | {
        *(
            _IK_WRAP + t
            for t in (
                "test_partial_before_args",
                "test_partial_inside_args",
                "test_prefix_stability",
                "test_non_object_args_rejected",
            )
        ),
        "TestStreaming.test_combined_parser_reasoning_to_tool_handoff_uses_text_markers",
        "TestPromptSeededState.test_prompt_ending_in_thinking_starts_reasoning",
        "TestPromptSeededState.test_prompt_ending_in_text_starts_content",
        "TestPromptSeededState.test_generation_prompt_tail_starts_message_header",
        "TestToolCallFiltering.test_tool_choice_none_non_streaming",
        "TestToolCallFiltering.test_tool_choice_none_streaming",
        "TestRegisteredAdapters.test_adapters_resolve",
        "test_content_tool_start_emits_reasoning_end_in_reasoning_pass",
        *(
            "TestCountReasoningTokens." + t
            for t in (
                "test_generated_thinking_marker",
                "test_prompt_opened_thinking_block",
                "test_prompt_opened_text_block",
                "test_reasoning_then_text",
                "test_non_streaming_count_after_replay",
            )
        ),
    }
)
assert len(IDS[INKLING]) == 102, len(IDS[INKLING])
NOT_APPLICABLE.update(
    {
        (INKLING, _IK_WRAP + "test_partial_before_args"): "vLLM's streaming argument "
        "converter over a partial call; here a call's arguments are read whole when its "
        "block closes (the format's `whole`)",
        (INKLING, _IK_WRAP + "test_partial_inside_args"): "as test_partial_before_args",
        (INKLING, _IK_WRAP + "test_prefix_stability"): "as test_partial_before_args",
        (INKLING, _IK_WRAP + "test_non_object_args_rejected"): "asserts the converter's "
        "ValueError; here a call whose args is no JSON object is no call (its block comes "
        "back as content, as for every format)",
        (
            INKLING,
            "TestStreaming.test_combined_parser_reasoning_to_tool_handoff_uses_text_markers",
        ): "feeds vLLM's DelegatingParser a reconstructed text whose token ids disagree "
        "with it (no model output)",
        (INKLING, "TestPromptSeededState.test_prompt_ending_in_thinking_starts_reasoning"): (
            "asserts vLLM's engine state from prompt token ids; here the prompt's last "
            "think marker decides (reasoning_formats.prompt_state)"
        ),
        (INKLING, "TestPromptSeededState.test_prompt_ending_in_text_starts_content"): (
            "as test_prompt_ending_in_thinking_starts_reasoning"
        ),
        (INKLING, "TestPromptSeededState.test_generation_prompt_tail_starts_message_header"): (
            "as test_prompt_ending_in_thinking_starts_reasoning"
        ),
        (INKLING, "TestToolCallFiltering.test_tool_choice_none_non_streaming"): "a request "
        "with tool_choice none; the cases here run the parser with the request's tools "
        "only (what the backend does with calls under tool_choice none is not this file's)",
        (INKLING, "TestToolCallFiltering.test_tool_choice_none_streaming"): "as "
        "test_tool_choice_none_non_streaming",
        (INKLING, "TestRegisteredAdapters.test_adapters_resolve"): "vLLM's parser manager "
        "class lookup (no model output)",
        (INKLING, "test_content_tool_start_emits_reasoning_end_in_reasoning_pass"): "vLLM's "
        "engine event sequence (no model output)",
        **{
            (INKLING, "TestCountReasoningTokens." + t): "vLLM's count_reasoning_tokens "
            "(usage.reasoning_tokens) over token ids; the reasoning text of the same "
            "outputs is in the cases"
            for t in (
                "test_generated_thinking_marker",
                "test_prompt_opened_thinking_block",
                "test_prompt_opened_text_block",
                "test_reasoning_then_text",
                "test_non_streaming_count_after_replay",
            )
        },
    }
)


# --- cohere_command3 / cohere_command4 through vLLM's unified Cohere parser: the same
# outputs as test_cohere_command_tool_parser.py's, Command 4's answer framed in
# <|START_TEXT|> ... <|END_TEXT|> (Command 3's in RESPONSE) ---
COHERE_UNIFIED = "tests/parser/cohere/test_tool_calls.py@57eabfad17"
for _name, _tag in (("cohere_command3", "RESPONSE"), ("cohere_command4", "TEXT")):
    for _kind, _output, _calls, _content, _reasoning in (
        ("single_tool_call", _CO_ONE, [_CO_FOO], "", "i will call foo with query1"),
        (
            "citations_no_tool_calls",
            _CO_CITE.replace("RESPONSE|>", _tag + "|>"),
            [],
            "foo bar",
            "This is a rainbow emoji: 🌈",
        ),
        (
            "multiple_tool_calls",
            _CO_TWO,
            [_CO_FOO, ("bar", {"x": 42})],
            "",
            "first I think about foo",
        ),
        (
            "reasoning_only",
            "<|START_THINKING|>just think, no response<|END_THINKING|>",
            [],
            "",
            "just think, no response",
        ),
    ):
        _ids = tuple(f"TestExtractToolCalls.{t}[{_name}-{_kind}]" for t in _CO_TESTS)
        if _kind == "single_tool_call":
            _ids = (
                *_ids,
                *(f"{t}[{n}-{_name}]" for t in _CO_SPLIT for n in (2, 3, 4, 6)),
                f"TestStreamingDeltaShape.test_reasoning_and_tool_calls_are_separate_deltas"
                f"[{_name}]",
            )
        CASES.append(
            Case(
                f"cohere_unified_{_name}_{_kind}",
                COHERE_UNIFIED,
                _name,
                "",
                _output,
                tuple(_calls),
                _content,
                _reasoning,
                ids=_ids,
            )
        )
IDS[COHERE_UNIFIED] = [
    *(
        f"TestExtractToolCalls.{t}[{name}-{kind}]"
        for name in ("cohere_command3", "cohere_command4")
        for kind in (
            "single_tool_call",
            "citations_no_tool_calls",
            "multiple_tool_calls",
            "reasoning_only",
        )
        for t in _CO_TESTS
    ),
    *(
        f"{t}[{n}-{name}]"
        for t in _CO_SPLIT
        for n in (2, 3, 4, 6)
        for name in ("cohere_command3", "cohere_command4")
    ),
    *every(
        "TestStreamingDeltaShape.test_reasoning_and_tool_calls_are_separate_deltas",
        "cohere_command3",
        "cohere_command4",
    ),
]
# --- minimax (MiniMax-M1): JSON objects one a line in `<tool_calls>` ... `</tool_calls>`; a
# block inside `<think>` ... `</think>` stays content. vLLM's streaming tests feed deltas
# to the parser and check a few of its results; here each is the whole output, streamed
# byte by byte ---
MINIMAX = "tests/tool_parsers/test_minimax_tool_parser.py@41c5903d04"
_MM_W = "get_current_weather"
_MM_AREA = ("calculate_area", {"shape": "rectangle", "dimensions": {"width": 10, "height": 5}})


def minimax(id, output, calls=(), content="", ids=()):
    return Case(id, MINIMAX, "minimax", "", output, tuple(calls), content, ids=tuple(ids))


def _mm(name: str, args: dict) -> str:
    return json.dumps({"name": name, "arguments": args})


def _mm_w(city: str, state: str, unit: str | None = None) -> tuple[str, dict]:
    return (_MM_W, {"city": city, "state": state, **({"unit": unit} if unit else {})})


_MM_THINK = (
    f"<think>I should use a tool. <tool_calls>\n{_mm('ignored_tool', {'should': 'ignore'})}"
    "\n</tool_calls></think>\n\nLet me help you with the weather."
)
_MM_COMPLEX_HEAD = (
    "Let me help you with this task.<think>I need to analyze this situation first."
    f"<tool_calls>\n{_mm('internal_analysis', {'query': 'analyze situation'})}\n</tool_calls>"
    "</think>\nNow I need to get weather information and calculate area."
)
_MM_CHARS_HEAD = (
    "I'll help you with the weather analysis. <think>Let me think about this. <tool_calls>\n"
    f"{_mm('internal_analysis', {'type': 'thinking'})}\n</tool_calls>This tool should be "
    "ignored.</think>\n\nNow I'll get the weather information for you."
)
_MM_TBUF = (
    "<think>I need to use a tool. <tool_calls>\n"
    f"{_mm('ignored_tool', {'param': 'value'})}\n</tool_calls></think>\n"
)
CASES += [
    minimax(
        "no_tools",
        "This is a test",
        content="This is a test",
        ids=("test_extract_tool_calls_no_tools",),
    ),
    minimax(
        "single_tool_call",
        f"<tool_calls>\n{_mm(*_mm_w('Dallas', 'TX', 'fahrenheit'))}\n</tool_calls>",
        [_mm_w("Dallas", "TX", "fahrenheit")],
        ids=("test_extract_tool_calls[single_tool_call]",),
    ),
    minimax(
        "multiple_tool_calls",
        f"<tool_calls>\n{_mm(*_mm_w('Dallas', 'TX', 'fahrenheit'))}\n"
        f"{_mm(*_mm_w('Orlando', 'FL', 'fahrenheit'))}\n</tool_calls>",
        [_mm_w("Dallas", "TX", "fahrenheit"), _mm_w("Orlando", "FL", "fahrenheit")],
        ids=("test_extract_tool_calls[multiple_tool_calls]",),
    ),
    minimax(
        "tool_call_with_content_before",
        "I'll help you check the weather. <tool_calls>\n"
        f"{_mm(*_mm_w('Seattle', 'WA', 'celsius'))}\n</tool_calls>",
        [_mm_w("Seattle", "WA", "celsius")],
        "I'll help you check the weather.",
        ids=("test_extract_tool_calls[tool_call_with_content_before]",),
    ),
    minimax(
        "tool_call_with_single_line_json",
        f"<tool_calls>\n{_mm(*_mm_w('New York', 'NY', 'celsius'))}\n</tool_calls>",
        [_mm_w("New York", "NY", "celsius")],
        ids=("test_extract_tool_calls[tool_call_with_single_line_json]",),
    ),
    minimax(
        "tool_call_incomplete_tag",
        f"<tool_calls>\n{_mm(*_mm_w('Boston', 'MA'))}",
        [_mm_w("Boston", "MA")],
        ids=("test_extract_tool_calls[tool_call_incomplete_tag]",),
    ),
    minimax(
        "preprocess_thinking_tags",
        "<think>Let me think about this. <tool_calls>\n"
        f"{_mm('fake_tool', {'param': 'value'})}\n</tool_calls> This should be removed."
        "</think>\n\nI'll help you with that. <tool_calls>\n"
        f"{_mm(*_mm_w('Seattle', 'WA'))}\n</tool_calls>",
        [_mm_w("Seattle", "WA")],
        "<think>Let me think about this. <tool_calls>\n"
        f"{_mm('fake_tool', {'param': 'value'})}\n</tool_calls> This should be removed."
        "</think>\n\nI'll help you with that.",
        ids=("test_preprocess_model_output_with_thinking_tags",),
    ),
    minimax(
        "with_thinking_tags",
        f"{_MM_THINK} <tool_calls>\n{_mm(*_mm_w('Miami', 'FL', 'fahrenheit'))}\n</tool_calls>",
        [_mm_w("Miami", "FL", "fahrenheit")],
        _MM_THINK,
        ids=("test_extract_tool_calls_with_thinking_tags",),
    ),
    minimax(
        "invalid_json",
        f"<tool_calls>\n{_mm('valid_tool', {'city': 'Seattle'})}\n{{invalid json here}}\n"
        f"{_mm('another_valid_tool', {'param': 'value'})}\n</tool_calls>",
        [("valid_tool", {"city": "Seattle"}), ("another_valid_tool", {"param": "value"})],
        ids=("test_extract_tool_calls_invalid_json",),
    ),
    minimax(
        "missing_name_or_arguments",
        f'<tool_calls>\n{_mm("valid_tool", {"city": "Seattle"})}\n{{"name": "missing_args"}}\n'
        '{"arguments": {"city": "Portland"}}\n'
        f"{_mm('another_valid_tool', {'param': 'value'})}\n</tool_calls>",
        [("valid_tool", {"city": "Seattle"}), ("another_valid_tool", {"param": "value"})],
        ids=("test_extract_tool_calls_missing_name_or_arguments",),
    ),
    minimax(
        "streaming_basic",
        f"<tool_calls>\n{_mm(_MM_W, {'city': 'Seattle'})}\n</tool_calls>",
        [(_MM_W, {"city": "Seattle"})],
        ids=("test_streaming_basic_functionality",),
    ),
    minimax(
        "streaming_no_tool_calls",
        "This is just regular text without any tool calls.",
        content="This is just regular text without any tool calls.",
        ids=("test_streaming_no_tool_calls",),
    ),
    minimax(
        "streaming_with_thinking_tags",
        '<think><tool_calls>{"name": "ignored", "arguments": {}}</tool_calls></think>'
        f"<tool_calls>{_mm('real_tool', {'param': 'value'})}</tool_calls>",
        [("real_tool", {"param": "value"})],
        '<think><tool_calls>{"name": "ignored", "arguments": {}}</tool_calls></think>',
        ids=("test_streaming_with_thinking_tags",),
    ),
    minimax(
        "arguments_incremental_output",
        f"<tool_calls>\n{_mm(*_mm_w('Seattle', 'WA', 'celsius'))}\n</tool_calls>",
        [_mm_w("Seattle", "WA", "celsius")],
        ids=("test_streaming_arguments_incremental_output",),
    ),
    minimax(
        "arguments_delta_only",
        f"<tool_calls>\n{_mm('test_tool', {'param1': 'value1', 'param2': 'value2'})}",
        [("test_tool", {"param1": "value1", "param2": "value2"})],
        ids=("test_streaming_arguments_delta_only",),
    ),
    minimax(
        "complex_scenario_with_multiple_tools",
        f"{_MM_COMPLEX_HEAD}<tool_calls>\n{_mm(*_mm_w('Seattle', 'WA', 'celsius'))}\n"
        f"{_mm(*_MM_AREA)}</tool_calls>",
        [_mm_w("Seattle", "WA", "celsius"), _MM_AREA],
        _MM_COMPLEX_HEAD,
        ids=("test_streaming_complex_scenario_with_multiple_tools",),
    ),
    minimax(
        "character_by_character_output",
        f"{_MM_CHARS_HEAD} <tool_calls>\n{_mm(*_mm_w('Seattle', 'WA', 'celsius'))}\n"
        f"{_mm(*_MM_AREA)}\n</tool_calls>Here are the results.",
        [_mm_w("Seattle", "WA", "celsius"), _MM_AREA],
        _MM_CHARS_HEAD + "Here are the results.",
        ids=("test_streaming_character_by_character_output",),
    ),
    minimax(
        "character_by_character_simple_tool_call",
        'Let me check the weather. <tool_calls>\n{"name": "get_weather", "arguments": '
        '{"city": "NYC"}}\n</tool_calls>',
        [("get_weather", {"city": "NYC"})],
        "Let me check the weather.",
        ids=("test_streaming_character_by_character_simple_tool_call",),
    ),
    minimax(
        "character_by_character_with_buffering",
        'Hello world<tool_calls>\n{"name": "test"}\n</tool_calls>done',
        content='Hello world<tool_calls>\n{"name": "test"}\n</tool_calls>done',
        ids=("test_streaming_character_by_character_with_buffering",),
    ),
]
KNOWN_DIFFERENCES += [
    known(
        minimax(
            "thinking_tag_buffering",
            _MM_TBUF + "<tool_calls>",
            (),
            _MM_TBUF,
            ids=("test_streaming_thinking_tag_buffering",),
        ),
        {"content": _MM_TBUF.rstrip() + "<tool_calls>"},
        "a block that holds no call comes back as content with its marker, as the pipeline "
        "does for every format (vLLM's stream drops the marker; its whole parse gives the "
        "output as written)",
    ),
    known(
        minimax(
            "multiline_json_not_supported",
            '<tool_calls>\n{\n  "name": "get_current_weather",\n  "arguments": {\n'
            '    "city": "New York",\n    "state": "NY",\n    "unit": "celsius"\n  }\n}\n'
            "</tool_calls>",
            (),
            ids=("test_extract_tool_calls_multiline_json_not_supported",),
        ),
        {"calls": [_mm_w("New York", "NY", "celsius")]},
        "a call object written over several lines is a call (vLLM reads one object a line "
        "and its test marks this as not supported yet: neither call nor content)",
    ),
]
IDS[MINIMAX] = [
    "test_extract_tool_calls_no_tools",
    *every(
        "test_extract_tool_calls",
        "single_tool_call",
        "multiple_tool_calls",
        "tool_call_with_content_before",
        "tool_call_with_single_line_json",
        "tool_call_incomplete_tag",
    ),
    "test_preprocess_model_output_with_thinking_tags",
    "test_extract_tool_calls_with_thinking_tags",
    "test_extract_tool_calls_invalid_json",
    "test_extract_tool_calls_missing_name_or_arguments",
    "test_streaming_basic_functionality",
    "test_streaming_with_content_before_tool_calls",
    "test_streaming_no_tool_calls",
    "test_streaming_with_thinking_tags",
    "test_extract_tool_calls_multiline_json_not_supported",
    "test_streaming_arguments_incremental_output",
    "test_streaming_arguments_delta_only",
    "test_streaming_openai_compatibility",
    "test_streaming_thinking_tag_buffering",
    "test_streaming_complex_scenario_with_multiple_tools",
    "test_streaming_character_by_character_output",
    "test_streaming_character_by_character_simple_tool_call",
    "test_streaming_character_by_character_with_buffering",
]
NOT_APPLICABLE[MINIMAX, "test_streaming_with_content_before_tool_calls"] = (
    "one delta ending in an opened `<tool_calls>` with nothing after it, checked only for "
    "some content (no whole output: an empty block at the end)"
)
NOT_APPLICABLE[MINIMAX, "test_streaming_openai_compatibility"] = (
    "deltas of unrelated texts fed to one parser, each checked for the content it lets "
    "through (its buffering of a partial marker; no whole output)"
)


# --- solar_open2: `<|tool_call:start|>NAME\n` + `<|tool_arg:start|>K<|tool_arg:value|>V
# <|tool_arg:end|>`... + `<|tool_call:end|>`; content is the text before the first call,
# values typed by the schema. vLLM's stream tests split each output in chunks of the sizes
# in their ids; here each output streams byte by byte (its calls come whole at the end:
# ToolFormat.whole) ---
SOLAR2 = "tests/tool_parsers/test_solar_open2_tool_parser.py@0064cc9cb1"
_S2C, _S2E = "<|tool_call:start|>", "<|tool_call:end|>"
_S2_TYPED = (
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "max_results": {"type": "integer"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "do_all_types",
            "parameters": {
                "type": "object",
                "properties": {
                    "s": {"type": "string"},
                    "i": {"type": "integer"},
                    "n": {"type": "number"},
                    "b": {"type": "boolean"},
                    "arr": {"type": "array"},
                    "obj": {"type": "object"},
                    "maybe_int": {"type": ["integer", "null"]},
                },
            },
        },
    },
)
# vLLM's Responses-API request (a flat FunctionTool); the chat shape here
_S2_OPTIONS = (
    {
        "type": "function",
        "function": {
            "name": "set_options",
            "parameters": {
                "type": "object",
                "properties": {"count": {"type": "integer"}, "enabled": {"type": "boolean"}},
            },
        },
    },
)


def solar2(id, output, calls=(), content="", ids=(), tools=_S2_TYPED):
    return Case(
        id, SOLAR2, "solar_open2", "", output, tuple(calls), content, tools=tools, ids=tuple(ids)
    )


def _s2arg(key: str, value: str) -> str:
    return f"<|tool_arg:start|>{key}<|tool_arg:value|>{value}<|tool_arg:end|>\n"


def _s2(name: str, *args: tuple[str, str]) -> str:
    return f"{_S2C}{name}\n" + "".join(_s2arg(k, v) for k, v in args) + _S2E


_S2_TOOL = _s2("get_weather", ("city", "Seoul"))
_S2_SEOUL = ("get_weather", {"city": "Seoul"})
_S2_LITERAL = "what does <|tool_call: mean"
_S2_PARITY = {  # vLLM's _PARITY_FIXTURES: (output, calls, content)
    "plain_text": ("Hello! I cannot help with that.", [], "Hello! I cannot help with that."),
    "text_then_call": (
        "I'll check the weather. " + _S2_TOOL,
        [_S2_SEOUL],
        "I'll check the weather. ",
    ),
    "reasoning_then_call": (
        "<|think:start|>I should use a tool<|think:end|>Sure, let me help." + _S2_TOOL,
        [_S2_SEOUL],
        "<|think:start|>I should use a tool<|think:end|>Sure, let me help.",
    ),
    "leading_newline": ("\n" + _S2_TOOL, [_S2_SEOUL], ""),
    "trailing_newline_before_call": ("Let me check.\n" + _S2_TOOL, [_S2_SEOUL], "Let me check.\n"),
    "text_after_last_call": (_S2_TOOL + "After the call.", [_S2_SEOUL], ""),
    "text_between_calls": (
        "pre" + _S2_TOOL + "mid" + _S2_TOOL + "post",
        [_S2_SEOUL, _S2_SEOUL],
        "pre",
    ),
    "whitespace_between_calls": (_S2_TOOL + "\n\n" + _S2_TOOL, [_S2_SEOUL, _S2_SEOUL], ""),
    "back_to_back_calls": (_S2_TOOL + _S2_TOOL, [_S2_SEOUL, _S2_SEOUL], ""),
    "no_args": (f"{_S2C}get_time\n{_S2E}", [("get_time", {})], ""),
    "all_types": (
        _s2(
            "do_all_types",
            ("i", "42"),
            ("n", "7.0"),
            ("b", "true"),
            ("arr", "[1, 2]"),
            ("obj", '{"k": "v"}'),
            ("s", "hello"),
        ),
        [
            (
                "do_all_types",
                {"i": 42, "n": 7, "b": True, "arr": [1, 2], "obj": {"k": "v"}, "s": "hello"},
            )
        ],
        "",
    ),
    "duplicate_arg_name": (
        _s2("search", ("query", "first"), ("query", "second")),
        [("search", {"query": "first"})],
        "",
    ),
    "dropped_arg_end": (
        f"{_S2C}broken\n<|tool_arg:start|>a<|tool_arg:value|>oops{_S2E}" + _S2_TOOL,
        [("broken", {"a": "oops"}), _S2_SEOUL],
        "",
    ),
    "dropped_call_end": (
        f"{_S2C}search\n" + _s2arg("query", "vLLM") + _S2_TOOL,
        [("search", {"query": "vLLM"}), _S2_SEOUL],
        "",
    ),
    "dropped_call_end_and_arg_end": (
        f"{_S2C}search\n<|tool_arg:start|>query<|tool_arg:value|>vLLM" + _S2_TOOL,
        [("search", {"query": "vLLM"}), _S2_SEOUL],
        "",
    ),
    "restart_before_function_name": (f"{_S2C}get_weat" + _S2_TOOL, [_S2_SEOUL], ""),
    "restart_before_function_name_with_prefix": (
        f"Hmm. {_S2C}oops" + _S2_TOOL,
        [_S2_SEOUL],
        "Hmm. ",
    ),
    "call_end_before_function_name": (f"{_S2C}oops{_S2E}" + _S2_TOOL, [_S2_SEOUL], ""),
    "empty_function_name": (
        f"{_S2C}\n" + _s2arg("city", "Seoul") + _S2E,
        [("", {"city": "Seoul"})],
        "",
    ),
    "call_end_before_arg_name": (
        f"{_S2C}get_time\n<|tool_arg:start|>ci{_S2E}" + _S2_TOOL,
        [("get_time", {}), _S2_SEOUL],
        "",
    ),
    "restart_before_arg_name": (
        f"{_S2C}get_time\n<|tool_arg:start|>ci" + _S2_TOOL,
        [("get_time", {}), _S2_SEOUL],
        "",
    ),
    "arg_start_before_arg_name": (
        f"{_S2C}get_weather\n<|tool_arg:start|>ci" + _s2arg("city", "Seoul") + _S2E,
        [_S2_SEOUL],
        "",
    ),
    "boundary_at_arg_name_start": (
        f"{_S2C}get_time\n<|tool_arg:start|>{_S2E}" + _S2_TOOL,
        [("get_time", {}), _S2_SEOUL],
        "",
    ),
    "literal_call_sentinel_in_value": (
        _s2("search", ("query", _S2_LITERAL)),
        [("search", {"query": _S2_LITERAL})],
        "",
    ),
}
_S2_EXTRACT = {  # TestExtractToolCalls's tests on a parity fixture's output
    "dropped_arg_end": ("TestExtractToolCalls.test_dropped_arg_end_does_not_swallow_later_calls",),
    "dropped_call_end": (
        "TestExtractToolCalls.test_dropped_call_end_recovers_both_calls[dropped_call_end]",
    ),
    "dropped_call_end_and_arg_end": (
        "TestExtractToolCalls.test_dropped_call_end_recovers_both_calls[dropped_call_end_and_arg_end]",
    ),
    "empty_function_name": (
        "TestExtractToolCalls.test_empty_function_name_is_parsed_as_empty",
        "TestExtractToolCalls.test_function_name_stops_at_the_first_newline",
    ),
    "literal_call_sentinel_in_value": (
        "TestExtractToolCalls.test_literal_call_sentinel_prefix_in_value",
        *every("TestStreaming.test_literal_call_sentinel_prefix_streams_verbatim", 1, 3, 1000),
    ),
    "duplicate_arg_name": (
        "TestStreaming.test_repeated_argument_name_is_emitted_once",
        "TestExtractToolCalls.test_repeated_argument_name_keeps_first_value",
    ),
    "plain_text": ("TestStreaming.test_no_tool_calls_passthrough",),
    "text_between_calls": (),
    "leading_newline": every(
        "TestStreamingWhitespaceNormalization.test_ws_only_before_tool_call_is_dropped",
        1,
        3,
        7,
        1000,
    ),
    "whitespace_between_calls": every(
        "TestStreamingWhitespaceNormalization.test_ws_between_tool_calls_is_dropped", 1, 4, 1000
    ),
    "trailing_newline_before_call": every(
        "TestStreamingWhitespaceNormalization.test_trailing_ws_after_text_before_first_call_is_kept",
        1,
        5,
        1000,
    ),
}
for _fixture in ("dropped_call_end", "dropped_call_end_and_arg_end"):
    _S2_EXTRACT[_fixture] += tuple(
        f"TestStreaming.test_dropped_call_end_resyncs_on_bare_start[{_fixture}-{n}]"
        for n in (1, 3, 1000)
    )
_S2_EXTRACT["dropped_arg_end"] += ("TestStreaming.test_dropped_arg_end_recovers_the_next_call",)
for _fixture in (
    "restart_before_function_name",
    "restart_before_function_name_with_prefix",
    "call_end_before_function_name",
):
    _S2_EXTRACT[_fixture] = (
        f"TestExtractToolCalls.test_boundary_before_function_name_skips_the_block[{_fixture}]",
        *(
            f"TestStreaming.test_boundary_before_function_name_resyncs[{_fixture}-{n}]"
            for n in (1, 3, 1000)
        ),
    )
for _fixture in (
    "call_end_before_arg_name",
    "restart_before_arg_name",
    "arg_start_before_arg_name",
):
    _S2_EXTRACT[_fixture] = (
        f"TestExtractToolCalls.test_boundary_before_arg_name_skips_the_argument[{_fixture}]",
        *(
            f"TestStreaming.test_boundary_before_arg_name_resyncs[{_fixture}-{n}]"
            for n in (1, 3, 1000)
        ),
    )
CASES += [
    solar2(
        f"parity_{_fixture}",
        _output,
        _calls,
        _content,
        ids=tuple(
            f"TestStreaming.test_parity_with_non_stream[{_fixture}-{n}]" for n in (1, 4, 1000)
        )
        + _S2_EXTRACT.get(_fixture, ()),
    )
    for _fixture, (_output, _calls, _content) in _S2_PARITY.items()
    if _fixture != "empty_function_name"
]
_S2_WEATHER = _s2("get_weather", ("city", "Seoul"))
_S2_SEARCH = _s2("search", ("query", "vLLM tutorial"), ("max_results", "5"))


def _s2typed(arg: str, raw: str) -> str:
    return _s2("do_all_types", (arg, raw))


_S2_AB = _s2("search", ("query", "A"), ("max_results", "1")) + _s2(
    "search", ("query", "B"), ("max_results", "2")
)
CASES += [
    solar2(
        "no_tool_calls",
        "This is a regular response.",
        content="This is a regular response.",
        ids=("TestExtractToolCalls.test_no_tool_calls",),
        tools=(),
    ),
    solar2(
        "single_tool_no_content",
        _S2_WEATHER,
        [_S2_SEOUL],
        ids=("TestExtractToolCalls.test_single_tool_no_content",),
        tools=(),
    ),
    solar2(
        "single_tool_with_content_prefix",
        "Let me check the weather." + _S2_WEATHER,
        [_S2_SEOUL],
        "Let me check the weather.",
        ids=("TestExtractToolCalls.test_single_tool_with_content_prefix",),
        tools=(),
    ),
    solar2(
        "multiple_tool_calls",
        "I'll check both." + _S2_WEATHER + "\n" + _s2("get_weather", ("city", "Tokyo")),
        [_S2_SEOUL, ("get_weather", {"city": "Tokyo"})],
        "I'll check both.",
        ids=("TestExtractToolCalls.test_multiple_tool_calls",),
        tools=(),
    ),
    solar2(
        "multiple_arguments_without_schema",
        _S2_SEARCH,
        [("search", {"query": "vLLM tutorial", "max_results": "5"})],
        ids=("TestExtractToolCalls.test_multiple_arguments_without_schema",),
        tools=(),
    ),
    solar2(
        "multiple_arguments_with_schema",
        _S2_SEARCH,
        [("search", {"query": "vLLM tutorial", "max_results": 5})],
        ids=("TestExtractToolCalls.test_multiple_arguments_with_schema",),
    ),
    solar2(
        "no_arguments",
        f"{_S2C}get_time\n{_S2E}",
        [("get_time", {})],
        ids=("TestExtractToolCalls.test_no_arguments",),
        tools=(),
    ),
    solar2(
        "json_like_value_in_arg",
        _s2("process_data", ("data", '{"key": "value"}')),
        [("process_data", {"data": '{"key": "value"}'})],
        ids=("TestExtractToolCalls.test_json_like_value_in_arg",),
        tools=(),
    ),
    solar2(
        "reasoning_tags_with_tool_calls",
        "<|think:start|>I should use a tool<|think:end|>Sure, let me help." + _S2_WEATHER,
        [_S2_SEOUL],
        "<|think:start|>I should use a tool<|think:end|>Sure, let me help.",
        ids=("TestExtractToolCalls.test_reasoning_tags_with_tool_calls",),
        tools=(),
    ),
    solar2(
        "whitespace_only_prefix_is_no_content",
        "  \n\n" + _S2_WEATHER,
        [_S2_SEOUL],
        ids=("TestExtractToolCalls.test_whitespace_only_prefix_is_no_content",),
        tools=(),
    ),
    solar2(
        "text_after_last_tool_call_is_not_content",
        "pre" + _S2_WEATHER + "post",
        [_S2_SEOUL],
        "pre",
        ids=("TestExtractToolCalls.test_text_after_last_tool_call_is_not_content",),
        tools=(),
    ),
    solar2(
        "unterminated_block_returns_raw_output",
        f"Let me check.{_S2C}search\n<|tool_arg:start|>query<|tool_arg:value|>Seo",
        content=f"Let me check.{_S2C}search\n<|tool_arg:start|>query<|tool_arg:value|>Seo",
        ids=("TestExtractToolCalls.test_unterminated_block_returns_raw_output",),
    ),
    solar2(
        "truncated_multiline_value_returns_raw_output",
        f"Writing the file.{_S2C}write_file\n"
        + _s2arg("path", "/tmp/a.py")
        + "<|tool_arg:start|>content<|tool_arg:value|>"
        + "".join(f"line {i}\n" for i in range(200)),
        content=f"Writing the file.{_S2C}write_file\n"
        + _s2arg("path", "/tmp/a.py")
        + "<|tool_arg:start|>content<|tool_arg:value|>"
        + "".join(f"line {i}\n" for i in range(200)),
        ids=("TestExtractToolCalls.test_truncated_multiline_value_returns_raw_output",),
    ),
    *(
        solar2(
            f"coercion_{arg}_{pid(raw)}",
            _s2typed(arg, raw),
            [("do_all_types", {arg: value})],
            ids=ids,
        )
        for arg, raw, value, ids in (
            (
                "i",
                "42",
                42,
                (
                    "TestTypeCoercion.test_integer",
                    "TestStreaming.test_parity_with_non_stream_across_all_coercions[i-42-42]",
                ),
            ),
            (
                "n",
                "3.14",
                3.14,
                (
                    "TestTypeCoercion.test_number_float",
                    "TestStreaming.test_parity_with_non_stream_across_all_coercions[n-3.14-3.14]",
                ),
            ),
            (
                "n",
                "7.0",
                7,
                (
                    "TestTypeCoercion.test_number_downcasts_to_int_when_fractional_is_zero",
                    "TestStreaming.test_parity_with_non_stream_across_all_coercions[n-7.0-7]",
                ),
            ),
            *(
                (
                    "b",
                    raw,
                    value,
                    (
                        f"TestTypeCoercion.test_boolean[{raw}-{value}]",
                        *(
                            (
                                "TestStreaming.test_parity_with_non_stream_across_all_coercions"
                                "[b-true-True]",
                            )
                            if raw == "true"
                            else ()
                        ),
                    ),
                )
                for raw, value in (
                    ("true", True),
                    ("True", True),
                    ("1", True),
                    ("false", False),
                    ("False", False),
                    ("0", False),
                    ("yes", "yes"),
                    ("no", "no"),
                )
            ),
            (
                "arr",
                "[1, 2, 3]",
                [1, 2, 3],
                (
                    "TestTypeCoercion.test_array",
                    "TestStreaming.test_parity_with_non_stream_across_all_coercions"
                    "[arr-[1, 2, 3]-expected_py7]",
                    "TestStreaming.test_non_string_args_remain_atomic[arr-[1, 2, 3]]",
                ),
            ),
            (
                "obj",
                '{"k": "v"}',
                {"k": "v"},
                (
                    "TestTypeCoercion.test_object",
                    "TestStreaming.test_parity_with_non_stream_across_all_coercions"
                    '[obj-{"k": "v"}-expected_py8]',
                ),
            ),
            (
                "maybe_int",
                "9",
                9,
                (
                    "TestTypeCoercion.test_union_with_null_prefers_non_null_type",
                    "TestStreaming.test_parity_with_non_stream_across_all_coercions[maybe_int-9-9]",
                ),
            ),
            (
                "i",
                "null",
                None,
                (
                    "TestTypeCoercion.test_literal_null_becomes_none_for_non_string_param",
                    "TestStreaming.test_parity_with_non_stream_across_all_coercions[i-null-None]",
                ),
            ),
            ("maybe_int", "null", None, ("TestStreaming.test_literal_null_becomes_none",)),
            (
                "s",
                "42",
                "42",
                (
                    "TestTypeCoercion.test_string_type_preserves_raw_value",
                    "TestStreaming.test_parity_with_non_stream_across_all_coercions[s-42-42]",
                ),
            ),
            (
                "i",
                "not-a-number",
                "not-a-number",
                (
                    "TestTypeCoercion.test_conversion_failure_falls_back_to_string",
                    "TestStreaming.test_malformed_value_falls_back_to_string",
                    "TestStreaming.test_parity_with_non_stream_across_all_coercions"
                    "[i-not-a-number-not-a-number]",
                ),
            ),
            (
                "b",
                "False",
                False,
                ("TestStreaming.test_parity_with_non_stream_across_all_coercions[b-False-False]",),
            ),
            ("i", "12345", 12345, ("TestStreaming.test_non_string_args_remain_atomic[i-12345]",)),
            ("b", "false", False, ("TestStreaming.test_non_string_args_remain_atomic[b-false]",)),
            (
                "obj",
                '{"nested": {"ok": true}}',
                {"nested": {"ok": True}},
                ('TestStreaming.test_non_string_args_remain_atomic[obj-{"nested": {"ok": true}}]',),
            ),
        )
    ),
    solar2(
        "unknown_function_falls_back_to_string",
        _s2("unknown_fn", ("x", "5")),
        [("unknown_fn", {"x": "5"})],
        ids=("TestTypeCoercion.test_unknown_function_falls_back_to_string",),
    ),
    solar2(
        "unknown_param_falls_back_to_string",
        _s2("search", ("undeclared", "5")),
        [("search", {"undeclared": "5"})],
        ids=("TestTypeCoercion.test_unknown_param_falls_back_to_string",),
    ),
    solar2(
        "responses_function_tool_schema",
        _s2("set_options", ("count", "7"), ("enabled", "true")),
        [("set_options", {"count": 7, "enabled": True})],
        ids=(
            "TestTypeCoercion.test_responses_function_tool_schema",
            *every("TestStreaming.test_responses_function_tool_schema", 1, 7, 1000),
        ),
        tools=_S2_OPTIONS,
    ),
    solar2(
        "malformed_properties_fall_back_to_string",
        _s2("malformed", ("count", "7")),
        [("malformed", {"count": "7"})],
        ids=("TestTypeCoercion.test_malformed_properties_fall_back_to_string",),
        tools=(
            {
                "type": "function",
                "function": {
                    "name": "malformed",
                    "parameters": {"type": "object", "properties": ["count"]},
                },
            },
        ),
    ),
    solar2(
        "various_chunk_sizes",
        _s2("do_all_types", ("i", "7"), ("b", "false")),
        [("do_all_types", {"i": 7, "b": False})],
        ids=every("TestStreaming.test_various_chunk_sizes", 1, 2, 3, 5, 7, 13, 31),
    ),
    solar2(
        "content_before_tool_call_is_emitted",
        "I'll check the weather. " + _s2("search", ("query", "Seoul"), ("max_results", "3")),
        [("search", {"query": "Seoul", "max_results": 3})],
        "I'll check the weather. ",
        ids=("TestStreaming.test_content_before_tool_call_is_emitted",),
    ),
    solar2(
        "trailing_whitespace_is_streamed",
        "Hello world.\n\n",
        content="Hello world.\n\n",
        ids=("TestStreaming.test_trailing_whitespace_is_streamed",),
    ),
    solar2(
        "streaming_multiple_tool_calls",
        _s2("search", ("query", "Seoul"), ("max_results", "2"))
        + _s2("search", ("query", "Tokyo"), ("max_results", "3")),
        [
            ("search", {"query": "Seoul", "max_results": 2}),
            ("search", {"query": "Tokyo", "max_results": 3}),
        ],
        ids=("TestStreaming.test_multiple_tool_calls",),
    ),
    solar2(
        "empty_args_call",
        f"{_S2C}get_time\n{_S2E}",
        [("get_time", {})],
        ids=("TestStreaming.test_empty_args_call",),
    ),
    solar2(
        "streamed_state_reset_between_streams",
        _s2("search", ("query", "B"), ("max_results", "2")),
        [("search", {"query": "B", "max_results": 2})],
        ids=("TestStreaming.test_streamed_state_reset_between_streams",),
    ),
    solar2(
        "value_containing_left_angle_bracket",
        _s2("search", ("query", "a<b"), ("max_results", "1")),
        [("search", {"query": "a<b", "max_results": 1})],
        ids=("TestStreaming.test_value_containing_left_angle_bracket",),
    ),
    solar2(
        "reasoning_tags_before_tool_call",
        "<|think:start|>I should use a tool<|think:end|>Sure, let me help."
        + _s2("search", ("query", "Seoul"), ("max_results", "3")),
        [("search", {"query": "Seoul", "max_results": 3})],
        "<|think:start|>I should use a tool<|think:end|>Sure, let me help.",
        ids=("TestStreaming.test_reasoning_tags_before_tool_call",),
    ),
    solar2(
        "content_between_tool_calls_is_dropped",
        _s2("search", ("query", "A"), ("max_results", "1"))
        + "Also checking..."
        + _s2("search", ("query", "B"), ("max_results", "2")),
        [
            ("search", {"query": "A", "max_results": 1}),
            ("search", {"query": "B", "max_results": 2}),
        ],
        ids=("TestStreaming.test_content_between_tool_calls_is_dropped",),
    ),
    solar2(
        "base_class_state_after_stream",
        _S2_AB,
        [
            ("search", {"query": "A", "max_results": 1}),
            ("search", {"query": "B", "max_results": 2}),
        ],
        ids=("TestStreaming.test_base_class_state_after_stream",),
    ),
    solar2(
        "empty_string_value",
        _s2("search", ("query", ""), ("max_results", "1")),
        [("search", {"query": "", "max_results": 1})],
        ids=("TestStreaming.test_empty_string_value",),
    ),
    solar2(
        "false_positive_sentinel_prefix_in_content",
        "<|thinking about it|> here is the plan. "
        + _s2("search", ("query", "x"), ("max_results", "1")),
        [("search", {"query": "x", "max_results": 1})],
        "<|thinking about it|> here is the plan. ",
        ids=("TestStreaming.test_false_positive_sentinel_prefix_in_content",),
    ),
    solar2(
        "unicode_value",
        _s2("search", ("query", "서울 날씨"), ("max_results", "3")),
        [("search", {"query": "서울 날씨", "max_results": 3})],
        ids=("TestStreaming.test_unicode_value",),
    ),
    solar2(
        "streaming_without_tools_schema",
        _s2("search", ("query", "vLLM"), ("max_results", "5")),
        [("search", {"query": "vLLM", "max_results": "5"})],
        ids=("TestStreaming.test_streaming_without_tools_schema",),
        tools=(),
    ),
    solar2(
        "back_to_back_tool_calls_no_separator",
        _s2("search", ("query", "A")) + _s2("search", ("query", "B")),
        [("search", {"query": "A"}), ("search", {"query": "B"})],
        ids=("TestStreaming.test_back_to_back_tool_calls_no_separator",),
    ),
    solar2(
        "zero_args_call_followed_by_args_call",
        f"{_S2C}get_time\n{_S2E}" + _s2("search", ("query", "x")),
        [("get_time", {}), ("search", {"query": "x"})],
        ids=("TestStreaming.test_zero_args_call_followed_by_args_call",),
    ),
    solar2(
        "unique_ids_across_tool_calls",
        "".join(_s2("search", ("query", q)) for q in "ABC"),
        [("search", {"query": q}) for q in "ABC"],
        ids=("TestStreaming.test_unique_ids_across_tool_calls",),
    ),
    solar2(
        "content_and_tool_name_in_same_delta",
        "prefix " + _s2("search", ("query", "x")),
        [("search", {"query": "x"})],
        "prefix ",
        ids=("TestStreaming.test_content_and_tool_name_in_same_delta",),
    ),
    *(
        solar2(
            f"null_prefix_{pid(raw).strip() or 'empty'}_{i}",
            _s2("search", ("query", raw)),
            [("search", {"query": raw})],
            ids=(f"TestStreaming.test_null_and_null_prefix_strings_stay_atomic[{pid(raw)}]",),
        )
        for i, raw in enumerate(["null", " NULL ", "n", "nu", "nul", ""])
    ),
    *(
        solar2(
            f"partial_string_escaping_{i}",
            _s2("search", ("query", raw)),
            [("search", {"query": raw})],
            ids=tuple(
                f"TestStreaming.test_partial_string_json_escaping_matches_non_stream[{pid(raw)}-{n}]"
                for n in (1, 2, 7)
            ),
        )
        for i, raw in enumerate(
            [
                'line1\nline2 "quoted" and \\ trailing\\',
                "서울 날씨 🙂\t\r\n다음 줄",
                "prefix <|tool_arX suffix",
                "nullish",
                "  nullable",
                "line separator \u2028 paragraph \u2029",
            ]
        )
    ),
    solar2(
        "string_arg_streams_before_arg_end",
        _s2("search", ("query", "abcdefghijklmnopqrstuvwxyz" * 4)),
        [("search", {"query": "abcdefghijklmnopqrstuvwxyz" * 4})],
        ids=("TestStreaming.test_string_arg_streams_before_arg_end",),
    ),
    solar2(
        "multiple_string_args_without_schema",
        _s2("custom", ("first", "A" * 80), ("second", "B" * 80)),
        [("custom", {"first": "A" * 80, "second": "B" * 80})],
        ids=("TestStreaming.test_multiple_string_args_stream_incrementally_without_schema",),
        tools=(),
    ),
    solar2(
        "streamed_string_does_not_retain_full_raw_buffer",
        _s2("search", ("query", "0123456789abcdef" * 512)),
        [("search", {"query": "0123456789abcdef" * 512})],
        ids=("TestStreaming.test_streamed_string_does_not_retain_full_raw_buffer",),
    ),
]

_S2_EMPTY = _S2_PARITY["empty_function_name"][0]
KNOWN_DIFFERENCES += [
    known(
        solar2(
            "parity_empty_function_name",
            _S2_EMPTY,
            [("", {"city": "Seoul"})],
            ids=tuple(
                f"TestStreaming.test_parity_with_non_stream[empty_function_name-{n}]"
                for n in (1, 4, 1000)
            )
            + _S2_EXTRACT["empty_function_name"],
        ),
        {"calls": [], "content": _S2_EMPTY},
        "a call with no name is no call here, in every format: the block comes back as "
        'content as written (vLLM\'s solar_open2 reports a call named "")',
    ),
    known(
        solar2(
            "trailing_partial_tool_sentinel_is_held_back",
            "see <|to",
            content="see ",
            ids=("TestStreaming.test_trailing_partial_tool_sentinel_is_held_back",),
        ),
        {"content": "see <|to"},
        "text held back as a possible marker is released when the output ends (vLLM's "
        "stream keeps it back for good; its non-streaming path, as the test notes, gives "
        "the whole text, as here)",
    ),
    known(
        solar2(
            "truncated_stream_before_tool_call_end",
            f"{_S2C}search\n" + _s2arg("query", "x") + _s2arg("max_results", "5"),
            [("search", {"query": "x", "max_results": 5})],
            ids=("TestStreaming.test_truncated_stream_before_tool_call_end",),
        ),
        {
            "calls": [],
            "content": f"{_S2C}search\n" + _s2arg("query", "x") + _s2arg("max_results", "5"),
        },
        "a call cut off before its end marker is no call, and the output comes back as "
        "content (vLLM's non-streaming path; its stream has sent the partial arguments "
        '`{"query": "x", "max_results": 5`, no JSON)',
    ),
    known(
        solar2(
            "truncated_mid_string_keeps_emitted_state_consistent",
            f"{_S2C}search\n<|tool_arg:start|>query<|tool_arg:value|>" + "print('hello')\n" * 20,
            [("search", {"query": "print('hello')\n" * 20})],
            ids=("TestStreaming.test_truncated_mid_string_keeps_emitted_state_consistent",),
        ),
        {
            "calls": [],
            "content": f"{_S2C}search\n<|tool_arg:start|>query<|tool_arg:value|>"
            + "print('hello')\n" * 20,
        },
        "as truncated_stream_before_tool_call_end (vLLM's stream has sent an unclosed string)",
    ),
]
IDS[SOLAR2] = [
    *(
        f"TestExtractToolCalls.test_{t}"
        for t in (
            "no_tool_calls",
            "single_tool_no_content",
            "single_tool_with_content_prefix",
            "multiple_tool_calls",
            "multiple_arguments_without_schema",
            "multiple_arguments_with_schema",
            "no_arguments",
            "json_like_value_in_arg",
            "reasoning_tags_with_tool_calls",
            "whitespace_only_prefix_is_no_content",
            "text_after_last_tool_call_is_not_content",
            "unterminated_block_returns_raw_output",
            "dropped_arg_end_does_not_swallow_later_calls",
            "dropped_call_end_recovers_both_calls[dropped_call_end]",
            "dropped_call_end_recovers_both_calls[dropped_call_end_and_arg_end]",
            "boundary_before_function_name_skips_the_block[restart_before_function_name]",
            "boundary_before_function_name_skips_the_block"
            "[restart_before_function_name_with_prefix]",
            "boundary_before_function_name_skips_the_block[call_end_before_function_name]",
            "function_name_stops_at_the_first_newline",
            "empty_function_name_is_parsed_as_empty",
            "truncated_multiline_value_returns_raw_output",
            "boundary_before_arg_name_skips_the_argument[call_end_before_arg_name]",
            "boundary_before_arg_name_skips_the_argument[restart_before_arg_name]",
            "boundary_before_arg_name_skips_the_argument[arg_start_before_arg_name]",
            "literal_call_sentinel_prefix_in_value",
            "repeated_argument_name_keeps_first_value",
        )
    ),
    *(
        f"TestTypeCoercion.test_{t}"
        for t in (
            "integer",
            "number_float",
            "number_downcasts_to_int_when_fractional_is_zero",
            *(
                f"boolean[{r}]"
                for r in (
                    "true-True",
                    "True-True",
                    "1-True",
                    "false-False",
                    "False-False",
                    "0-False",
                    "yes-yes",
                    "no-no",
                )
            ),
            "array",
            "object",
            "union_with_null_prefers_non_null_type",
            "literal_null_becomes_none_for_non_string_param",
            "string_type_preserves_raw_value",
            "conversion_failure_falls_back_to_string",
            "unknown_function_falls_back_to_string",
            "unknown_param_falls_back_to_string",
            "responses_function_tool_schema",
            "malformed_properties_fall_back_to_string",
        )
    ),
    *(
        f"TestStreaming.test_parity_with_non_stream[{f}-{n}]"
        for f in sorted(_S2_PARITY)
        for n in (1, 4, 1000)
    ),
    *every("TestStreaming.test_responses_function_tool_schema", 1, 7, 1000),
    *every("TestStreaming.test_various_chunk_sizes", 1, 2, 3, 5, 7, 13, 31),
    *(
        f"TestStreaming.test_{t}"
        for t in (
            "content_before_tool_call_is_emitted",
            "no_tool_calls_passthrough",
            "trailing_partial_tool_sentinel_is_held_back",
            "trailing_whitespace_is_streamed",
            "multiple_tool_calls",
            "empty_args_call",
            "malformed_value_falls_back_to_string",
            "literal_null_becomes_none",
            "streamed_state_reset_between_streams",
            "value_containing_left_angle_bracket",
            "reasoning_tags_before_tool_call",
            "content_between_tool_calls_is_dropped",
            "empty_string_value",
            "false_positive_sentinel_prefix_in_content",
            "unicode_value",
            "truncated_stream_before_tool_call_end",
            "dropped_arg_end_recovers_the_next_call",
            "repeated_argument_name_is_emitted_once",
            "delta_protocol_shape",
            "base_class_state_after_stream",
            "streaming_without_tools_schema",
            "back_to_back_tool_calls_no_separator",
            "zero_args_call_followed_by_args_call",
            "unique_ids_across_tool_calls",
            "empty_delta_text_no_raise",
            "content_and_tool_name_in_same_delta",
            "string_arg_streams_before_arg_end",
            "multiple_string_args_stream_incrementally_without_schema",
            "truncated_mid_string_keeps_emitted_state_consistent",
            "streamed_string_does_not_retain_full_raw_buffer",
        )
    ),
    *(
        f"TestStreaming.test_dropped_call_end_resyncs_on_bare_start[{f}-{n}]"
        for f in ("dropped_call_end", "dropped_call_end_and_arg_end")
        for n in (1, 3, 1000)
    ),
    *(
        f"TestStreaming.test_boundary_before_function_name_resyncs[{f}-{n}]"
        for f in (
            "restart_before_function_name",
            "restart_before_function_name_with_prefix",
            "call_end_before_function_name",
        )
        for n in (1, 3, 1000)
    ),
    *(
        f"TestStreaming.test_boundary_before_arg_name_resyncs[{f}-{n}]"
        for f in (
            "call_end_before_arg_name",
            "restart_before_arg_name",
            "arg_start_before_arg_name",
        )
        for n in (1, 3, 1000)
    ),
    *every("TestStreaming.test_literal_call_sentinel_prefix_streams_verbatim", 1, 3, 1000),
    *(
        f"TestStreaming.test_parity_with_non_stream_across_all_coercions[{p}]"
        for p in (
            "i-42-42",
            "i-null-None",
            "i-not-a-number-not-a-number",
            "n-3.14-3.14",
            "n-7.0-7",
            "b-true-True",
            "b-False-False",
            "arr-[1, 2, 3]-expected_py7",
            'obj-{"k": "v"}-expected_py8',
            "maybe_int-9-9",
            "s-42-42",
        )
    ),
    *(
        f"TestStreaming.test_null_and_null_prefix_strings_stay_atomic[{p}]"
        for p in ("null", " NULL ", "n", "nu", "nul", "")
    ),
    *(
        f"TestStreaming.test_partial_string_json_escaping_matches_non_stream[{pid(r)}-{n}]"
        for r in (
            'line1\nline2 "quoted" and \\ trailing\\',
            "서울 날씨 🙂\t\r\n다음 줄",
            "prefix <|tool_arX suffix",
            "nullish",
            "  nullable",
            "line separator \u2028 paragraph \u2029",
        )
        for n in (1, 2, 7)
    ),
    *(
        f"TestStreaming.test_non_string_args_remain_atomic[{p}]"
        for p in ("i-12345", "b-false", "arr-[1, 2, 3]", 'obj-{"nested": {"ok": true}}')
    ),
    *(
        f"TestStreamingWhitespaceNormalization.test_ws_only_before_tool_call_is_dropped[{n}]"
        for n in (1, 3, 7, 1000)
    ),
    *(
        f"TestStreamingWhitespaceNormalization.test_ws_between_tool_calls_is_dropped[{n}]"
        for n in (1, 4, 1000)
    ),
    *(
        "TestStreamingWhitespaceNormalization."
        f"test_trailing_ws_after_text_before_first_call_is_kept[{n}]"
        for n in (1, 5, 1000)
    ),
]
NOT_APPLICABLE[SOLAR2, "TestStreaming.test_delta_protocol_shape"] = (
    "which fields each stream delta of a call carries (id and name first, then argument "
    "pieces): here a solar_open2 call comes whole, in one delta, at the end of the output "
    "(ToolFormat.whole); its output is the case base_class_state_after_stream's shape"
)
NOT_APPLICABLE[SOLAR2, "TestStreaming.test_empty_delta_text_no_raise"] = (
    "an empty delta handed to the streaming parser (no model output)"
)
