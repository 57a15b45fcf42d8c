"""Splitting decoded text into per-state segments at marker and stop strings: the state
machine of the output pipeline (`decoding.output`) and of a reasoning format's whole-text
split (`decoding.reasoning_formats`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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

    def __init__(
        self,
        edges: Mapping[str, Sequence[tuple]],
        state: str,
        content_start: Sequence[str] = (),
        content_start_after: Sequence[str] = (),
        content_state: str = "normal",
        is_block: Callable[[str | None], bool] = lambda state: False,
    ):
        # (pattern, next state[, keep]): keep leaves the pattern as text of the next state
        # (a reasoning format's `ends_reasoning` marker, then read by that state's edges).
        self._edges = {s: tuple((e[0], e[1]) for e in es if e[0]) for s, es in edges.items()}
        self._keep = {(s, *e[:2]) for s, es in edges.items() for e in es if len(e) > 2 and e[2]}
        for _, pattern, dst in self._keep:  # a kept marker kept again would loop forever
            if any((dst, pattern, d) in self._keep for p, d in self._edges.get(dst, ())):
                raise ValueError(f"marker {pattern!r} is kept again in state {dst!r}")
        self.state: str | None = state
        self._held = ""
        # A tool format's markers that count only before any content (pythonic's "["), or
        # right after one of content_start_after; is_block: the states of tool blocks.
        self._content_start = frozenset(content_start)
        self._after = tuple(content_start_after)
        self._content_state = content_state
        self._is_block = is_block
        self._content_tail = ""  # the end of the content so far (stripped of whitespace)
        self._content_seen = False

    def push(self, text: str) -> list[Segment]:
        buf, pos, segments = self._held + text, 0, []
        while self.state is not None:
            hit = self._first_match(buf, pos)
            if hit is None:
                break
            start, pattern, dst = hit
            segments.append(Segment(self.state, buf[pos:start], pattern, dst))
            self._saw(segments[-1])
            keep = (self.state, pattern, dst) in self._keep
            pos, self.state = (start if keep else start + len(pattern)), dst
        if self.state is None:  # stopped: text after the stop string is dropped
            self._held = ""
            return segments
        cut = len(buf) - self._partial_suffix(buf, pos)
        segments.append(Segment(self.state, buf[pos:cut]))
        self._saw(segments[-1])
        self._held = buf[cut:]
        return segments

    def _saw(self, seg: Segment) -> None:
        """Note the content passed (for content_start markers)."""
        if not self._content_start:
            return
        if seg.state == self._content_state and seg.text.strip():
            self._content_seen = True
            self._content_tail = (self._content_tail + seg.text).rstrip()[-64:]
        if seg.state == self._content_state == seg.next_state and seg.marker:
            self._content_seen = True
            self._content_tail = (self._content_tail + seg.marker)[-64:]
        if self._is_block(seg.next_state):  # one list of calls: no second block
            self._content_seen, self._content_tail = True, ""

    def _anchored_at(self, buf: str, pos: int, pattern: str) -> int:
        """Where a content_start marker opens a block in buf[pos:], or -1: before any
        content, or right after a content_start_after marker (whitespace aside), and not
        where a longer marker starting with it matches or may still match."""
        i = buf.find(pattern, pos)
        while i >= 0:
            before = (self._content_tail + buf[pos:i]).rstrip()
            at_start = not self._content_seen and not before
            if (at_start or (self._after and before.endswith(self._after))) and not any(
                p != pattern and p.startswith(pattern) and p.startswith(buf[i : i + len(p)])
                for p, _ in self._current_edges()
            ):
                return i
            i = buf.find(pattern, i + 1)
        return -1

    def flush(self) -> str:
        """Release the held text (at the end it can no longer complete a match)."""
        held, self._held = self._held, ""
        return held

    def _current_edges(self) -> tuple[tuple[str, str | None], ...]:
        return self._edges.get(self.state, ()) if self.state is not None else ()

    def _first_match(self, buf: str, pos: int) -> tuple[int, str, str | None] | None:
        best = None
        for pattern, dst in self._current_edges():
            if self.state == self._content_state and pattern in self._content_start:
                start = self._anchored_at(buf, pos, pattern)
            else:
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
