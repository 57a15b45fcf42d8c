"""Engine events -> LocalAI's protobuf replies (the edge's `to_pb`).

`Accumulator` joins one request's events: Predict's single reply and each streamed
reply are built from the same events, so the joined stream equals Predict's reply.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import backend_pb2
from decoding.tool_calls import ToolCall, ToolCallDelta, merge_tool_call_deltas
from engine.jobs import Event


class Accumulator:
    """Joins a request's events; builds Predict's reply and each streamed reply.

    Usage and timings ride on every streamed reply (LocalAI overwrites usage per chunk);
    the final streamed reply also carries the whole logprobs list (LocalAI keeps the last).
    """

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: list = []
        self.logprobs: list[dict] = []
        self.last: Event | None = None

    def add(self, event: Event) -> None:
        d = event.delta
        self.content.append(d.content)
        self.reasoning.append(d.reasoning)
        self.tool_calls.extend(d.tool_calls)
        self.logprobs.extend(d.logprobs)
        self.last = event

    def _usage(self, event: Event) -> dict:
        return dict(
            tokens=event.tokens,
            prompt_tokens=event.prompt_tokens,
            timing_prompt_processing=event.prompt_ms,
            timing_token_generation=event.generation_ms,
        )

    def stream_reply(self, event: Event) -> backend_pb2.Reply:
        d = event.delta
        entries = self.logprobs if event.final else list(d.logprobs)
        return backend_pb2.Reply(
            message=d.content.encode("utf-8"),
            chat_deltas=[_chat_delta(d.content, d.reasoning, d.tool_calls)] if d else [],
            logprobs=_logprobs_json(entries),
            **self._usage(event),
        )

    def final_reply(self) -> backend_pb2.Reply:
        content, reasoning = "".join(self.content), "".join(self.reasoning)
        return backend_pb2.Reply(
            message=content.encode("utf-8"),
            chat_deltas=[_chat_delta(content, reasoning, merge_tool_call_deltas(self.tool_calls))],
            logprobs=_logprobs_json(self.logprobs),
            **(self._usage(self.last) if self.last else {}),
        )


def _chat_delta(
    content: str, reasoning: str, tool_calls: Iterable[ToolCall | ToolCallDelta]
) -> backend_pb2.ChatDelta:
    return backend_pb2.ChatDelta(
        content=content,
        reasoning_content=reasoning,
        tool_calls=[
            backend_pb2.ToolCallDelta(index=t.index, id=t.id, name=t.name, arguments=t.arguments)
            for t in tool_calls
            if not getattr(t, "dropped", False)  # a withdrawn call: the proto cannot say so
        ],
    )


def _logprobs_json(entries: list[dict]) -> bytes:
    return json.dumps({"content": entries}).encode("utf-8") if entries else b""
