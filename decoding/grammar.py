"""Constrained decoding: GBNF grammars and JSON schemas as per-request logits processors.

Owns validating and compiling a `Constraint` (read from the request by
`parsing/constraint.py`) against the model's tokenizer (cached: one compile serves the
check before queueing and every sequence after it), and the per-sequence logits processor
that masks every token the grammar forbids. Nothing here is global per request: each
processor owns its own matcher, so constrained and unconstrained sequences decode together
in one batch; there `batch.logits` fills all rows' masks in one call of llguidance's
thread pool (`fill_masks`) and applies them as one stacked mask.

Engine: llguidance (guidance-ai/llguidance, Rust, MIT). Measured against xgrammar 0.2.9 on
this 2-core CPU with SmolLM2's 49,152-token vocabulary:
  - install: llguidance is one 3 MB wheel (7.6 MB installed, ~1.4 s) with no dependencies;
    xgrammar's wheel hard-requires torch (+ triton and ~2.2 GB of CUDA wheels on Linux x86),
    about 2.8 GB to download, and `import xgrammar` fails without torch.
  - GBNF: llguidance reads llama.cpp GBNF (and Lark); xgrammar rejects llama.cpp's own
    json.gbnf (`ws ::= | " " | ...`: an empty first alternative).
  - mask cost per token: llguidance 15-45 us for JSON schema and JSON GBNF; xgrammar
    15 us for JSON schema but 65-100 ms for the JSON GBNF.
  - MLX: neither applies masks on MLX's CPU backend (llguidance.mlx is a Metal kernel),
    so the bitmask is unpacked with numpy and applied with one `mx.where` (~0.1 ms).

Everything a processor does runs on the engine's MLX thread; compilation may run on any
thread (the caches take a lock only around lookups, never while compiling).

Bounds (measured on this 2-core CPU, llguidance 1.9.1): a 1 MB GBNF grammar of 100,000
alternatives costs 1.5 s in the pure-Python GBNF-to-Lark converter (holding the GIL), 8.9 s
to validate and 9.2 s to compile against SmolLM2's tokenizer, and then fails with a Rust
panic (`grammar.symbols.len() < u16::MAX`) carrying a backtrace. So every constraint is
first held to cheap bounds (`parsing.constraint`: every `Constraint` obeys them by
construction), then validated off the event loop (`compile_constraint`, in the prepare step on its
worker pool, with a time bound; llguidance's compile drops the GIL: a 30,000
alternative validation in a thread left the main thread's 1 ms sleeps at most 4 ms apart).
Error texts are one line without panic or backtrace text (`clean_error`).
"""

from __future__ import annotations

import copy
import hashlib
import logging
import re
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import llguidance
import mlx.core as mx
import numpy as np
from llguidance.numpy import fill_next_token_bitmask_par

from decoding import arrays, reasoning_formats
from decoding.finish import FinishReason
from decoding.grammar_gate import ChainGate, Gate, ReasoningGate, TriggerGate
from errors import BackendError, FailedPrecondition, InvalidArgument, ResourceExhausted
from parsing.constraint import TOOLS_FIELD, Constraint
from parsing.options import GRAMMAR_SCOPES

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # declared in its stubs only

logger = logging.getLogger("localai.mlx." + __name__)

# JSON output on one line in json.dumps' default style (", " and ": "), which models see
# most. Flexible whitespace would let a sampled small model emit newlines until max_tokens.
# A schema's own "x-guidance" options override these.
JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
COMPILED_CACHE_SIZE = 64  # compiled grammars kept per tokenizer (LRU)

# Steps of the validation walk (see `_walk`): bytes fed to the grammar after its first mask.
VALIDATE_WALK_BYTES = 8
# Time bound (seconds) of compiling one request's constraint (`engine.prepare`).
VALIDATE_TIMEOUT_S = 10.0
# Validations remembered (by kind and source digest), so a repeated grammar costs nothing.
VALIDATED_CACHE_SIZE = 256
# Longest error text taken from llguidance (characters); the rest is cut.
MAX_ERROR_CHARS = 400

_lock = threading.Lock()  # guards the module's caches; never held while compiling or building

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


# Markers after which llguidance error texts carry internals: a backtrace, parser state,
# the grammar listing.
_ERROR_TAIL = re.compile(r"<backtrace>|stack backtrace:|<state>|<grammar>|\nnote: run with")
_LISTING_LINE = re.compile(r"^\s*(\d+\s*\|.*|\^+\s*)$")  # "  3 | start: ..." and "   ^"


def clean_error(message: str) -> str:
    """One line of an llguidance/converter error: no panic, backtrace, state or listing.

    Keeps the message's own lines (joined by spaces), drops everything from a backtrace,
    `<state>` or `<grammar>` marker on, grammar listing lines ("3 | ...") and caret lines;
    a Rust panic ("panic: X" or "thread ... panicked at ...: X") becomes "internal error: X".
    At most MAX_ERROR_CHARS characters; "unknown error" when nothing is left.
    """
    text = str(message)
    tail = _ERROR_TAIL.search(text)
    if tail is not None:
        text = text[: tail.start()]
    lines = []
    for line in text.splitlines():
        line = line.strip()
        if not line or _LISTING_LINE.match(line):
            continue
        if line.startswith("thread ") and " panicked at " in line:
            continue  # "thread 'x' panicked at src/file.rs:1:2:"; the reason follows
        lines.append(line)
    text = " ".join(" ".join(lines).split())
    panicked = text.startswith("panic:") or "panicked" in str(message)
    text = re.sub(r"^panic:\s*", "", text)
    if panicked:
        text = f"internal error: {text}" if text else "internal error"
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 1].rstrip() + "…"
    return text or "unknown error"


def _to_llguidance(constraint: Constraint) -> str:
    """The llguidance grammar for a constraint; ValueError naming the field if it fails."""
    try:
        if constraint.kind == "gbnf":
            return llguidance.grammar_from("gbnf", constraint.source)
        if constraint.kind == "lark":
            return llguidance.grammar_from("lark", constraint.source)
        return llguidance.LLMatcher.grammar_from_json_schema(
            constraint.source, defaults=JSON_OPTIONS
        )
    except RecursionError:
        raise ValueError(
            f"{constraint.field} nests too deeply: split the {_what(constraint)} into "
            "smaller named parts"
        ) from None
    except Exception as err:  # the GBNF converter is pure Python and raises many types
        raise ValueError(
            f"{constraint.field} is not a valid {_what(constraint)}: {clean_error(str(err))}"
        ) from None


def _what(constraint: Constraint) -> str:
    if constraint.kind == "lark":
        return "tool-call grammar (built from the tools' JSON schemas)"
    return "GBNF grammar" if constraint.kind == "gbnf" else "JSON schema"


def _matcher_error(constraint: Constraint, matcher: llguidance.LLMatcher) -> ValueError | None:
    """The ValueError for a matcher in its error state (None when it is not)."""
    if not matcher.is_error():
        return None
    message = matcher.get_error() or ""
    if message.startswith("NoExtensionBias") and not matcher.is_accepting():
        # llguidance stops with "NoExtensionBias" when no byte can start a match.
        return ValueError(
            f"{constraint.field}: the {_what(constraint)} matches no string (not even the "
            "empty one), so no output could satisfy it: check its rules, e.g. a rule "
            "defined only by itself such as `root ::= root`"
        )
    return ValueError(
        f"{constraint.field} is not a valid {_what(constraint)}: {clean_error(message)}"
    )


class _ByteTokens:
    """A 257-token vocabulary: the 256 bytes and an end token; what validation compiles to.

    Own code because llguidance needs some tokenizer to run a grammar's first step, and
    any model tokenizer costs ~2 s to build; with single bytes, a grammar whose first
    step allows nothing is exactly one that matches no string.
    """

    eos_token_id = 256
    bos_token_id = None
    tokens: ClassVar[list[bytes]] = [bytes([i]) for i in range(256)] + [b"<end>"]
    special_token_ids: ClassVar[list[int]] = [256]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


_byte_tokenizer: llguidance.LLTokenizer | None = None


def _validation_tokenizer() -> llguidance.LLTokenizer:
    global _byte_tokenizer
    with _lock:
        if _byte_tokenizer is None:
            _byte_tokenizer = llguidance.LLTokenizer(
                llguidance.TokenizerWrapper(_ByteTokens()), slices=[]
            )
        return _byte_tokenizer


_validated: OrderedDict[tuple[str, bytes], None] = OrderedDict()


def _validate(constraint: Constraint) -> None:
    """Compile `constraint` for bytes and run its first step; ValueError if it fails.

    Bounded by the size checks every `Constraint` passed when built; takes ~0.3 s for a
    grammar at MAX_GRAMMAR_BYTES, well under 1 ms for usual ones. Remembers successes
    (VALIDATED_CACHE_SIZE), so repeated constraints cost one hash.
    """
    key = (constraint.kind, hashlib.sha256(constraint.source.encode("utf-8", "replace")).digest())
    with _lock:
        if key in _validated:
            _validated.move_to_end(key)
            return
    matcher = llguidance.LLMatcher(_validation_tokenizer(), _to_llguidance(constraint), log_level=0)
    error = _matcher_error(constraint, matcher)
    if error is not None:
        raise error
    _walk(constraint, matcher)
    for message in matcher.get_grammar_warnings():
        logger.warning("%s: %s", constraint.field, clean_error(message))
    with _lock:
        _validated[key] = None
        if len(_validated) > VALIDATED_CACHE_SIZE:
            _validated.popitem(last=False)


def _walk(constraint: Constraint, matcher: llguidance.LLMatcher, vocab: int = 256) -> None:
    """Run the first VALIDATE_WALK_BYTES steps, always taking the lowest allowed token
    (a byte, or a token of a vocabulary of `vocab` ids). Consumes `matcher`'s state.

    The first step finds a grammar that matches no string; the next ones find limits that
    llguidance only meets while parsing, e.g. a rule with more than 2,000 alternatives
    ("Current row has N items; max is 2000"), which would otherwise fail mid-generation.
    """
    for step in range(VALIDATE_WALK_BYTES):
        allowed = np.unpackbits(
            np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little"
        )[:vocab]
        if matcher.is_error():
            if step > 0 and matcher.get_error().startswith("NoExtensionBias"):
                return  # a dead branch deeper in: other bytes may still lead somewhere
            error = _matcher_error(constraint, matcher)
            if error is not None:
                raise error
        nonzero = np.flatnonzero(allowed)
        if nonzero.size == 0 or matcher.is_stopped():
            return
        matcher.consume_token(int(nonzero[0]))
        if matcher.is_error():
            raise _matcher_error(constraint, matcher)  # type: ignore[misc]


def compile_constraint(constraint: Constraint | None, tokenizer: Any = None) -> None:
    """Validate a constraint read by `parsing.constraint.read_constraint` (the prepare
    step's, `engine.prepare`, on its worker pool; llguidance drops the GIL while compiling).

    Checks: the grammar or schema compiles, and it matches at least one string. With
    `tokenizer` (the loaded model's), it is compiled for that tokenizer and kept, so the
    sequence's processor (`make_constraint_processor`) reuses that one compile; without,
    it is compiled for single bytes. None is accepted and does nothing. The prepare step
    bounds its time (`timeout_error`).

    Raises ValueError naming `constraint.field`: invalid, matching no string, or not a
    fast tokenizer.
    """
    if constraint is None:
        return
    if tokenizer is None:
        _validate(constraint)
    else:
        _compiled_matcher(constraint, tokenizer)


def timeout_error(constraint: Constraint, timeout_s: float) -> ValueError:
    """The error of a constraint not compiled within ``timeout_s`` seconds."""
    return ValueError(
        f"{constraint.field}: the {_what(constraint)} did not compile within "
        f"{timeout_s:g} s: simplify it"
    )


# --- compiling, cached per tokenizer -----------------------------------------------------


class _Compiled:
    """One tokenizer's llguidance tokenizer (~2 s to build) and its compiled grammars."""

    def __init__(self, tokenizer: Any) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ValueError(
                "constrained decoding needs a fast (Hugging Face `tokenizers`) tokenizer; "
                f"this model's is {type(tokenizer).__name__}"
            )
        backend = copy.copy(backend)  # as llguidance.hf does: no padding or truncation
        backend.no_padding()
        backend.no_truncation()
        self.eos_ids = _eos_ids(tokenizer)
        start = time.perf_counter()
        self.llg_tokenizer = llguidance.LLTokenizer(
            backend.to_str(), eos_token=self.eos_ids or None
        )
        logger.info(
            "llguidance tokenizer ready: %d tokens, EOS %s, %.2fs",
            self.llg_tokenizer.vocab_size,
            self.eos_ids,
            time.perf_counter() - start,
        )
        self.matchers: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()


def _eos_ids(tokenizer: Any) -> list[int]:
    first = getattr(tokenizer, "eos_token_id", None)
    ids = [int(first)] if first is not None else []
    ids += sorted(int(i) for i in getattr(tokenizer, "eos_token_ids", None) or () if i != first)
    return ids


_by_tokenizer: weakref.WeakKeyDictionary[Any, _Compiled] = weakref.WeakKeyDictionary()
_building: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()


def _compiled_for(tokenizer: Any) -> _Compiled:
    """The tokenizer's `_Compiled`, built once (~2 s) under a lock of its own: `_lock` is
    never held while building, so validations of other requests go on meanwhile."""
    with _lock:
        compiled = _by_tokenizer.get(tokenizer)
        if compiled is not None:
            return compiled
        building = _building.setdefault(tokenizer, threading.Lock())
    with building:  # a second caller for the same tokenizer waits for the first build
        with _lock:
            compiled = _by_tokenizer.get(tokenizer)
        if compiled is None:
            compiled = _Compiled(tokenizer)
            with _lock:
                _by_tokenizer[tokenizer] = compiled
    return compiled


def warm_up(tokenizer: Any) -> None:
    """Build llguidance's view of `tokenizer` now (~2 s for SmolLM2's 49k vocabulary).

    Optional: call it after loading a model, so the first constrained request does not
    stall the decode loop that long. Raises ValueError if the tokenizer is not a fast one.
    """
    _compiled_for(tokenizer)


def llg_tokenizer(tokenizer: Any) -> llguidance.LLTokenizer:
    """llguidance's view of `tokenizer` (built once per tokenizer, `warm_up`); ValueError
    when it is not a fast tokenizer."""
    return _compiled_for(tokenizer).llg_tokenizer


def _compiled_matcher(
    constraint: Constraint, tokenizer: Any
) -> tuple[llguidance.LLMatcher, _Compiled]:
    """A fresh matcher for `constraint` (a copy of the cached compiled one) and its cache."""
    key = (constraint.kind, constraint.source)
    try:
        compiled = _compiled_for(tokenizer)
    except ValueError as err:
        raise ValueError(f"{constraint.field}: {err}") from None
    with _lock:
        template = compiled.matchers.get(key)
        if template is not None:
            compiled.matchers.move_to_end(key)
            return template.deep_copy(), compiled
    # Compiled without the lock (llguidance drops the GIL), so a long compile on one
    # thread never stalls another thread's cache hits.
    start = time.perf_counter()
    template = llguidance.LLMatcher(compiled.llg_tokenizer, _to_llguidance(constraint), log_level=0)
    logger.debug(
        "compiled %s from %s in %.1f ms",
        constraint.kind,
        constraint.field,
        1e3 * (time.perf_counter() - start),
    )
    error = _matcher_error(constraint, template)
    if error is not None:
        raise error
    _walk(constraint, template.deep_copy(), compiled.llg_tokenizer.vocab_size)
    for warning in template.get_grammar_warnings():
        logger.warning("%s: %s", constraint.field, clean_error(warning))
    with _lock:
        compiled.matchers[key] = template
        compiled.matchers.move_to_end(key)
        if len(compiled.matchers) > COMPILED_CACHE_SIZE:
            compiled.matchers.popitem(last=False)
    return template.deep_copy(), compiled


# --- the per-request processor -----------------------------------------------------------


class ConstraintProcessor:
    """Logits processor for one sequence: (tokens (T,) or (1, T) int, logits (1, V)) -> (1, V).

    Follows mlx-lm's contract (`GenerationBatch._step` via `TokenBuffer`, and
    `generate_step`): the first call sees the prompt (all of it, or the part not in a
    cached prefix); each later call sees the same context plus the tokens sampled since.
    The first call only records the context length; later calls feed the new tokens to
    the matcher. Disallowed tokens get -inf; once the grammar is complete only the EOS
    ids keep their logits (all set to 0 if an earlier processor, e.g. ignore_eos, had
    banned every one of them).
    Ids beyond the tokenizer's vocabulary (padded embedding rows) are always banned.

    A matcher that fails after the start (one of llguidance's limits met while parsing,
    e.g. "Current row has 2011 items; max is 2000", or a token it rejects) never raises
    here, which would end every sequence of the batch: `failure` then says why, in one
    line naming the request field, and only EOS is allowed from then on. The engine
    checks `failure` after every step and ends the request with that error, never with
    a "successful" reply that breaks its constraint.

    With a `gate` (`decoding.grammar_gate`: after the reasoning, lazy triggers) the
    constraint is dormant until the gate opens: logits pass unchanged and the generated
    tokens go to the gate, which hands the grammar those it must consume.

    Not thread-safe; one instance per sequence (build it with `make_constraint_processor`).
    """

    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        eos_ids: list[int],
        vocab_size: int,
        field: str,
        gate: Gate | None = None,
    ) -> None:
        self._matcher = matcher
        self._gate = gate
        self._field = field
        self._eos = mx.array(eos_ids, dtype=mx.int32) if eos_ids else None
        self._seen: int | None = None
        self._bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
        self._consumed = 0  # generated tokens the matcher accepted
        self._generated = 0  # generated tokens seen (the gate's included)
        self.failure: str | None = None  # why the matcher failed after the start

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        flat = tokens.reshape(-1)
        # Forces the previously sampled token to the CPU: the grammar needs it now.
        self.advance(flat.shape[0], lambda start: arrays.ints(flat[start:]))
        if self.dormant:
            return logits
        if self.masking:
            self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
            self.check_mask()
        if self.masking:
            self.allow_extra(self._bits)
            return apply_bitmask(logits, self._bits)
        return self.only_eos(logits)

    # -- the steps of a call, also taken for many rows at once (`batch.logits`) -----
    @property
    def matcher(self) -> llguidance.LLMatcher:
        return self._matcher

    @property
    def words(self) -> int:
        """int32 words of its masks: (tokenizer vocabulary + 31) // 32."""
        return int(self._bits.shape[0])

    @property
    def dormant(self) -> bool:
        """Whether the constraint has not started yet (its gate is closed): the row's
        logits must pass unchanged."""
        return self.failure is None and self._gate is not None and not self._gate.open

    @property
    def masking(self) -> bool:
        """Whether the next mask comes from the grammar (else, unless `dormant`, only EOS
        is allowed: `only_eos`): started, neither failed nor finished."""
        return self.failure is None and not self.dormant and not self._matcher.is_stopped()

    def allow_extra(self, bits: np.ndarray) -> None:
        """Add the gate's extra token (a think start the model may still open) to a mask
        (words,) int32 the grammar just filled."""
        extra = self._gate.extra if self._gate is not None else None
        if extra is not None and extra < 32 * bits.shape[0]:
            bits.view(np.uint32)[extra // 32] |= np.uint32(1 << (extra % 32))

    def advance(self, length: int, fetch: Callable[[int], list[int]]) -> None:
        """The sequence's context is now ``length`` tokens; ``fetch(start)`` gives its
        tokens from ``start`` on (ints), read only when there are new ones to consume.

        Raises:
            RuntimeError: the context shrank (one processor serves one sequence).
        """
        if self._seen is None:
            self._seen = length
        elif length > self._seen:
            self._consume(fetch(self._seen))
            self._generated += length - self._seen
            self._seen = length
        elif length < self._seen:
            raise RuntimeError(
                f"token context shrank from {self._seen} to {length}: "
                "a ConstraintProcessor serves exactly one sequence"
            )

    def check_mask(self) -> None:
        """After the matcher computed a mask: record a failure if it went wrong."""
        if self._matcher.is_error():
            self._fail("the next mask")

    def only_eos(self, logits: mx.array) -> mx.array:
        """Logits (1, V) with only the EOS ids left (unchanged without EOS ids)."""
        if self._eos is None:
            return logits
        # Keep the model's preference among the EOS ids; if an earlier processor banned
        # them all (ignore_eos), the finished (or failed) grammar wins: all at logit 0.
        eos = logits[:, self._eos]
        eos = mx.where(mx.all(eos == -mx.inf), mx.zeros_like(eos), eos)
        only_eos = mx.full(logits.shape, -mx.inf, dtype=logits.dtype)
        only_eos[:, self._eos] = eos
        return only_eos

    @property
    def in_reasoning(self) -> bool:
        """Whether the constraint is still held back by an open think block."""
        gates = self._gate.gates if isinstance(self._gate, ChainGate) else (self._gate,)
        return any(isinstance(g, ReasoningGate) and g.in_reasoning for g in gates)

    def unmet(self, reason: FinishReason, last: int | None, generated: int) -> BackendError | None:
        """At the end of the sequence (finish `reason`, its last token `last`, the
        `generated` tokens it has in all): the error when the constraint was asked for and
        not applied, else None. The last token is fed first unless a call has seen it
        already (the batch computes the next step before a token is delivered). Never an
        OK reply whose text breaks what was asked (issue 41 item 2):

        - the matcher failed (on the last token too): INVALID_ARGUMENT, as `failure`;
        - the output ended (EOS, a stop sequence) inside the reasoning, so the constraint
          never engaged: FAILED_PRECONDITION naming the field (a think block cut by
          max_tokens is a "length" reply as any cut-off output);
        - a tool-call grammar cut by max_tokens inside a call: RESOURCE_EXHAUSTED naming
          PredictOptions.Tools (the streamed part of the call could not be withdrawn, and
          a cut-off call is no call). A GBNF or JSON schema output cut by max_tokens stays
          a "length" reply, as OpenAI's and llama.cpp's are.
        """
        if last is not None and self._seen is not None and self._generated < generated:
            self._consume([int(last)])
            self._generated += 1
        if self.failure is not None:
            return InvalidArgument(self.failure)
        if self.in_reasoning and reason != FinishReason.LENGTH:
            return FailedPrecondition(
                f"{self._field}: the output ended inside the reasoning (the think block was "
                "never closed), so the constraint never applied; no reply is given: raise "
                "the token limit, set Metadata reasoning_budget, or grammar_scope:all"
            )
        engaged = not self.dormant and self._consumed > 0
        if (
            self._field == TOOLS_FIELD
            and reason == FinishReason.LENGTH
            and engaged
            and not (self._matcher.is_accepting() or self._matcher.is_stopped())
        ):
            return ResourceExhausted(
                f"{self._field}: the token limit was reached inside a tool call, whose "
                "arguments are incomplete; no reply is given: raise Tokens"
            )
        return None

    def _consume(self, new_tokens: list[int]) -> None:
        if self._gate is not None and self.failure is None:
            new_tokens = self._gate.feed(new_tokens)
        for token in new_tokens:
            if self.failure is not None or self._matcher.is_stopped():
                return  # after the end (EOS, pipelined steps): nothing left to check
            if not self._matcher.consume_token(token) or self._matcher.is_error():
                self._fail(f"token {token}")
                return
            self._consumed += 1

    def _fail(self, at: str) -> None:
        """Record why the matcher failed (`failure`), once, with a warning."""
        reason = clean_error(self._matcher.get_error() or f"{at} was rejected")
        self.failure = (
            f"{self._field}: llguidance failed after {self._consumed} generated tokens: "
            f"{reason}; no reply is given, as the output would break the constraint"
        )
        logger.warning("%s", self.failure)


def apply_bitmask(logits: mx.array, bits: np.ndarray) -> mx.array:
    """Mask logits (B, V) with an llguidance bitmask (words,) int32, bit i = token i allowed.

    Vectorized: numpy unpacks the bits (little-endian words, as on x86-64 and arm64
    hosts), one `mx.where` sets the rest to -inf. Bits past V are dropped; ids past
    the mask are banned.
    """
    vocab = logits.shape[-1]
    allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[:vocab]
    if allowed.shape[0] < vocab:
        allowed = np.pad(allowed, (0, vocab - allowed.shape[0]))
    return mx.where(mx.array(allowed.astype(np.bool_)), logits, -mx.inf)


_executor: llguidance.LLExecutor | None = None


def fill_masks(processors: list[tuple[ConstraintProcessor, int]], bits: np.ndarray) -> None:
    """Compute the next mask of every (processor, row) into ``bits[row]`` ((B, words)
    int32, C-contiguous, words = (vocab + 31) // 32 of their tokenizer) in one call of
    llguidance's thread pool (``llguidance.numpy.fill_next_token_bitmask_par``), then
    record each failed one (`check_mask`). Each processor must be `masking`."""
    global _executor
    if not processors:
        return
    if _executor is None:
        _executor = llguidance.LLExecutor()
    fill_next_token_bitmask_par(_executor, [(p.matcher, row) for p, row in processors], bits)
    for p, _ in processors:
        p.check_mask()


def unmet_of(
    processors: list, reason: FinishReason, last: int | None, generated: int
) -> BackendError | None:
    """`ConstraintProcessor.unmet` of the constraint among `processors` (None without one):
    the engine's check when a sequence ends."""
    for p in processors:
        if isinstance(p, ConstraintProcessor):
            return p.unmet(reason, last, generated)
    return None


def failure_of(processors: list) -> str | None:
    """The `failure` of the `ConstraintProcessor` among `processors`, if it failed."""
    for p in processors:
        if isinstance(p, ConstraintProcessor) and p.failure is not None:
            return p.failure
    return None


#: `grammar_scope` values (`parsing.options.GRAMMAR_SCOPES`): the constraint covers the
#: answer after the reasoning (the default), or everything generated, reasoning included.
AFTER_REASONING, ALL = GRAMMAR_SCOPES


def reasoning_end_markers(tokenizer: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(markers that end a think block, markers that end it and stay in the text after)
    as the output pipeline reads them: the reasoning format's `end` and `other_ends`, and
    its `ends_reasoning` (decoding/reasoning_formats.py), else the tokenizer's think_end."""
    fmt = reasoning_formats.format_of(tokenizer)
    think_end = getattr(tokenizer, "think_end", "") or ""
    if fmt is None or not fmt.routes:
        return (think_end,) if think_end else (), ()
    ends = tuple(dict.fromkeys(m for m in (fmt.end, *fmt.other_ends, think_end) if m))
    return ends, tuple(m for m in fmt.ends_reasoning if m)


def make_gate(
    tokenizer: Any,
    compiled: _Compiled,
    initial_state: str = "normal",
    scope: str = AFTER_REASONING,
    triggers: tuple[str, ...] = (),
) -> Gate | None:
    """The gate of a sequence's constraint (`decoding.grammar_gate`), or None (it starts
    at once). A `ReasoningGate` when `scope` is AFTER_REASONING and the tokenizer knows
    think markers (mlx-lm's `has_thinking`, set by the chat template or the
    `reasoning_parser` option); closed from the start when ``initial_state`` is
    "reasoning" (the prompt left a think block open). A `TriggerGate` after it for
    non-empty `triggers` (lazy grammar)."""
    gates: list[Gate] = []
    llg = compiled.llg_tokenizer
    end = tuple(getattr(tokenizer, "think_end_tokens", None) or ())
    if scope == AFTER_REASONING and getattr(tokenizer, "has_thinking", False) and end:
        start = tuple(getattr(tokenizer, "think_start_tokens", None) or ())
        # The end markers' text too: the output pipeline ends the reasoning on text, at
        # every end marker the reasoning format knows, so the grammar must engage there
        # however the model spelled the marker in tokens.
        ends, kept = reasoning_end_markers(tokenizer)
        gates.append(
            ReasoningGate(
                start,
                end,
                initial_state == "reasoning",
                end_text=ends,
                decode=llg.decode_bytes,
                encode=llg.tokenize_bytes,
                kept_text=kept,
            )
        )
    words = tuple(w for w in triggers if w)
    if words:
        gates.append(TriggerGate(words, llg.decode_bytes, llg.tokenize_bytes))
    if not gates:
        return None
    return gates[0] if len(gates) == 1 else ChainGate(gates)


def make_constraint_processor(
    constraint: Constraint,
    tokenizer: Any,
    initial_state: str = "normal",
    scope: str = AFTER_REASONING,
    triggers: tuple[str, ...] = (),
) -> LogitsProcessor:
    """A fresh logits processor enforcing `constraint` for one sequence.

    `tokenizer`: the model's tokenizer (mlx-lm `TokenizerWrapper` or a Hugging Face fast
    tokenizer); it must expose `backend_tokenizer`. Its `eos_token_id` and
    `eos_token_ids` are the tokens allowed when the grammar is complete. Compiling is
    cached per tokenizer (weakly held, ~2 s the first time for SmolLM2's vocabulary) and
    per (kind, source) in an LRU of COMPILED_CACHE_SIZE; each call returns a copy with
    its own state. `initial_state`, `scope` (GRAMMAR_SCOPES) and `triggers` (lazy
    grammar words) decide when it starts (`make_gate`). Raises ValueError naming
    `constraint.field` when the grammar does not compile or the tokenizer is not a fast
    one. Returns a `ConstraintProcessor`; append it last to the sequence's logits
    processors.
    """
    matcher, compiled = _compiled_matcher(constraint, tokenizer)
    gate = make_gate(tokenizer, compiled, initial_state, scope, triggers)
    return ConstraintProcessor(
        matcher, compiled.eos_ids, compiled.llg_tokenizer.vocab_size, constraint.field, gate
    )
