"""Request and load-time parameters: the only reader of `PredictOptions`, `ModelOptions`
and `ModelOptions.Options`.

Turns protobuf messages into frozen dataclasses (`GenerationParams`, `LoadParams`) and
validates them; every bad value raises `ValueError` whose message names the field or
option and the allowed range. Holds no state, seeds no RNG, never calls MLX.

proto3 cannot tell "unset" from zero, so zero means "not set" for every numeric request
field; the load-time option default then applies, else the built-in one. A request's
non-zero value always wins over the option default.

What each field means is documented once, in the tables of `parsing/fields.py` (a row per
field of both messages, and the Metadata keys: what unset means, what is accepted,
refused or ignored; the refusals below come from there) and the load options' table
`OPTIONS` in
`parsing/options.py` (key, kind, bounds, default, doc, environment variable);
docs/FIELDS.md is generated from both (``python -m parsing.fields docs/FIELDS.md``).
`load_params` reads the options once per LoadModel (`parsing.options.read_options`) into
`LoadParams` fields; nothing reads them again.

Bugs of the original LocalAI MLX backend not copied: Temperature 0 was turned into 0.6
(here: greedy); the repetition penalty was read from a field that does not exist
(here: Penalty, with Repeat as its window); options overrode the request (here: the
request wins); seeds went into MLX's global RNG (here: `sampling.py` keeps one key per
request); "10" parsed as float 10.0 (here: int first).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from parsing import bounds as bounds_mod
from parsing import fields as fields_mod
from parsing import images as images_mod
from parsing import jsonfield
from parsing import videos as videos_mod
from parsing.bounds import Bounds
from parsing.constraint import Constraint, read_constraint
from parsing.fields import (  # re-exported: prompting/fit.py, tests
    DEFAULT_MAX_TOKENS as DEFAULT_MAX_TOKENS,
)
from parsing.fields import (
    DEFAULT_REPETITION_CONTEXT_SIZE,
    KV_CACHE_TYPES,
    LOGIT_BIAS_LIMIT,
    MAX_NDRAFT,
    MAX_TOP_LOGPROBS,
)
from parsing.fields import MAX_TOKENS_CAP as MAX_TOKENS_CAP  # re-exported: prompting/fit.py
from parsing.options import (
    DEFAULT_MAX_BATCH_SIZE as DEFAULT_MAX_BATCH_SIZE,  # re-exported: engine/status.py
)
from parsing.options import (
    DEFAULT_MAX_QUEUE as DEFAULT_MAX_QUEUE,  # re-exported: engine/status.py
)
from parsing.options import (
    DEFAULT_NGRAM_DRAFT_TOKENS,
    DEFAULT_NGRAM_SIZE,
    DEFAULT_NUM_DRAFT_TOKENS,
    DEFAULT_PREFILL_STEP,
    DEFAULT_PROMPT_CACHE_DISK_BYTES,
    DEFAULT_RERANK_INSTRUCTION,
    DEFAULT_STEP_BUDGET_MS,
    GRAMMAR_SCOPES,
    OPTIONS,
    REASONING_EFFORTS,
    SAMPLING,
    TOKENIZER_OPTION_KEYS,
    TOOL_GRAMMAR_MODES,
    UNLIMITED_REASONING,
    read_engine_args,
    read_options,
)
from parsing.options import check_float as _check_float
from parsing.options import check_int as _check_int
from parsing.options import (
    embd_normalize_code as embd_normalize_code,  # re-exported: tasks/embedding.py
)
from parsing.options import is_number as _is_number
from parsing.options import parse_options as parse_options  # re-exported
from parsing.paths import safe_cache_dir
from parsing.tool_choice import ToolChoice, read_tool_choice
from parsing.volatile_spans import VolatileSpans
from parsing.volatile_spans import read as read_volatile_spans

UNTIL_CONTEXT_FULL = 2**31 - 1  # Tokens -1: capped to the context left and MAX_TOKENS_CAP
DEFAULT_XTC_THRESHOLD = 0.1  # mlx-lm's default


@dataclass(frozen=True)
class GenerationParams:
    """Resolved sampling and stopping settings of one request (the fields: `parsing.fields`).

    `temperature` 0.0 means greedy. `top_p` 1.0, `top_k` 0, `min_p` 0.0,
    `repetition_penalty` 0.0 or 1.0, presence/frequency 0.0 and `xtc_probability` 0.0
    mean "disabled". `max_tokens` is in tokens, as requested (UNTIL_CONTEXT_FULL for -1);
    the prepare step caps it, once (`prompting.fit.max_tokens`). `seed` None means a fresh
    random seed.
    """

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    repetition_context_size: int
    presence_penalty: float
    frequency_penalty: float
    xtc_threshold: float
    xtc_probability: float
    seed: int | None
    stop: tuple[str, ...]
    logprobs: bool
    top_logprobs: int
    ignore_eos: bool
    logit_bias: dict[int, float] | None
    correlation_id: str
    model_identity: str
    num_draft_tokens: int = 0  # NDraft: tokens the draft model proposes per step; 0 = load default
    keep: int = 0  # NKeep: with a rotating KV cache, prompt tokens always kept; 0 = mlx-lm's 4
    cache_write: bool = True  # False (PromptCacheRO): read the prompt cache, never add to it
    constraint: Constraint | None = None  # Grammar / Metadata json_schema constraint
    # Metadata reasoning_budget, else option reasoning_budget: reasoning tokens before the
    # backend ends the think block (reasoning_budget.py); -1 unlimited, 0 no thinking.
    reasoning_budget: int = UNLIMITED_REASONING
    # Metadata grammar_scope, else option grammar_scope: "after_reasoning" (the constraint
    # starts after a think block) or "all" (parsing.options.GRAMMAR_SCOPES).
    grammar_scope: str = "after_reasoning"
    # ModelOptions.GrammarTriggers words: the constraint starts at the first of them
    # (llama.cpp's lazy grammar); () = from the start.
    grammar_triggers: tuple[str, ...] = ()
    # Metadata tool_grammar, else option tool_grammar: when tool calls are held to the
    # request's Tools (parsing.options.TOOL_GRAMMAR_MODES; decoding/tool_grammar.py).
    tool_grammar: str = "required"
    # Disk tier of the prompt cache: option prompt_cache_dir, else the checked
    # PromptCachePath (absolute); "" = memory only.
    prompt_cache_dir: str = ""


@dataclass(frozen=True)
class LoadParams:
    """What LoadModel needs, plus the option defaults later requests fall back to.

    `context_size` 0 means the model's own. `max_cache_bytes` / `max_kv_size` None
    mean unbounded. `tokenizer_config` goes to mlx-lm's `load(tokenizer_config=...)`
    and is empty unless options set tokens or trust_remote_code is on. `defaults` holds
    validated sampling defaults under canonical keys (`temperature`, not `temp`); treat
    both dicts as read-only. Every load option is read once, into a field here (the raw
    entries are not kept, so nothing parses them again); the fields named after an option
    are documented in its table entry (`parsing.options.OPTIONS`).
    """

    model: str
    model_file: str
    model_path: str
    context_size: int
    trust_remote_code: bool
    max_cache_entries: int | None  # None: `caches.prompt_tiers.entry_bound` decides
    max_cache_bytes: int | None
    max_kv_size: int | None
    tokenizer_config: dict[str, Any]
    defaults: dict[str, Any]
    # Option keys the table (`parsing.options.OPTIONS`) lacks: LocalAI passes options meant
    # for other backends too, so they are a warning at load (`engine.model_host`).
    unknown_options: tuple[str, ...] = ()
    kv_bits: int | None = None  # quantized KV cache bits (CacheTypeKey/Value or kv_bits)
    kv_group_size: int = 64  # option kv_group_size
    quantized_kv_start: int = 0  # option quantized_kv_start: tokens kept unquantized
    draft_model: str = ""  # DraftModel: path/repo of the speculative-decoding draft model
    num_draft_tokens: int = DEFAULT_NUM_DRAFT_TOKENS  # option num_draft_tokens
    lora_adapter: str = ""  # LoraAdapter(s): adapter dir, "" = none (see `_lora_params`)
    lora_scale: float = 0.0  # LoraScale(s): multiplier of the trained scale, 0 = as trained
    max_batch_size: int = (
        DEFAULT_MAX_BATCH_SIZE  # option max_batch_size: sequences decoded together
    )
    max_queue: int = DEFAULT_MAX_QUEUE  # option max_queue: requests waiting for a batch slot
    prefill_step_size: int = DEFAULT_PREFILL_STEP  # option prefill_step_size (or NBatch): tokens
    # option step_budget_ms: while other sequences decode, a batch step prefills only as
    # many prompt tokens as fit this many milliseconds (their inter-token latency); 0 = off.
    step_budget_ms: int = DEFAULT_STEP_BUDGET_MS
    warmup: bool = True  # option warmup: run the request path once at LoadModel (kernels)
    # option memory_budget: bytes (or "12GiB") of MLX memory for weights, KV, prompt cache
    # and prefill; None = the platform default (engine/memory.py), 0 = off.
    memory_budget: int | None = None
    cpu_dequantize: bool | None = (
        None  # option cpu_dequantize: True dense, False quantized, None auto
    )
    cpu_dequantize_budget: int | None = (
        None  # option cpu_dequantize_budget: bytes; None = half the RAM
    )
    embedding_pooling: str = "mean"  # option embedding_pooling: mean | last | none
    embedding_normalize: int = 2  # option embedding_normalize: llama.cpp's embd_normalize code
    distributed_mode: str = ""  # option distributed_mode: tensor | pipeline; "" = the group's
    distributed_vocab: bool = True  # option distributed_vocab: false keeps embeddings whole
    speculative: str = ""  # option speculative: "ngram" (prompt lookup), "draft" (DraftModel)
    ngram_size: int = DEFAULT_NGRAM_SIZE  # option ngram_size: longest n-gram matched for drafts
    # LocalAI's worker protocol: rank 0 joins the group of this hostfile at LoadModel.
    hostfile: str = ""  # option hostfile: path of the ring/JACCL hostfile; "" = none (or env)
    distributed_backend: str = ""  # option distributed_backend: ring | jaccl; "" = env or ring
    tool_parser: str = ""  # option tool_parser: a vLLM tool-parser name overriding mlx-lm's choice
    reasoning_parser: str = ""  # option reasoning_parser: a vLLM reasoning-parser name
    reasoning_budget: int = UNLIMITED_REASONING  # option reasoning_budget: tokens, -1 unlimited
    grammar_scope: str = "after_reasoning"  # option grammar_scope: after_reasoning | all
    grammar_triggers: tuple[str, ...] = ()  # ModelOptions.GrammarTriggers words (lazy grammar)
    tool_grammar: str = "required"  # option tool_grammar: required | on | off
    prompt_cache_dir: str = ""  # option prompt_cache_dir: absolute disk-tier directory; "" = none
    prompt_cache_disk_bytes: int = DEFAULT_PROMPT_CACHE_DISK_BYTES  # option: bytes per directory
    # option max_pending_events: undelivered stream events before a non-reading client's
    # request is ended (RESOURCE_EXHAUSTED); None = jobs.DEFAULT_MAX_PENDING_EVENTS
    max_pending_events: int | None = None
    prompt_checkpoint_interval: int = 0  # option prompt_checkpoint_interval: tokens, 0 = off
    cpu_fuse: bool = True  # option cpu_fuse: false skips cpu_fuse.transform (dense CPU path)
    cpu_attention: bool = True  # option cpu_attention: false skips cpu_attention.install
    # option volatile_spans: compiled patterns removed from every prompt before tokenizing
    # (parsing/volatile_spans.py); default Claude Code's billing header.
    volatile_spans: VolatileSpans = field(default_factory=lambda: read_volatile_spans(None))
    rerank: str = "auto"  # option rerank: auto | yes_no | likelihood (tasks/rerank.py)
    rerank_instruction: str = DEFAULT_RERANK_INSTRUCTION  # option rerank_instruction
    # The options of vision-language models (vision, max_images, vision_cache_entries...).
    vision: images_mod.VisionOptions = field(default_factory=images_mod.VisionOptions)


# --- load options (the table: parsing/options.py) ----------------------------------


def _f32(value: float) -> float:
    # Proto floats are float32: 0.9 arrives as 0.8999999761...; 7 digits give it back.
    return float(f"{value:.7g}")


def _top_k(value: int, defaults: dict[str, Any]) -> int:
    """PredictOptions.TopK: > 0 keeps that many tokens; < 0 is off (llama.cpp's meaning:
    LocalAI's family defaults send -1, core/config/inference_defaults.json, and its MLX
    importer writes `top_k: -1`); 0 = not set: option top_k, else off (0)."""
    if value > 0:
        return value
    return 0 if value < 0 else int(defaults.get("top_k", 0))


def _lora_params(req: Any) -> tuple[str, float]:
    """(adapter, scale) from LoraAdapter / LoraAdapters and LoraScale / LoraScales.

    LocalAI sends both spellings; together they may name one adapter. The scale
    multiplies the adapter's trained scale, as llama.cpp's does (0 = as trained).
    """
    # LoraBase is refused before (`_refuse`): llama.cpp applies a LoRA onto a separate
    # higher-precision base; mlx-lm keeps the adapter as full-precision layers beside the
    # loaded (even quantized) weights.
    adapters = list(dict.fromkeys(a for a in (req.LoraAdapter, *req.LoraAdapters) if a))
    if len(adapters) > 1:
        raise ValueError(
            "ModelOptions.LoraAdapter/LoraAdapters: only one LoRA adapter is supported on "
            f"MLX, got {len(adapters)} ({', '.join(adapters)}); fuse the others into the "
            "model with `mlx_lm.fuse`"
        )
    scale = _check_float("ModelOptions.LoraScale", _f32(req.LoraScale), 0.0)
    scales = [
        _check_float(f"ModelOptions.LoraScales[{i}]", _f32(v), 0.0)
        for i, v in enumerate(req.LoraScales)
    ]
    if len(scales) > 1:
        raise ValueError(f"ModelOptions.LoraScales has {len(scales)} entries for one adapter")
    if scales and scale and scales[0] != scale:
        raise ValueError(
            f"ModelOptions.LoraScale ({scale:g}) and LoraScales[0] ({scales[0]:g}) disagree"
        )
    return (adapters[0], scale or (scales[0] if scales else 0.0)) if adapters else ("", 0.0)


def load_params(req: Any) -> LoadParams:
    """Read a `backend_pb2.ModelOptions` into `LoadParams`: the one reading of the load
    options per LoadModel (`parsing.options.read_options`, from the table `OPTIONS`).

    Raises ValueError naming the field or option: negative ContextSize, any option
    outside what its table entry accepts, speculative:draft without a DraftModel (or
    ngram with one), kv_bits 7 or a CacheTypeKey/Value MLX lacks; LoraScale(s) negative
    or not finite, more than one adapter, or a LoraBase.
    """
    _refuse(req, _REFUSED_LOAD, "ModelOptions")
    # Load-level fields that map onto options, when the options do not set them already.
    fallbacks = {}
    if req.Seed > 0:
        fallbacks["seed"] = str(req.Seed)
    if req.NBatch > 0:
        fallbacks["prefill_step_size"] = str(req.NBatch)
    read = read_options(req.Options, fallbacks, engine_args=read_engine_args(req.EngineArgs))
    value = read.values
    context_size = _check_int("ModelOptions.ContextSize", req.ContextSize, 0)
    trust_remote_code = bool(req.TrustRemoteCode) or value["trust_remote_code"]
    tokenizer_config: dict[str, Any] = {
        k: value[k] for k in TOKENIZER_OPTION_KEYS if k in read.given
    }
    if trust_remote_code:
        tokenizer_config["trust_remote_code"] = True

    lora_adapter, lora_scale = _lora_params(req)
    speculative = value["speculative"]
    if speculative == "draft" and not req.DraftModel:
        raise ValueError("option speculative:draft needs ModelOptions.DraftModel")
    if speculative == "ngram" and req.DraftModel:
        raise ValueError("option speculative:ngram needs no DraftModel; set one or the other")
    return LoadParams(
        **{o.key: value[o.key] for o in OPTIONS if o.field},
        model=req.Model,
        model_file=req.ModelFile,
        model_path=req.ModelPath,
        context_size=context_size,
        trust_remote_code=trust_remote_code,
        tokenizer_config=tokenizer_config,
        defaults={
            o.key: value[o.key] for o in OPTIONS if o.group == SAMPLING and o.key in read.given
        },
        unknown_options=read.unknown,
        lora_adapter=lora_adapter,
        lora_scale=lora_scale,
        kv_bits=_kv_bits(req, value["kv_bits"]),
        grammar_triggers=bounds_mod.check_triggers(t.word for t in req.GrammarTriggers),
        draft_model=req.DraftModel,
        num_draft_tokens=value["num_draft_tokens"]
        or (DEFAULT_NGRAM_DRAFT_TOKENS if speculative == "ngram" else DEFAULT_NUM_DRAFT_TOKENS),
        prompt_cache_dir=_prompt_cache_option(value["prompt_cache_dir"], req.ModelPath),
        vision=images_mod.VisionOptions(
            on=value["vision"],
            limits=images_mod.ImageLimits(
                value["max_images"], value["max_image_bytes"], value["max_image_pixels"]
            ),
            max_pixels=value["vision_max_pixels"],
            cache_entries=value["vision_cache_entries"],
            cache_bytes=value["vision_cache_bytes"],
            max_videos=value["max_videos"],
            max_video_bytes=value["max_video_bytes"],
            max_video_frames=value["max_video_frames"],
        ),
    )


def _prompt_cache_option(value: str, model_path: str) -> str:
    """Option prompt_cache_dir as an absolute path ("" = none); relative to ModelPath."""
    value = value.strip()
    if not value:
        return ""
    if "\0" in value:
        raise ValueError("option prompt_cache_dir contains a NUL byte")
    path = os.path.expanduser(value)
    if not os.path.isabs(path) and model_path:
        path = os.path.join(model_path, path)
    return os.path.abspath(path)


def _prompt_cache_path(value: str, load: LoadParams | None) -> str:
    """The disk-tier directory of a request: option prompt_cache_dir when set, else
    PromptCachePath confined to ModelPath (`parsing.paths.safe_cache_dir`), else ""."""
    if load is not None and load.prompt_cache_dir:
        return load.prompt_cache_dir
    if not value:
        return ""
    try:
        return str(safe_cache_dir(value, load.model_path if load else ""))
    except ValueError as exc:
        raise ValueError(f"PredictOptions.PromptCachePath: {exc}") from None


def _kv_bits(req: Any, bits: int | None) -> int | None:
    """KV quantization bits from option kv_bits, else CacheTypeKey/CacheTypeValue."""
    if bits is not None:
        if bits == 7:
            raise ValueError("option kv_bits must be one of 2, 3, 4, 5, 6, 8, got 7")
        return bits
    found = []
    for name in ("CacheTypeKey", "CacheTypeValue"):
        value = getattr(req, name).strip().lower()
        if value not in KV_CACHE_TYPES:
            accepted = ", ".join(k for k in KV_CACHE_TYPES if k)
            raise ValueError(
                f"ModelOptions.{name} {value!r} is not supported; accepted: {accepted}"
            )
        found.append(KV_CACHE_TYPES[value])
    key, value = found
    if req.CacheTypeKey and req.CacheTypeValue and key != value:
        raise ValueError(
            "ModelOptions.CacheTypeKey and CacheTypeValue must give the same precision: "
            f"MLX quantizes keys and values alike (got {req.CacheTypeKey!r} and "
            f"{req.CacheTypeValue!r})"
        )
    return key if key is not None else value


# --- fields this backend refuses ---------------------------------------------------
# Fields with a meaning for text generation that MLX / mlx-lm cannot honour: a request or
# load that sets them gets INVALID_ARGUMENT / a failed LoadModel naming the field, never
# silence. The refused rows of `parsing/fields.py`'s tables, with their reasons. "Set"
# means: differs from proto3's zero (and, for the samplers of `DISABLED_AT_ONE`, from their
# own "disabled" value 1.0, which LocalAI sends by default).
_REFUSED_PREDICT = fields_mod.REFUSED_PREDICT
_REFUSED_LOAD = fields_mod.REFUSED_LOAD


def _refuse(req: Any, refused: dict[str, str], message: str) -> None:
    for name, reason in refused.items():
        value = getattr(req, name)
        if name in fields_mod.DISABLED_AT_ONE and value == 1.0:
            continue
        if value if not hasattr(value, "__len__") else len(value):
            raise ValueError(f"{message}.{name} is not supported on MLX: {reason}")


# --- per-request parameters ---------------------------------------------------------


def parse_tools(raw: str) -> tuple[dict[str, Any], ...] | None:
    """Decode `PredictOptions.Tools`: a JSON array of OpenAI tool definitions.

    Empty, whitespace, "null" or "[]" -> None (no tools). Raises ValueError naming
    Tools for invalid, oversized or too deeply nested JSON (`jsonfield`), a non-array,
    or an element that is not an object.
    """
    tools = jsonfield.decode(raw, "PredictOptions.Tools", list)
    if tools is None:
        return None
    if not all(isinstance(t, dict) for t in tools):
        raise ValueError("PredictOptions.Tools must be a JSON array of objects")
    bounds_mod.check_tools(tools)
    return tuple(tools) or None


def parse_logit_bias(raw: str) -> dict[int, float] | None:
    """Decode `PredictOptions.LogitBias`: a JSON object {"token id": bias}.

    Empty, "null" or "{}" -> None. Raises ValueError naming LogitBias for invalid JSON,
    a non-object, a key that is not a non-negative integer, or a bias that is not a
    number in [-100, 100]. Ids are checked against the vocabulary in `sampling.py`.
    """
    decoded = jsonfield.decode(raw, "PredictOptions.LogitBias", dict)
    if decoded is None:
        return None
    bias: dict[int, float] = {}
    for key, value in decoded.items():
        try:
            token = int(key)
        except ValueError:
            token = -1
        if token < 0:
            raise ValueError(
                f"PredictOptions.LogitBias keys must be token ids (integers >= 0), got {key!r}"
            )
        if not _is_number(value):
            raise ValueError(f"PredictOptions.LogitBias[{key}] must be a number, got {value!r}")
        bias[token] = _check_float(
            f"PredictOptions.LogitBias[{key}]",
            float(value),
            -LOGIT_BIAS_LIMIT,
            LOGIT_BIAS_LIMIT,
        )
    return bias or None


def _metadata_choice(
    metadata: Any, load: LoadParams | None, name: str, choices: tuple[str, ...]
) -> str:
    """Metadata ``name`` (one of ``choices``: grammar_scope, tool_grammar), else the load
    option of that name (``choices[0]`` without a load)."""
    raw: str = metadata.get(name, "").strip().lower()
    if not raw:
        return str(getattr(load, name)) if load is not None else choices[0]
    if raw not in choices:
        raise ValueError(
            f"PredictOptions.Metadata.{name} must be one of {', '.join(choices)}, got {raw[:40]!r}"
        )
    return raw


def _reasoning_budget(metadata: Any, load: LoadParams | None) -> int:
    """Metadata reasoning_budget (an integer >= -1), else the load option, else -1."""
    raw = metadata.get("reasoning_budget", "").strip()
    if not raw:
        return load.reasoning_budget if load is not None else UNLIMITED_REASONING
    try:
        budget = int(raw)
    except ValueError:
        budget = None
    if budget is None or budget < UNLIMITED_REASONING:
        raise ValueError(
            "PredictOptions.Metadata.reasoning_budget must be an integer >= -1 (reasoning "
            f"tokens; -1 unlimited, 0 thinking off), got {raw[:40]!r}"
        )
    return budget


def _stop_strings(stops: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(s for s in stops if s))


def _window(req: Any, name: str, option: str, builtin: int, defaults: dict, bounds: Bounds) -> int:
    """A token window field (Repeat, NKeep): in [0, context] (`parsing.bounds`); zero takes
    the load option ``option`` (bounded the same way, named as the option), else ``builtin``."""
    value = bounds_mod.check_window(f"PredictOptions.{name}", getattr(req, name), bounds)
    if value or not option or option not in defaults:
        return value or builtin
    return bounds_mod.check_window(f"option {option}", int(defaults[option]), bounds)


def generation_params(
    req: Any, load: LoadParams | None = None, bounds: Bounds | None = None
) -> GenerationParams:
    """Resolve a `backend_pb2.PredictOptions` into `GenerationParams`.

    `load` supplies the option defaults (LoadParams.defaults); without it only built-in
    defaults apply. Raises ValueError naming the PredictOptions field and the allowed
    range for: Tokens < 0, Temperature < 0 or not finite, TopP / MinP outside [0, 1],
    Penalty < 0, Repeat < 0, Logprobs < 0, TopLogprobs outside [0, 20], any
    non-finite float, non-JSON LogitBias, a bad Grammar / Metadata constraint, or
    Metadata.reasoning_budget not an integer >= -1; Repeat or NKeep (or option
    repetition_context_size) longer than ``bounds``' context (`parsing.bounds`; without
    ``bounds``: `parsing.bounds.FALLBACK_CONTEXT`).
    The prompt fields (Prompt, Messages, Tools, ...) are read by `parse_request`.
    """
    defaults = load.defaults if load is not None else {}
    bounds = bounds if bounds is not None else Bounds(None)
    _refuse(req, _REFUSED_PREDICT, "PredictOptions")

    def pick(value: float, key: str, builtin: float) -> float:
        return value if value != 0 else defaults.get(key, builtin)

    if req.Tokens == -1:  # llama.cpp's meaning, carried over in LocalAI model files
        max_tokens = UNTIL_CONTEXT_FULL
    else:
        tokens = _check_int("PredictOptions.Tokens", req.Tokens, 0)
        max_tokens = int(pick(tokens, "max_tokens", DEFAULT_MAX_TOKENS))
    temperature = _check_float("PredictOptions.Temperature", _f32(req.Temperature), 0.0)
    top_p = _check_float("PredictOptions.TopP", _f32(req.TopP), 0.0, 1.0)
    min_p = _check_float("PredictOptions.MinP", _f32(req.MinP), 0.0, 1.0)
    penalty = _check_float("PredictOptions.Penalty", _f32(req.Penalty), 0.0)
    # Bounded by the context: the batch keeps a (rows, window) array of token ids.
    repeat = _window(
        req, "Repeat", "repetition_context_size", DEFAULT_REPETITION_CONTEXT_SIZE, defaults, bounds
    )
    presence = _check_float("PredictOptions.PresencePenalty", _f32(req.PresencePenalty))
    frequency = _check_float("PredictOptions.FrequencyPenalty", _f32(req.FrequencyPenalty))
    logprobs = _check_int("PredictOptions.Logprobs", req.Logprobs, 0)
    top_logprobs = _check_int("PredictOptions.TopLogprobs", req.TopLogprobs, 0, MAX_TOP_LOGPROBS)

    if req.Seed > 0:
        seed: int | None = req.Seed
    elif req.Seed == 0 and defaults.get("seed", 0) > 0:
        seed = defaults["seed"]
    else:
        seed = None

    return GenerationParams(
        max_tokens=max_tokens,
        temperature=float(pick(temperature, "temperature", 0.0)),
        top_p=float(pick(top_p, "top_p", 1.0)),
        top_k=_top_k(req.TopK, defaults),
        min_p=float(pick(min_p, "min_p", 0.0)),
        repetition_penalty=float(pick(penalty, "repetition_penalty", 0.0)),
        repetition_context_size=repeat,
        presence_penalty=float(pick(presence, "presence_penalty", 0.0)),
        frequency_penalty=float(pick(frequency, "frequency_penalty", 0.0)),
        xtc_threshold=float(defaults.get("xtc_threshold", DEFAULT_XTC_THRESHOLD)),
        xtc_probability=float(defaults.get("xtc_probability", 0.0)),
        seed=seed,
        stop=_stop_strings(req.StopPrompts),
        logprobs=logprobs > 0 or top_logprobs > 0,
        top_logprobs=top_logprobs,
        ignore_eos=bool(req.IgnoreEOS),
        logit_bias=parse_logit_bias(req.LogitBias),
        correlation_id=req.CorrelationId,
        model_identity=req.ModelIdentity,
        num_draft_tokens=_check_int("PredictOptions.NDraft", req.NDraft, 0, MAX_NDRAFT),
        keep=_window(req, "NKeep", "", 0, defaults, bounds),
        cache_write=not req.PromptCacheRO,
        prompt_cache_dir=_prompt_cache_path(req.PromptCachePath, load),
        # Bounds and JSON only here; compiling is `grammar.compile_constraint` (engine.prepare).
        constraint=read_constraint(req.Grammar, req.Metadata),
        reasoning_budget=_reasoning_budget(req.Metadata, load),
        grammar_scope=_metadata_choice(req.Metadata, load, "grammar_scope", GRAMMAR_SCOPES),
        grammar_triggers=load.grammar_triggers if load is not None else (),
        tool_grammar=_metadata_choice(req.Metadata, load, "tool_grammar", TOOL_GRAMMAR_MODES),
    )


# --- the prompt of a request ----------------------------------------------------------

# chat_template_kwargs may not override what the renderer itself passes.
_RESERVED_TEMPLATE_KWARGS = frozenset(
    {"conversation", "messages", "tools", "tokenize", "return_dict", "add_generation_prompt"}
)


@dataclass(frozen=True)
class PromptSpec:
    """What the model is asked, parsed and validated; `prompt.py` renders it.

    `messages` None: `prompt` is used as is (raw completion). Otherwise each message is a
    read-only mapping with role and content, plus name, tool_call_id, reasoning_content
    when set and tool_calls (decoded; each `function.arguments` string decoded to an
    object when it is a JSON object, since templates index into it). `tools`: the
    request's tool definitions (None = none), offered to the template unless
    `tool_choice` is "none", and handed to the tool-call parser; `tool_choice` is
    ToolChoice's mode (`parsing.tool_choice`: auto, none, required, function) and
    `tool_name` the function it names (mode "function"). `template_kwargs`:
    extra keyword arguments of the chat template (`enable_thinking`, `reasoning_effort`,
    then `chat_template_kwargs` merged over them).
    """

    prompt: str = ""
    messages: tuple[MappingProxyType, ...] | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    template_kwargs: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    tool_choice: str = ""
    tool_name: str = ""
    # PredictOptions.Images, decoded from base64 and bounded (`parsing.images`); each
    # fills one media marker or image slot of the prompt, in order.
    images: tuple[images_mod.ImageData, ...] = ()
    # PredictOptions.Videos, decoded from base64 and bounded (`parsing.videos`); their
    # frames are sampled and decoded on the prompt workers (`engine.vision_prompt`).
    videos: tuple[videos_mod.VideoData, ...] = ()

    @property
    def continue_final(self) -> bool:
        """A trailing assistant message is continued, not answered (prefilled output)."""
        if not self.messages:
            return False
        return bool(self.messages[-1]["role"] == "assistant")

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools the template shows the model: none when ToolChoice is "none" (OpenAI)."""
        return None if self.tool_choice == "none" or not self.tools else list(self.tools)

    @property
    def enable_thinking(self) -> bool | None:
        """The enable_thinking passed to the template; None = not requested."""
        value = self.template_kwargs.get("enable_thinking")
        return value if isinstance(value, bool) else None


@dataclass(frozen=True)
class GenerationRequest:
    """One Predict/PredictStream request, parsed completely: all the engine receives."""

    params: GenerationParams
    prompt: PromptSpec


def _decode_tool_calls(index: int, raw: str) -> list[dict[str, Any]] | None:
    field = f"PredictOptions.Messages[{index}].tool_calls"
    calls = jsonfield.decode(raw, field, list)
    if calls is None:
        return None
    if not all(isinstance(c, dict) for c in calls):
        raise ValueError(f"{field} must be a JSON array of tool-call objects")
    for call in calls:
        function = call.get("function")
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            try:  # not JSON, or not an object: the model's text is echoed back verbatim
                arguments = jsonfield.decode(function["arguments"], field, dict)
            except ValueError:
                continue
            if arguments is not None:
                function["arguments"] = arguments
    return calls or None


def _messages(req: Any) -> tuple[MappingProxyType, ...]:
    messages = []
    for i, msg in enumerate(req.Messages):
        if not msg.role:
            raise ValueError(f"PredictOptions.Messages[{i}].role must not be empty")
        out: dict[str, Any] = {"role": msg.role, "content": msg.content}
        for name in ("name", "tool_call_id", "reasoning_content"):
            if getattr(msg, name):
                out[name] = getattr(msg, name)
        if msg.tool_calls.strip():
            calls = _decode_tool_calls(i, msg.tool_calls)
            if calls:
                out["tool_calls"] = calls
        messages.append(MappingProxyType(out))
    return tuple(messages)


def _template_kwargs(metadata: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    flag = metadata.get("enable_thinking", "").strip().lower()
    if flag in ("true", "false"):
        kwargs["enable_thinking"] = flag == "true"
    elif flag:
        raise ValueError(
            "PredictOptions.Metadata.enable_thinking must be true or false, "
            f"got {metadata['enable_thinking'][:40]!r}"
        )
    effort = metadata.get("reasoning_effort", "")
    if effort.strip():
        # LocalAI sends it for templates that read it (gpt-oss, LFM2.5: core/backend/
        # options.go gRPCPredictOpts); a template variable, as vLLM's build_chat_params
        # and llama.cpp's chat_template_kwargs pass it.
        value = effort.strip().lower()
        if value not in REASONING_EFFORTS:
            raise ValueError(
                "PredictOptions.Metadata.reasoning_effort must be one of "
                f"{', '.join(REASONING_EFFORTS)}, got {effort[:40]!r}"
            )
        kwargs["reasoning_effort"] = value
    field = "PredictOptions.Metadata.chat_template_kwargs"
    extra = jsonfield.decode(metadata.get("chat_template_kwargs", ""), field, dict)
    if extra:
        reserved = sorted(_RESERVED_TEMPLATE_KWARGS & extra.keys())
        if reserved:
            raise ValueError(f"{field} may not set {', '.join(reserved)}")
        kwargs.update(extra)
    return kwargs


def prompt_spec(req: Any, load: LoadParams | None = None) -> PromptSpec:
    """Read the prompt fields of a `backend_pb2.PredictOptions` into a `PromptSpec`.

    `Prompt` is used as given unless `UseTokenizerTemplate` is set and `Messages` is
    non-empty. Raises ValueError naming the field: Tools, Messages[i].role / tool_calls,
    Metadata.enable_thinking / chat_template_kwargs, Images[i] (`parsing.images`; the
    load options max_images / max_image_bytes bound them).
    """
    tools = parse_tools(req.Tools)
    choice: ToolChoice = read_tool_choice(req.ToolChoice)
    images: tuple[images_mod.ImageData, ...] = ()
    if req.Images:
        limits = load.vision.limits if load is not None else images_mod.ImageLimits()
        images = images_mod.read_images(req.Images, limits.max_images, limits.max_bytes)
    videos: tuple[videos_mod.VideoData, ...] = ()
    if req.Videos:
        vision = load.vision if load is not None else images_mod.VisionOptions()
        videos = videos_mod.read_videos(req.Videos, vision.max_videos, vision.max_video_bytes)
    if not (req.UseTokenizerTemplate and req.Messages):
        return PromptSpec(
            prompt=req.Prompt,
            tools=tools,
            tool_choice=choice.mode,
            tool_name=choice.name,
            images=images,
            videos=videos,
        )
    return PromptSpec(
        messages=_messages(req),
        tools=tools,
        template_kwargs=MappingProxyType(_template_kwargs(req.Metadata)),
        tool_choice=choice.mode,
        tool_name=choice.name,
        images=images,
        videos=videos,
    )


def parse_request(
    req: Any, load: LoadParams | None = None, bounds: Bounds | None = None
) -> GenerationRequest:
    """Parse a whole `backend_pb2.PredictOptions`: generation parameters and prompt.

    ``bounds`` (the loaded model's context and longest token) are checked first, on
    lengths and counts (`parsing.bounds.check_predict`), before any JSON is decoded or
    any template rendered. A reasoning budget of 0 turns thinking off in the template
    (`enable_thinking` false) unless the request set `enable_thinking` itself (Metadata
    or chat_template_kwargs); else a `reasoning_effort` sets it (`_implied_thinking`).
    Raises ValueError naming the first bad field (see `generation_params`, `prompt_spec`).
    """
    if bounds is not None:
        bounds_mod.check_predict(req, bounds)
    gen, spec = generation_params(req, load, bounds), prompt_spec(req, load)
    thinking_set = "enable_thinking" in spec.template_kwargs
    if spec.messages is not None and not thinking_set:
        effort = req.Metadata.get("reasoning_effort", "").strip().lower()  # checked above
        implied = _implied_thinking(gen.reasoning_budget, effort)
        if implied is not None:
            kwargs = {**spec.template_kwargs, "enable_thinking": implied}
            spec = replace(spec, template_kwargs=MappingProxyType(kwargs))
    return GenerationRequest(gen, spec)


def _implied_thinking(budget: int, effort: str) -> bool | None:
    """The template's enable_thinking when the request leaves it unset: False with a
    reasoning budget of 0; else from Metadata's reasoning_effort, "none" False and a level
    True (vLLM's build_chat_params, from the request's reasoning_effort; LocalAI's
    ApplyReasoningEffort: templates such as Gemma 4's think only when asked); None = leave
    the template's default."""
    if budget == 0:
        return False
    if effort in REASONING_EFFORTS:
        return effort != "none"
    return None
