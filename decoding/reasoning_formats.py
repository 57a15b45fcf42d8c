"""Reasoning formats: one object per vLLM reasoning-parser name LocalAI may write.

LocalAI's importer writes `Options` `reasoning_parser:NAME` (vLLM's names, from LocalAI's
core/config/parser_defaults.json via core/gallery/importers/mlx.go). Each name maps to one
`ReasoningFormat` in `FORMATS`: its markers, where the output starts, the markers that end
reasoning or wrap the answer, and the labels vLLM's parser of that name strips. The output
pipeline (`decoding.output`) routes text by it while streaming (`edges`, `ReasoningStream`),
`split_text` applies the same rules to a whole text, and ModelMetadata shows `markers`.

Adding a format is one entry in `FORMATS` plus its cases in tests/vllm_reasoning_cases.py
(vLLM's tests/reasoning/test_<name>*.py). The reference for each entry is vLLM's parser of
that name (vllm/reasoning/<file>.py, named per entry) and its unit tests.

A name in no table is a one-line warning naming the known ones (`known_names`, logged by
`decoding.parsers.apply_parser_overrides`); a vLLM name with no format here (`NO_FORMAT`)
warns too; neither fails the load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from decoding.text_router import Segment, TextRouter

__all__ = [
    "FORMATS",
    "HARMONY_FORMAT",
    "NO_FORMAT",
    "ReasoningFormat",
    "ReasoningStream",
    "format_of",
    "known_names",
    "normal_name",
    "resolve",
]

NORMAL, REASONING = "normal", "reasoning"
CITATION = "citation_"  # + the state a citation's close tag returns to

# gpt-oss's channels as an mlx-lm response format (the shape of mlx_lm/chat_templates/
# muse_spark.py's RESPONSE_FORMAT, read by output._edges): analysis is reasoning, final and
# commentary are content; the headers between them are stripped; each call message is one
# tool block (` to=functions.` to `<|call|>`; tool_parser openai, decoding/parsers.py).
HARMONY_FORMAT: Mapping[str, Any] = {
    "transitions": {
        "normal": [
            ("<|channel|>analysis", "reasoning"),
            ("<|channel|>final", "normal"),
            ("<|channel|>commentary", "normal"),
            ("<|constrain|>json", "normal"),
            ("<|message|>", "normal"),
            ("<|start|>assistant", "normal"),
            ("<|end|>", "normal"),
        ],
        "reasoning": [("<|message|>", "reasoning"), ("<|end|>", "normal")],
        # A call message ends at `<|call|>` (`<|end|>` as a rendered conversation has it);
        # later messages (more calls, the final answer) are read on, as vLLM's
        # openai_tool_parser.py reads every message of the output.
        "tool": [("<|call|>", "normal"), ("<|end|>", "normal")],
    },
}


@dataclass(frozen=True)
class ReasoningFormat:
    """How one model family writes its reasoning.

    start / end: the markers around a reasoning block (stripped, never shown).
    implicit_start: vLLM's parser reads the output as inside the block from its first token
    (its thinking template opens the block in the prompt). Here the prompt decides
    (`initial_state`): a prompt that opened the block starts in reasoning, one with no
    marker in content. LocalAI's importer gives these names to whole families, models
    that never think among them (mistral-nemo / -small: mistral; Qwen3 instruct: qwen3;
    DeepSeek-V3: deepseek_v3), whose whole answer would otherwise be reasoning.
    `split_text` of a whole output reads it as vLLM's parser does.
    ends_reasoning: markers that end reasoning without `end` and stay in the text that
    follows (a tool-call section: the tool parser reads it).
    other_starts / other_ends: other spellings of start / end the model writes.
    content_markers: wrapper markers around the answer, stripped from content.
    newlines_after: markers after which the content's leading newlines are dropped.
    reasoning_label: a label the model writes at the start of each block, dropped.
    content_prefix: text put before the content (vLLM's minimax_m2_append_think hands the
    whole output on as content with `<think>` before it).
    trim_newline: one newline right before the end marker (or the output's end) is no
    reasoning, and one right after the end marker no content (vLLM's step3p5).
    split: False when reasoning is not split from content at all.
    channels: an mlx-lm response format (Harmony) instead of a marker pair.
    citations: `(open, close_head, close_tail)`: inline citation tags dropped from reasoning
    and content alike, the open tag as written, the close tag from its head to the next tail
    (Cohere's `<co>` ... `</co: 0:[1,2]>`).
    lstrip: a reasoning block's leading whitespace is dropped.
    shown: the (start, end) ModelMetadata shows; (start, end) when not given.
    source: vLLM's parser file this follows.
    """

    name: str
    start: str = ""
    end: str = ""
    source: str = ""
    implicit_start: bool = False
    ends_reasoning: tuple[str, ...] = ()
    other_starts: tuple[str, ...] = ()
    other_ends: tuple[str, ...] = ()
    content_markers: tuple[str, ...] = ()
    newlines_after: tuple[str, ...] = ()
    reasoning_label: str = ""
    content_prefix: str = ""
    trim_newline: bool = False
    split: bool = True
    channels: Mapping[str, Any] | None = None
    citations: tuple[str, str, str] | None = None
    lstrip: bool = False
    shown: tuple[str, str] | None = None

    @property
    def markers(self) -> tuple[str, str]:
        """The (start, end) markers ModelMetadata shows."""
        return self.shown or (self.start, self.end)

    @property
    def routes(self) -> bool:
        """Whether the pipeline splits reasoning by this format's marker pair."""
        return self.split and bool(self.start) and bool(self.end)

    def edges(self) -> dict[str, list[tuple[str, str, bool]]]:
        """This format's part of the output state machine: state -> [(pattern, next state,
        keep)], keep meaning the pattern stays as text of the next state."""
        edges: dict[str, list[tuple[str, str, bool]]] = {NORMAL: [], REASONING: []}
        if self.routes:
            starts, ends = (self.start, *self.other_starts), (self.end, *self.other_ends)
            edges[NORMAL].extend((m, REASONING, False) for m in starts)
            edges[REASONING].extend((m, NORMAL, False) for m in ends)
            # Ours: a repeated open or stray close marker is stripped too, never shown as
            # text (vLLM's minimax_m2 double_end_token: a second </think> is dropped).
            edges[REASONING].extend((m, REASONING, False) for m in starts)
            edges[NORMAL].extend((m, NORMAL, False) for m in ends)
            edges[REASONING].extend((m, NORMAL, True) for m in self.ends_reasoning)
        edges[NORMAL].extend((m, NORMAL, False) for m in self.content_markers)
        if self.citations:
            # A citation's close tag is a state of its own whose text is no one's (the
            # stream keeps normal / reasoning text only), ended by the tag's tail.
            open_, head, tail = self.citations
            for state in (NORMAL, REASONING):
                edges[state].append((open_, state, False))
                edges[state].append((head, CITATION + state, False))
                edges[CITATION + state] = [(tail, state, False)]
        return edges

    def initial_state(self, start_at: int, end_at: int) -> str:
        """The state a prompt leaves: its last start marker at ``start_at``, its last end
        marker at ``end_at`` (-1: none)."""
        if not self.routes:
            return NORMAL
        return REASONING if start_at > end_at else NORMAL

    def split_text(self, text: str, initial: str | None = None) -> tuple[str, str]:
        """(reasoning, content) of a whole output by the rules the stream follows (the
        same router and filters), starting where vLLM's parser does (`implicit_start`)
        unless ``initial`` says."""
        edges: dict[str, list] = {s: list(e) for s, e in self.edges().items()}
        for state, extra in ((self.channels or {}).get("transitions") or {}).items():
            edges.setdefault(state, []).extend(extra)
        state = initial or (REASONING if self.routes and self.implicit_start else NORMAL)
        router = TextRouter(edges, state)
        stream = ReasoningStream(self)
        if state == REASONING:
            stream.open_block()
        content: list[str] = []
        reasoning: list[str] = []
        for seg in router.push(text):
            stream.route(seg, content, reasoning)
        if router.state is not None:
            stream.route(Segment(router.state, router.flush()), content, reasoning)
        reasoning.append(stream.close_block())
        return "".join(reasoning), stream.content("".join(content), final=True)


class ReasoningStream:
    """The per-request text filters of a format, applied after routing: the block label
    dropped at each block start (held while it may still be the label), the content
    prefix put before the first content, and the newlines around the end marker a format
    trims (`trim_newline`: a reasoning's last newline is held until more reasoning
    follows)."""

    def __init__(self, fmt: ReasoningFormat) -> None:
        self._label = fmt.reasoning_label
        self._held: str | None = None  # None: not at a block start
        self._prefix = fmt.content_prefix
        self._newlines_after = fmt.newlines_after
        self._eat_newlines = False
        self._trim_newline = fmt.trim_newline
        self._held_newline = False  # the reasoning's last "\n", held (trim_newline)
        self._skip_newline = False  # drop one "\n" at the content's next text
        self._lstrip = fmt.lstrip
        self._at_start = False  # at a block's start, its leading whitespace dropped (lstrip)

    def open_block(self) -> None:
        if self._label:
            self._held = ""
        self._at_start = self._lstrip

    def reasoning(self, text: str) -> str:
        text = self._labelled(text)
        if self._at_start and text:
            text = text.lstrip()
            self._at_start = not text
        if not self._trim_newline or not text:
            return text
        if self._held_newline:
            text, self._held_newline = "\n" + text, False
        if text.endswith("\n"):
            text, self._held_newline = text[:-1], True
        return text

    def _labelled(self, text: str) -> str:
        if self._held is None or not text:
            return text
        held = self._held + text
        if held.startswith(self._label):
            self._held = None
            return held[len(self._label) :]
        if self._label.startswith(held):
            self._held = held
            return ""
        self._held = None
        return held

    def close_block(self) -> str:
        """Text held at the block's end (a label cut short is the model's text)."""
        held, self._held = self._held or "", None
        self._held_newline = False  # the newline before the end marker (trim_newline)
        return held

    def route(self, seg: Segment, content: list[str], reasoning: list[str]) -> None:
        """Append the content / reasoning text of one routed segment, filtered; other
        states' text (tool calls, channel headers) is the caller's."""
        if seg.state == NORMAL:
            text = seg.text.lstrip("\n") if self._eat_newlines else seg.text
            self._eat_newlines = self._eat_newlines and not text
            if self._skip_newline and text:
                text = text.removeprefix("\n")
                self._skip_newline = False
            content.append(text)
        elif seg.state == REASONING:
            reasoning.append(self.reasoning(seg.text))
        if seg.marker is None:  # still open
            return
        # Newlines right after such a marker are dropped, up to the next text or marker.
        self._eat_newlines = seg.marker in self._newlines_after and seg.next_state == NORMAL
        if seg.state == REASONING and seg.next_state not in (REASONING, CITATION + REASONING):
            reasoning.append(self.close_block())
            self._skip_newline = self._trim_newline and seg.next_state == NORMAL
        elif seg.state not in (REASONING, CITATION + REASONING) and seg.next_state == REASONING:
            self.open_block()  # (back from a citation's close tag is the same block)

    def content(self, text: str, final: bool = False) -> str:
        if self._prefix and (text or final):
            text, self._prefix = self._prefix + text, ""
        return text


_THINK = ("<think>", "</think>")


def _think(name: str, source: str, **kw: Any) -> ReasoningFormat:
    return ReasoningFormat(name, *_THINK, source=source, **kw)


_R = "vllm/reasoning/"
FORMATS: dict[str, ReasoningFormat] = {
    f.name: f
    for f in (
        _think("deepseek_r1", _R + "deepseek_r1_reasoning_parser.py", implicit_start=True),
        # With thinking (chat_template_kwargs thinking) vLLM's deepseek_v3 is deepseek_r1;
        # without it (its default), identity: here the prompt says which (V3.1's template
        # opens <think> with thinking, closes it without).
        _think("deepseek_v3", _R + "deepseek_v3_reasoning_parser.py"),
        # vLLM's qwen3 parser ends reasoning at a <tool_call> without </think> and hands the
        # call on as content (tests/reasoning/test_qwen3_reasoning_parser.py).
        _think(
            "qwen3",
            _R + "qwen3_reasoning_parser.py",
            implicit_start=True,
            ends_reasoning=("<tool_call>",),
        ),
        _think("glm45", _R + "glm4_moe_reasoning_parser.py"),
        # GLM-4.7's template opens <think> itself: vLLM reads it as deepseek_r1 does.
        _think("glm47", _R + "glm47_moe_reasoning_parser.py", implicit_start=True),
        _think("step3", _R + "step3_reasoning_parser.py", implicit_start=True),
        # Step-3.5 writes a newline before and after </think>: one each is no text
        # (vLLM's step3p5_reasoning_parser.py).
        _think(
            "step3p5", _R + "step3p5_reasoning_parser.py", implicit_start=True, trim_newline=True
        ),
        # ERNIE 4.5 writes `abc\n</think>\n\n<response>\ndef\n</response>\n` (or
        # `abc\n</think>\ndef`): the <response> wrapper and the newlines after </think>
        # and </response> are no content (vLLM's ernie45_reasoning_parser.py).
        _think(
            "ernie45",
            _R + "ernie45_reasoning_parser.py",
            implicit_start=True,
            content_markers=("<response>", "</response>"),
            newlines_after=("</think>", "</response>"),
        ),
        _think("minimax_m2", _R + "minimax_m2_reasoning_parser.py", implicit_start=True),
        _think(
            "minimax_m2_append_think",
            _R + "minimax_m2_reasoning_parser.py (MiniMaxM2AppendThinkReasoningParser)",
            split=False,
            content_prefix="<think>",
        ),
        _think("olmo3", _R + "olmo3_reasoning_parser.py", implicit_start=True),
        # A tool-call section ends reasoning without </think>; the tool parser reads it.
        _think(
            "kimi_k2",
            _R + "kimi_k2_reasoning_parser.py",
            implicit_start=True,
            ends_reasoning=("<|tool_calls_section_begin|>",),
        ),
        _think("nemotron_v3", _R + "nemotron_v3_reasoning_parser.py", implicit_start=True),
        ReasoningFormat(
            "hunyuan_a13b",
            "<think>\n",
            "\n</think>\n<answer>\n",
            _R + "hunyuan_a13b_reasoning_parser.py",
            content_markers=("\n</answer>",),
        ),
        ReasoningFormat(
            "mistral",
            "[THINK]",
            "[/THINK]",
            _R + "mistral_reasoning_parser.py",
            implicit_start=True,
        ),
        # The model writes `<|channel>thought\n...<channel|>`: the `thought\n` label is no
        # reasoning (vLLM's gemma4_reasoning_parser.py strips it).
        ReasoningFormat(
            "gemma4",
            "<|channel>",
            "<channel|>",
            _R + "gemma4_reasoning_parser.py",
            reasoning_label="thought\n",
        ),
        ReasoningFormat(
            "seed_oss",
            "<seed:think>",
            "</seed:think>",
            _R + "seed_oss_reasoning_parser.py",
            implicit_start=True,
        ),
        # vLLM's granite parser also reads "Here's" (seen from quantized models).
        ReasoningFormat(
            "granite",
            "Here is my thought process:",
            "Here is my response:",
            _R + "granite_reasoning_parser.py",
            other_starts=("Here's my thought process:",),
            other_ends=("Here's my response:",),
        ),
        ReasoningFormat(
            "openai_gptoss",
            source=_R + "gptoss_reasoning_parser.py",
            channels=HARMONY_FORMAT,
            shown=("<|channel|>analysis<|message|>", "<|end|>"),
        ),
    )
}

# vLLM names whose parser is an entry's above (vllm/reasoning/__init__.py @0064cc9cb1): the
# same class (mimo: Qwen3ParserReasoningAdapter, qwen3's), or one that differs only in what
# here the prompt decides: holo2 (DeepSeekV3ReasoningWithThinkingParser) is deepseek_v3
# thinking by default; poolside_v1 (poolside_v1_reasoning_parser.py) is deepseek_v3 that
# reads only the current assistant turn of the prompt for a </think>.
FORMATS.update(
    {
        "mimo": replace(FORMATS["qwen3"], name="mimo"),
        "holo2": replace(
            FORMATS["deepseek_v3"],
            name="holo2",
            source=_R + "deepseek_v3_reasoning_parser.py (DeepSeekV3ReasoningWithThinkingParser)",
        ),
        "poolside_v1": replace(
            FORMATS["deepseek_v3"],
            name="poolside_v1",
            source=_R + "poolside_v1_reasoning_parser.py",
        ),
        # Hy3 (hy_v3_reasoning_parser.py): <think> opened by the prompt when its
        # reasoning_effort thinks, none (identity) with no_think: the prompt says which.
        "hy_v3": _think("hy_v3", _R + "hy_v3_reasoning_parser.py", implicit_start=True),
        # DeepSeek-V4: deepseek_v3's (the prompt says whether it thinks), and a DSML tool-call
        # block ends reasoning without </think>; the deepseek_v4 tool parser reads it
        # (tests/reasoning/test_deepseekv4_reasoning_parser.py).
        "deepseek_v4": _think(
            "deepseek_v4",
            _R + "deepseek_v4_reasoning_parser.py",
            ends_reasoning=("<｜DSML｜tool_calls>",),
        ),
        # Kimi K3's XTML channels (kimi_k3_reasoning_parser.py; its DelegatingParser
        # vllm/parser/kimi_k3.py unwraps the response channel): a `think` channel opened by
        # the prompt when thinking, the answer in a `response` channel whose markers and
        # the end-of-turn `<|close|>message<|sep|>` are no content.
        # MiniMax-M3 (minimax_m3_reasoning_parser.py): <mm:think> blocks; the output starts
        # in reasoning when thinking_mode opens the block in the prompt.
        "minimax_m3": ReasoningFormat(
            "minimax_m3",
            "<mm:think>",
            "</mm:think>",
            source=_R + "minimax_m3_reasoning_parser.py",
        ),
        # Cohere Command A reasoning (vLLM's cohere_command_reasoning_parser.py hands the
        # parsing to an external package, so this follows what
        # tests/reasoning/test_cohere_command_reasoning_parser.py asserts): a THINKING block,
        # the answer in a RESPONSE block whose markers are no content, `<co>` ... `</co: ...>`
        # citation tags dropped from both, the reasoning's leading whitespace dropped.
        **{
            name: ReasoningFormat(
                name,
                "<|START_THINKING|>",
                "<|END_THINKING|>",
                source=_R + "cohere_command_reasoning_parser.py",
                content_markers=(
                    "<|START_RESPONSE|>",
                    "<|END_RESPONSE|>",
                    "<|START_TEXT|>",
                    "<|END_TEXT|>",
                ),
                newlines_after=("<|END_THINKING|>",),
                citations=("<co>", "</co:", ">"),
                lstrip=True,
            )
            for name in ("cohere_command3", "cohere_command4")
        },
        # Inkling (inkling_reasoning_parser.py, on vllm/parser/inkling.py; cases in
        # tests/parser/engine/test_inkling.py): typed blocks,
        # each closed by <|end_message|> (or <|content_model_end_sampling|>), later ones after
        # <|message_model|>; a thinking block is reasoning, text / tool-text / tool-error
        # blocks are content without their markers.
        "inkling": ReasoningFormat(
            "inkling",
            "<|content_thinking|>",
            "<|end_message|>",
            source=_R + "inkling_reasoning_parser.py",
            other_ends=("<|content_model_end_sampling|>",),
            content_markers=(
                "<|message_model|>",
                "<|content_text|>",
                "<|content_invoke_tool_text|>",
                "<|content_tool_error|>",
                "<|end_message|>",
                "<|content_model_end_sampling|>",
            ),
        ),
        # Solar Open2: the template opens <|think:start|> in the prompt (closed at once for
        # low / none effort), so the prompt decides where the output starts. A tool call
        # inside the block ends the reasoning and stays for the tool parser, as vLLM's
        # stream does (solar_open2_reasoning_parser.py's extract_reasoning_streaming).
        "solar_open2": ReasoningFormat(
            "solar_open2",
            "<|think:start|>",
            "<|think:end|>",
            source=_R + "solar_open2_reasoning_parser.py",
            implicit_start=True,
            ends_reasoning=("<|tool_call:start|>",),
        ),
        "kimi_k3": ReasoningFormat(
            "kimi_k3",
            "<|open|>think<|sep|>",
            "<|close|>think<|sep|>",
            source=_R + "kimi_k3_reasoning_parser.py",
            implicit_start=True,
            content_markers=(
                "<|open|>response<|sep|>",
                "<|close|>response<|sep|>",
                "<|close|>message<|sep|>",
            ),
        ),
    }
)

# vLLM reasoning-parser names with no format here yet (a warning; mlx-lm's detection stays).
NO_FORMAT: frozenset[str] = frozenset()


def normal_name(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def resolve(name: str) -> ReasoningFormat | None:
    """vLLM reasoning-parser name -> its format; None for a name with none here."""
    return FORMATS.get(normal_name(name))


def known_names() -> list[str]:
    return sorted(FORMATS)


def format_of(tokenizer: Any) -> ReasoningFormat | None:
    """The format the output pipeline routes by: the one LocalAI's option named
    (`decoding.parsers.apply_parser_overrides` sets it), else the think markers mlx-lm
    inferred from the chat template, else None."""
    fmt = getattr(tokenizer, "_reasoning_format", None)
    if isinstance(fmt, ReasoningFormat):
        return fmt
    if getattr(tokenizer, "has_thinking", False):  # getattr: engine tests use fakes
        return ReasoningFormat("detected", tokenizer.think_start, tokenizer.think_end)
    return None


def prompt_state(fmt: ReasoningFormat | None, tokenizer: Any, tokens: Sequence[int]) -> str:
    """The state ``tokens`` (a prompt) leave the output in under ``fmt``."""
    if fmt is None or not fmt.routes or not getattr(tokenizer, "has_thinking", False):
        return NORMAL
    return fmt.initial_state(tokenizer.rfind_think_start(tokens), tokenizer.rfind_think_end(tokens))
