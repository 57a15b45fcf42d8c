"""Splitting decoded text into per-state segments at marker and stop strings: the state
machine of the output pipeline (`decoding.output`) and of a reasoning format's whole-text
split (`decoding.reasoning_formats`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Segment", "TextRouter"]


@dataclass(frozen=True)
class Segment:
    """Text of one state; `marker` is the string that ended it (None: still open)."""

    state: str
    text: str
    marker: str | None = None
    next_state: str | None = None  # with a marker: the state entered; None means a stop matched


class TextRouter:
    """Splits decoded text into per-state segments at marker and stop strings.

    `edges` maps state -> [(pattern, next state or None for stop)], the shape mlx-lm's
    `make_text_state_machine` builds. Differs from `TextStateMachine`: it holds back only the
    longest suffix that is a prefix of a pattern (TextStateMachine holds until its automaton
    returns to the root, e.g. all of "aaaa" for "ab"), and stop is a terminal state.
    """

    def __init__(self, edges: Mapping[str, Sequence[tuple]], state: str):
        # (pattern, next state[, keep]): keep leaves the pattern as text of the next state
        # (a reasoning format's `ends_reasoning` marker, then read by that state's edges).
        self._edges = {s: tuple((e[0], e[1]) for e in es if e[0]) for s, es in edges.items()}
        self._keep = {(s, *e[:2]) for s, es in edges.items() for e in es if len(e) > 2 and e[2]}
        for _, pattern, dst in self._keep:  # a kept marker kept again would loop forever
            if any((dst, pattern, d) in self._keep for p, d in self._edges.get(dst, ())):
                raise ValueError(f"marker {pattern!r} is kept again in state {dst!r}")
        self.state: str | None = state
        self._held = ""

    def push(self, text: str) -> list[Segment]:
        buf, pos, segments = self._held + text, 0, []
        while self.state is not None:
            hit = self._first_match(buf, pos)
            if hit is None:
                break
            start, pattern, dst = hit
            segments.append(Segment(self.state, buf[pos:start], pattern, dst))
            keep = (self.state, pattern, dst) in self._keep
            pos, self.state = (start if keep else start + len(pattern)), dst
        if self.state is None:  # stopped: text after the stop string is dropped
            self._held = ""
            return segments
        cut = len(buf) - self._partial_suffix(buf, pos)
        segments.append(Segment(self.state, buf[pos:cut]))
        self._held = buf[cut:]
        return segments

    def flush(self) -> str:
        """Release the held text (at the end it can no longer complete a match)."""
        held, self._held = self._held, ""
        return held

    def _current_edges(self) -> tuple[tuple[str, str | None], ...]:
        return self._edges.get(self.state, ()) if self.state is not None else ()

    def _first_match(self, buf: str, pos: int) -> tuple[int, str, str | None] | None:
        best = None
        for pattern, dst in self._current_edges():
            start = buf.find(pattern, pos)
            if start >= 0:
                key = (start + len(pattern), start)  # ends first, then longest
                if best is None or key < best[0]:
                    best = (key, pattern, dst)
        return None if best is None else (best[0][1], best[1], best[2])

    def _partial_suffix(self, buf: str, pos: int) -> int:
        patterns = [p for p, _ in self._current_edges()]
        longest = min(max((len(p) for p in patterns), default=1) - 1, len(buf) - pos)
        for k in range(longest, 0, -1):
            tail = buf[-k:]
            if any(p.startswith(tail) for p in patterns):
                return k
        return 0
