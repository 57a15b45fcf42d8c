"""Output pipeline: generated token ids -> `Delta`s (content, reasoning, tool calls, logprobs).

Owns, per request: incremental UTF-8-safe detokenizing (mlx-lm's streaming detokenizer), the
split of text into content / reasoning / tool calls at the model's markers, stop-sequence
matching with hold-back, tool-call parsing (`tool_calls.py`) and OpenAI-style logprobs.
Knows nothing about gRPC or the engine; it is fed one token at a time from the engine thread.

Text rules (what a client sees):
- Markers (`<think>`, `</think>`, `<tool_call>`, ...) are matched on decoded text, as mlx-lm's
  `TextStateMachine` (mlx_lm/generate.py) does, so a marker split across tokens is still found.
  Text that could still be the start of a marker or stop string is held back, and released as
  soon as it cannot (vLLM's rule: at most max(len(pattern)) - 1 characters, only while they are
  a prefix of some pattern).
- Stop strings apply to content only: reasoning is the model's scratch text (a stop like "\\n\\n"
  would end an answer before it starts) and tool-call bodies are JSON that may contain them.
  mlx-lm applies them in every state. The first match is the one that *ends* first (ties: the
  longer one), since generation must end as soon as any stop string is complete. Nothing of a
  matched stop string is emitted; text after it (even within the same token) is dropped.
- Reasoning text goes to `reasoning` only; tool-call text never streams as content. Calls
  stream as `ToolCallDelta`s (first: index, id, name; then argument fragments) for the formats
  `tool_calls.py` can stream, else whole at the block's end; a malformed block comes back as
  content (markers included) with a logged warning, and calls already streamed from it get a
  `dropped` delta (rules and the format table: `tool_calls.py`'s docstring).
  `OutputPipeline.tool_calls` holds the whole calls for Predict's final reply.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import mlx.core as mx
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer
from tokenizers import decoders as hf_decoders

from decoding import arrays, reasoning_formats, tool_formats, tool_schema
from decoding.finish import FinishReason, settled
from decoding.reasoning_formats import ReasoningFormat, ReasoningStream
from decoding.text_router import Segment, TextRouter
from decoding.tool_calls import BlockStreamer, ToolCall, ToolCallDelta, merge_tool_call_deltas
from parsing.fields import MAX_TOP_LOGPROBS
from seam import tokenizer as seam_tokenizer

__all__ = [
    "Delta",
    "OutputPipeline",
    "ToolCall",
    "ToolCallDelta",
    "initial_state_for",
    "merge_tool_call_deltas",
]

logger = logging.getLogger(__name__)

MIN_LOGPROB = -9999.0  # stands in for -inf, which JSON cannot carry (OpenAI and vLLM do the same)
NORMAL, REASONING, TOOL = "normal", "reasoning", "tool"
INERT = "inert"  # a tool format's region where it reads no calls (`ToolFormat.inert`)
_NO_BLOCK = tool_formats.Block("")


def _is_tool(state: str | None) -> bool:
    """A tool block's state: "tool", or "tool1", "tool2"... for a format's other blocks."""
    return state is not None and state.startswith(TOOL)


def tool_state(i: int) -> str:
    """The router state of a tool format's i-th block."""
    return TOOL if i == 0 else f"{TOOL}{i}"


_SPM_SPACE = "\u2581".encode()  # SentencePiece's word-boundary mark


@dataclass(frozen=True)
class Delta:
    """What one `feed()`/`finish()` call adds to the response; empty fields mean nothing new.

    content / reasoning: text to append; tool_calls: tool-call pieces of this step, to be
    joined by index (`merge_tool_call_deltas`; pieces with `dropped` set are no calls and are
    not sent); logprobs: one OpenAI chat logprobs entry per generated (non-EOS) token.
    """

    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    logprobs: tuple[dict, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls or self.logprobs)


def initial_state_for(tokenizer: Any, prompt_tokens: Sequence[int]) -> str:
    """The `initial_state` for a prompt: "reasoning" when its last think block is still open.

    Same rule as mlx-lm's server (`_tokenize`): the last think-start token sequence after the
    last think-end one (the reasoning format's markers, `reasoning_formats.prompt_state`);
    a chat template's response format (`response_initial_state`) wins.
    """
    fmt = reasoning_formats.format_of(tokenizer)
    state = reasoning_formats.prompt_state(fmt, tokenizer, list(prompt_tokens))
    return getattr(tokenizer, "response_initial_state", None) or state  # none on mlx-lm main


def _edges(
    tokenizer: Any, fmt: ReasoningFormat | None, stop: Sequence[str], tools_on: bool
) -> dict[str, list]:
    """Transitions as mlx-lm's `make_text_state_machine`, plus the differences noted inline;
    the reasoning format's (`ReasoningFormat.edges`) come after the tool markers, so that
    with tools on a tool-call marker opens a call rather than ending reasoning as text."""
    edges: dict[str, list] = {NORMAL: [], REASONING: [], TOOL: []}
    thinking = fmt is not None and fmt.routes
    responses = getattr(tokenizer, "response_transitions", None) or {}
    if fmt is not None and thinking:
        edges[NORMAL].append((fmt.start, REASONING))
        edges[REASONING].append((fmt.end, NORMAL))
    if tools_on:
        tool_fmt = tool_formats.of(tokenizer)
        blocks = (
            tool_fmt.blocks
            if tool_fmt is not None
            else (tool_formats.Block(tokenizer.tool_call_start, tokenizer.tool_call_end),)
        )
        from_normal = TOOL not in {d for e in responses.values() for _, d in e}
        for i, block in enumerate(blocks):  # a decoding.tool_formats format: every block
            state = tool_state(i)
            edges.setdefault(state, [])
            if from_normal:
                edges[NORMAL].append((block.start, state))
            if thinking and not block.at_content_start:
                edges[REASONING].append((block.start, state))
            if block.end:  # Mistral has none: the call runs to the end
                edges[state].append((block.end, NORMAL))
        edges[NORMAL].extend((m, NORMAL) for m in (tool_fmt.strip if tool_fmt else ()))
        if tool_fmt is not None and not thinking:  # a reasoning format takes them if any
            for opening, closing in tool_fmt.inert:
                edges[NORMAL].append((opening, INERT))
                edges.setdefault(INERT, []).append((closing, NORMAL))
    if fmt is not None:
        for state, extra in fmt.edges().items():
            known = edges.setdefault(state, [])
            known.extend(e for e in extra if e[:2] not in {x[:2] for x in known})
    for marker in getattr(tokenizer, "structural_markers", None) or ():
        edges[NORMAL].append((marker, NORMAL))
    for state, extra in responses.items():
        edges.setdefault(state, []).extend(extra)
    for state in (NORMAL, INERT) if INERT in edges else (NORMAL,):  # ours: content only
        edges[state].extend((s, None) for s in dict.fromkeys(stop) if s)
    return edges


class OutputPipeline:
    """Turns one request's generated tokens into `Delta`s; one instance per request.

    tokenizer: mlx-lm `TokenizerWrapper`. stop: stop strings (empty ones ignored).
    top_logprobs: None = no logprobs; 0 = the chosen token only; n = n alternatives (capped
    at 20). temperature: the sampling temperature, used to report log-probabilities of the
    distribution actually sampled from (log_softmax(row / T)); at 0 (greedy) the row itself.
    Top-k/top-p/min-p truncation is not reflected. initial_state: "normal", or "reasoning"
    when the prompt already opened a think block (see `initial_state_for`). parse_tool_calls:
    False streams tool-call markup as content. tools: the request's tool definitions, handed
    to the tool parser (some parsers type arguments from them). schema_field: the field of
    the tool-call grammar applied to the request (None without one): a final call whose
    arguments its declared schema rejects is then the constraint failing, `failure` (the
    request ends with that error); without a grammar calls are reported as the parser reads
    them, as vLLM's parsers do (a call turned into text is worse for an agent, issue 37).

    Not thread-safe: call it from one thread (the engine's).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        stop: Sequence[str] = (),
        top_logprobs: int | None = None,
        temperature: float = 0.0,
        initial_state: str = NORMAL,
        parse_tool_calls: bool = True,
        tools: Sequence[dict] | None = None,
        schema_field: str | None = None,
    ) -> None:
        if top_logprobs is not None and top_logprobs < 0:
            raise ValueError(f"top_logprobs must be None or >= 0, got {top_logprobs}")
        self._tok = tokenizer
        # A fresh copy per call, with two fixes (seam.tokenizer.exact_detokenizer).
        self._detok = seam_tokenizer.exact_detokenizer(tokenizer.detokenizer)
        self._eos = frozenset(tokenizer.eos_token_ids)
        self._top_n = None if top_logprobs is None else min(top_logprobs, MAX_TOP_LOGPROBS)
        self._temperature = float(temperature)
        self._tools_on = bool(
            parse_tool_calls
            and getattr(tokenizer, "has_tool_calling", False)
            and tokenizer.tool_parser
        )
        self._tools = tools
        self._schema_field = schema_field
        self.failure: str | None = None  # a call the applied tool-call grammar let break
        fmt = reasoning_formats.format_of(tokenizer)
        self._text = ReasoningStream(fmt or ReasoningFormat(""))
        stops = [stop] if isinstance(stop, str) else stop
        edges = _edges(tokenizer, fmt, stops, self._tools_on)
        if initial_state not in edges:
            raise ValueError(f"unknown initial_state {initial_state!r}; use one of {list(edges)}")
        if initial_state == REASONING and not edges[REASONING]:
            # No end marker could ever leave reasoning: the whole answer would be lost there.
            logger.warning("initial_state 'reasoning' ignored: the tokenizer has no think markers")
            initial_state = NORMAL
        tool_fmt = tool_formats.of(tokenizer) if self._tools_on else None
        blocks = tool_fmt.blocks if tool_fmt is not None else ()
        self._blocks = {tool_state(i): b for i, b in enumerate(blocks)}
        self._router = TextRouter(
            edges,
            initial_state,
            [b.start for b in blocks if b.at_content_start],
            tool_fmt.content_start_after if tool_fmt is not None else (),
            NORMAL,
            _is_tool,
        )
        self._trim = bool(tool_fmt is not None and tool_fmt.trim_content)
        self._blank = bool(tool_fmt is not None and tool_fmt.blank_content)
        self._content_seen = False
        self._space = ""  # content whitespace held back (formats that trim it)
        self._keep = False  # whether the current block's markers are part of its text
        if initial_state == REASONING:
            self._text.open_block()
        self._tool_open = ""  # the marker that opened the current tool block
        self._streamer: BlockStreamer | None = None  # the current tool block's
        self._next_index = 0  # the index of the next tool call
        self._token_info: dict[int, tuple[str, list[int]]] = {}
        self._vocab: int | None = None  # the tokenizer's size, once needed
        self._token_kind: str | None = None
        self._added: dict[int, str] = {}
        self.content = ""
        self.reasoning = ""
        self.tool_calls: list[ToolCall] = []
        self.finish_reason: FinishReason | None = None
        self.generated_tokens = 0  # every token fed, EOS included (usage.completion_tokens)

    @property
    def stopped(self) -> bool:
        """True once a stop string matched; the engine should then end the sequence."""
        return self._router.state is None

    def feed(self, token: int, logprobs: mx.array | None = None) -> Delta:
        """Consume one generated token; `logprobs` is its (V,) log-softmax row from mlx-lm.

        EOS ids add no text and no logprobs entry. After a stop match or `finish()` tokens
        are ignored (empty Delta).
        """
        if self.finish_reason is not None or self.stopped:
            return Delta()
        self.generated_tokens += 1
        if token in self._eos:
            return Delta()
        entries: tuple[dict, ...] = ()
        if self._top_n is not None and logprobs is not None:
            entries = (self._logprob_entry(token, logprobs),)
        self._detok.add_token(token)
        text = self._detok.last_segment
        return self._emit(self._router.push(text) if text else [], entries)

    def finish(self, reason: FinishReason) -> Delta:
        """End the request (how its sequence ended: ``reason``) and flush what is held back.

        Held text that can no longer complete a marker or stop is released in its state; if
        the final flush completes a stop string, that stop applies. Unterminated reasoning is
        flushed as reasoning; an unterminated tool call is parsed as it stands (vLLM's rule:
        a complete call without its end marker still counts), and returned as content with a
        warning when it does not parse. `finish_reason`
        becomes STOP when a stop string matched, else `reason` (`decoding.finish.settled`).
        Idempotent.
        """
        if self.finish_reason is not None:
            return Delta()
        segments: list[Segment] = []
        if not self.stopped:
            self._detok.finalize()
            text = self._detok.last_segment
            segments = self._router.push(text) if text else []
            state = self._router.state
            if state is not None:
                segments.append(Segment(state, self._router.flush()))
                if _is_tool(state):
                    segments.append(Segment(state, "", "", NORMAL))  # close it: see _tool_call
        self.finish_reason = settled(reason, self.stopped)
        if self._space and not segments:
            segments.append(Segment(NORMAL, ""))
        return self._emit(segments, (), final=True)

    def _emit(
        self, segments: list[Segment], entries: tuple[dict, ...], final: bool = False
    ) -> Delta:
        content: list[str] = []
        reasoning: list[str] = []
        pieces: list[ToolCallDelta] = []
        for seg in segments:
            if seg.state == NORMAL and (self._trim or self._blank):
                routed: list[str] = []
                self._text.route(seg, routed, reasoning)
                content.append(self._held_space(seg, "".join(routed), final))
            elif seg.state == INERT:  # content as written, markers included
                content.append(seg.text + (seg.marker or ""))
            else:
                self._text.route(seg, content, reasoning)
            if seg.next_state == INERT and seg.state != INERT:
                content.append(seg.marker or "")
            if _is_tool(seg.state) and self._streamer is not None:
                pieces += self._streamer.push(seg.text)
            # Text of other states (a response format's header) is dropped, as mlx-lm does.
            if seg.marker is None or seg.next_state is None:
                continue
            if not _is_tool(seg.state) and _is_tool(seg.next_state):
                self._tool_open = seg.marker
                parser = self._tok.tool_parser if self._tools_on else None
                self._streamer = BlockStreamer(
                    parser, self._tools, self._next_index, tool_formats.stream_of(self._tok)
                )
                self._keep = self._blocks.get(seg.next_state, _NO_BLOCK).keep
                if self._keep:  # the marker is part of the calls' text
                    pieces += self._streamer.push(seg.marker)
            elif _is_tool(seg.state) and not _is_tool(seg.next_state):
                closed, raw = self._tool_call(seg.marker)
                pieces += closed
                content.append(raw)
        if final:
            reasoning.append(self._text.close_block())
        text = self._text.content("".join(content), final)
        delta = Delta(text, "".join(reasoning), tuple(pieces), entries)
        self.content += delta.content
        self.reasoning += delta.reasoning
        return delta

    def _held_space(self, seg: Segment, text: str, final: bool) -> str:
        """The content of a NORMAL segment for a format that trims it: whitespace is held
        back until more content shows it is no gap around a block (then it is left out)."""
        if self._blank and not self._content_seen:
            # vLLM gives no content where it is only whitespace before the calls
            self._space += text
            if self._space.strip():
                out, self._space, self._content_seen = self._space, "", True
                return out
            if _is_tool(seg.next_state):
                self._space = ""
            elif seg.marker is not None or (final and not self.tool_calls):
                out, self._space = self._space, ""
                return out
            return ""
        if not self._trim:
            return text
        # vLLM strips the content around a format's calls: before a block, between blocks
        # and after the last one
        text = self._space + text
        kept = text.rstrip()
        self._space = text[len(kept) :]
        if _is_tool(seg.next_state):
            self._space = ""
        elif seg.marker is not None or (final and not self.tool_calls):
            kept, self._space = kept + self._space, ""
        return kept

    def _tool_call(self, close: str) -> tuple[list[ToolCallDelta], str]:
        """End the current block: (its last pieces, "") or (dropped pieces, raw markup)."""
        streamer, self._streamer = self._streamer, None
        if streamer is None:  # cannot happen: a TOOL state always starts with a marker
            return [], close
        pushed: list[ToolCallDelta] = []
        if self._keep:  # the end marker is part of the calls' text too
            pushed = streamer.push(close)
            raw = streamer.text
        else:
            raw = self._tool_open + streamer.text + close
        if not self._tools_on:
            return [], raw
        # A block still open at the end (close "") is parsed as it stands, as vLLM's hermes
        # parser does (hermes_tool_parser.py reads `<tool_call>(.*)` up to the end).
        pieces, calls, ok = streamer.close(True)
        pieces = pushed + pieces
        self._next_index = streamer.next_index
        if not ok and not close and self._tok.tool_call_end:
            logger.warning(
                "unterminated tool call returned as content (%s): %r", streamer.error, raw[:200]
            )
        elif not ok:
            logger.warning(
                "malformed tool call returned as content (%s): %r", streamer.error, raw[:200]
            )
        if ok and self._schema_field is not None and self.failure is None:
            try:
                tool_schema.check_calls(calls, self._tools)
            except ValueError as exc:
                # llguidance is lenient about schema keywords it does not implement
                # (uniqueItems, not, ...): the grammar held the call's shape, not its schema.
                self.failure = (
                    f"{self._schema_field}: the tool-call grammar could not hold the call to "
                    f"its declared schema (a keyword it does not enforce): {exc}; no reply is "
                    "given: simplify the schema, or send Metadata tool_grammar:off to take "
                    "calls unconstrained"
                )
                logger.warning("%s", self.failure)
        self.tool_calls.extend(calls)
        return pieces, "" if ok else raw

    def _logprob_entry(self, token: int, row: mx.array) -> dict:
        """OpenAI chat logprobs entry; natural log of the sampled distribution."""
        lp = row.astype(mx.float32)
        if self._temperature > 0 and self._temperature != 1.0:  # the row is already T = 1
            lp = lp / self._temperature
            lp = lp - mx.logsumexp(lp, keepdims=True)
        top = []
        n = min(self._top_n or 0, lp.shape[-1])
        if n > 0:
            idx = mx.argpartition(-lp, kth=n - 1)[:n]
            pairs = sorted(
                zip(arrays.floats(lp[idx]), arrays.ints(idx), strict=True),
                key=lambda p: (-p[0], p[1]),
            )
            top = [self._alternative(i, v) for v, i in pairs]
        entry = self._alternative(token, arrays.scalar(lp[token]))
        entry["top_logprobs"] = top
        return entry

    def _alternative(self, token: int, logprob: float) -> dict:
        text, raw = self._token_text(token)
        return {"token": text, "logprob": max(logprob, MIN_LOGPROB), "bytes": list(raw)}

    def _token_text(self, token: int) -> tuple[str, list[int]]:
        """A single token's text and raw bytes (partial UTF-8 shows in bytes, U+FFFD in text)."""
        if token in self._token_info:
            return self._token_info[token]
        if self._token_kind is None:
            self._token_kind = _token_kind(self._tok, self._detok)
            added = getattr(self._tok, "added_tokens_decoder", None) or {}
            self._added = {i: t.content for i, t in added.items()}
        raw = None
        if token in self._added:
            raw = self._added[token].encode("utf-8")
        elif self._token_kind == "spm" and token < len(self._detok.tokenmap):
            raw = self._detok.tokenmap[token].replace(_SPM_SPACE, b" ")
        elif self._token_kind == "byte_level":
            piece = self._tok.convert_ids_to_tokens(token)
            if piece is not None:
                table = _byte_decoder()
                raw = b"".join(
                    bytes([table[c]]) if c in table else c.encode("utf-8") for c in piece
                )
        if raw is None:  # unknown tokenizer family, or an id beyond the vocab (padded)
            if self._vocab is None:
                self._vocab = seam_tokenizer.vocab_size(self._tok)
            raw = self._tok.decode([token]).encode("utf-8") if token < self._vocab else b""
        info = (raw.decode("utf-8", errors="replace"), list(raw))
        self._token_info[token] = info
        return info


def _token_kind(tokenizer: Any, detok: Any) -> str:
    """How to get a token's raw bytes: "byte_level" (GPT-2 byte map), "spm" or "decode"."""
    if isinstance(detok, SPMStreamingDetokenizer):
        return "spm"
    if isinstance(detok, BPEStreamingDetokenizer):
        return "byte_level"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and isinstance(backend.decoder, hf_decoders.ByteLevel):
        return "byte_level"
    return "decode"


@cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, char -> byte (github.com/openai/gpt-2 src/encoder.py)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + n): b for n, b in enumerate(others)})
    return table
