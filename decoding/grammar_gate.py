"""When a request's constraint starts: after the reasoning, and (lazy grammars) at a trigger.

A `ConstraintProcessor` (`decoding.grammar`) may hold a gate. While the gate is closed the
constraint is dormant: the row's logits go through unchanged (not the EOS-only mask of a
finished grammar) and the generated tokens are not fed to the grammar. The gate sees every
generated token first (`feed`) and hands on those the grammar must consume from its
opening on.

- `ReasoningGate`: closed while the sequence is inside a think block (the prompt left one
  open: the job's `initial_state`, or the model opened one with its first token), open from
  the token after the end marker on (a marker forced by the reasoning budget counts alike).
  vLLM does the same with a reasoning parser: `vllm/v1/structured_output/__init__.py`,
  `StructuredOutputManager.should_advance` / `should_fill_bitmask` skip a request until its
  reasoner's `is_reasoning_end` sets `reasoning_ended`; its `enable_in_reasoning` setting is
  our `grammar_scope:all`.
- `TriggerGate`: llama.cpp's lazy grammars (`common/sampling.cpp`, `grammar_lazy` with
  trigger words): free text until one of the words appears in the decoded output; then
  the text from the word's first byte on is fed to the grammar (so the grammar must match
  the word itself, as in llama.cpp) and the grammar constrains the rest. Own code rather
  than llguidance's lazy support (Lark `lazy` lexemes, sugared as `llguidance.StructTag`,
  `_struct_tag.py`): that is a Lark grammar of free text and tags that returns to free text
  after each tag's end, so it would mean rewriting each request's GBNF or JSON schema into
  a new Lark grammar per trigger set (no reuse of the per-source compile cache) and still
  differ from llama.cpp, whose lazy grammar holds the whole rest once triggered.
- `ChainGate`: open once all of its gates are open, each fed what the one before passes on
  (reasoning first, then the trigger in the answer).

Pure Python on token ids and bytes; no MLX. Not thread-safe: one gate per sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

__all__ = ["ChainGate", "Gate", "MarkerText", "ReasoningGate", "TriggerGate"]

# ReasoningGate states.
_INSIDE = "inside"  # in a think block: dormant
_MAYBE = "maybe"  # nothing generated yet: the grammar masks, the think start is allowed too
_OPEN = "open"


class Gate(Protocol):
    @property
    def open(self) -> bool:
        """Whether the grammar masks the next token (else the row is left alone)."""

    @property
    def extra(self) -> int | None:
        """A token id allowed beside the grammar's mask at the next step (or None)."""

    def feed(self, tokens: Sequence[int]) -> list[int]:
        """Take the newly generated tokens; return those the grammar must consume."""


class MarkerText:
    """Finds a marker in decoded text, however the model split it into tokens.

    The output pipeline routes reasoning by text (`decoding.output`), so the gates must
    too: a model may end its think block with ` </think>` (a space token, then the marker
    in other tokens than the template's) and the text still says the block ended.
    `push(token)` decodes one token and returns None while no marker has appeared, else
    the bytes after the first one's end (the rest of the token that completed it); for a
    marker in `kept` (one that ends reasoning and stays in the text that follows, as a
    reasoning format's `ends_reasoning`: Qwen3's `<tool_call>`), the marker's bytes too.
    """

    def __init__(
        self,
        marker: str | Sequence[str],
        decode: Callable[[list[int]], bytes],
        kept: Sequence[str] = (),
    ) -> None:
        names = [marker] if isinstance(marker, str) else list(marker)
        self._markers = [(m.encode("utf-8"), False) for m in names if m]
        self._markers += [(m.encode("utf-8"), True) for m in kept if m]
        if not self._markers or len(self._markers) != len(names) + len(tuple(kept)):
            raise ValueError("a marker needs at least one character")
        self._longest = max(len(m) for m, _ in self._markers)
        self._decode = decode
        self._text = b""

    def push(self, token: int) -> bytes | None:
        self._text += self._decode([int(token)])
        found = [(at, m, keep) for m, keep in self._markers if (at := self._text.find(m)) >= 0]
        if found:
            at, marker, keep = min(found, key=lambda f: (f[0], -len(f[1])))
            tail = self._text[at if keep else at + len(marker) :]
            self._text = b""
            return tail
        self._text = self._text[-(self._longest - 1) :] if self._longest > 1 else b""
        return None


class ReasoningGate:
    """Closed inside a think block; `start` / `end`: the think markers' token ids.

    inside: the prompt left a think block open (`output.initial_state_for` says
    "reasoning"). Otherwise the grammar masks from the first token, but a one-token
    `start` is allowed beside it there (`extra`): the model may still open a think block,
    and then the gate closes until `end`. After the end marker the gate stays open.

    With `end_text`, `decode` and `encode` (token ids -> bytes, bytes -> ids, as
    `TriggerGate` takes them) the end marker is found in the decoded text (`MarkerText`),
    as the output pipeline finds it, not only as the token sequence `end`; text after the
    marker in the token that completed it is handed on re-tokenized by `encode`.
    `end_text` may name several spellings (the reasoning format's `end` and `other_ends`);
    `kept_text`: markers that end the block and belong to what follows (its
    `ends_reasoning`), handed on with the text after them.
    Raises ValueError for an empty `end`.
    """

    def __init__(
        self,
        start: Sequence[int],
        end: Sequence[int],
        inside: bool,
        *,
        end_text: str | Sequence[str] = "",
        decode: Callable[[list[int]], bytes] | None = None,
        encode: Callable[[bytes], list[int]] | None = None,
        kept_text: Sequence[str] = (),
    ) -> None:
        if not end:
            raise ValueError("the end-of-thinking marker must have at least one token")
        self._start = tuple(int(t) for t in start)
        self._end = tuple(int(t) for t in end)
        self._recent: list[int] = []
        self._decode = decode
        texts = [end_text] if isinstance(end_text, str) else list(end_text)
        usable = decode is not None and encode is not None
        self._end_text = tuple(t for t in texts if t) if usable else ()
        self._kept_text = tuple(t for t in kept_text if t) if usable else ()
        self._encode = encode
        self._text: MarkerText | None = None
        self._state = _MAYBE if len(self._start) == 1 else _OPEN
        if inside:
            self._enter()

    @property
    def open(self) -> bool:
        return self._state != _INSIDE

    @property
    def extra(self) -> int | None:
        return self._start[0] if self._state == _MAYBE else None

    @property
    def in_reasoning(self) -> bool:
        """Whether the sequence is inside a think block (the gate closed by it)."""
        return self._state == _INSIDE

    def feed(self, tokens: Sequence[int]) -> list[int]:
        out: list[int] = []
        for token in tokens:
            if self._state == _OPEN:
                out.append(token)
            elif self._state == _MAYBE:
                if token == self._start[0]:
                    self._enter()
                else:
                    self._state = _OPEN
                    out.append(token)
            else:
                self._recent = [*self._recent, token][-len(self._end) :]
                if tuple(self._recent) == self._end:
                    self._state = _OPEN
                    continue
                if self._text is not None:
                    tail = self._text.push(token)
                    if tail is not None:
                        self._state = _OPEN
                        if tail and self._encode is not None:
                            out += self._encode(tail)
        return out

    def _enter(self) -> None:
        self._state = _INSIDE
        self._recent = []
        if (self._end_text or self._kept_text) and self._decode is not None:
            self._text = MarkerText(self._end_text, self._decode, self._kept_text)


class TriggerGate:
    """Closed until one of `words` appears in the decoded output (llama.cpp's lazy grammar).

    decode: token ids -> their bytes; encode: bytes -> token ids (any tokenization the
    grammar's tokenizer reads back to those bytes). On the trigger, `feed` returns the
    tokens of the text from the word's first byte through the token that completed it,
    followed by the tokens after that one. Raises ValueError when no word is non-empty.
    """

    def __init__(
        self,
        words: Sequence[str],
        decode: Callable[[list[int]], bytes],
        encode: Callable[[bytes], list[int]],
    ) -> None:
        self._words = tuple(w.encode("utf-8") for w in words if w)
        if not self._words:
            raise ValueError("a lazy grammar needs at least one non-empty trigger word")
        self._keep = max(len(w) for w in self._words) - 1  # bytes a word may span back
        self._decode, self._encode = decode, encode
        self._text = b""
        self._open = False

    @property
    def open(self) -> bool:
        return self._open

    @property
    def extra(self) -> int | None:
        return None

    def feed(self, tokens: Sequence[int]) -> list[int]:
        if self._open:
            return list(tokens)
        for n, token in enumerate(tokens):
            self._text += self._decode([int(token)])
            hits = [i for i in (self._text.find(w) for w in self._words) if i >= 0]
            if hits:
                self._open = True
                tail = self._text[min(hits) :]
                self._text = b""
                return [*self._encode(tail), *tokens[n + 1 :]]
            self._text = self._text[-self._keep :] if self._keep else b""
        return []


class ChainGate:
    """Gates in order: each is fed what the one before passes on; open once all are."""

    def __init__(self, gates: Sequence[Gate]) -> None:
        self._gates = tuple(gates)

    @property
    def open(self) -> bool:
        return all(g.open for g in self._gates)

    @property
    def extra(self) -> int | None:
        if not self.open:
            return None
        return next((g.extra for g in self._gates if g.extra is not None), None)

    @property
    def gates(self) -> tuple[Gate, ...]:
        return self._gates

    def feed(self, tokens: Sequence[int]) -> list[int]:
        out = list(tokens)
        for gate in self._gates:
            out = gate.feed(out)
        return out
