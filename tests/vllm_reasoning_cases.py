"""vLLM's reasoning-parser unit tests, wholesale, for every reasoning-parser name LocalAI's
importer writes (core/config/parser_defaults.json) and those vLLM registers beside them
(vllm/reasoning/__init__.py): what vLLM's parser of that name extracts.

Each case names the vLLM test file (github.com/vllm-project/vllm, at the commit given) and
the test ids it stands for: vLLM runs most outputs twice (non-streaming and streaming, ids
X and X_streaming); one case here covers both where vLLM expects the same, and both run
here as one piece and split at every byte. `IDS` lists every test id of each file;
`test_every_vllm_test_id_is_a_case` checks that each is a case here, a case of
tests/vllm_parser_cases.py (the reasoning cases that were there before), a known
difference (`KNOWN`, with vLLM's result, ours and why) or `NOT_APPLICABLE` (why).

prompt: what the prompt leaves open. "" is vLLM's unit-test setup: for a format whose vLLM
parser reads the output as inside the block (`implicit_start`: its thinking template opens
the block) the prompt ends with the start marker, for the others it has none; "open" the
start marker; "closed" the block opened and closed (thinking off); "none" no marker (here a
prompt with no marker starts in content for every format: `KNOWN`).

Used by tests/fast/test_reasoning_references.py (the output pipeline) and
tests/fast/test_reasoning_references_grpc.py (Predict and PredictStream over gRPC).
"""

from __future__ import annotations

from dataclasses import dataclass

T = "tests/reasoning/"
GEMMA4 = T + "test_gemma4_reasoning_parser.py@0c4966200a"
GEMMA4_TOOL = T + "test_gemma4_reasoning_with_tool_call.py@109eefd646"
MINIMAX = T + "test_minimax_m2_reasoning_parser.py@3f9d440b5a"
MINIMAX_APPEND = T + "test_minimax_m2_append_reasoning_parser.py@41c5903d04"
HUNYUAN = T + "test_hunyuan_reasoning_parser.py@0011c7437d"
HUNYUAN_A13B = T + "test_hunyuan_a13b_reasoning_parser.py@3de3265613"
GRANITE = T + "test_granite_reasoning_parser.py@04dbd8f32c"
GPTOSS = T + "test_gptoss_reasoning_parser.py@0985a564f4"
GLM45 = T + "test_glm4_moe_reasoning_parser.py@158912e581"
GLM45_FIX = T + "test_glm45_fix.py@5c3d82e08f"
KIMI = T + "test_kimi_k2_reasoning_parser.py@0847a95f7f"
ERNIE = T + "test_ernie45_reasoning_parser.py@0fed8908ce"
DSV3 = T + "test_deepseekv3_reasoning_parser.py@0fdc121666"
QWEN3 = T + "test_qwen3_reasoning_parser.py@049d8df27d"
R1 = T + "test_deepseekr1_reasoning_parser.py@04dbd8f32c"
MISTRAL = T + "test_mistral_reasoning_parser.py@04dbd8f32c"
SEED = T + "test_seedoss_reasoning_parser.py@3060cdea8c"
OLMO3 = T + "test_olmo3_reasoning_parser.py@11c69d49ad"
NEMOTRON = T + "test_nemotron_v3_reasoning_parser.py@028e77a725"
GLM47 = T + "test_glm47_reasoning_parser.py@fd125f499b"
STEP3 = T + "test_step3_reasoning_parser.py@4cf9a39530"


@dataclass(frozen=True)
class Case:
    """One vLLM reasoning case: what vLLM's parser extracts from ``output`` (None there is
    "" here). ids: the vLLM test ids it stands for; tool: a tool_parser beside it (calls:
    (name, arguments) in order)."""

    ids: tuple[str, ...]
    source: str
    parser: str
    output: str
    reasoning: str = ""
    content: str = ""
    prompt: str = ""
    tool: str = ""
    calls: tuple = ()
    why: str = ""  # known differences: the reason

    @property
    def id(self) -> str:
        return f"{self.parser}/{self.ids[0]}"


@dataclass(frozen=True)
class StreamCase:
    """vLLM's streaming sub-cases: after ``prefix`` (not checked), each step's text emits
    exactly its (reasoning, content) ("" for vLLM's None: nothing yet)."""

    ids: tuple[str, ...]
    source: str
    parser: str
    prefix: str
    steps: tuple[tuple[str, str, str], ...]

    @property
    def id(self) -> str:
        return f"{self.parser}/{self.ids[0]}"


@dataclass(frozen=True)
class PromptCase:
    """vLLM's parser selection / is_reasoning_end over a whole prompt: the state the
    prompt leaves the output in here ("reasoning" where vLLM reads on as reasoning)."""

    ids: tuple[str, ...]
    source: str
    parser: str
    prompt: str
    state: str

    @property
    def id(self) -> str:
        return f"{self.parser}/{self.ids[0]}"


def prompt_tail(fmt, prompt: str) -> str:
    """The end of the prompt a case runs with (see `prompt` above)."""
    if prompt == "":
        prompt = "open" if fmt.implicit_start else "none"
    return {"none": "", "open": fmt.start, "closed": fmt.start + fmt.end}[prompt]


def both(id_: str, suffix: str = "_streaming") -> tuple[str, str]:
    return (id_, id_ + suffix)


RS = "This is a reasoning section"
REST = "This is the rest"


def case(ids, source, parser, output, reasoning="", content="", **kw) -> Case:
    ids = (ids,) if isinstance(ids, str) else tuple(ids)
    return Case(ids, source, parser, output, reasoning, content, **kw)


# --- gemma4: <|channel>...<channel|>, the `thought\n` label dropped; starts in content ---
G_START, G_END = "<|channel>", "<channel|>"
GEMMA4_CASES = [
    case("invalid_simple_streaming", GEMMA4, "gemma4", f"{RS}{G_END}{REST}", content=RS + REST),
    case("invalid_complete_streaming", GEMMA4, "gemma4", f"{RS}{G_END}", content=RS),
    case("no_content", GEMMA4, "gemma4", f"{G_START}This is reasoning", "This is reasoning"),
    case("no_reasoning", GEMMA4, "gemma4", "This is content", content="This is content"),
    case(both("reasoning"), GEMMA4, "gemma4", f"{G_START}{RS}{G_END}{REST}", RS, REST),
    case(both("complete_reasoning"), GEMMA4, "gemma4", f"{G_START}{RS}{G_END}", RS),
    case(
        both("multiple_lines"),
        GEMMA4,
        "gemma4",
        f"{G_START}This\nThat{G_END}{REST}\nThat",
        "This\nThat",
        REST + "\nThat",
    ),
    case(both("no_end"), GEMMA4, "gemma4", f"{G_START}{RS}", RS),
    case("empty", GEMMA4, "gemma4", ""),
    case(
        both("new_line"),
        GEMMA4,
        "gemma4",
        f"Before\n{G_START}{RS}{G_END}\n{REST}",
        RS,
        "Before\n\n" + REST,
    ),
    case(
        both("thought_prefix"),
        GEMMA4,
        "gemma4",
        f"{G_START}thought\nActual reasoning here{G_END}Final answer",
        "Actual reasoning here",
        "Final answer",
    ),
    case(both("thought_prefix_only"), GEMMA4, "gemma4", f"{G_START}thought\n{G_END}"),
    case(
        both("thought_prefix_multiline"),
        GEMMA4,
        "gemma4",
        f"{G_START}thought\nLine1\nLine2{G_END}Answer",
        "Line1\nLine2",
        "Answer",
    ),
    case(
        both("thought_prefix_diverge"),
        GEMMA4,
        "gemma4",
        f"{G_START}thousand reasons{G_END}Done",
        "thousand reasons",
        "Done",
    ),
    case(both("tool_call_started"), GEMMA4, "gemma4", "<|tool_call>", content="<|tool_call>"),
]
FIND_CALL = '<|tool_call>call:find{path:<|"|>research<|"|>}<tool_call|>'
GEMMA4_CASES += [
    case(
        (
            "test_reasoning_then_tool_call_token_by_token",
            "test_reasoning_then_tool_call_single_delta",
        ),
        GEMMA4_TOOL,
        "gemma4",
        f"{G_START}thought\nI need to find files{G_END}{FIND_CALL}",
        "I need to find files",
        tool="gemma4",
        calls=(("find", {"path": "research"}),),
    ),
    # The prompt's completed tool exchange leaves the output in content; the model's own
    # <|channel> opens the reasoning.
    case(
        "test_reasoning_after_tool_response",
        GEMMA4_TOOL,
        "gemma4",
        f"{G_START}thought\nI need to answer{G_END}The answer is 42",
        "I need to answer",
        "The answer is 42",
        tool="gemma4",
    ),
    case(
        "test_reasoning_only_no_tool_call",
        GEMMA4_TOOL,
        "gemma4",
        f"{G_START}thought\nLet me think{G_END}The answer is 42",
        "Let me think",
        "The answer is 42",
        tool="gemma4",
    ),
]

# --- minimax_m2: output inside <think> from the start; only </think> is written ---
MINIMAX_CASES = [
    case(both("simple_reasoning"), MINIMAX, "minimax_m2", f"{RS}</think>{REST}", RS, REST),
    case(both("complete_reasoning"), MINIMAX, "minimax_m2", f"{RS}</think>", RS),
    case(
        both("no_end_token"),
        MINIMAX,
        "minimax_m2",
        "This is reasoning in progress",
        "This is reasoning in progress",
    ),
    case(
        both("multiple_lines"),
        MINIMAX,
        "minimax_m2",
        "First line\nSecond line</think>Response first line\nResponse second",
        "First line\nSecond line",
        "Response first line\nResponse second",
    ),
    case(
        both("shortest_reasoning"),
        MINIMAX,
        "minimax_m2",
        "</think>This is the response",
        content="This is the response",
    ),
    case(both("empty"), MINIMAX, "minimax_m2", ""),
    case(
        both("special_chars"),
        MINIMAX,
        "minimax_m2",
        "Let me think... 1+1=2, right?</think>Yes, 1+1=2.",
        "Let me think... 1+1=2, right?",
        "Yes, 1+1=2.",
    ),
    case(
        both("code_in_reasoning"),
        MINIMAX,
        "minimax_m2",
        "```python\nprint('hello')\n```</think>Here is the code.",
        "```python\nprint('hello')\n```",
        "Here is the code.",
    ),
    case(
        both("double_end_token"),
        MINIMAX,
        "minimax_m2",
        "reasoning</think>content A</think>content B",
        "reasoning",
        "content Acontent B",
    ),
]

# --- minimax_m2_append_think: no split; the content is `<think>` + the output ---
MA = "minimax_m2_append_think"


def append(ids, output: str) -> Case:
    return case(both(ids), MINIMAX_APPEND, MA, output, content="<think>" + output)


MINIMAX_APPEND_CASES = [
    append("simple_output", "This is reasoning</think>This is response"),
    append("no_end_token", "This is reasoning in progress"),
    append("only_end_token", "</think>This is response"),
    append("multiple_lines", "Line 1\nLine 2</think>Response 1\nResponse 2"),
    append("special_chars", "Let me think... 1+1=2</think>Yes!"),
    append("code_output", "```python\nprint('hi')\n```</think>Here's the code."),
    case("empty", MINIMAX_APPEND, MA, "", content="<think>"),
]

# --- hunyuan_a13b: "<think>\n" ... "\n</think>\n<answer>\n" ... "\n</answer>" ---
H_START, H_RESPONSE, H_END = "<think>\n", "\n</think>\n<answer>\n", "\n</answer>"
HY = "hunyuan_a13b"
HUNYUAN_CASES = [
    case(
        both("simple_reasoning"), HUNYUAN, HY, f"{H_START}{RS}{H_RESPONSE}{REST}{H_END}", RS, REST
    ),
    case(both("complete_reasoning"), HUNYUAN, HY, f"{H_START}{RS}{H_RESPONSE}", RS),
    case("complete_reasoning_with_symbol", HUNYUAN, HY, f"{H_START}{RS}!{H_RESPONSE}", RS + "!"),
    case(both("no_reasoning"), HUNYUAN, HY, "This is content", content="This is content"),
    case(
        ("no_reasoning_quick", "no_reasoning_quick_stream"),
        HUNYUAN,
        HY,
        f"{H_START}{H_RESPONSE}{REST}{H_END}",
        content=REST,
    ),
    case(
        both("multiple_lines"),
        HUNYUAN,
        HY,
        f"{H_START}This\nThat{H_RESPONSE}{REST}\nThat",
        "This\nThat",
        REST + "\nThat",
    ),
    case(both("reasoning_with_think"), HUNYUAN, HY, f"{H_START}{RS}{H_RESPONSE}{REST}", RS, REST),
    case(both("complete_reasoning_with_think"), HUNYUAN, HY, f"{H_START}{RS}{H_RESPONSE}", RS),
    case(
        both("multiple_lines_with_think"),
        HUNYUAN,
        HY,
        f"{H_START}This\nThat{H_RESPONSE}{REST}\nThat",
        "This\nThat",
        REST + "\nThat",
    ),
    case(
        tuple(
            f"test_streaming_multi_token_delta_matches_single_token_feed[{n}]"
            for n in (2, 3, 7, 100)
        ),
        HUNYUAN,
        HY,
        f"{H_START} reasoning here{H_RESPONSE} the answer{H_END}",
        " reasoning here",
        " the answer",
    ),
    # test_hunyuan_a13b_reasoning_parser.py feeds the token ids of these texts (its
    # comments: THINK_START_IDS "<think>\n", RESPONSE_START_IDS "\n</think>\n<answer>\n"
    # as "\n", "</", "think", ">\n", "<", "answer", ">\n"); here the text.
    case(
        "test_streaming_reaches_the_response_state",
        HUNYUAN_A13B,
        HY,
        f"{H_START}x{H_RESPONSE}",
        "x",
    ),
]
_H_PIECES = ["\n", "</", "think", ">\n", "<", "answer", ">\n"]
HUNYUAN_CASES += [
    case(
        f"test_partial_response_start_falls_back_to_reasoning[{n}]",
        HUNYUAN_A13B,
        HY,
        f"{H_START}x{''.join(_H_PIECES[:n])}y",
        f"x{''.join(_H_PIECES[:n])}y",
    )
    for n in range(1, len(_H_PIECES))
]

# --- granite: "Here is my thought process:" ... "Here is my response:" ---
G_THINK, G_RESPONSE = "Here is my thought process:", "Here is my response:"
GRANITE_CASES = [
    case(
        ("simple_reasoning_streaming",),
        GRANITE,
        "granite",
        f"{G_THINK}{RS}{G_RESPONSE}{REST}",
        RS,
        REST,
    ),
    case(("complete_reasoning_streaming",), GRANITE, "granite", f"{G_THINK}{RS}{G_RESPONSE}", RS),
    case(
        ("no_reasoning_streaming",),
        GRANITE,
        "granite",
        "This is content",
        content="This is content",
    ),
    case(
        ("multiple_lines_streaming",),
        GRANITE,
        "granite",
        f"{G_THINK}This\nThat{G_RESPONSE}{REST}\nThat",
        "This\nThat",
        REST + "\nThat",
    ),
    case(
        both("reasoning_with_think"),
        GRANITE,
        "granite",
        f"{G_THINK}{RS}{G_RESPONSE}{REST}",
        RS,
        REST,
    ),
    case(
        both("complete_reasoning_with_think"), GRANITE, "granite", f"{G_THINK}{RS}{G_RESPONSE}", RS
    ),
    case(
        both("multiple_lines_with_think"),
        GRANITE,
        "granite",
        f"{G_THINK}This\nThat{G_RESPONSE}{REST}\nThat",
        "This\nThat",
        REST + "\nThat",
    ),
]


def sub(name: str, previous: str | None, delta: str, reasoning="", content="") -> StreamCase:
    return StreamCase(
        (f"test_streaming_subcases[{name}]",),
        GRANITE,
        "granite",
        previous or "",
        ((delta, reasoning, content),),
    )


GP = "Here is my thought process: foo"
GRANITE_STREAM_CASES = [
    sub("Starting reasoning special sequence", None, "Here"),
    sub(
        "Unexpected start reasoning sequence",
        "Here is my thought",
        " failure",
        content="Here is my thought failure",
    ),
    sub("Only start reasoning sequence and nothing else", "Here is my thought", " process:"),
    sub("Reasoning content has started", "Here is my thought process:", " foo", " foo"),
    sub("Response special sequence has started", GP, " Here is", " "),
    sub("Response special sequence reset", GP + " Here is", " Here", "Here is "),
    sub("Response text has started", GP + " Here is my response:", " bar", content=" bar"),
    sub("Delta contains everything", None, GP + " Here is my response: bar", " foo ", " bar"),
    sub(
        "Delta contains some reasoning and response",
        GP,
        " bar Here is my response: baz",
        " bar ",
        " baz",
    ),
    sub(
        "Delta starts response sequence",
        "Here is my thought process: This is a reasoning section ",
        "Here",
    ),
    sub("Delta finishes response sequence", GP + " Here is my response", ":"),
    sub("Delta breaks potential responise sequence", GP + " Here", " was", "Here was"),
]

# --- glm45: <think> written by the model; starts in content ---
GLM45_CASES = [
    case(
        ("with_think", "with_think_stream"), GLM45, "glm45", f"<think>{RS}</think>{REST}", RS, REST
    ),
    case(("without_think", "without_think_stream"), GLM45, "glm45", REST, content=REST),
    case(both("complete_reasoning", "_stream"), GLM45, "glm45", f"<think>{RS}</think>", RS),
    case(
        both("multiline_reasoning", "_stream"),
        GLM45,
        "glm45",
        "<think>This is a reasoning\nsection</think>This is the rest\nThat",
        "This is a reasoning\nsection",
        "This is the rest\nThat",
    ),
    case(
        both("empty_think_block", "_stream"), GLM45, "glm45", f"<think></think>{REST}", content=REST
    ),
    case(both("empty_think_block_no_content", "_stream"), GLM45, "glm45", "<think></think>"),
    case("only_open_tag_stream", GLM45, "glm45", f"<think>{RS}", RS),
]
GLM_PROMPT = (
    "[gMASK]<sop><|system|>\nYou are a helpful assistant.<|user|>\n"
    "What is the capital of France?<|assistant|>\n"
)
GLM_TURN_1 = (
    "<think></think>\nThe capital of France is Paris.<|user|>\nWhat about Chile?<|assistant|>\n"
)
GLM45_PROMPT_CASES = [
    PromptCase(
        ("test_is_reasoning_end_full_prompt[still_reasoning]",),
        GLM45,
        "glm45",
        GLM_PROMPT + "<think>The user is asking for the capital of",
        "reasoning",
    ),
    PromptCase(
        ("test_is_reasoning_end_full_prompt[done_reasoning]",),
        GLM45,
        "glm45",
        GLM_PROMPT
        + "<think>The user is asking for the capital of France.</think>\n"
        + "The capital of France is Paris.",
        "normal",
    ),
    PromptCase(
        ("test_is_reasoning_end_full_prompt[multi_turn_still_reasoning]",),
        GLM45,
        "glm45",
        GLM_PROMPT + GLM_TURN_1 + "<think>The user is asking for the capital of",
        "reasoning",
    ),
    PromptCase(
        ("test_is_reasoning_end_full_prompt[multi_turn_done_reasoning]",),
        GLM45,
        "glm45",
        GLM_PROMPT
        + GLM_TURN_1
        + "<think>The user is asking for the capital of Chile.</think>\n"
        + "The capital of Chile is Santiago.",
        "normal",
    ),
]

# --- glm47: inside <think> from the start (the template opens it), as deepseek_r1 ---
GLM47_CASES = [
    case(both("simple_reasoning"), GLM47, "glm47", f"{RS}</think>{REST}", RS, REST),
    case(both("complete_reasoning"), GLM47, "glm47", f"{RS}</think>", RS),
    case(("no_content_token", "no_reasoning_token_streaming"), GLM47, "glm47", RS, RS),
    case(
        both("multiple_lines"),
        GLM47,
        "glm47",
        "This\nThat</think>This is the rest\nThat",
        "This\nThat",
        "This is the rest\nThat",
    ),
    case(("shortest", "shortest_no_streaming"), GLM47, "glm47", f"</think>{REST}", "", REST),
    case(both("reasoning_with_think"), GLM47, "glm47", f"<think>{RS}</think>{REST}", RS, REST),
    case(both("complete_reasoning_with_think"), GLM47, "glm47", f"<think>{RS}</think>", RS),
    case(
        both("multiple_lines_with_think"),
        GLM47,
        "glm47",
        "<think>This\nThat</think>This is the rest\nThat",
        "This\nThat",
        "This is the rest\nThat",
    ),
    case(both("think_no_end"), GLM47, "glm47", f"<think>{RS}", RS),
    case(both("empty"), GLM47, "glm47", ""),
]

# --- kimi_k2: inside <think> from the start; a tool-call section ends reasoning ---
KS = "<|tool_calls_section_begin|>"
KIMI_CASES = [
    case(
        "test_extract_reasoning_with_think_tags",
        KIMI,
        "kimi_k2",
        "<think>step by step reasoning</think>final answer",
        "step by step reasoning",
        "final answer",
    ),
    case(
        "test_extract_reasoning_empty_thinking",
        KIMI,
        "kimi_k2",
        "<think></think>final answer",
        content="final answer",
    ),
    case(
        "test_extract_reasoning_implicit_start",
        KIMI,
        "kimi_k2",
        "implicit reasoning with no tags",
        "implicit reasoning with no tags",
    ),
    case(
        "test_extract_reasoning_tool_section_ends_reasoning",
        KIMI,
        "kimi_k2",
        f"some reasoning{KS}tool call data",
        "some reasoning",
        f"{KS}tool call data",
    ),
]
KIMI_STREAM_CASES = [
    StreamCase(
        ("test_streaming_reasoning_then_content",),
        KIMI,
        "kimi_k2",
        "",
        (
            ("<think>", "", ""),
            ("step one", "step one", ""),
            ("</think>", "", ""),
            ("answer", "", "answer"),
        ),
    ),
    StreamCase(
        ("test_streaming_tool_section_ends_reasoning",),
        KIMI,
        "kimi_k2",
        "<think>thinking",
        ((KS, "", KS),),
    ),
]
GLM47_PROMPT_CASES = [
    PromptCase(tuple(c.ids), GLM47, "glm47", c.prompt, c.state) for c in GLM45_PROMPT_CASES
]
# step3 (test_is_reasoning_end_ignores_think_end_in_prompt_history): a </think> of an
# earlier turn does not end the reasoning a fresh <think> opened.
STEP3_PROMPT_CASES = [
    PromptCase(
        ("test_is_reasoning_end_ignores_think_end_in_prompt_history",),
        STEP3,
        "step3",
        text,
        state,
    )
    for text, state in (
        ("a</think>b<think>c", "reasoning"),
        ("a</think>b<think>c</think>", "normal"),
        ("ab</think>", "normal"),
    )
]
KIMI_PROMPT_CASES = [
    PromptCase(
        ("test_parser_selection_thinking_enabled",), KIMI, "kimi_k2", "<think>", "reasoning"
    ),
    PromptCase(
        ("test_parser_selection_thinking_disabled",), KIMI, "kimi_k2", "<think></think>", "normal"
    ),
]

# --- ernie45: inside <think> from the start ---
ERNIE_CASES = [
    case(both("with_think", "_stream"), ERNIE, "ernie45", "abc</think>def", "abc", "def"),
    case(both("without_think", "_stream"), ERNIE, "ernie45", "abc", "abc"),
    case(both("complete_reasoning", "_stream"), ERNIE, "ernie45", "abc</think>", "abc"),
    case(
        both("multiline_reasoning", "_stream"),
        ERNIE,
        "ernie45",
        "abc\nABC</think>def\nDEF",
        "abc\nABC",
        "def\nDEF",
    ),
]

# --- deepseek_v3: deepseek_r1 with thinking, identity without ---
DSV3_CASES = [
    case(
        "test_identity_reasoning_parser_basic",
        DSV3,
        "deepseek_v3",
        "This is some output",
        content="This is some output",
        prompt="closed",
    ),
]
DSV3_PROMPT_CASES = [
    PromptCase(
        ("test_parser_selection[True-DeepSeekR1ReasoningParser]",),
        DSV3,
        "deepseek_v3",
        "<think>",
        "reasoning",
    ),
    PromptCase(
        ("test_parser_selection[False-IdentityReasoningParser]",),
        DSV3,
        "deepseek_v3",
        "</think>",
        "normal",
    ),
]

# --- qwen3: the ids tests/vllm_parser_cases.py's QWEN3_CASES leave (with tool_parser
# qwen3_coder there; here the reasoning parser alone, as vLLM's test runs it) ---
TOOL_BODY = (
    "<tool_call>\n<function=bash>\n<parameter=command>"
    "\ncat /etc/hosts\n</parameter>\n</function>\n</tool_call>"
)
NEED = "I need to read the file.\n\n"
QWEN3_CASES = [
    case("without_start_token_stream", QWEN3, "qwen3", f"{RS}</think>{REST}", RS, REST),
    case("without_start_token_complete_reasoning_stream", QWEN3, "qwen3", f"{RS}</think>", RS),
    case("with_think_stream", QWEN3, "qwen3", f"<think>{RS}</think>{REST}", RS, REST),
    case("without_think_stream", QWEN3, "qwen3", REST, REST),
    case("complete_reasoning_stream", QWEN3, "qwen3", f"<think>{RS}</think>", RS),
    case(
        "multiline_reasoning_stream",
        QWEN3,
        "qwen3",
        "<think>This is a reasoning\nsection</think>This is the rest\nThat",
        "This is a reasoning\nsection",
        "This is the rest\nThat",
    ),
    case("only_open_tag_stream", QWEN3, "qwen3", f"<think>{RS}", RS),
    case("truncated_no_start_token_stream", QWEN3, "qwen3", RS, RS),
    case(
        both("tool_call_no_think_end", "_stream"), QWEN3, "qwen3", NEED + TOOL_BODY, NEED, TOOL_BODY
    ),
    case(
        both("tool_call_with_think_no_end", "_stream"),
        QWEN3,
        "qwen3",
        "<think>" + NEED + TOOL_BODY,
        NEED,
        TOOL_BODY,
    ),
    case(
        "start_token_grouped_with_text",
        QWEN3,
        "qwen3",
        f"<think>{RS}</think>{REST}",
        RS,
        REST,
    ),
    case(
        "end_token_grouped_with_content",
        QWEN3,
        "qwen3",
        f"reasoning section</think>{REST}",
        "reasoning section",
        REST,
    ),
    case(
        "start_and_end_in_one_delta_no_content",
        QWEN3,
        "qwen3",
        "<think>reasoning</think>",
        "reasoning",
    ),
    case(
        "no_start_end_grouped_with_content",
        QWEN3,
        "qwen3",
        "reasoning section</think>content",
        "reasoning section",
        "content",
    ),
    case(
        "tool_call_implicit_reasoning_end",
        QWEN3,
        "qwen3",
        NEED + "<tool_call>\n<function=bash>",
        NEED,
        "<tool_call>\n<function=bash>",
    ),
    case(
        "thinking_disabled_no_think_tokens",
        QWEN3,
        "qwen3",
        "Some output without think tokens",
        content="Some output without think tokens",
        prompt="closed",
    ),
    case(
        "thinking_disabled_with_tool_call",
        QWEN3,
        "qwen3",
        NEED + TOOL_BODY,
        content=NEED + TOOL_BODY,
        prompt="closed",
    ),
]


# --- deepseek_r1 / mistral: the streaming ids tests/vllm_parser_cases.py's R1_CASES and
# MISTRAL_REASONING_CASES leave ---
def r1_family(source: str, parser: str, start: str, end: str) -> list[Case]:
    def c(ids, output, reasoning="", content=""):
        output = output.replace("<think>", start).replace("</think>", end)
        return case(ids, source, parser, output, reasoning, content)

    return [
        c("simple_reasoning_streaming", f"{RS}</think>{REST}", RS, REST),
        c("complete_reasoning_streaming", f"{RS}</think>", RS),
        c("no_reasoning_token_streaming", RS, RS),
        c(
            "multiple_lines_streaming",
            "This\nThat</think>This is the rest\nThat",
            "This\nThat",
            "This is the rest\nThat",
        ),
        c("shortest_streaming", f"</think>{REST}", "", REST),
        c("reasoning_with_think_streaming", f"<think>{RS}</think>{REST}", RS, REST),
        c("complete_reasoning_with_think_streaming", f"<think>{RS}</think>", RS),
        c(
            "multiple_lines_with_think_streaming",
            "<think>This\nThat</think>This is the rest\nThat",
            "This\nThat",
            "This is the rest\nThat",
        ),
        c(both("shortest_with_think"), f"</think>{REST}", "", REST),
        c("think_no_end_streaming", f"<think>{RS}", RS),
        c("empty_streaming", ""),
    ]


R1_CASES = r1_family(R1, "deepseek_r1", "<think>", "</think>")
MISTRAL_CASES = r1_family(MISTRAL, "mistral", "[THINK]", "[/THINK]")

# --- seed_oss: inside <seed:think> from the start ---
SS, SE = "<seed:think>", "</seed:think>"


def seed(name: str, output: str, reasoning="", content="") -> Case:
    return case((f"{name}[True]", f"{name}[False]"), SEED, "seed_oss", output, reasoning, content)


SEED_CASES = [
    seed("test_simple_reasoning", f"{RS}{SE}{REST}", RS, REST),
    seed("test_complete_reasoning", f"{RS}{SE}", RS),
    seed("test_no_content", "This is content", "This is content"),
    seed("test_multiple_lines", f"This\nThat{SE}{REST}\nThat", "This\nThat", REST + "\nThat"),
    seed("test_with_start_token", f"{SS}{RS}{SE}{REST}", RS, REST),
    seed("test_only_end_token", f"Some reasoning{SE}{REST}", "Some reasoning", REST),
    seed(
        "test_no_tokens",
        "This is just content without any reasoning tokens",
        "This is just content without any reasoning tokens",
    ),
    case(
        "test_streaming_delta_processing",
        SEED,
        "seed_oss",
        f"Some reasoning content{SE}Final answer",
        "Some reasoning content",
        "Final answer",
    ),
]
# test_seedoss_reasoning_parser_creation: the parser's markers (ModelMetadata shows them).
MARKERS = {"seed_oss": (SS, SE, SEED, "test_seedoss_reasoning_parser_creation")}

# --- olmo3: inside <think> from the start; whitespace kept ---
NO_THOUGHTS = "No thoughts, head empty!"
OLMO3_CASES = [
    case(
        both("no_reasoning"), OLMO3, "olmo3", f"<think></think>{NO_THOUGHTS}", content=NO_THOUGHTS
    ),
    case(
        both("no_reasoning_with_newline"),
        OLMO3,
        "olmo3",
        f"<think>\n</think>\n\n{NO_THOUGHTS}",
        "\n",
        "\n\n" + NO_THOUGHTS,
    ),
    case(
        (*both("simple_reasoning"), "test_single_delta_preserves_content_after_end_marker"),
        OLMO3,
        "olmo3",
        f"<think>{RS}</think>{REST}",
        RS,
        REST,
    ),
    case(
        both("simple_reasoning_with_newline"),
        OLMO3,
        "olmo3",
        f"<think> Look!\n\nI'm thinking...</think>\n{REST}",
        " Look!\n\nI'm thinking...",
        "\n" + REST,
    ),
    case(
        both("simple_reasoning_with_multiple_newlines"),
        OLMO3,
        "olmo3",
        f"<think>\nLook!\nI'm thinking...\n\n</think>\n\n\n{REST}",
        "\nLook!\nI'm thinking...\n\n",
        "\n\n\n" + REST,
    ),
    case(
        "simple_reasoning_with_trailing_space_streaming",
        OLMO3,
        "olmo3",
        f"<think>\nLook!\nI'm thinking... </think>\n{REST}",
        "\nLook!\nI'm thinking... ",
        "\n" + REST,
    ),
    case(
        both("no_reasoning_only_end_think"),
        OLMO3,
        "olmo3",
        f"</think>\n\n{NO_THOUGHTS}",
        content="\n\n" + NO_THOUGHTS,
    ),
    case(
        both("yes_reasoning_only_end_think"),
        OLMO3,
        "olmo3",
        "The user is asking me not to think.</think>No thoughts!",
        "The user is asking me not to think.",
        "No thoughts!",
    ),
]

# --- nemotron_v3: inside <think> from the start ---
NV = "nemotron_v3"
NEMOTRON_CASES = [
    case(both("without_start_token"), NEMOTRON, NV, f"{RS}</think>{REST}", RS, REST),
    case(both("with_start_token"), NEMOTRON, NV, f"<think>{RS}</think>{REST}", RS, REST),
    case(
        "test_nemotron_v3_without_thinking_moves_into_content",
        NEMOTRON,
        NV,
        "This is plain content",
        content="This is plain content",
        prompt="closed",
    ),
    case(
        (
            "test_nemotron_v3_force_nonempty_keeps_real_content",
            "test_nemotron_v3_streaming_no_promotion_with_real_content",
        ),
        NEMOTRON,
        NV,
        "<think>reasoning here</think>real answer",
        "reasoning here",
        "real answer",
    ),
    case(
        "test_nemotron_v3_with_thinking_keeps_truncated_reasoning",
        NEMOTRON,
        NV,
        "This is truncated reasoning",
        "This is truncated reasoning",
    ),
    case("test_nemotron_v3_streaming_no_promotion_without_opt_in", NEMOTRON, NV, "<think>4", "4"),
]

CASES = (
    GEMMA4_CASES
    + MINIMAX_CASES
    + MINIMAX_APPEND_CASES
    + HUNYUAN_CASES
    + GRANITE_CASES
    + GLM45_CASES
    + KIMI_CASES
    + ERNIE_CASES
    + GLM47_CASES
    + DSV3_CASES
    + QWEN3_CASES
    + R1_CASES
    + MISTRAL_CASES
    + SEED_CASES
    + OLMO3_CASES
    + NEMOTRON_CASES
)
STREAM_CASES = GRANITE_STREAM_CASES + KIMI_STREAM_CASES
PROMPT_CASES = (
    GLM45_PROMPT_CASES
    + GLM47_PROMPT_CASES
    + STEP3_PROMPT_CASES
    + KIMI_PROMPT_CASES
    + DSV3_PROMPT_CASES
)


def known(c: Case, ours: dict, why: str) -> tuple[Case, dict]:
    return Case(**{**c.__dict__, "why": why}), ours


PATHS = (
    "vLLM's non-streaming and streaming paths disagree here; this backend has one path "
    "(Predict is the joined stream) and gives vLLM's streaming result"
)
NO_MARKER = (
    "vLLM's parser cannot see the prompt and reads an output with no marker as reasoning; "
    "here the prompt decides, and one with no marker starts in content: LocalAI's importer "
    "gives this name to whole families, models that never think among them "
    "(mistral-nemo / -small, Qwen3 instruct), whose whole answer would else be reasoning. "
    "The thinking templates open the block in the prompt, and then the output starts in "
    "reasoning as vLLM's does (every other case of this name)"
)
KNOWN = [
    known(
        case(
            "no_content_token",
            R1,
            "deepseek_r1",
            "This is content",
            "This is content",
            prompt="none",
        ),
        {"reasoning": "", "content": "This is content"},
        NO_MARKER,
    ),
    known(
        case("without_think", QWEN3, "qwen3", REST, REST, prompt="none"),
        {"reasoning": "", "content": REST},
        NO_MARKER,
    ),
    known(
        case(
            "no_content_token",
            MISTRAL,
            "mistral",
            "This is content",
            "This is content",
            prompt="none",
        ),
        {"reasoning": "", "content": "This is content"},
        NO_MARKER,
    ),
    known(
        case(
            both("no_end_token"),
            MINIMAX,
            "minimax_m2",
            "This is reasoning in progress",
            "This is reasoning in progress",
            prompt="none",
        ),
        {"reasoning": "", "content": "This is reasoning in progress"},
        NO_MARKER,
    ),
    known(
        case("invalid_simple", GEMMA4, "gemma4", f"{RS}{G_END}{REST}", RS, REST),
        {"reasoning": "", "content": RS + REST},
        PATHS + " (a stray <channel|> without <|channel>: dropped, all content)",
    ),
    known(
        case("invalid_complete", GEMMA4, "gemma4", f"{RS}{G_END}", RS),
        {"reasoning": "", "content": RS},
        PATHS + " (a stray <channel|> without <|channel>: dropped, all content)",
    ),
    known(
        case("only_open_tag", GLM45, "glm45", f"<think>{RS}", content=f"<think>{RS}"),
        {"reasoning": RS, "content": ""},
        PATHS + " (an open <think> never closed: reasoning, cut off)",
    ),
    known(
        case("new_line", MISTRAL, "mistral", f"\n[THINK]{RS}[/THINK]\n{REST}", RS, "\n" + REST),
        {"reasoning": "\n" + RS},
        PATHS + " (tests/vllm_parser_cases.py has deepseek_r1's new_line so)",
    ),
    known(
        case("empty_streaming", MINIMAX_APPEND, MA, ""),
        {"content": "<think>"},
        "vLLM's two paths disagree (non-streaming '<think>', streaming nothing); here "
        "Predict and the stream agree on the non-streaming result: the content always "
        "starts with <think>",
    ),
    known(
        case(
            "test_nemotron_v3_force_nonempty_content_moves_into_content",
            NEMOTRON,
            NV,
            "<think>This is plain content",
            content="This is plain content",
        ),
        {"reasoning": "This is plain content", "content": ""},
        "chat_template_kwargs force_nonempty_content (reasoning moved into empty content) "
        "is vLLM's own request field; LocalAI's proto has no such option, so reasoning "
        "stays reasoning",
    ),
    known(
        case(
            "test_nemotron_v3_streaming_promotes_reasoning_to_content",
            NEMOTRON,
            NV,
            "<think>4",
            "4",
            "4",
        ),
        {"reasoning": "4", "content": ""},
        "as test_nemotron_v3_force_nonempty_content_moves_into_content: no "
        "force_nonempty_content option here",
    ),
]

# Tests whose subject is not the text split (or not reachable through LocalAI's proto).
_IS_END = (
    "asserts only vLLM's is_reasoning_end(token ids), which gates vLLM's structured "
    "output; here the routing state is covered by the cases and the grammar gate "
    "(decoding/grammar_gate.py) decides when a grammar starts"
)
NOT_APPLICABLE = {
    (GEMMA4, "test_gemma4_adjust_request"): "vLLM's skip_special_tokens request flag: "
    "here markers are matched on the decoded text, special tokens included",
    (GEMMA4, "test_gemma4_previous_turn_reasoning_is_reasoning_end"): _IS_END
    + " (a new turn starts in content here; the model's own <|channel> opens reasoning)",
    (GRANITE, "test_streaming_subcases[Continuing unexpected start reasoning sequence]"): (
        "its previous/current/delta texts are no prefix chain (current ' words' does not "
        "start with previous 'Here wrong'), so no token stream gives them"
    ),
    (GPTOSS, "test_gptoss_is_reasoning_end[9 outputs]"): _IS_END,
    (GPTOSS, "TestGptOssStructuralTags"): "xgrammar structural tags vLLM builds for "
    "gpt-oss; constrained decoding here is decoding/grammar.py's (issue 37 item 4)",
    (GLM45_FIX, "*"): "tests a helper the file defines itself (_split_embedded_tool_calls), "
    "not vLLM's glm45 parser",
    (KIMI, "test_streaming_end_token_id_buffered"): "a marker's token id arriving before "
    "its text: here markers are matched on the decoded text only",
    (KIMI, "test_streaming_tool_section_id_buffered"): "as test_streaming_end_token_id_buffered",
    (DSV3, "test_deepseek_v4_reasoning_parser_alias"): "deepseek_v4: no LocalAI name",
    (DSV3, "test_count_reasoning_tokens_delegates[True-3]"): "counts reasoning tokens "
    "(usage); LocalAI's proto has no reasoning-token count",
    (DSV3, "test_count_reasoning_tokens_delegates[False-0]"): "as [True-3]",
    (SEED, "test_is_reasoning_end"): _IS_END,
    (STEP3, "test_count_reasoning_tokens_stops_at_think_end"): "counts reasoning tokens "
    "(usage); LocalAI's proto has no reasoning-token count",
    (STEP3, "test_count_reasoning_tokens_without_think_end"): "as "
    "test_count_reasoning_tokens_stops_at_think_end",
    (SEED, "test_extract_content_ids"): "vLLM's content token-id API; here content is text",
}


def _ids(*names: str, streaming: str = "_streaming") -> list[str]:
    return [i for n in names for i in (n, n + streaming)]


# Every test id of each vLLM file (non-streaming id, streaming id, other tests).
IDS = {
    GEMMA4: [
        "invalid_simple", "invalid_simple_streaming", "invalid_complete",
        "invalid_complete_streaming", "no_content", "no_reasoning",
        *_ids("reasoning", "complete_reasoning", "multiple_lines"),
        "no_end", "no_end_streaming", "empty", "new_line", "new_line_streaming",
        *_ids("thought_prefix", "thought_prefix_only", "thought_prefix_multiline",
              "thought_prefix_diverge", "tool_call_started"),
        "test_gemma4_adjust_request", "test_gemma4_previous_turn_reasoning_is_reasoning_end",
    ],
    GEMMA4_TOOL: [
        "test_reasoning_then_tool_call_token_by_token",
        "test_reasoning_then_tool_call_single_delta",
        "test_reasoning_after_tool_response", "test_reasoning_only_no_tool_call",
    ],
    MINIMAX: _ids(
        "simple_reasoning", "complete_reasoning", "no_end_token", "multiple_lines",
        "shortest_reasoning", "empty", "special_chars", "code_in_reasoning", "double_end_token",
    ),
    MINIMAX_APPEND: _ids(
        "simple_output", "no_end_token", "only_end_token", "multiple_lines", "empty",
        "special_chars", "code_output",
    ),
    HUNYUAN: [
        "simple_reasoning", "complete_reasoning", "complete_reasoning_with_symbol",
        "no_reasoning", "no_reasoning_quick", "multiple_lines", "reasoning_with_think",
        "complete_reasoning_with_think", "multiple_lines_with_think",
        "simple_reasoning_streaming", "complete_reasoning_streaming", "no_reasoning_streaming",
        "no_reasoning_quick_stream", "multiple_lines_streaming",
        "reasoning_with_think_streaming", "complete_reasoning_with_think_streaming",
        "multiple_lines_with_think_streaming",
        *(f"test_streaming_multi_token_delta_matches_single_token_feed[{n}]"
          for n in (2, 3, 7, 100)),
    ],
    HUNYUAN_A13B: [
        "test_streaming_reaches_the_response_state",
        *(f"test_partial_response_start_falls_back_to_reasoning[{n}]" for n in range(1, 7)),
    ],
    GRANITE: [
        *_ids("simple_reasoning", "complete_reasoning", "no_reasoning", "multiple_lines",
              "reasoning_with_think", "complete_reasoning_with_think", "multiple_lines_with_think"),
        *(f"test_streaming_subcases[{n}]" for n in (
            "Starting reasoning special sequence", "Unexpected start reasoning sequence",
            "Continuing unexpected start reasoning sequence",
            "Only start reasoning sequence and nothing else", "Reasoning content has started",
            "Response special sequence has started", "Response special sequence reset",
            "Response text has started", "Delta contains everything",
            "Delta contains some reasoning and response", "Delta starts response sequence",
            "Delta finishes response sequence", "Delta breaks potential responise sequence",
        )),
    ],
    GPTOSS: ["test_gptoss_is_reasoning_end[9 outputs]", "TestGptOssStructuralTags"],
    GLM45: [
        *_ids("with_think", "without_think", "complete_reasoning", "multiline_reasoning",
              "empty_think_block", "empty_think_block_no_content", "only_open_tag",
              streaming="_stream"),
        *(f"test_is_reasoning_end_full_prompt[{n}]" for n in (
            "still_reasoning", "done_reasoning", "multi_turn_still_reasoning",
            "multi_turn_done_reasoning")),
    ],
    GLM45_FIX: ["*"],
    KIMI: [
        "test_parser_selection_thinking_enabled", "test_parser_selection_thinking_disabled",
        "test_extract_reasoning_with_think_tags", "test_extract_reasoning_empty_thinking",
        "test_extract_reasoning_implicit_start",
        "test_extract_reasoning_tool_section_ends_reasoning",
        "test_streaming_reasoning_then_content", "test_streaming_tool_section_ends_reasoning",
        "test_streaming_end_token_id_buffered", "test_streaming_tool_section_id_buffered",
    ],
    ERNIE: _ids("with_think", "without_think", "complete_reasoning", "multiline_reasoning",
                streaming="_stream"),
    DSV3: [
        "test_parser_selection[True-DeepSeekR1ReasoningParser]",
        "test_parser_selection[False-IdentityReasoningParser]",
        "test_deepseek_v4_reasoning_parser_alias", "test_identity_reasoning_parser_basic",
        "test_count_reasoning_tokens_delegates[True-3]",
        "test_count_reasoning_tokens_delegates[False-0]",
    ],
    QWEN3: [
        *_ids("without_start_token", "without_start_token_complete_reasoning", "with_think",
              "without_think", "complete_reasoning", "multiline_reasoning", "only_open_tag",
              "truncated_no_start_token", "tool_call_no_think_end",
              "tool_call_with_think_no_end", streaming="_stream"),
        "start_token_grouped_with_text", "end_token_grouped_with_content",
        "start_and_end_in_one_delta_no_content", "no_start_end_grouped_with_content",
        "tool_call_implicit_reasoning_end", "thinking_disabled_plain_content",
        "thinking_disabled_no_think_tokens", "thinking_disabled_with_tool_call",
    ],
    R1: [
        *_ids("simple_reasoning", "complete_reasoning", "multiple_lines", "reasoning_with_think",
              "complete_reasoning_with_think", "multiple_lines_with_think", "shortest_with_think",
              "think_no_end", "empty", "new_line"),
        "no_content_token", "no_reasoning_token_streaming", "shortest", "shortest_streaming",
    ],
    SEED: [
        "test_seedoss_reasoning_parser_creation",
        *(f"{n}[{s}]" for n in (
            "test_simple_reasoning", "test_complete_reasoning", "test_no_content",
            "test_multiple_lines", "test_with_start_token", "test_only_end_token",
            "test_no_tokens") for s in (True, False)),
        "test_is_reasoning_end", "test_extract_content_ids", "test_streaming_delta_processing",
    ],
    OLMO3: [
        *_ids("no_reasoning", "no_reasoning_with_newline", "simple_reasoning",
              "simple_reasoning_with_newline", "simple_reasoning_with_multiple_newlines",
              "no_reasoning_only_end_think", "yes_reasoning_only_end_think"),
        "simple_reasoning_with_trailing_space_streaming",
        "test_single_delta_preserves_content_after_end_marker",
    ],
    NEMOTRON: [
        *_ids("without_start_token", "with_start_token"),
        "test_nemotron_v3_without_thinking_moves_into_content",
        "test_nemotron_v3_force_nonempty_content_moves_into_content",
        "test_nemotron_v3_force_nonempty_keeps_real_content",
        "test_nemotron_v3_with_thinking_keeps_truncated_reasoning",
        "test_nemotron_v3_streaming_promotes_reasoning_to_content",
        "test_nemotron_v3_streaming_no_promotion_with_real_content",
        "test_nemotron_v3_streaming_no_promotion_without_opt_in",
    ],
}  # fmt: skip
IDS[MISTRAL] = list(IDS[R1])
IDS[GLM47] = [
    *_ids("simple_reasoning", "complete_reasoning", "multiple_lines", "reasoning_with_think",
          "complete_reasoning_with_think", "multiple_lines_with_think", "think_no_end", "empty"),
    "no_content_token", "no_reasoning_token_streaming", "shortest", "shortest_no_streaming",
    *(f"test_is_reasoning_end_full_prompt[{n}]" for n in (
        "still_reasoning", "done_reasoning", "multi_turn_still_reasoning",
        "multi_turn_done_reasoning")),
]  # fmt: skip
IDS[STEP3] = [
    "test_count_reasoning_tokens_stops_at_think_end",
    "test_count_reasoning_tokens_without_think_end",
    "test_is_reasoning_end_ignores_think_end_in_prompt_history",
]


def expected(c: Case) -> dict:
    return {"calls": list(c.calls), "content": c.content, "reasoning": c.reasoning}


# --- holo2: deepseek_v3 thinking by default (vLLM's DeepSeekV3ReasoningWithThinkingParser);
# here the prompt decides: a thinking prompt opens <think>, one without closes it ---
HOLO2 = T + "test_holo2_reasoning_parser.py@045d757550"
CASES += [
    case(
        ("with_think", "with_think_stream", "with_think_enabled", "with_think_stream_enabled"),
        HOLO2,
        "holo2",
        f"{RS}</think>{REST}",
        RS,
        REST,
        prompt="open",
    ),
    case(
        ("thinking_disabled", "thinking_disabled_stream"),
        HOLO2,
        "holo2",
        REST,
        content=REST,
        prompt="closed",
    ),
    case(both("complete_reasoning", "_stream"), HOLO2, "holo2", f"{RS}</think>", RS, prompt="open"),
]
STRAY_END = (
    "vLLM's identity parser (thinking off) hands a stray </think> on as content; here a "
    "format's marker is never shown as text: one outside its block is dropped "
    "(ReasoningFormat.edges), as vLLM's minimax_m2 drops a second </think>"
)
KNOWN += [
    known(
        case(
            "thinking_disabled_with_close_tag",
            HOLO2,
            "holo2",
            f"</think>{REST}",
            content=f"</think>{REST}",
            prompt="closed",
        ),
        {"content": REST},
        STRAY_END,
    ),
    known(
        case(
            "thinking_disabled_with_close_tag_stream",
            HOLO2,
            "holo2",
            f"some text</think>{REST}",
            content=f"some text</think>{REST}",
            prompt="closed",
        ),
        {"content": f"some text{REST}"},
        STRAY_END,
    ),
]
PROMPT_CASES += [
    PromptCase(
        ("test_parser_selection[True-DeepSeekR1ReasoningParser]",
         "test_holo2_default_parser_is_deepseekr1"),
        HOLO2,
        "holo2",
        "<think>",
        "reasoning",
    ),
    PromptCase(
        ("test_parser_selection[False-IdentityReasoningParser]",),
        HOLO2,
        "holo2",
        "<think></think>",
        "normal",
    ),
]  # fmt: skip
IDS[HOLO2] = [
    "test_parser_selection[True-DeepSeekR1ReasoningParser]",
    "test_parser_selection[False-IdentityReasoningParser]",
    "test_holo2_default_parser_is_deepseekr1",
    "test_holo2_supports_structured_output",
    "with_think", "with_think_stream", "with_think_enabled", "with_think_stream_enabled",
    *_ids("thinking_disabled", "thinking_disabled_with_close_tag", "complete_reasoning",
          streaming="_stream"),
]  # fmt: skip
NOT_APPLICABLE[HOLO2, "test_holo2_supports_structured_output"] = _IS_END

# --- poolside_v1: deepseek_v3 reading only the current assistant turn of the prompt for
# its </think>; the file tests that gate alone (token ids, a fake tokenizer) ---
POOLSIDE = T + "test_poolside_v1_reasoning_parser.py@37283f4149"
PROMPT_CASES += [
    PromptCase(
        ("test_is_reasoning_end_true_when_end_after_assistant",),
        POOLSIDE,
        "poolside_v1",
        "a<assistant><think>b</think>",
        "normal",
    ),
    PromptCase(
        ("test_is_reasoning_end_false_when_start_after_end_in_current_turn",),
        POOLSIDE,
        "poolside_v1",
        "<assistant></think><think>",
        "reasoning",
    ),
]
IDS[POOLSIDE] = [
    "test_registered_name_is_poolside_v1",
    "test_constructor_requires_assistant_token",
    "test_thinking_kwarg_selects_deepseek_r1_inner_parser",
    "test_no_thinking_selects_identity_inner_parser",
    "test_is_reasoning_end_true_when_end_after_assistant",
    "test_is_reasoning_end_false_when_start_after_end_in_current_turn",
    "test_is_reasoning_end_false_when_no_tokens_after_assistant",
    "test_is_reasoning_end_false_on_empty_input",
    "test_scoping_prevents_prior_turn_false_positive",
    "test_is_reasoning_end_with_identity_parser_returns_true",
]
_NO_THINK_MARKER = (
    _IS_END + "; its prompt holds no <think> of the current turn, where vLLM's thinking "
    "parser reads on as reasoning and here the output starts in content (the prompt "
    "decides: a thinking template opens <think>)"
)
NOT_APPLICABLE.update(
    {
        (POOLSIDE, "test_registered_name_is_poolside_v1"): "vLLM's registry class lookup "
        "(no model output); the name is a format here (decoding/reasoning_formats.py)",
        (POOLSIDE, "test_constructor_requires_assistant_token"): "vLLM's constructor "
        "refusing a tokenizer without <assistant> (no model output)",
        (POOLSIDE, "test_thinking_kwarg_selects_deepseek_r1_inner_parser"): "vLLM's inner "
        "parser chosen by chat_template_kwargs (no model output); here the prompt decides",
        (POOLSIDE, "test_no_thinking_selects_identity_inner_parser"): "as "
        "test_thinking_kwarg_selects_deepseek_r1_inner_parser",
        (POOLSIDE, "test_is_reasoning_end_false_when_no_tokens_after_assistant"): (
            _NO_THINK_MARKER
        ),
        (POOLSIDE, "test_is_reasoning_end_false_on_empty_input"): _NO_THINK_MARKER,
        (POOLSIDE, "test_scoping_prevents_prior_turn_false_positive"): _NO_THINK_MARKER,
        (POOLSIDE, "test_is_reasoning_end_with_identity_parser_returns_true"): _IS_END
        + " (thinking off: vLLM's identity parser; here a prompt that opens <think> "
        "thinks whatever the kwargs say)",
    }
)

# --- deepseek_v4: deepseek_v3's, and a DSML tool-call block ends reasoning ---
DSV4 = T + "test_deepseekv4_reasoning_parser.py@3e10d2f243"
_DSV4_CALL = (
    "<｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="read_file">\n'
    '<｜DSML｜parameter name="path" string="true">/tmp/example.lean</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>"
)
CASES += [
    case(  # the reasoning parser alone hands the block on as content
        "test_tool_call_start_implicitly_ends_reasoning",
        DSV4,
        "deepseek_v4",
        f"Let me search.\n\n{_DSV4_CALL}",
        "Let me search.\n\n",
        _DSV4_CALL,
        prompt="open",
    ),
    case(  # and the deepseek_v4 tool parser reads the call in it
        "test_implicit_content_is_parseable_as_tool_call",
        DSV4,
        "deepseek_v4",
        f"Let me search.\n\n{_DSV4_CALL}",
        "Let me search.\n\n",
        prompt="open",
        tool="deepseek_v4",
        calls=(("read_file", {"path": "/tmp/example.lean"}),),
    ),
]
IDS[DSV4] = [
    "test_tool_call_start_implicitly_ends_reasoning",
    "test_implicit_content_is_parseable_as_tool_call",
]

# --- step3p5: <think> opened by the prompt; one newline before and one after </think>
# are no text. vLLM's non-streaming path reads text before a <think> the model writes as
# content (the block was not open), its streaming path as reasoning (the prompt opened
# it): each such case runs with the prompt that gives the reading its id asserts ---
STEP3P5 = T + "test_step3p5_reasoning_parser.py@265c96671c"
S35 = "step3p5"
CASES += [
    case(both("simple_reasoning"), STEP3P5, S35, f"{RS}</think>{REST}", RS, REST),
    case(both("complete_reasoning"), STEP3P5, S35, f"{RS}</think>", RS),
    case(
        ("no_content_token", "no_reasoning_token_streaming"),
        STEP3P5,
        S35,
        "This is a reasoning section",
        RS,
    ),
    case(
        both("multiple_lines"),
        STEP3P5,
        S35,
        "This\nThat</think>This is the rest\nThat",
        "This\nThat",
        "This is the rest\nThat",
    ),
    case(
        ("shortest", "shortest_streaming", "shortest_with_think", "shortest_with_think_streaming"),
        STEP3P5,
        S35,
        f"</think>{REST}",
        content=REST,
    ),
    case(both("reasoning_with_think"), STEP3P5, S35, f"<think>{RS}</think>{REST}", RS, REST),
    case(both("complete_reasoning_with_think"), STEP3P5, S35, f"<think>{RS}</think>", RS),
    case(
        both("multiple_lines_with_think"),
        STEP3P5,
        S35,
        "<think>This\nThat</think>This is the rest\nThat",
        "This\nThat",
        "This is the rest\nThat",
    ),
    case(both("think_no_end"), STEP3P5, S35, f"<think>{RS}", RS),
    case(both("empty"), STEP3P5, S35, ""),
    case(  # non-streaming: the newline before <think> is content
        "new_line", STEP3P5, S35, f"\n<think>{RS}</think>\n{REST}", RS, f"\n{REST}", prompt="none"
    ),
    case(  # streaming: it is reasoning, as the block was open
        "new_line_streaming", STEP3P5, S35, f"\n<think>{RS}\n</think>\n{REST}", f"\n{RS}", REST
    ),
    case(
        "new_line_streaming_complex_content",
        STEP3P5,
        S35,
        "\n This is a \n reasoning section\n\n\n</think>\n\nThis is the rest",
        "\n This is a \n reasoning section\n\n",
        "\nThis is the rest",
    ),
]
_S35_PREFIX = [  # test_step3p5_preserves_prefix_before_think: (output, reasoning, content)
    ("\nIntro<think>reasoning</think>\nAnswer", "reasoning", "\nIntroAnswer"),
    ("<think>calc</think>\nAnswer", "calc", "Answer"),
    ("<think>reasoning\n</think>\nAnswer", "reasoning", "Answer"),
    ("before<think>still thinking", "still thinking", "before"),
    ("before<think>still thinking\n", "still thinking", "before"),
    ("Intro\n<think>reasoning</think>\nAnswer", "reasoning", "Intro\nAnswer"),
    ("Intro<think>reasoning</think>Answer", "reasoning", "IntroAnswer"),
    ("Intro<think>reasoning</think>\n", "reasoning", "Intro"),
    ("<think>reasoning</think>\n\nAnswer", "reasoning", "\nAnswer"),
]


def _s35_prefix_id(output: str, reasoning: str, content: str) -> str:
    return (
        "test_step3p5_preserves_prefix_before_think["
        + "-".join(v.encode("unicode_escape").decode("ascii") for v in (output, reasoning, content))
        + "]"
    )


CASES += [
    case(  # a non-streaming test: the model's own <think> opens the block
        (_s35_prefix_id(o, r, c),)
        + (
            ("test_step3p5_streaming_drops_leading_newline",) if o.startswith("<think>calc") else ()
        ),
        STEP3P5,
        S35,
        o,
        r,
        c,
        prompt="none",
    )
    for o, r, c in _S35_PREFIX
]
IDS[STEP3P5] = [
    *_ids("simple_reasoning", "complete_reasoning"),
    "no_content_token", "no_reasoning_token_streaming",
    *_ids("multiple_lines"), "shortest", "shortest_streaming",
    *_ids("reasoning_with_think", "complete_reasoning_with_think", "multiple_lines_with_think",
          "shortest_with_think", "think_no_end", "empty", "new_line"),
    "new_line_streaming_complex_content", "multi_turn_prompt_content",
    *(_s35_prefix_id(*p) for p in _S35_PREFIX),
    "test_step3p5_streaming_drops_leading_newline",
]  # fmt: skip
NOT_APPLICABLE[STEP3P5, "multi_turn_prompt_content"] = (
    "vLLM's test skips the reasoning / content check for this id and asserts only "
    "is_reasoning_end and extract_content_ids over token ids"
)

# --- hy_v3: <think> opened by the prompt when reasoning_effort thinks; with no_think (the
# template closes it) or no effort given (no marker) the output is content ---
HYV3 = T + "test_hy_v3_reasoning_parser.py@41c5903d04"
CASES += [
    case(both("with_think", "_stream"), HYV3, "hy_v3", f"{RS}</think>{REST}", RS, REST),
    case(both("without_think", "_stream"), HYV3, "hy_v3", REST, content=REST, prompt="closed"),
    case(
        both("with_reasoning_effort_none", "_stream"),
        HYV3,
        "hy_v3",
        REST,
        content=REST,
        prompt="none",
    ),
    case(both("complete_reasoning", "_stream"), HYV3, "hy_v3", f"{RS}</think>", RS),
    case(
        both("multiline_reasoning", "_stream"),
        HYV3,
        "hy_v3",
        "This is a reasoning\nsection</think>This is the rest\nThat",
        "This is a reasoning\nsection",
        "This is the rest\nThat",
    ),
    case(both("only_open_tag", "_stream"), HYV3, "hy_v3", RS, RS),
]
_HY_HEAD = (
    "<｜hy_begin▁of▁sentence｜>\nYou are a helpful assistant.\n"
    "<｜reasoning_mode｜>reasoning_effort:high<｜hy_User｜>\n"
    "What is the capital of France?<｜hy_Assistant｜"
)
_HY_TURN = "\n><think></think>The capital of France is Paris.<eos:6124c78e>\n<｜hy_User｜>What about Chile?<｜hy_Assistant｜>\n<think>"  # noqa: E501
PROMPT_CASES += [
    PromptCase((f"test_is_reasoning_end_full_prompt[{n}]",), HYV3, "hy_v3", prompt, state)
    for n, prompt, state in (
        (
            "still_reasoning",
            _HY_HEAD + ">\n<think>The user is asking for the capital of",
            "reasoning",
        ),
        (
            "done_reasoning",
            _HY_HEAD + ">\n<think>The user is asking for the capital of France.</think>\n"
            "The capital of France is Paris.",
            "normal",
        ),
        (
            "multi_turn_still_reasoning",
            _HY_HEAD + _HY_TURN + "The user is asking for the capital of",
            "reasoning",
        ),
        (
            "multi_turn_done_reasoning",
            _HY_HEAD + _HY_TURN + "The user is asking for the capital of Chile.</think>\n"
            "The capital of Chile is Santiago.",
            "normal",
        ),
    )
]
IDS[HYV3] = [
    *_ids("with_think", "without_think", "with_reasoning_effort_none", "complete_reasoning",
          "multiline_reasoning", "only_open_tag", streaming="_stream"),
    *(f"test_is_reasoning_end_full_prompt[{n}]" for n in (
        "still_reasoning", "done_reasoning", "multi_turn_still_reasoning",
        "multi_turn_done_reasoning")),
    "test_constructor_does_not_mutate_shared_chat_template_kwargs",
    "test_constructor_falls_back_to_outer_reasoning_effort",
]  # fmt: skip
NOT_APPLICABLE.update(
    {
        (HYV3, "test_constructor_does_not_mutate_shared_chat_template_kwargs"): "vLLM's "
        "constructor and its chat_template_kwargs (no model output); here the prompt decides",
        (HYV3, "test_constructor_falls_back_to_outer_reasoning_effort"): "as "
        "test_constructor_does_not_mutate_shared_chat_template_kwargs",
    }
)

# --- kimi_k3: XTML `think` / `response` channels; the think channel opened by the prompt
# when thinking; the response channel's markers and the end-of-turn marker are no content
# (vLLM's DelegatingParser, vllm/parser/kimi_k3.py, unwraps them) ---
K3 = T + "test_kimi_k3_reasoning_parser.py@0ad0a4635e"
K3_THINK, K3_THINK_END = "<|open|>think<|sep|>", "<|close|>think<|sep|>"
K3_RESPONSE = "<|open|>response<|sep|>"
CASES += [
    # the model's own think channel after a prompt with none open
    case(
        (
            "test_extract_reasoning_with_xtml_tags",
            "test_delegating_parser_strips_response_wrapper_without_tool_parser",
            "test_streaming_split_open_marker_is_held_back",
            "test_streaming_split_close_marker_hands_content_downstream",
        ),
        K3,
        "kimi_k3",
        f"{K3_THINK}step{K3_THINK_END}{K3_RESPONSE}answer",
        "step",
        "answer",
        prompt="none",
    ),
    case(
        "test_extract_reasoning_with_generation_prefix_consumed",
        K3,
        "kimi_k3",
        f"step{K3_THINK_END}{K3_RESPONSE}answer",
        "step",
        "answer",
    ),
    case(
        (
            "test_extract_reasoning_truncated_before_close_marker",
            "test_streaming_truncated_before_close_marker",
        ),
        K3,
        "kimi_k3",
        "unfinished reasoning",
        "unfinished reasoning",
    ),
    case(
        "test_extract_markerless_output_with_thinking_disabled",
        K3,
        "kimi_k3",
        "answer",
        content="answer",
        prompt="closed",
    ),
    case(
        "test_delegating_parser_thinking_false_streams_response_content",
        K3,
        "kimi_k3",
        "OK<|close|>response<|sep|>",
        content="OK",
        prompt="closed",
    ),
]
KNOWN += [
    known(
        case(
            "test_thinking_disabled_streams_content",
            K3,
            "kimi_k3",
            f"{K3_RESPONSE}answer",
            content=f"{K3_RESPONSE}answer",
            prompt="closed",
        ),
        {"content": "answer"},
        "vLLM's reasoning parser alone hands the response channel's marker on as content "
        "for its DelegatingParser to strip (test_delegating_parser_strips_response_wrapper_"
        "without_tool_parser); this backend has one pipeline, and its content is what vLLM "
        "serves: the marker left out",
    ),
]
PROMPT_CASES += [
    # a prior turn's closed think channel, then the current turn's open one
    PromptCase(
        ("test_is_reasoning_end_ignores_stale_close_from_prior_turn",),
        K3,
        "kimi_k3",
        f"{K3_THINK}a{K3_THINK_END}{K3_RESPONSE}b<|close|>response<|sep|>{K3_THINK}",
        "reasoning",
    ),
    PromptCase(
        ("test_is_reasoning_end_uses_full_input_ids",),
        K3,
        "kimi_k3",
        f"{K3_THINK}step{K3_THINK_END}",
        "normal",
    ),
]
IDS[K3] = [
    "test_parser_manager_selects_kimi_k3_parser_for_reasoning_only",
    "test_parser_selection_thinking_disabled",
    "test_extract_reasoning_with_xtml_tags",
    "test_extract_reasoning_with_generation_prefix_consumed",
    "test_extract_reasoning_truncated_before_close_marker",
    "test_extract_markerless_output_with_thinking_disabled",
    "test_delegating_parser_strips_response_wrapper_without_tool_parser",
    "test_is_reasoning_end_uses_full_input_ids",
    "test_is_reasoning_end_ignores_stale_close_from_prior_turn",
    "test_streaming_split_open_marker_is_held_back",
    "test_streaming_split_close_marker_hands_content_downstream",
    "test_streaming_truncated_before_close_marker",
    "test_thinking_disabled_streams_content",
    "test_delegating_parser_thinking_false_streams_response_content",
    "test_adjust_request_keeps_xtml_markers_contiguous",
]
NOT_APPLICABLE.update(
    {
        (K3, "test_parser_manager_selects_kimi_k3_parser_for_reasoning_only"): "vLLM's "
        "ParserManager class selection (no model output)",
        (K3, "test_parser_selection_thinking_disabled"): "vLLM's constructor reading "
        "chat_template_kwargs (no model output); here the prompt decides",
        (K3, "test_adjust_request_keeps_xtml_markers_contiguous"): "vLLM's "
        "skip_special_tokens / spaces_between_special_tokens request flags: here markers "
        "are matched on the decoded text, special tokens included and never spaced",
    }
)

# --- minimax_m3: <mm:think> blocks; thinking_mode "enabled" opens the block in the prompt
# (prompt "open" here); a leading </mm:think> is dropped ---
MM3 = T + "test_minimax_m3_reasoning_parser.py@0429c5c02c"
MM3_RC = "<mm:think>Reasoning content</mm:think>"
CASES += [
    case(
        (
            "test_nonstreaming_extracts_explicit_reasoning_block",
            "test_streaming_reasoning_tags_are_not_returned",
            "test_streaming_boundary_can_emit_reasoning_and_content",
        ),
        MM3,
        "minimax_m3",
        "<mm:think>plan</mm:think>answer",
        "plan",
        "answer",
    ),
    case(
        (
            "test_nonstreaming_without_start_tag_is_content",
            "test_streaming_plain_content_ends_reasoning_phase",
        ),
        MM3,
        "minimax_m3",
        "plain answer",
        content="plain answer",
    ),
    case(
        ("test_nonstreaming_drops_leading_end_tag", "test_streaming_drops_leading_end_tag"),
        MM3,
        "minimax_m3",
        "</mm:think>answer",
        content="answer",
    ),
    case(
        "test_streaming_split_leading_end_marker_text_across_deltas",
        MM3,
        "minimax_m3",
        "</mm:think>content",
        content="content",
    ),
    case(
        (
            "test_nonstreaming_enabled_mode_starts_in_reasoning",
            "test_streaming_enabled_mode_starts_in_reasoning",
        ),
        MM3,
        "minimax_m3",
        "plan</mm:think>answer",
        "plan",
        "answer",
        prompt="open",
    ),
    case(
        "test_streaming_split_marker_tokens_enabled_mode",
        MM3,
        "minimax_m3",
        "Reasoning content</mm:think>content",
        "Reasoning content",
        "content",
        prompt="open",
    ),
    case(
        "test_nonstreaming_open_reasoning_block",
        MM3,
        "minimax_m3",
        "<mm:think>still thinking",
        "still thinking",
    ),
    case(
        (
            "test_streaming_split_marker_tokens_are_not_returned",
            "test_streaming_split_marker_text_across_deltas",
            "test_streaming_split_end_marker_content_ids_are_stripped",
        ),
        MM3,
        "minimax_m3",
        MM3_RC + "content",
        "Reasoning content",
        "content",
    ),
    case(
        "test_streaming_split_marker_text_drives_end_state",
        MM3,
        "minimax_m3",
        MM3_RC,
        "Reasoning content",
    ),
    # the token-id helpers' outputs: what is reasoning and what content
    case(
        ("test_token_id_helpers", "test_token_id_helpers_with_split_marker_tokens"),
        MM3,
        "minimax_m3",
        "<mm:think>abc</mm:think>def",
        "abc",
        "def",
    ),
    case(
        "test_token_id_helpers_enabled_mode",
        MM3,
        "minimax_m3",
        "abc</mm:think>def",
        "abc",
        "def",
        prompt="open",
    ),
]
KNOWN += [
    known(
        case(
            (
                "test_nonstreaming_non_leading_end_tag_is_content",
                "test_streaming_non_leading_end_tag_is_content",
            ),
            MM3,
            "minimax_m3",
            "XXX</mm:think>YYY",
            content="XXX</mm:think>YYY",
        ),
        {"content": "XXXYYY"},
        "an end marker with no block open is dropped wherever it stands (a stray </think> "
        "with thinking off, as for the other names); vLLM's minimax_m3 drops it only at "
        "the output's start and keeps a later one as content",
    )
]
IDS[MM3] = [
    "test_parser_registration",
    "test_nonstreaming_extracts_explicit_reasoning_block",
    "test_nonstreaming_without_start_tag_is_content",
    "test_nonstreaming_drops_leading_end_tag",
    "test_nonstreaming_non_leading_end_tag_is_content",
    "test_nonstreaming_enabled_mode_starts_in_reasoning",
    "test_nonstreaming_open_reasoning_block",
    "test_streaming_reasoning_tags_are_not_returned",
    "test_streaming_boundary_can_emit_reasoning_and_content",
    "test_streaming_drops_leading_end_tag",
    "test_streaming_non_leading_end_tag_is_content",
    "test_streaming_enabled_mode_starts_in_reasoning",
    "test_streaming_plain_content_ends_reasoning_phase",
    "test_streaming_split_marker_tokens_are_not_returned",
    "test_streaming_split_marker_text_drives_end_state",
    "test_streaming_split_end_marker_content_ids_are_stripped",
    "test_streaming_split_marker_tokens_enabled_mode",
    "test_streaming_split_marker_text_across_deltas",
    "test_streaming_split_leading_end_marker_text_across_deltas",
    "test_token_id_helpers_with_split_marker_tokens",
    "test_token_id_helpers",
    "test_token_id_helpers_enabled_mode",
    "test_is_reasoning_end_ignores_paired_prompt_examples_with_thinking_enabled",
]
NOT_APPLICABLE.update(
    {
        (MM3, "test_parser_registration"): "vLLM's ReasoningParserManager class lookup "
        "(no model output)",
        (MM3, "test_is_reasoning_end_ignores_paired_prompt_examples_with_thinking_enabled"): (
            "vLLM's thinking_mode chat_template_kwarg over a prompt with no open block; "
            "here the prompt decides, and a thinking template ends it with <mm:think>"
        ),
    }
)

# --- cohere_command3 / cohere_command4: <|START_THINKING|> blocks (leading whitespace
# dropped), the answer in <|START_RESPONSE|> blocks whose markers are no content, `<co>` ...
# `</co: ...>` citation tags dropped. vLLM's reasoning parser alone hands an action block on
# as content (test_nonstreaming); its streaming one also emits the block's calls, the tool
# parser's job here (the case with tool=) ---
COHERE = T + "test_cohere_command_reasoning_parser.py@15c2a7b7e2"
_CO_ACTION = (
    "<|START_ACTION|>\n[\n"
    '    {"tool_call_id": "0", "tool_name": "foo", "parameters": {"query": "query1"}}\n]\n'
    "<|END_ACTION|>"
)
_CO_CITE = (
    "<|START_THINKING|>This is a rainbow <co>emoji: 🌈</co: 0:[1]><|END_THINKING|>\n"
    "<|START_RESPONSE|>foo <co>bar</co: 0:[1,2],1:[3,4]><|END_RESPONSE|>"
)
for _v in ("cmd3", "cmd4"):
    _name = {"cmd3": "cohere_command3", "cmd4": "cohere_command4"}[_v]
    _one = "<|START_THINKING|> i will call foo with query1<|END_THINKING|>" + _CO_ACTION
    CASES += [
        case(
            f"TestExtractReasoning.test_nonstreaming[{_v}-single_tool_call]",
            COHERE,
            _name,
            _one,
            "i will call foo with query1",
            _CO_ACTION,
        ),
        case(
            f"TestExtractReasoning.test_streaming[{_v}-single_tool_call]",
            COHERE,
            _name,
            _one,
            "i will call foo with query1",
            tool=_name,
            calls=(("foo", {"query": "query1"}),),
        ),
        case(
            (
                f"TestExtractReasoning.test_nonstreaming[{_v}-citations_with_emoji]",
                f"TestExtractReasoning.test_streaming[{_v}-citations_with_emoji]",
            ),
            COHERE,
            _name,
            _CO_CITE,
            "This is a rainbow emoji: 🌈",
            "foo bar",
        ),
    ]
_CO_ADJUST = (
    "vLLM's adjust_request folding response_format / structured_outputs / tools into a "
    "Cohere structural tag for its guided decoding (no model output); here the request's "
    "grammar fields are LocalAI's"
)
IDS[COHERE] = [
    *(
        f"TestExtractReasoning.{t}[{v}-{kind}]"
        for kind in ("single_tool_call", "citations_with_emoji")
        for v in ("cmd3", "cmd4")
        for t in ("test_nonstreaming", "test_streaming")
    ),
    "TestIsReasoningEnd.test_is_reasoning_end[cmd3]",
    "TestIsReasoningEnd.test_is_reasoning_end[cmd4]",
    "TestAdjustRequestPassthrough.test_structured_outputs_structural_tag_not_modified",
    "TestAdjustRequestPassthrough.test_response_format_structural_tag_short_circuit",
    "TestAdjustRequestNoOp.test_no_schema_no_tools",
    "TestAdjustRequestNoOp.test_no_model_config",
    "TestAdjustRequestUnsupportedArchitecture.test_json_schema_raises",
    *(
        f"TestAdjustRequestFoldFromResponseFormat.test_response_format_cleared[{p}]"
        for p in ("json_schema_pydantic", "json_schema_dict", "json_object")
    ),
    *(
        f"TestHasEffectiveTools.test_has_effective_tools[{p}]"
        for p in ("none", "empty_list", "blank_str", "non_empty_list", "non_empty_str")
    ),
    "TestHasEffectiveTools.test_convert_schema_json_only_with_empty_tools_list",
    *(
        f"TestAdjustRequestFoldFromStructuredOutputs.test_structured_outputs_folded[{p}]"
        for p in (
            "json_dict",
            "json_string",
            "json_object_flag",
            "structured_outputs_dataclass",
            "openai_wrapper_dict_unwrapped",
        )
    ),
    "TestAdjustRequestFoldFromStructuredOutputs.test_responses_request_default_empty_tools",
    "TestAdjustRequestFoldFromStructuredOutputs.test_json_userdict_mapping_unwrapped",
    *(
        f"TestAdjustRequestFoldFromStructuredOutputs.test_structured_outputs_json_string_raises[{p}]"
        for p in ("invalid_json_string", "non_object_json_string", "empty_json_string")
    ),
    *(
        f"TestAdjustRequestFoldFromStructuredOutputs.test_json_wrong_type_raises[{p}]"
        for p in ("chat_completion_request", "structured_outputs_params")
    ),
    "TestAdjustRequestPrecedence.test_response_format_over_structured_outputs_json",
    "TestAdjustRequestTextPlusStructuredOutputs.test_text_response_format_preserved",
    "TestAdjustRequestTools.test_tools_only_command_a_grammar",
    "TestAdjustRequestTools.test_tools_plus_json_schema_both_kinds",
    "TestMelodySourceResolution.test_multi_index_source_fans_out",
    "TestMelodySourceResolution.test_unresolvable_position_skipped",
    "TestMelodySourceResolution.test_missing_position_map_drops_all_sources",
    "TestMelodySourceResolution.test_citations_pass_through_is_thinking_tag",
]
NOT_APPLICABLE.update(
    {
        (COHERE, i): (
            _IS_END
            if i.startswith("TestIsReasoningEnd")
            else "vLLM's Cohere serving layer's citation sources (numeric positions resolved "
            "to documents); here citation tags are dropped and no sources are returned"
            if i.startswith("TestMelody")
            else _CO_ADJUST
        )
        for i in IDS[COHERE]
        if not i.startswith("TestExtractReasoning")
    }
)

# --- cohere_command3 / cohere_command4 through vLLM's unified Cohere parser
# (tests/parser/cohere/): the same outputs; Command 4 frames its answer in <|START_TEXT|> ---
COHERE_UNIFIED = T.replace("reasoning", "parser/cohere") + "test_reasoning.py@a3e23fa059"
COHERE_CITATIONS = T.replace("reasoning", "parser/cohere") + "test_citations.py@756794a9a7"
for _v in ("cmd3", "cmd4"):
    _name = {"cmd3": "cohere_command3", "cmd4": "cohere_command4"}[_v]
    CASES.append(
        case(
            (
                f"TestExtractReasoning.test_nonstreaming[{_v}-citations_with_emoji]",
                f"TestExtractReasoning.test_streaming[{_v}-citations_with_emoji]",
            ),
            COHERE_UNIFIED,
            _name,
            _CO_CITE,
            "This is a rainbow emoji: 🌈",
            "foo bar",
        )
    )
    KNOWN.append(
        known(
            case(
                (
                    f"TestExtractReasoning.test_nonstreaming[{_v}-single_tool_call]",
                    f"TestExtractReasoning.test_streaming[{_v}-single_tool_call]",
                ),
                COHERE_UNIFIED,
                _name,
                "<|START_THINKING|> i will call foo with query1<|END_THINKING|>" + _CO_ACTION,
                "i will call foo with query1",
            ),
            {"content": _CO_ACTION},
            "with the reasoning parser alone the action block is content as written, as "
            "vLLM's own tests/reasoning/test_cohere_command_reasoning_parser.py expects; "
            "vLLM's unified parser drops it when the request declares no tools (with "
            "tool_parser set, or this tool-parser name alone, it is the calls here)",
        )
    )
for _v, _name, _tags in (
    ("cmd4", "cohere_command4", ("<|START_TEXT|>", "<|END_TEXT|>")),
    ("cmd3", "cohere_command3", ("<|START_RESPONSE|>", "<|END_RESPONSE|>")),
):
    CASES.append(
        case(
            tuple(
                f"TestFramingTokensStripped.test_content_framing_tokens_stripped[{w}-{c}-{_v}]"
                for w in ("no_tools", "tools")
                for c in ("per_token", "batched")
            ),
            COHERE_UNIFIED,
            _name,
            "<|START_THINKING|>Think deeply. The user greets us.<|END_THINKING|>"
            f"{_tags[0]}I'm doing well, thank you{_tags[1]}",
            "Think deeply. The user greets us.",
            "I'm doing well, thank you",
        )
    )
IDS[COHERE_UNIFIED] = [
    *(
        f"TestExtractReasoning.{t}[{v}-{kind}]"
        for kind in ("single_tool_call", "citations_with_emoji")
        for v in ("cmd3", "cmd4")
        for t in ("test_nonstreaming", "test_streaming")
    ),
    *(
        f"TestFramingTokensStripped.test_content_framing_tokens_stripped[{w}-{c}-{v}]"
        for w in ("no_tools", "tools")
        for c in ("per_token", "batched")
        for v in ("cmd4", "cmd3")
    ),
    "TestIsReasoningEnd.test_is_reasoning_end[cmd3]",
    "TestIsReasoningEnd.test_is_reasoning_end[cmd4]",
    "test_count_reasoning_tokens[cohere_command3]",
    "test_count_reasoning_tokens[cohere_command4]",
    "TestParserSelection.test_adjust_request_keeps_framing_tokens[True]",
    "TestParserSelection.test_adjust_request_keeps_framing_tokens[False]",
    "TestParserSelection.test_non_cohere_selection_does_not_import_melody_parser",
]
NOT_APPLICABLE.update(
    {
        (COHERE_UNIFIED, "TestIsReasoningEnd.test_is_reasoning_end[cmd3]"): _IS_END,
        (COHERE_UNIFIED, "TestIsReasoningEnd.test_is_reasoning_end[cmd4]"): _IS_END,
        **{
            (COHERE_UNIFIED, f"test_count_reasoning_tokens[{n}]"): "vLLM's "
            "count_reasoning_tokens over token ids (usage.reasoning_tokens); the reasoning "
            "text is in the cases"
            for n in ("cohere_command3", "cohere_command4")
        },
        **{
            (
                COHERE_UNIFIED,
                f"TestParserSelection.test_adjust_request_keeps_framing_tokens[{b}]",
            ): (
                "vLLM's skip_special_tokens request flag: here markers are matched on the "
                "decoded text, special tokens included"
            )
            for b in ("True", "False")
        },
        (
            COHERE_UNIFIED,
            "TestParserSelection.test_non_cohere_selection_does_not_import_melody_parser",
        ): "vLLM's optional import of its Cohere package (no model output)",
    }
)
# vLLM's Cohere serving layer also streams the citation (offsets 15-20, its source resolved
# from the request's documents): LocalAI's proto has no citations, so the tags are dropped
# and the reasoning and content are what this case checks (docs/LOCALAI.md)
CASES.append(
    case(
        "TestParserStreamingEndToEnd.test_full_wire_stream_shape",
        COHERE_CITATIONS,
        "cohere_command3",
        "<|START_THINKING|>Let me check.<|END_THINKING|>"
        "<|START_RESPONSE|>The capital is <co>Paris</co: 0:[1]>.<|END_RESPONSE|>",
        "Let me check.",
        "The capital is Paris.",
    )
)
IDS[COHERE_CITATIONS] = [
    "TestMelodySourceResolution.test_multi_index_source_fans_out",
    "TestMelodySourceResolution.test_unresolvable_position_skipped",
    "TestMelodySourceResolution.test_missing_position_map_drops_all_sources",
    "TestMelodySourceResolution.test_citations_pass_through_is_thinking_tag",
    "TestParserStreamingEndToEnd.test_full_wire_stream_shape",
]
NOT_APPLICABLE.update(
    {
        (COHERE_CITATIONS, i): "vLLM's Cohere serving layer's citation sources (numeric "
        "positions resolved to documents; no model output)"
        for i in IDS[COHERE_CITATIONS][:4]
    }
)

# --- solar_open2: <|think:start|> opened by the template (closed at once for low / none
# effort): the prompt decides where the output starts; a <|tool_call:start|> inside the block
# ends the reasoning and stays as content for the tool parser, as vLLM's stream does ---
SOLAR = T + "test_solar_open2_reasoning_parser.py@c7dcf180c3"
SO = "solar_open2"
SO_END = "<|think:end|>"
SO_TB = (
    "<|tool_call:start|>get_weather\n"
    "<|tool_arg:start|>city<|tool_arg:value|>Seoul<|tool_arg:end|>\n<|tool_call:end|>"
)
SO_TB2 = (
    "<|tool_call:start|>get_time\n"
    "<|tool_arg:start|>tz<|tool_arg:value|>KST<|tool_arg:end|>\n<|tool_call:end|>"
)
SO_ARG = "<|tool_arg:start|>city<|tool_arg:value|>Seoul<|tool_arg:end|>\n"
SO_F = "<|tool_call:start|>f\n<|tool_call:end|>"
_SO_CHUNKS = ("1", "2", "3", "5", "7", "100")


def _so_esc(text: str) -> str:
    """A string parameter as pytest writes it into a test id."""
    return text.encode("unicode_escape").decode("ascii")


_SO_PARITY = {
    "I need to analyze<|think:end|>The answer is 42": ("I need to analyze", "The answer is 42"),
    "My reasoning<|think:end|>": ("My reasoning", ""),
    "<|think:end|>Direct answer": ("", "Direct answer"),
    "Step 1: analyze\nStep 2: solve\n<|think:end|>Final answer": (
        "Step 1: analyze\nStep 2: solve\n",
        "Final answer",
    ),
    "Still thinking...": ("Still thinking...", ""),
    f"checking weather\n{SO_TB}": ("checking weather\n", SO_TB),
    f"plan<|think:end|>text {SO_F}": ("plan", f"text {SO_F}"),
}
_SO_PARITY_IDS = {
    out: [
        f"TestExtractReasoningStreaming.test_streaming_parity_with_non_stream[{_so_esc(out)}-{n}]"
        for n in ("1", "1000")
    ]
    for out in _SO_PARITY
}
_SO_EXTRA_IDS = {  # the other ids of an output the parity test also runs
    "I need to analyze<|think:end|>The answer is 42": [
        "TestExtractReasoning.test_standard_reasoning_and_content",
        *(
            f"TestExtractReasoningStreaming.test_standard_reasoning_and_content[{n}]"
            for n in _SO_CHUNKS
        ),
    ],
    "My reasoning<|think:end|>": [
        "TestExtractReasoning.test_reasoning_with_empty_content",
        "TestExtractReasoningStreaming.test_reasoning_with_empty_content",
    ],
    "<|think:end|>Direct answer": [
        "TestExtractReasoning.test_empty_reasoning",
        "TestExtractReasoningStreaming.test_empty_reasoning",
    ],
    "Step 1: analyze\nStep 2: solve\n<|think:end|>Final answer": [
        "TestExtractReasoning.test_multiline_reasoning",
        "TestExtractReasoningStreaming.test_multiline_reasoning",
    ],
    "Still thinking...": ["TestExtractReasoning.test_reasoning_only_no_end_tag"],
    f"checking weather\n{SO_TB}": [
        "TestEmbeddedToolCallPromotion.test_truncated_mid_think_regression"
    ],
    f"plan<|think:end|>text {SO_F}": [
        "TestExtractReasoningStreaming.test_think_end_before_tool_call_keeps_normal_transition"
    ],
}
CASES += [
    case((*_SO_EXTRA_IDS[out], *_SO_PARITY_IDS[out]), SOLAR, SO, out, r, c)
    for out, (r, c) in _SO_PARITY.items()
]
# reasoning_effort (the request's, chat_template_kwargs', the server's default) decides
# whether the template leaves <|think:start|> open: here that is the prompt the case runs with
CASES += [
    *(
        case(
            i,
            SOLAR,
            SO,
            "Hello, world!",
            content="Hello, world!",
            prompt="closed",
        )
        for i in (
            "TestExtractReasoning.test_pure_content_no_tags[none]",
            "TestExtractReasoning.test_pure_content_no_tags[low]",
            "TestExtractReasoning.test_pure_content_no_tags_via_template_kwargs",
        )
    ),
    case(
        (
            "TestExtractReasoning.test_server_default_effort_used_when_request_unset",
            "TestExtractReasoning.test_unknown_effort_treated_as_closed",
            "TestExtractReasoning.test_responses_effort_wins_over_template_kwargs",
        ),
        SOLAR,
        SO,
        "Direct answer",
        content="Direct answer",
        prompt="closed",
    ),
    case(
        (
            "TestExtractReasoning.test_top_level_effort_wins_over_template_kwargs",
            "TestExtractReasoning.test_responses_effort_wins_over_template_kwargs",
        ),
        SOLAR,
        SO,
        "truncated think",
        "truncated think",
        prompt="open",
    ),
    case(
        "TestEmbeddedToolCallPromotion.test_truncated_mid_think_without_tool_block",
        SOLAR,
        SO,
        "checking weather in Se",
        "checking weather in Se",
    ),
    case(
        "TestExtractReasoningStreaming.test_sentinel_split_across_chunks",
        SOLAR,
        SO,
        "reasoning body <|think:end|>after",
        "reasoning body ",
        "after",
    ),
    case(
        tuple(
            f"TestExtractReasoningStreaming.test_embedded_tool_call_implicit_reasoning_end[{n}]"
            for n in ("1", "3", "7", "100")
        ),
        SOLAR,
        SO,
        f"need the weather\n{SO_TB}",
        "need the weather\n",
        SO_TB,
    ),
    case(
        "TestExtractReasoningStreaming.test_tool_sentinel_split_across_chunks",
        SOLAR,
        SO,
        f"thinking {SO_F}",
        "thinking ",
        SO_F,
    ),
    *(
        case(
            "TestExtractReasoningStreaming.test_stream_state_reset_between_streams",
            SOLAR,
            SO,
            f"{r}<|think:end|>{c}",
            r,
            c,
        )
        for r, c in (("A", "alpha"), ("B", "beta"))
    ),
    # vLLM's two paths agree: a call the block holds with its end ends the reasoning
    case(
        "TestEmbeddedToolCallPatternAgreement.test_unstructured_call_body_is_promoted",
        SOLAR,
        SO,
        "hmm\n<|tool_call:start|>refresh\nnote<|tool_call:end|><|think:end|>",
        "hmm\n",
        "<|tool_call:start|>refresh\nnote<|tool_call:end|>",
    ),
    case(
        "TestEmbeddedToolCallPatternAgreement.test_literal_call_prefix_in_a_value_is_promoted",
        SOLAR,
        SO,
        "quoting markup\n<|tool_call:start|>search\n<|tool_arg:start|>q<|tool_arg:value|>"
        "what does <|tool_call: mean<|tool_arg:end|>\n<|tool_call:end|><|think:end|>",
        "quoting markup\n",
        "<|tool_call:start|>search\n<|tool_arg:start|>q<|tool_arg:value|>"
        "what does <|tool_call: mean<|tool_arg:end|>\n<|tool_call:end|>",
    ),
    # vLLM's non-streaming path keeps the trailing "<" its stream holds back (its test pins
    # that the two paths differ); here Predict and the stream both give the whole text
    case(
        "TestExtractReasoningStreaming.test_trailing_partial_sentinel_held_back_at_end_of_stream",
        SOLAR,
        SO,
        "thinking <",
        "thinking <",
    ),
]
SO_PROMOTE = (
    "vLLM's non-streaming path moves complete calls out of the think block to after the "
    "content; its stream (its own test_embedded_tool_call_ordering_diverges_from_non_stream) "
    "ends the reasoning at the first <|tool_call:start|> and hands the rest on as content. "
    "Here Predict is the joined stream, so both give the stream's split, with the stray "
    "<|think:end|> after it dropped (a format's marker is never shown as text): the calls "
    "stay in the order written, and the tool parser reads them"
)
KNOWN += [
    known(case(i, SOLAR, SO, out, r, c), ours, SO_PROMOTE)
    for i, out, r, c, ours in (
        (
            "TestExtractReasoningStreaming.test_embedded_tool_call_ordering_diverges_from_non_stream",
            f"thinking\n{SO_TB}\n{SO_END}The answer is 42",
            "thinking\n\n",
            f"The answer is 42\n{SO_TB}",
            {"reasoning": "thinking\n", "content": f"{SO_TB}\nThe answer is 42"},
        ),
        (
            "TestEmbeddedToolCallPromotion.test_embedded_tool_call_promoted_to_content",
            f"I should check the weather.\n{SO_TB}\n{SO_END}",
            "I should check the weather.\n\n",
            SO_TB,
            {"reasoning": "I should check the weather.\n", "content": f"{SO_TB}\n"},
        ),
        (
            "TestEmbeddedToolCallPromotion.test_promoted_block_appended_after_existing_content",
            f"thinking\n{SO_TB}\n{SO_END}The answer is 42",
            "thinking\n\n",
            f"The answer is 42\n{SO_TB}",
            {"reasoning": "thinking\n", "content": f"{SO_TB}\nThe answer is 42"},
        ),
        (
            "TestEmbeddedToolCallPromotion.test_embedded_plus_tool_call_after_think_end",
            f"plan calls\n{SO_TB}\n{SO_END}{SO_TB2}",
            "plan calls\n\n",
            f"{SO_TB2}\n{SO_TB}",
            {"reasoning": "plan calls\n", "content": f"{SO_TB}\n{SO_TB2}"},
        ),
        (
            "TestEmbeddedToolCallPromotion.test_multiple_embedded_blocks",
            f"first\n{SO_TB}\nthen\n{SO_TB2}\n{SO_END}",
            "first\n\nthen\n\n",
            f"{SO_TB}\n{SO_TB2}",
            {"reasoning": "first\n", "content": f"{SO_TB}\nthen\n{SO_TB2}\n"},
        ),
        (
            "TestEmbeddedToolCallPromotion.test_block_without_args_promoted",
            f"no args needed\n{SO_F.replace('f', 'refresh')}\n{SO_END}done",
            "no args needed\n\n",
            f"done\n{SO_F.replace('f', 'refresh')}",
            {"reasoning": "no args needed\n", "content": f"{SO_F.replace('f', 'refresh')}\ndone"},
        ),
        (
            "TestEmbeddedToolCallPromotion.test_whitespace_only_remainder_leaves_no_reasoning",
            f"\n{SO_TB}\n{SO_END}done",
            "",
            f"done\n{SO_TB}",
            {"reasoning": "\n", "content": f"{SO_TB}\ndone"},
        ),
        (
            "TestEmbeddedToolCallPromotion.test_mere_sentinel_mention_not_promoted",
            f"Should I emit <|tool_call:start|> here? No.\n{SO_END}Answer",
            "Should I emit <|tool_call:start|> here? No.\n",
            "Answer",
            {"reasoning": "Should I emit ", "content": "<|tool_call:start|> here? No.\nAnswer"},
        ),
        (
            "TestEmbeddedToolCallPromotion.test_abandoned_call_not_promoted",
            f"let me call\n<|tool_call:start|>foo\n{SO_ARG[:-16]}1\n{SO_END}after",
            f"let me call\n<|tool_call:start|>foo\n{SO_ARG[:-16]}1\n",
            "after",
            {
                "reasoning": "let me call\n",
                "content": f"<|tool_call:start|>foo\n{SO_ARG[:-16]}1\nafter",
            },
        ),
        (
            "TestEmbeddedToolCallPatternAgreement.test_unterminated_call_stays_in_reasoning",
            f"planning\n<|tool_call:start|>write_file\n{SO_ARG * 8}{SO_END}",
            f"planning\n<|tool_call:start|>write_file\n{SO_ARG * 8}",
            "",
            {
                "reasoning": "planning\n",
                "content": f"<|tool_call:start|>write_file\n{SO_ARG * 8}",
            },
        ),
        (
            "TestEmbeddedToolCallPatternAgreement."
            "test_call_missing_its_end_before_the_next_call_is_not_promoted",
            f"<|tool_call:start|>first\n{SO_ARG}<|tool_call:start|>second\n{SO_ARG}"
            f"<|tool_call:end|>{SO_END}",
            f"<|tool_call:start|>first\n{SO_ARG}",
            f"<|tool_call:start|>second\n{SO_ARG}<|tool_call:end|>",
            {
                "reasoning": "",
                "content": f"<|tool_call:start|>first\n{SO_ARG}<|tool_call:start|>second\n"
                f"{SO_ARG}<|tool_call:end|>",
            },
        ),
    )
]
MARKERS[SO] = (
    "<|think:start|>",
    "<|think:end|>",
    SOLAR,
    "TestDelimiterProperties.test_delimiter_strings",
)
_SO_PRIOR = (
    "<|im:start|>user<|im:content|>q1<|im:end|>\n<|im:start|>assistant<|im:content|>"
    "<|think:start|><|think:end|>a1<|im:end|>\n<|im:start|>user<|im:content|>q2<|im:end|>\n"
    "<|im:start|>assistant<|im:content|>"
)
PROMPT_CASES += [
    PromptCase(
        ("TestIsReasoningEnd.test_multi_turn_prompt_high_effort_not_ended",),
        SOLAR,
        SO,
        _SO_PRIOR + "<|think:start|>",
        "reasoning",
    ),
    PromptCase(
        ("TestIsReasoningEnd.test_multi_turn_prompt_low_effort_ended",),
        SOLAR,
        SO,
        _SO_PRIOR + "<|think:start|><|think:end|>",
        "normal",
    ),
    PromptCase(
        ("TestIsReasoningEnd.test_single_turn_prompt_high_effort_not_ended",),
        SOLAR,
        SO,
        "<|im:start|>user<|im:content|>q1<|im:end|>\n"
        "<|im:start|>assistant<|im:content|><|think:start|>",
        "reasoning",
    ),
    PromptCase(
        ("TestIsReasoningEnd.test_literal_start_tag_in_prior_text_anchors_on_last",),
        SOLAR,
        SO,
        "<|im:start|>assistant<|im:content|><|think:start|>I'll mention <|think:start|> "
        "here<|think:end|>ok<|im:end|>\n<|im:start|>user<|im:content|>again?<|im:end|>\n"
        "<|im:start|>assistant<|im:content|><|think:start|>",
        "reasoning",
    ),
]
_SO_FIXTURES = sorted(
    (
        "no_sentinel",
        "mention_only",
        "stray_end_sentinel",
        "single_call",
        "two_calls",
        "no_args",
        "empty_function_name",
        "unstructured_body",
        "body_without_trailing_newline",
        "literal_prefix_in_value",
        "dropped_arg_end",
        "unterminated",
        "dropped_call_end",
        "boundary_before_name",
        "end_sentinel_on_the_name_line",
    )
)
_SO_PATTERN = "TestEmbeddedToolCallPatternAgreement."
IDS[SOLAR] = [
    *(i for out in _SO_PARITY for i in (*_SO_EXTRA_IDS[out], *_SO_PARITY_IDS[out])),
    "TestExtractReasoning.test_pure_content_no_tags[none]",
    "TestExtractReasoning.test_pure_content_no_tags[low]",
    "TestExtractReasoning.test_pure_content_no_tags_via_template_kwargs",
    "TestExtractReasoning.test_top_level_effort_wins_over_template_kwargs",
    "TestExtractReasoning.test_server_default_effort_used_when_request_unset",
    "TestExtractReasoning.test_responses_effort_wins_over_template_kwargs",
    "TestExtractReasoning.test_unknown_effort_treated_as_closed",
    *(
        "TestEmbeddedToolCallPromotion." + t
        for t in (
            "test_embedded_tool_call_promoted_to_content",
            "test_promoted_block_appended_after_existing_content",
            "test_embedded_plus_tool_call_after_think_end",
            "test_multiple_embedded_blocks",
            "test_block_without_args_promoted",
            "test_whitespace_only_remainder_leaves_no_reasoning",
            "test_mere_sentinel_mention_not_promoted",
            "test_abandoned_call_not_promoted",
            "test_truncated_mid_think_without_tool_block",
            "test_promoted_blocks_parse_via_tool_parser",
        )
    ),
    *(
        f"{_SO_PATTERN}{t}[{f}]"
        for t in (
            "test_promotes_exactly_the_terminated_tool_parser_calls",
            "test_each_promoted_block_is_one_call_on_its_own",
            "test_promoted_content_parses_as_the_promoted_blocks",
        )
        for f in _SO_FIXTURES
    ),
    *(
        _SO_PATTERN + t
        for t in (
            "test_unterminated_call_stays_in_reasoning",
            "test_call_missing_its_end_before_the_next_call_is_not_promoted",
            "test_unstructured_call_body_is_promoted",
            "test_literal_call_prefix_in_a_value_is_promoted",
            "test_a_promoted_block_cannot_cross_a_call_boundary",
            "test_the_function_name_is_not_read_across_a_call_boundary",
        )
    ),
    "TestDelimiterProperties.test_delimiter_strings",
    "TestDelimiterProperties.test_mock_tokenizer_encodes_delimiters_atomically",
    "TestDelimiterProperties.test_delimiter_ids_resolved_from_vocab",
    *(
        "TestIsReasoningEnd." + t
        for t in (
            "test_reasoning_ended",
            "test_reasoning_not_ended",
            "test_empty_ids",
            "test_multi_turn_prompt_high_effort_not_ended",
            "test_multi_turn_prompt_low_effort_ended",
            "test_single_turn_prompt_high_effort_not_ended",
            "test_literal_start_tag_in_prior_text_anchors_on_last",
            "test_partially_exposed_vocab_falls_back_to_text[<|think:start|>]",
            "test_partially_exposed_vocab_falls_back_to_text[<|think:end|>]",
            "test_is_reasoning_end_streaming_follows_stream_state[False]",
            "test_is_reasoning_end_streaming_follows_stream_state[True]",
            "test_is_reasoning_end_streaming_only_inspects_delta",
        )
    ),
    "TestExtractReasoningStreaming.test_sentinel_split_across_chunks",
    *(
        f"TestExtractReasoningStreaming.test_embedded_tool_call_implicit_reasoning_end[{n}]"
        for n in ("1", "3", "7", "100")
    ),
    "TestExtractReasoningStreaming.test_tool_sentinel_split_across_chunks",
    "TestExtractReasoningStreaming.test_is_reasoning_end_defers_during_active_stream",
    "TestExtractReasoningStreaming.test_stream_state_reset_between_streams",
    "TestExtractReasoningStreaming.test_trailing_partial_sentinel_held_back_at_end_of_stream",
    "TestExtractReasoningStreaming.test_embedded_tool_call_ordering_diverges_from_non_stream",
]
_SO_TOKEN_IDS = "vLLM's delimiter token ids in its mock tokenizer's vocabulary (no model output)"
NOT_APPLICABLE.update(
    {
        (SOLAR, "TestDelimiterProperties.test_mock_tokenizer_encodes_delimiters_atomically"): (
            _SO_TOKEN_IDS
        ),
        (SOLAR, "TestDelimiterProperties.test_delimiter_ids_resolved_from_vocab"): _SO_TOKEN_IDS,
        **{
            (SOLAR, f"TestIsReasoningEnd.{t}"): _IS_END
            for t in (
                "test_reasoning_ended",
                "test_reasoning_not_ended",
                "test_empty_ids",
                "test_partially_exposed_vocab_falls_back_to_text[<|think:start|>]",
                "test_partially_exposed_vocab_falls_back_to_text[<|think:end|>]",
                "test_is_reasoning_end_streaming_follows_stream_state[False]",
                "test_is_reasoning_end_streaming_follows_stream_state[True]",
                "test_is_reasoning_end_streaming_only_inspects_delta",
            )
        },
        (
            SOLAR,
            "TestExtractReasoningStreaming.test_is_reasoning_end_defers_during_active_stream",
        ): (_IS_END),
        **{
            (SOLAR, f"{_SO_PATTERN}{t}"): "the agreement of vLLM's two internal regexes "
            "(which blocks its non-streaming path may promote; no extraction asserted): here "
            "there is no promotion (SO_PROMOTE)"
            for t in (
                *(
                    f"{m}[{f}]"
                    for m in (
                        "test_promotes_exactly_the_terminated_tool_parser_calls",
                        "test_each_promoted_block_is_one_call_on_its_own",
                    )
                    for f in _SO_FIXTURES
                ),
                "test_a_promoted_block_cannot_cross_a_call_boundary",
                "test_the_function_name_is_not_read_across_a_call_boundary",
            )
        },
    }
)

# vLLM's promoted content read by its solar_open2 tool parser (it asserts the calls' names,
# in order, and no content where nothing was promoted): here with tool_parser solar_open2
_SO_PROMOTED = (
    "TestEmbeddedToolCallPatternAgreement.test_promoted_content_parses_as_the_promoted_blocks"
)
_SO_GW = ("get_weather", {"city": "Seoul"})
_SO_TEXTS = {
    "no_sentinel": "just thinking about the weather\n",
    "mention_only": "Should I emit <|tool_call:start|> here? No.\n",
    "stray_end_sentinel": "<|tool_call:end|>\nand then some thinking\n",
    "single_call": f"I should check.\n<|tool_call:start|>get_weather\n{SO_ARG}<|tool_call:end|>",
    "two_calls": f"first\n<|tool_call:start|>get_weather\n{SO_ARG}<|tool_call:end|>\n"
    f"then\n{SO_TB2}",
    "no_args": "<|tool_call:start|>refresh\n<|tool_call:end|>",
    "empty_function_name": f"<|tool_call:start|>\n{SO_ARG}<|tool_call:end|>",
    "unstructured_body": "<|tool_call:start|>refresh\nnote to self\n<|tool_call:end|>",
    "body_without_trailing_newline": "<|tool_call:start|>refresh\nnote<|tool_call:end|>",
    "literal_prefix_in_value": "<|tool_call:start|>search\n<|tool_arg:start|>q"
    "<|tool_arg:value|>what does <|tool_call: mean<|tool_arg:end|>\n<|tool_call:end|>",
    "dropped_arg_end": "<|tool_call:start|>get_weather\n"
    "<|tool_arg:start|>city<|tool_arg:value|>Seoul\n<|tool_call:end|>",
    "unterminated": f"planning\n<|tool_call:start|>write_file\n{SO_ARG * 8}",
    "dropped_call_end": f"<|tool_call:start|>first\n{SO_ARG}"
    f"<|tool_call:start|>second\n{SO_ARG}<|tool_call:end|>",
    "boundary_before_name": "<|tool_call:start|>oops<|tool_call:end|>\n"
    f"<|tool_call:start|>get_weather\n{SO_ARG}<|tool_call:end|>",
    "end_sentinel_on_the_name_line": "<|tool_call:start|>oops<|tool_call:end|>\nbody\n"
    "<|tool_call:end|>",
}
assert sorted(_SO_TEXTS) == _SO_FIXTURES
# vLLM's whole result: (reasoning, content, calls); the value of dropped_arg_end runs to the
# call's end (decoding/tool_formats/solar_open2.py reads vLLM's tool parser so)
_SO_VLLM = {
    "no_sentinel": (_SO_TEXTS["no_sentinel"], "", ()),
    "stray_end_sentinel": (_SO_TEXTS["stray_end_sentinel"], "", ()),
    "single_call": ("I should check.\n", "", (_SO_GW,)),
    "no_args": ("", "", (("refresh", {}),)),
    "unstructured_body": ("", "", (("refresh", {}),)),
    "body_without_trailing_newline": ("", "", (("refresh", {}),)),
    "literal_prefix_in_value": ("", "", (("search", {"q": "what does <|tool_call: mean"}),)),
    "dropped_arg_end": ("", "", (("get_weather", {"city": "Seoul\n"}),)),
}
CASES += [
    case(
        f"{_SO_PROMOTED}[{f}]",
        SOLAR,
        SO,
        _SO_TEXTS[f] + SO_END,
        r,
        c,
        tool=SO,
        calls=calls,
    )
    for f, (r, c, calls) in _SO_VLLM.items()
]
SO_AS_WRITTEN = (
    " (a block the tool parser cannot read is handed back as written, to the output's end, "
    "<|think:end|> included)"
)
SO_NO_NAME = "; a call with no name is no call here: the tool parser hands the block back as text"
KNOWN += [
    known(
        case(f"{_SO_PROMOTED}[{f}]", SOLAR, SO, _SO_TEXTS[f] + SO_END, r, c, tool=SO, calls=calls),
        ours,
        SO_PROMOTE + extra,
    )
    for f, r, c, calls, ours, extra in (
        (
            "mention_only",
            _SO_TEXTS["mention_only"],
            "",
            (),
            {
                "reasoning": "Should I emit ",
                "content": "<|tool_call:start|> here? No.\n" + SO_END,
            },
            SO_AS_WRITTEN,
        ),
        (
            "two_calls",
            "first\n\nthen\n",
            "",
            (_SO_GW, ("get_time", {"tz": "KST"})),
            {"reasoning": "first\n"},
            " (the text between the calls is the tool parser's, which keeps only the text "
            "before the first call)",
        ),
        (
            "empty_function_name",
            "",
            "",
            (("", {"city": "Seoul"}),),
            {"calls": [], "content": _SO_TEXTS["empty_function_name"] + SO_END},
            SO_NO_NAME,
        ),
        (
            "unterminated",
            _SO_TEXTS["unterminated"],
            "",
            (),
            {
                "reasoning": "planning\n",
                "content": _SO_TEXTS["unterminated"][len("planning\n") :] + SO_END,
            },
            " (a call never closed is handed back as text by the tool parser)",
        ),
        (
            "dropped_call_end",
            f"<|tool_call:start|>first\n{SO_ARG}",
            "",
            (("second", {"city": "Seoul"}),),
            {
                "reasoning": "",
                "calls": [("first", {"city": "Seoul"}), ("second", {"city": "Seoul"})],
            },
            " (the tool parser reads a call ended by the next call's start, as vLLM's does "
            "after the reasoning)",
        ),
        (
            "boundary_before_name",
            "<|tool_call:start|>oops<|tool_call:end|>\n",
            "",
            (_SO_GW,),
            {"reasoning": ""},
            " (the tool parser skips the nameless block)",
        ),
        (
            "end_sentinel_on_the_name_line",
            _SO_TEXTS["end_sentinel_on_the_name_line"],
            "",
            (),
            {"reasoning": "", "content": _SO_TEXTS["end_sentinel_on_the_name_line"] + SO_END},
            " (the tool parser hands a block it cannot read back as text)",
        ),
    )
]
KNOWN.append(
    known(
        case(
            "TestEmbeddedToolCallPromotion.test_promoted_blocks_parse_via_tool_parser",
            SOLAR,
            SO,
            f"Need the weather.\n{SO_TB}\n{SO_END}Checking now.",
            "Need the weather.\n\n",
            "Checking now.\n",
            tool=SO,
            calls=(_SO_GW,),
        ),
        {"reasoning": "Need the weather.\n", "content": ""},
        SO_PROMOTE + " (the text after the call is the tool parser's, which keeps only the "
        "text before the first call)",
    )
)
