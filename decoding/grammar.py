"""Constrained decoding: GBNF grammars and JSON schemas as per-request logits processors.

Owns reading a request's constraint (`PredictOptions.Grammar`, `Metadata["json_schema"]`,
`Metadata["response_format"]`) into a `Constraint`, compiling it against the model's
tokenizer (cached), and the per-sequence logits processor that masks every token the
grammar forbids. Nothing here is global per request: each processor owns its own matcher,
so constrained and unconstrained sequences decode together in one `BatchGenerator` batch.

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
first checked by cheap bounds (MAX_GRAMMAR_BYTES, MAX_GRAMMAR_NESTING, MAX_JSON_BYTES,
MAX_JSON_DEPTH), then validated off the event loop (`validate_constraint`, on a small
dedicated thread pool with a time bound; llguidance's compile drops the GIL: a 30,000
alternative validation in a thread left the main thread's 1 ms sleeps at most 4 ms apart).
Error texts are one line without panic or backtrace text (`clean_error`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import hashlib
import json
import logging
import re
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import llguidance
import mlx.core as mx
import numpy as np

from parsing import jsonfield

logger = logging.getLogger("localai.mlx.grammar")

GRAMMAR_FIELD = "PredictOptions.Grammar"
JSON_SCHEMA_FIELD = "Metadata.json_schema"
RESPONSE_FORMAT_FIELD = "Metadata.response_format"

# JSON output on one line in json.dumps' default style (", " and ": "), which models see
# most. Flexible whitespace would let a sampled small model emit newlines until max_tokens.
# A schema's own "x-guidance" options override these.
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
ANY_JSON_OBJECT = '{"type":"object"}'
COMPILED_CACHE_SIZE = 64  # compiled grammars kept per tokenizer (LRU)

# --- bounds, checked before any expensive work ---
# Largest grammar (UTF-8 bytes). 64 KiB holds LocalAI's function-calling grammar for dozens
# of tools, or ~6,000 short alternatives spread over rules (llguidance allows at most 2,000
# per rule). Validation is not all GIL-free (the GBNF converter is Python, and part of
# llguidance's build holds the GIL): at ~100 KB it paused the event loop up to ~150 ms on
# this loaded 2-core host, at 25 KB not measurably (baseline 17 ms gaps).
MAX_GRAMMAR_BYTES = 64 * 1024
# Deepest parenthesis nesting in a grammar; llguidance's GBNF converter recurses per level
# (RecursionError at ~500).
MAX_GRAMMAR_NESTING = 100
# Largest JSON text (UTF-8 bytes) of Metadata.json_schema / Metadata.response_format, or of a
# JSON schema given in PredictOptions.Grammar.
MAX_JSON_BYTES = 128 * 1024
# Deepest JSON nesting (arrays and objects) in those texts; llguidance's schema reader stops
# at 128 and Python's json at ~1000 with a RecursionError.
MAX_JSON_DEPTH = 64
# Steps of the validation walk (see `_walk`): bytes fed to the grammar after its first mask.
VALIDATE_WALK_BYTES = 8
# Default time bound (seconds) of `validate_constraint`.
VALIDATE_TIMEOUT_S = 10.0
# Threads validating constraints off the event loop; more requests wait their turn.
VALIDATE_THREADS = 2
# Validations remembered (by kind and source digest), so a repeated grammar costs nothing.
VALIDATED_CACHE_SIZE = 256
# Longest error text taken from llguidance (characters); the rest is cut.
MAX_ERROR_CHARS = 400

_lock = threading.Lock()  # guards the module's caches; never held while compiling

ConstraintKind = Literal["gbnf", "json_schema", "json_object"]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


@dataclass(frozen=True)
class Constraint:
    """What one request's output must match.

    `kind`: "gbnf" (llama.cpp GBNF; Lark syntax is accepted too), "json_schema" or
    "json_object" (any JSON object). `source`: the grammar text, or the schema as compact
    JSON with its key order kept (property order decides output order). `field`: the
    request field it came from, named in every error about it.
    """

    kind: ConstraintKind
    source: str
    field: str


# --- parsing the request ----------------------------------------------------------------


def check_json_bounds(
    raw: str, field: str, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH
) -> None:
    """`jsonfield.check_bounds` with the constraint limits (a JSON schema is smaller than
    other JSON fields). Raises ValueError naming `field` and the limit."""
    jsonfield.check_bounds(raw, field, max_bytes, max_depth)


def _json_object(raw: str, field: str) -> dict[str, Any]:
    check_json_bounds(raw, field)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ValueError(f"{field} must be a JSON object: {err}") from None
    except RecursionError:  # unreachable after the depth bound; kept as a safety net
        raise ValueError(f"{field} nests too deeply: flatten it") from None
    if not isinstance(value, dict):
        raise ValueError(f"{field} must be a JSON object, got {type(value).__name__}")
    return value


def _schema_constraint(schema: Any, field: str) -> Constraint:
    if not isinstance(schema, dict):
        raise ValueError(f"{field}: the JSON schema must be an object, got {type(schema).__name__}")
    source = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    return Constraint("json_schema", source, field)


def _response_format(raw: str) -> Constraint | None:
    field = RESPONSE_FORMAT_FIELD
    if raw in ("text", "json_object"):  # a bare type name, as some clients send it
        value: dict[str, Any] = {"type": raw}
    else:
        value = _json_object(raw, field)
    kind = value.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        # llama.cpp's server also takes {"type": "json_object", "schema": {...}}.
        if "schema" in value:
            return _schema_constraint(value["schema"], field)
        return Constraint("json_object", ANY_JSON_OBJECT, field)
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ValueError(
                f'{field} of type "json_schema" needs "json_schema": {{"schema": {{...}}}}'
            )
        return _schema_constraint(spec["schema"], field)
    raise ValueError(f'{field} "type" must be "text", "json_object" or "json_schema", got {kind!r}')


def _check_grammar_bounds(text: str, field: str) -> None:
    """Size and parenthesis-nesting bounds of a GBNF/Lark grammar; ValueError naming `field`."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_GRAMMAR_BYTES:
        raise ValueError(
            f"{field} is {size} bytes; the limit is {MAX_GRAMMAR_BYTES} bytes: shorten the grammar"
        )
    # Parentheses outside "strings", [classes] and # comments; Lark's /regex/ parentheses
    # count too (they nest in the regex compiler as well).
    depth = 0
    pos = 0
    n = len(text)
    while pos < n:
        match = _GRAMMAR_STRUCTURE.search(text, pos)
        if match is None:
            break
        char = match.group()
        pos = match.end()
        if char == "(":
            depth += 1
            if depth > MAX_GRAMMAR_NESTING:
                raise ValueError(
                    f"{field} nests parentheses deeper than {MAX_GRAMMAR_NESTING} levels: "
                    "split the grammar into named rules"
                )
        elif char == ")":
            depth = max(depth - 1, 0)
        elif char == "#":
            end = text.find("\n", pos)
            pos = n if end < 0 else end + 1
        else:  # a quoted string or character class: skip to its unescaped end
            close = '"' if char == '"' else "]"
            while pos < n and text[pos] != close:
                pos += 2 if text[pos] == "\\" else 1
            pos += 1


_GRAMMAR_STRUCTURE = re.compile(r'[()"\[#]')

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

    Bounded by the size checks done when the constraint was read; takes ~0.3 s for a
    grammar at MAX_GRAMMAR_BYTES, well under 1 ms for usual ones. Remembers successes
    (VALIDATED_CACHE_SIZE), so repeated constraints cost one hash.
    """
    key = (constraint.kind, hashlib.sha256(constraint.source.encode("utf-8", "replace")).digest())
    with _lock:
        if key in _validated:
            _validated.move_to_end(key)
            return
    if constraint.kind == "gbnf":
        _check_grammar_bounds(constraint.source, constraint.field)
    else:
        check_json_bounds(constraint.source, constraint.field)
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


def _walk(constraint: Constraint, matcher: llguidance.LLMatcher) -> None:
    """Run the first VALIDATE_WALK_BYTES steps, always taking the lowest allowed byte.

    The first step finds a grammar that matches no string; the next ones find limits that
    llguidance only meets while parsing, e.g. a rule with more than 2,000 alternatives
    ("Current row has N items; max is 2000"), which would otherwise fail mid-generation.
    """
    for step in range(VALIDATE_WALK_BYTES):
        allowed = np.unpackbits(
            np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little"
        )[:256]
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


def validate_constraint_sync(constraint: Constraint) -> None:
    """Validate `constraint` fully on the calling thread (see `validate_constraint`).

    Blocking: up to ~0.5 s for a grammar at the size bounds. Never call it on the event loop;
    `validate_constraint` runs it on the validation pool with a time bound.
    Raises ValueError naming `constraint.field` (one line, no panic text).
    """
    _validate(constraint)


_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _validation_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=VALIDATE_THREADS, thread_name_prefix="grammar-validate"
            )
        return _pool


async def validate_constraint(
    constraint: Constraint | None, timeout_s: float = VALIDATE_TIMEOUT_S
) -> None:
    """Validate a constraint read by `read_constraint`, off the event loop; await it
    before queueing the request.

    Runs on a dedicated pool of VALIDATE_THREADS threads (llguidance drops the GIL while
    compiling, so the loop keeps serving Health and other requests). Checks: the size and
    nesting bounds, the grammar or schema compiles, and it matches at least one string.
    `timeout_s`: seconds to wait, including any wait for a free thread; on expiry the
    request is refused (a compile already running finishes in the background; one not yet
    started is dropped). None is accepted and does nothing.

    Raises ValueError naming `constraint.field`: invalid, too large, matching no string, or
    not validated within `timeout_s` (INVALID_ARGUMENT at the edge).
    """
    if constraint is None:
        return
    future = asyncio.get_running_loop().run_in_executor(_validation_pool(), _validate, constraint)
    try:
        await asyncio.wait_for(future, timeout_s)
    except asyncio.TimeoutError:  # the builtin TimeoutError from 3.11 on
        raise ValueError(
            f"{constraint.field}: the {_what(constraint)} did not compile within "
            f"{timeout_s:g} s: simplify it"
        ) from None


def read_constraint(grammar: str, metadata: Mapping[str, str]) -> Constraint | None:
    """Read a request's output constraint without compiling it; None when it has none.

    Cheap and bounded (size and nesting bounds, JSON parsing), so it may run on the event
    loop; follow it with `await validate_constraint(...)`. Same sources and errors as
    `parse_constraint`, except the compile checks that `validate_constraint` does.
    """
    constraint: Constraint | None = None
    if grammar.strip():
        if grammar.lstrip().startswith("{"):  # no GBNF or Lark grammar starts with "{"
            constraint = _schema_constraint(_json_object(grammar, GRAMMAR_FIELD), GRAMMAR_FIELD)
        else:
            _check_grammar_bounds(grammar, GRAMMAR_FIELD)
            constraint = Constraint("gbnf", grammar, GRAMMAR_FIELD)
    elif metadata.get("json_schema", "").strip():
        schema = _json_object(metadata["json_schema"], JSON_SCHEMA_FIELD)
        if isinstance(schema.get("schema"), dict):  # OpenAI's {"name", "schema", "strict"}
            schema = schema["schema"]
        constraint = _schema_constraint(schema, JSON_SCHEMA_FIELD)
    elif metadata.get("response_format", "").strip():
        constraint = _response_format(metadata["response_format"].strip())
    return constraint


def parse_constraint(grammar: str, metadata: Mapping[str, str]) -> Constraint | None:
    """Read a request's output constraint and validate it on this thread; None when it has none.

    Sources, first match wins: `grammar` (PredictOptions.Grammar: GBNF as LocalAI sends
    it for JSON mode and function calling, or a JSON schema when the text is a JSON
    object); `metadata["json_schema"]` (a JSON schema, or OpenAI's wrapper
    {"name": ..., "schema": {...}}); `metadata["response_format"]` (OpenAI style:
    {"type": "json_object"}, {"type": "json_schema", "json_schema": {"schema": {...}}},
    {"type": "text"}, or the bare type name). Empty or whitespace values count as absent;
    fields after the winner are not read.

    `read_constraint` followed by `validate_constraint_sync`: bounds first (MAX_GRAMMAR_BYTES,
    MAX_GRAMMAR_NESTING, MAX_JSON_BYTES, MAX_JSON_DEPTH), then the full check (syntax,
    undefined rules, unsupported schema keywords, matching no string) without a model
    tokenizer. Blocking for up to ~0.5 s at the size bounds: on the event loop prefer
    `read_constraint` + `await validate_constraint(...)`. Raises ValueError naming
    PredictOptions.Grammar, Metadata.json_schema or Metadata.response_format, one line.
    Never touches MLX.
    """
    constraint = read_constraint(grammar, metadata)
    if constraint is not None:
        _validate(constraint)
    return constraint


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


def _compiled_for(tokenizer: Any) -> _Compiled:
    with _lock:
        compiled = _by_tokenizer.get(tokenizer)
        if compiled is None:
            compiled = _by_tokenizer[tokenizer] = _Compiled(tokenizer)
        return compiled


def warm_up(tokenizer: Any) -> None:
    """Build llguidance's view of `tokenizer` now (~2 s for SmolLM2's 49k vocabulary).

    Optional: call it after loading a model, so the first constrained request does not
    stall the decode loop that long. Raises ValueError if the tokenizer is not a fast one.
    """
    _compiled_for(tokenizer)


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
    if constraint.kind == "gbnf":
        _check_grammar_bounds(constraint.source, constraint.field)
    else:
        check_json_bounds(constraint.source, constraint.field)
    start = time.perf_counter()
    template = llguidance.LLMatcher(compiled.llg_tokenizer, _to_llguidance(constraint), log_level=0)
    logger.debug(
        "compiled %s from %s in %.1f ms",
        constraint.kind,
        constraint.field,
        1e3 * (time.perf_counter() - start),
    )
    error = _matcher_error(constraint, template)
    if error is None:
        template.compute_bitmask()  # the first step: a grammar matching nothing stops here
        error = _matcher_error(constraint, template)
    if error is not None:
        raise error
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

    Not thread-safe; one instance per sequence (build it with `make_constraint_processor`).
    """

    def __init__(
        self, matcher: llguidance.LLMatcher, eos_ids: list[int], vocab_size: int, field: str
    ) -> None:
        self._matcher = matcher
        self._field = field
        self._eos = mx.array(eos_ids, dtype=mx.int32) if eos_ids else None
        self._seen: int | None = None
        self._bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
        self._failed = False

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        flat = tokens.reshape(-1)
        length = flat.shape[0]
        if self._seen is None:
            self._seen = length
        elif length > self._seen:
            # Forces the previously sampled token to the CPU: the grammar needs it now.
            self._consume(flat[self._seen :].tolist())
            self._seen = length
        elif length < self._seen:
            raise RuntimeError(
                f"token context shrank from {self._seen} to {length}: "
                "a ConstraintProcessor serves exactly one sequence"
            )
        if self._eos is not None and self._matcher.is_stopped():
            # Keep the model's preference among the EOS ids; if an earlier processor
            # banned them all (ignore_eos), the finished grammar wins: all at logit 0.
            eos = logits[:, self._eos]
            eos = mx.where(mx.all(eos == -mx.inf), mx.zeros_like(eos), eos)
            only_eos = mx.full(logits.shape, -mx.inf, dtype=logits.dtype)
            only_eos[:, self._eos] = eos
            return only_eos
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        return apply_bitmask(logits, self._bits)

    def _consume(self, new_tokens: list[int]) -> None:
        if self._failed:
            return
        for token in new_tokens:
            if not self._matcher.consume_token(token):
                # Only reachable if a token outside the mask was sampled (e.g. all logits
                # -inf); the matcher then allows EOS only, ending the sequence.
                self._failed = True
                logger.warning(
                    "%s: token %d rejected by the grammar, ending the sequence: %s",
                    self._field,
                    token,
                    (self._matcher.get_error() or "no detail").splitlines()[0],
                )
                return


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


def make_constraint_processor(constraint: Constraint, tokenizer: Any) -> LogitsProcessor:
    """A fresh logits processor enforcing `constraint` for one sequence.

    `tokenizer`: the model's tokenizer (mlx-lm `TokenizerWrapper` or a Hugging Face fast
    tokenizer); it must expose `backend_tokenizer`. Its `eos_token_id` and
    `eos_token_ids` are the tokens allowed when the grammar is complete. Compiling is
    cached per tokenizer (weakly held, ~2 s the first time for SmolLM2's vocabulary) and
    per (kind, source) in an LRU of COMPILED_CACHE_SIZE; each call returns a copy with
    its own state. Raises ValueError naming `constraint.field` when the grammar does not
    compile or the tokenizer is not a fast one. Returns a `ConstraintProcessor`; append
    it last to the sequence's logits processors.
    """
    matcher, compiled = _compiled_matcher(constraint, tokenizer)
    return ConstraintProcessor(
        matcher, compiled.eos_ids, compiled.llg_tokenizer.vocab_size, constraint.field
    )
