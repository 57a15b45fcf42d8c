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
thread (the caches take a lock).
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import llguidance
import mlx.core as mx
import numpy as np

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


def _json_object(raw: str, field: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ValueError(f"{field} must be a JSON object: {err}") from None
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


def _to_llguidance(constraint: Constraint) -> str:
    """The llguidance grammar for a constraint; ValueError naming the field if it fails."""
    try:
        if constraint.kind == "gbnf":
            return llguidance.grammar_from("gbnf", constraint.source)
        return llguidance.LLMatcher.grammar_from_json_schema(
            constraint.source, defaults=JSON_OPTIONS
        )
    except Exception as err:  # the GBNF converter is pure Python and raises many types
        raise ValueError(f"{constraint.field} is not a valid {_what(constraint)}: {err}") from None


def _what(constraint: Constraint) -> str:
    return "GBNF grammar" if constraint.kind == "gbnf" else "JSON schema"


def _validate(constraint: Constraint) -> None:
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        _to_llguidance(constraint)
    )
    if is_error:
        raise ValueError(f"{constraint.field} is not a valid {_what(constraint)}: {messages[0]}")
    for message in messages:
        logger.warning("%s: %s", constraint.field, message)


def parse_constraint(grammar: str, metadata: Mapping[str, str]) -> Constraint | None:
    """Read a request's output constraint; None when it has none.

    Sources, first match wins: `grammar` (PredictOptions.Grammar: GBNF as LocalAI sends
    it for JSON mode and function calling, or a JSON schema when the text is a JSON
    object); `metadata["json_schema"]` (a JSON schema, or OpenAI's wrapper
    {"name": ..., "schema": {...}}); `metadata["response_format"]` (OpenAI style:
    {"type": "json_object"}, {"type": "json_schema", "json_schema": {"schema": {...}}},
    {"type": "text"}, or the bare type name). Empty or whitespace values count as absent;
    fields after the winner are not read.

    The winner is checked fully here (syntax, undefined rules, unsupported schema
    keywords) without a tokenizer, so bad input fails before it reaches the engine.
    Raises ValueError naming PredictOptions.Grammar, Metadata.json_schema or
    Metadata.response_format. Never touches MLX.
    """
    constraint: Constraint | None = None
    if grammar.strip():
        if grammar.lstrip().startswith("{"):  # no GBNF or Lark grammar starts with "{"
            constraint = _schema_constraint(_json_object(grammar, GRAMMAR_FIELD), GRAMMAR_FIELD)
        else:
            constraint = Constraint("gbnf", grammar, GRAMMAR_FIELD)
    elif metadata.get("json_schema", "").strip():
        schema = _json_object(metadata["json_schema"], JSON_SCHEMA_FIELD)
        if isinstance(schema.get("schema"), dict):  # OpenAI's {"name", "schema", "strict"}
            schema = schema["schema"]
        constraint = _schema_constraint(schema, JSON_SCHEMA_FIELD)
    elif metadata.get("response_format", "").strip():
        constraint = _response_format(metadata["response_format"].strip())
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


_lock = threading.Lock()
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
        start = time.perf_counter()
        template = llguidance.LLMatcher(
            compiled.llg_tokenizer, _to_llguidance(constraint), log_level=0
        )
        logger.debug(
            "compiled %s from %s in %.1f ms",
            constraint.kind,
            constraint.field,
            1e3 * (time.perf_counter() - start),
        )
        if template.is_error():
            raise ValueError(
                f"{constraint.field} is not a valid {_what(constraint)}: {template.get_error()}"
            )
        for warning in template.get_grammar_warnings():
            logger.warning("%s: %s", constraint.field, warning)
        compiled.matchers[key] = template
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
