"""The load options (``ModelOptions.Options``, "key:value" strings): one table, `OPTIONS`.

Each `Option` names its key, kind (which fixes how the value is read and checked), bounds,
default (what absence means), one-line doc and, where one sets the default, its
environment variable. `read_options` is generated from the table: one pass over the
entries reads and checks every known key and lists the unknown ones (a warning at load,
never an error: LocalAI passes options meant for other backends too).
``ModelOptions.EngineArgs`` (a JSON object) names the same options with JSON values
(`read_engine_args`): there an unknown key is an error, as LocalAI documents, and a key
both set takes the EngineArgs value. The option list
of docs/FIELDS.md is generated from it too (``python -m parsing.fields docs/FIELDS.md``;
tests/fast/test_options.py fails when the two drift). ``params.load_params`` turns the
result into ``LoadParams``; options that interact (``temp``/``temperature``, ``kv_bits``
with ``CacheTypeKey``, ``num_draft_tokens`` with ``speculative``) are resolved there.

`on_off` is the one reader of on/off words, for options and environment variables alike.
Nothing here imports MLX.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from parsing import jsonfield, volatile_spans
from parsing.images import (
    MAX_IMAGE_BYTES,
    MAX_IMAGE_PIXELS,
    MAX_IMAGES,
    MAX_VIDEO_BYTES,
    MAX_VIDEO_FRAMES,
    MAX_VIDEOS,
    VISION_CACHE_BYTES,
    VISION_CACHE_ENTRIES,
)

# --- on/off words -------------------------------------------------------------------
ON_WORDS = ("true", "yes", "on", "1")
OFF_WORDS = ("false", "no", "off", "0")
AUTO_WORDS = ("auto", "")


def on_off(
    value: str | bool | None, default: bool | None = None, synonyms: tuple[str, str] = ("", "")
) -> bool | None:
    """True for an on word (true, yes, on, 1), False for an off word (false, no, off, 0),
    ``default`` for None, "" and "auto"; any case, surrounding spaces ignored; a bool is
    itself. ``synonyms`` is one more (on, off) pair of words, e.g. ("dense", "quantized").
    ValueError (naming no option: callers add the name) for anything else."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in AUTO_WORDS:
            return default
        if text in ON_WORDS or (synonyms[0] and text == synonyms[0]):
            return True
        if text in OFF_WORDS or (synonyms[1] and text == synonyms[1]):
            return False
    raise ValueError(f"not an on/off word: {value!r}")


def env_on(environ: Mapping[str, str], name: str, default: bool = True) -> bool:
    """The on/off environment variable ``name`` (`on_off`); unset, auto or a value that
    is no on/off word gives ``default``: a typo in the environment never stops a start."""
    try:
        value = on_off(environ.get(name), default)
    except ValueError:
        return default
    return default if value is None else value


# --- built-in defaults ----------------------------------------------------------------
# Prompt-cache entries kept in memory where no memory budget bounds their bytes (memory_budget:0,
# distributed groups: `caches.prompt_tiers.entry_bound`): the original backend's default.
DEFAULT_MAX_CACHE_ENTRIES = 10
DEFAULT_PROMPT_CACHE_DISK_BYTES = 10 << 30  # option prompt_cache_disk_bytes: 10 GiB per directory
# No disk tier unless a directory is named (option prompt_cache_dir, or PromptCachePath, which
# LocalAI sends only when the model's YAML sets prompt_cache_path: core/backend/options.go
# gRPCPredictOpts; llama.cpp writes its prompt cache only then too). A default directory would
# write up to the budget above per model where nobody asked: the models volume can be
# read-only, shared or small, and $TMPDIR can be RAM-backed (tmpfs), which would spend the
# memory the tier exists to spare. The memory tier holds shared prefixes once (prompt_cache.py).
UNLIMITED_REASONING = -1  # reasoning_budget: no limit (LocalAI's and llama.cpp's default)
# grammar_scope: a constraint covers the answer after the reasoning, or all the output.
GRAMMAR_SCOPES = ("after_reasoning", "all")
# tool_grammar: when a request's calls are held to its declared tools (decoding/tool_grammar.py):
# only when ToolChoice requires a call or names a function, for every request with tools, or never.
TOOL_GRAMMAR_MODES = ("required", "on", "off")
# Metadata reasoning_effort: the values vLLM's ChatCompletionRequest accepts
# (vllm/entrypoints/openai/chat_completion/protocol.py), a superset of LocalAI's
# none|minimal|low|medium|high (core/config/model_config.go ReasoningEffort).
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
DEFAULT_NUM_DRAFT_TOKENS = 3  # draft tokens per speculative step (mlx-lm's server uses 3)
# N-gram drafts cost no model, start at 3 tokens and only grow while they keep being
# accepted, so a wider cap pays on repetitive text and costs little elsewhere.
DEFAULT_NGRAM_DRAFT_TOKENS = 8
DEFAULT_NGRAM_SIZE = 3  # longest n-gram looked up for drafts (option ngram_size)
# Most sequences decoded together (option ``max_batch_size``): a ceiling, not the usual bound.
# Below it the memory budget admits by the KV sequences hold and preempts when it runs short
# (engine/preemption.py), and the step budget shares each step's prefill (engine/step_budget.py),
# so 32 agents arriving together all start within a step or two. The ceiling bounds the decode
# step's time and the batch's host work per row; 256 is vLLM's default ``max_num_seqs``.
DEFAULT_MAX_BATCH_SIZE = 256
DEFAULT_MAX_QUEUE = 64  # requests waiting for a batch slot (option ``max_queue``)
DEFAULT_PREFILL_STEP = 512  # prompt tokens of one step, all rows (``prefill_step_size``)
# Milliseconds one batch step may take while others decode (option ``step_budget_ms``): the
# bound of their inter-token latency while a long prompt prefills (issue: a 3,000-token
# prompt froze running streams for 6-8 s on 2 CPU cores with full 512-token chunks).
DEFAULT_STEP_BUDGET_MS = 750
DEFAULT_KV_GROUP_SIZE = 64  # mlx-lm's default
EMBEDDING_POOLINGS = ("mean", "last", "none")  # option embedding_pooling
DISTRIBUTED_MODES = ("tensor", "pipeline")  # option distributed_mode
DISTRIBUTED_BACKENDS = ("ring", "jaccl")  # option distributed_backend (LocalAI's worker mode)
SPECULATIVE = ("ngram", "draft")  # option speculative
WARMUP_ENV = "LOCALAI_MLX_WARMUP"  # the default of option warmup (the test suite turns it off)
RERANK_MODES = ("auto", "yes_no", "likelihood")  # option rerank (tasks/rerank.py)
# Qwen3-Reranker's default instruction (its model card's format_instruction).
DEFAULT_RERANK_INSTRUCTION = (
    "Given a web search query, retrieve relevant passages that answer the query"
)


# --- the table --------------------------------------------------------------------------
@dataclass(frozen=True)
class Option:
    """One load option.

    ``kind``: int, float, size (bytes: an integer or "8GiB"), switch (on/off words; ""
    and auto give the default), auto_switch (on/off words or auto = None), choice (one
    of ``choices``, any case), text (as written, stripped), path (as written; present
    but empty is an error), normalize (true/false or llama.cpp's integer code).
    ``lo``/``hi``: inclusive bounds of numbers. ``default``: the value when the option
    is absent; ``shown`` says it in words where the value alone would not. ``aliases``:
    other spellings, read only when the key itself is absent. ``env``: the environment
    variable that sets the default (on/off). ``field``: ``LoadParams`` has a field of
    this name that takes the value as it is (the others are resolved by load_params).
    """

    key: str
    kind: str
    doc: str
    default: Any = None
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    synonyms: tuple[str, str] = ("", "")
    aliases: tuple[str, ...] = ()
    env: str = ""
    shown: str = ""
    group: str = ""
    field: bool = True


SAMPLING = "sampling defaults (a request's non-zero value wins)"
_TOKENIZER = "tokenizer"
_CACHE = "prompt cache, KV and memory"
_BATCH = "batching and scheduling"
_SPEC = "speculative decoding"
_CPU = "CPU weights"
_EMBED = "embeddings"
_PARSE = "output parsing and reasoning"
_DIST = "distributed"
_VISION = "vision-language models"
_RERANK = "reranking (the Rerank RPC, docs/RERANK.md)"


def _token(key: str) -> Option:
    return Option(
        key, "text", f"the tokenizer's {key} (text as written)", group=_TOKENIZER, field=False
    )


OPTIONS: tuple[Option, ...] = (
    # sampling defaults: LoadParams.defaults, under these keys
    Option("max_tokens", "int", "default `Tokens`", lo=1, shown="512", group=SAMPLING,
           field=False),
    Option("temperature", "float", "default `Temperature` (`temperature` wins over `temp`)",
           lo=0.0, aliases=("temp",), shown="0 (greedy)", group=SAMPLING, field=False),
    Option("top_p", "float", "default `TopP`", lo=0.0, hi=1.0, shown="1 (off)",
           group=SAMPLING, field=False),
    Option("min_p", "float", "default `MinP`", lo=0.0, hi=1.0, shown="0 (off)",
           group=SAMPLING, field=False),
    Option("top_k", "int", "default `TopK`", lo=0, shown="0 (off)", group=SAMPLING,
           field=False),
    Option("xtc_threshold", "float", "XTC sampling's threshold (no request field)", lo=0.0,
           hi=0.5, shown="0.1", group=SAMPLING, field=False),
    Option("xtc_probability", "float", "XTC sampling's probability (no request field)",
           lo=0.0, hi=1.0, shown="0 (off)", group=SAMPLING, field=False),
    Option("repetition_penalty", "float", "default `Penalty`", lo=0.0, shown="0 (off)",
           group=SAMPLING, field=False),
    Option("repetition_context_size", "int", "default `Repeat`: the penalties' window",
           lo=1, shown="20", group=SAMPLING, field=False),
    Option("presence_penalty", "float", "default `PresencePenalty`", shown="0 (off)",
           group=SAMPLING, field=False),
    Option("frequency_penalty", "float", "default `FrequencyPenalty`", shown="0 (off)",
           group=SAMPLING, field=False),
    Option("seed", "int", "default `Seed` (wins over `ModelOptions.Seed`)", lo=-(2**63),
           shown="random (≤ 0 = random)", group=SAMPLING, field=False),
    # tokenizer: mlx-lm's load(tokenizer_config=...)
    *(_token(key) for key in (
        "eos_token", "pad_token", "bos_token", "unk_token", "sep_token", "cls_token",
        "mask_token",
    )),
    Option("trust_remote_code", "switch", "run the model repo's tokenizer code (or the "
           "field `TrustRemoteCode`)", default=False, group=_TOKENIZER, field=False),
    # prompt cache, KV and memory
    Option("max_cache_entries", "int", "prompt-cache entries kept in memory", lo=1,
           shown="unbounded: the memory budget decides (10 without one)", group=_CACHE),
    Option("max_cache_bytes", "size", "bytes the prompt cache's memory tier may hold",
           lo=0, shown="unbounded (0 = off)", group=_CACHE),
    Option("max_kv_size", "int", "a rotating KV cache of this many tokens", lo=1,
           shown="unbounded", group=_CACHE),
    Option("prompt_cache_dir", "text", "the prompt cache's disk tier directory (relative: "
           "to `ModelPath`); wins over `PromptCachePath` (docs/PROMPT_CACHE.md)",
           default="", shown="none", group=_CACHE, field=False),
    Option("prompt_cache_disk_bytes", "size", "the disk tier's budget per directory",
           default=DEFAULT_PROMPT_CACHE_DISK_BYTES, shown="10GiB", group=_CACHE),
    Option("prompt_checkpoint_interval", "int", "on models whose KV cannot be trimmed, "
           "also snapshot the prefill every that many tokens (each counts against the "
           "cache bounds)", lo=0, default=0, shown="0 (off)", group=_CACHE),
    Option("kv_bits", "int", "quantized KV cache: 2, 3, 4, 5, 6 or 8 bits (wins over "
           "`CacheTypeKey`/`CacheTypeValue`)", lo=2, hi=8, shown="not quantized",
           group=_CACHE, field=False),
    Option("kv_group_size", "int", "quantized KV cache's group size", lo=1,
           default=DEFAULT_KV_GROUP_SIZE, group=_CACHE),
    Option("quantized_kv_start", "int", "tokens of a sequence kept unquantized (> 0 runs "
           "it outside the batch)", lo=0, default=0, group=_CACHE),
    Option("volatile_spans", "patterns", "text removed from every prompt before it is "
           "tokenized, so a per-request nonce does not end the prompt-cache prefix "
           "(docs/PROMPT_CACHE.md, \"Volatile spans\"): a regular expression, a JSON array "
           "of them (the name "
           "`claude_code` stands for the built-in pattern), or `none`",
           default=volatile_spans.read(None), shown="`claude_code`: Claude Code's "
           "`x-anthropic-billing-header: ...; cch=...;`", group=_CACHE),
    Option("memory_budget", "size", "bytes of MLX memory for weights, KV, prompt cache "
           "and prefill (docs/MEMORY.md)", lo=0,
           shown="the platform's (0 = off)", group=_CACHE),
    # batching and scheduling
    Option("max_batch_size", "int", "most sequences decoded together (below it the "
           "memory budget decides: docs/MEMORY.md)", lo=1,
           default=DEFAULT_MAX_BATCH_SIZE, group=_BATCH),
    Option("max_queue", "int", "requests waiting for a batch slot", lo=0,
           default=DEFAULT_MAX_QUEUE, group=_BATCH),
    Option("prefill_step_size", "int", "prompt tokens one step prefills, over all the rows "
           "in prefill (or the field `NBatch`)", lo=1, default=DEFAULT_PREFILL_STEP,
           group=_BATCH),
    Option("step_budget_ms", "int", "while others decode, a step prefills only what the "
           "measured speed fits into this many ms (their inter-token latency); 0 = one "
           "full chunk", lo=0, default=DEFAULT_STEP_BUDGET_MS, group=_BATCH),
    Option("max_pending_events", "int", "engine steps of output left untaken before a "
           "client that stopped reading is ended (a reader that lags gets them joined "
           "in one reply)", lo=1, shown="4096", group=_BATCH),
    Option("warmup", "switch", "run the request path once at LoadModel, so the first "
           "request does not pay for kernel compilation (~12 s of LoadModel on 2 CPU cores "
           "in a fresh container, 0.7 s once MLX's kernel cache in `$TMPDIR` is warm; "
           "Health answers meanwhile)", default=True, env=WARMUP_ENV,
           group=_BATCH),
    # speculative decoding
    Option("speculative", "choice", "`ngram`: draft-free prompt-lookup speculation; "
           "`draft`: the `DraftModel` (implied by it); greedy output unchanged, sampled "
           "output from the same distribution", choices=("", *SPECULATIVE),
           default="", shown="off", group=_SPEC),
    Option("num_draft_tokens", "int", "draft tokens per step (default `NDraft`)", lo=1,
           hi=64, shown="3; 8 with `speculative:ngram`", group=_SPEC, field=False),
    Option("ngram_size", "int", "longest n-gram looked up for drafts", lo=1, hi=16,
           default=DEFAULT_NGRAM_SIZE, group=_SPEC),
    # CPU weights
    Option("cpu_dequantize", "auto_switch", "on the CPU: float32 weights on the fast BLAS "
           "(`true`/`dense`), kept quantized (`false`/`quantized`), or `auto` when they "
           "fit `cpu_dequantize_budget`", synonyms=("dense", "quantized"), shown="auto",
           group=_CPU),
    Option("cpu_dequantize_budget", "size", "bytes the float32 weights may take under "
           "`auto`", shown="half the RAM", group=_CPU),
    Option("cpu_fuse", "switch", "on the dense CPU path, fuse Q/K/V and compile "
           "norm/rotary (llama, mistral, qwen2, qwen3; output unchanged)", default=True,
           group=_CPU),
    Option("cpu_attention", "switch", "on the CPU, attention's softmax with numpy's "
           "vectorized exp (MLX's x86 wheels run it scalar; ~7x faster prefill attention, "
           "outputs within float32 rounding)", default=True, group=_CPU),
    # embeddings
    Option("embedding_pooling", "choice", "`none` returns per-token vectors",
           choices=EMBEDDING_POOLINGS, default="mean", group=_EMBED),
    Option("embedding_normalize", "normalize", "llama.cpp's `embd_normalize`: true = 2 "
           "(L2), false = -1 (none), 0 max-abs, 1 taxicab, p > 2 p-norm",
           aliases=("embd_normalize",), default=2, shown="true (L2)", group=_EMBED),
    # output parsing and reasoning
    Option("tool_parser", "text", "a vLLM tool-parser name, as LocalAI's importer writes "
           "it (the table is in `decoding/parsers.py`), overriding what mlx-lm detects from "
           "the chat template; a name with no MLX equivalent, or unknown, logs a warning "
           "and keeps mlx-lm's: never a failed load", default="", shown="detected",
           group=_PARSE),
    Option("reasoning_parser", "text", "a vLLM reasoning-parser name (as `tool_parser`)",
           default="", shown="detected", group=_PARSE),
    Option("reasoning_budget", "int", "reasoning tokens per request (overridden by "
           "`Metadata` `reasoning_budget`); 0 also turns thinking off", lo=-1,
           default=UNLIMITED_REASONING, shown="-1 (unlimited)", group=_PARSE),
    Option("grammar_scope", "choice", "what a request's `Grammar` / JSON schema covers: "
           "`after_reasoning` starts it after the think block (when the model has think "
           "markers), `all` also holds the reasoning to it; `Metadata` `grammar_scope` "
           "overrides it per request", choices=GRAMMAR_SCOPES, default="after_reasoning",
           group=_PARSE),
    Option("tool_grammar", "choice", "hold tool calls to the request's `Tools` once the "
           "model's tool-call marker appears (every format of docs/DECODING.md, "
           "\"Tool-call grammars\": a declared name, arguments held to its JSON schema, "
           "the closing marker): "
           "`required` only when `ToolChoice` requires a call or names a function (then "
           "from the first token on), `on` for every request with tools, `off` never; an "
           "explicit `Grammar` / JSON schema wins; `Metadata` `tool_grammar` overrides it "
           "per request", choices=TOOL_GRAMMAR_MODES, default="required", group=_PARSE),
    # distributed
    Option("distributed_mode", "choice", "split over the group by tensors or layers",
           choices=("", *DISTRIBUTED_MODES), default="", shown="the group's", group=_DIST),
    Option("distributed_vocab", "switch", "false keeps the embeddings whole on every rank",
           default=True, group=_DIST),
    Option("hostfile", "path", "rank 0 joins the ring/JACCL group of this hostfile "
           "(LocalAI's worker protocol)", default="", shown="none (or "
           "`$MLX_DISTRIBUTED_HOSTFILE`)", group=_DIST),
    Option("distributed_backend", "choice", "the group's backend",
           choices=("", *DISTRIBUTED_BACKENDS), default="",
           shown="`$MLX_DISTRIBUTED_BACKEND`, else ring", group=_DIST),
    # vision-language models: LoadParams.vision
    Option("vision", "switch", "false serves a vision-language model text-only",
           default=True, group=_VISION, field=False),
    Option("max_images", "int", "images per request", lo=1, default=MAX_IMAGES,
           group=_VISION, field=False),
    Option("max_image_bytes", "int", "bytes of one image file", lo=1,
           default=MAX_IMAGE_BYTES, group=_VISION, field=False),
    Option("max_image_pixels", "int", "width x height of one decoded image", lo=1,
           default=MAX_IMAGE_PIXELS, group=_VISION, field=False),
    Option("vision_max_pixels", "int", "the processor resizes images to at most this "
           "many pixels", lo=1, shown="the processor's", group=_VISION, field=False),
    Option("vision_cache_entries", "int", "images whose vision features are kept", lo=0,
           default=VISION_CACHE_ENTRIES, group=_VISION, field=False),
    Option("vision_cache_bytes", "int", "bytes those features may hold", lo=0,
           default=VISION_CACHE_BYTES, group=_VISION, field=False),
    Option("max_videos", "int", "videos per request (`PredictOptions.Videos`)", lo=1,
           default=MAX_VIDEOS, group=_VISION, field=False),
    Option("max_video_bytes", "int", "bytes of one video file", lo=1,
           default=MAX_VIDEO_BYTES, group=_VISION, field=False),
    Option("max_video_frames", "int", "frames sampled from one video (at most; mlx-vlm's "
           "sampling: 2 per second, at least 4, an even count)", lo=2,
           default=MAX_VIDEO_FRAMES, group=_VISION, field=False),
    # reranking: LoadParams.rerank, rerank_instruction
    Option("rerank", "choice", "how Rerank scores a document: `yes_no`, the probability "
           "of \"yes\" after a generative reranker's judge prompt in the chat template "
           "(Qwen3-Reranker); `likelihood`, the query's log-likelihood given the document; "
           "`auto`: `yes_no` when the model's name contains \"rerank\" and it has a chat "
           "template and one-token yes/no, else `likelihood`", choices=RERANK_MODES,
           default="auto", group=_RERANK),
    Option("rerank_instruction", "text", "the `<Instruct>` line of the `yes_no` prompt",
           default=DEFAULT_RERANK_INSTRUCTION, shown="Qwen3-Reranker's web-search one",
           group=_RERANK),
)  # fmt: skip

BY_KEY: Mapping[str, Option] = {o.key: o for o in OPTIONS}
KNOWN_KEYS: frozenset[str] = frozenset(k for o in OPTIONS for k in (o.key, *o.aliases))
TOKENIZER_OPTION_KEYS = tuple(o.key for o in OPTIONS if o.group == _TOKENIZER and o.kind == "text")


# --- reading ----------------------------------------------------------------------------
def split_options(entries: Iterable[str]) -> Iterator[tuple[str, str]]:
    """("key", "value") of each "key:value" entry, split at the first colon, stripped;
    entries without a colon or with an empty key are skipped."""
    for entry in entries:
        if ":" not in entry:
            continue
        key, value = entry.split(":", 1)
        key = key.strip()
        if key:
            yield key, value.strip()


def typed(value: str) -> bool | int | float | str:
    """bool for true/false (any case), else int, else float, else the string."""
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    return value


def parse_options(entries: Iterable[str]) -> dict[str, Any]:
    """Parse `ModelOptions.Options` ("key:value" strings) into a dict of `typed` values.

    Split at the first colon ("a:b:c" -> {"a": "b:c"}); key and value are stripped.
    Entries without a colon or with an empty key are skipped; a repeated key keeps its
    last value. Never raises.
    """
    return {key: typed(value) for key, value in split_options(entries)}


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_float(name: str, value: float, lo: float | None = None, hi: float | None = None) -> float:
    if (
        not math.isfinite(value)
        or (lo is not None and value < lo)
        or (hi is not None and value > hi)
    ):
        lo_s = "-inf" if lo is None else f"{lo:g}"
        hi_s = "inf" if hi is None else f"{hi:g}"
        raise ValueError(f"{name} must be a finite number in [{lo_s}, {hi_s}], got {value!r}")
    return value


def check_int(name: str, value: int, lo: int, hi: int | None = None) -> int:
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be an integer {rng}, got {value!r}")
    return value


def _int(name: str, text: str, o: Option) -> int:
    value = typed(text)
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # "8e9" parses as float
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"option {name} must be an integer, got {value!r}")
    lo = -(2**63) if o.lo is None else int(o.lo)
    return check_int(f"option {name}", value, lo, None if o.hi is None else int(o.hi))


def _float(name: str, text: str, o: Option) -> float:
    value = typed(text)
    if not is_number(value):
        raise ValueError(f"option {name} must be a number, got {value!r}")
    return check_float(f"option {name}", float(value), o.lo, o.hi)


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_size(name: str, value: Any) -> int:
    """A positive byte count: an int, or a string like "512MB" / "8GiB" (KB=1000,
    KiB=1024). ValueError naming ``name`` otherwise."""
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if not match:
            raise ValueError(
                f'{name} must be a positive byte count like 1073741824 or "8GiB", got {value!r}'
            )
        number, unit, binary = match.groups()
        base = 1024 if binary else 1000
        size = float(number) * base ** " kmgt".index(unit.lower() or " ")
        return check_int(name, int(size), 1)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return check_int(name, value, 1)


def _size(name: str, text: str, o: Option) -> int:
    value = typed(text)
    if o.lo == 0 and value in (0, "0"):
        return 0  # 0 (or false) = off, where the table allows it
    return parse_size(f"option {name}", value)


def _switch(name: str, text: str, o: Option) -> bool | None:
    try:
        return on_off(text, o.default, o.synonyms)
    except ValueError:
        words = "auto, true or false" if o.kind == "auto_switch" else "true or false"
        raise ValueError(f"option {name} must be {words}, got {typed(text)!r}") from None


def _choice(name: str, text: str, o: Option) -> str:
    value = text.lower()
    if value not in o.choices:
        named = ", ".join(c for c in o.choices if c)
        raise ValueError(f"option {name} must be one of {named}, got {text!r}")
    return value


def _path(name: str, text: str, o: Option) -> str:
    if not text:
        raise ValueError(f"option {name} needs a file path, e.g. {name}:/path/to/hosts.json")
    return text


def embd_normalize_code(value: Any) -> int:
    """llama.cpp's ``embd_normalize`` code (-1 none, 0 max-abs, 1 taxicab, 2 L2, p > 2
    p-norm) of ``value``: true = 2, false = -1, or the integer code. ValueError naming
    option embedding_normalize otherwise."""
    if isinstance(value, bool):
        return 2 if value else -1
    if isinstance(value, int) and value >= -1:
        return value
    raise ValueError(
        "option embedding_normalize must be true/false or an integer >= -1 (-1 none, "
        f"0 max-abs, 1 taxicab, 2 L2, p > 2 p-norm), got {value!r}"
    )


_READERS: dict[str, Callable[[str, str, Option], Any]] = {
    "int": _int,
    "float": _float,
    "size": _size,
    "switch": _switch,
    "auto_switch": _switch,
    "choice": _choice,
    "text": lambda name, text, o: text,
    "path": _path,
    "normalize": lambda name, text, o: embd_normalize_code(typed(text)),
    "patterns": lambda name, text, o: volatile_spans.read(text),
}


def _env_default(o: Option, environ: Mapping[str, str]) -> Any:
    """The default of ``o``, from its environment variable when it has one (`env_on`)."""
    return env_on(environ, o.env, o.default) if o.env else o.default


@dataclass(frozen=True)
class ReadOptions:
    """What `read_options` found: ``values`` has every key of `OPTIONS` (checked, or the
    default), ``given`` the keys set (by the key or an alias), ``unknown`` the keys no
    option of the table has."""

    values: Mapping[str, Any]
    given: frozenset[str]
    unknown: tuple[str, ...]


def read_options(
    entries: Iterable[str],
    fallbacks: Mapping[str, str] | None = None,
    environ: Mapping[str, str] = os.environ,
    engine_args: Mapping[str, str] | None = None,
) -> ReadOptions:
    """Read and check the load options in ``entries`` against `OPTIONS`, in one pass.

    ``fallbacks``: text values of keys the entries may leave unset (``ModelOptions.Seed``,
    ``NBatch``); they count as given. ``engine_args``: the options of
    ``ModelOptions.EngineArgs`` (`read_engine_args`), which win over ``entries`` for the
    same option, whatever spelling either uses (module doc of `read_engine_args`).
    Raises ValueError naming the option (the spelling used, and EngineArgs when it came
    from there) and what it accepts.
    """
    raw = dict(split_options(entries))
    for key, text in (fallbacks or {}).items():
        raw.setdefault(key, text)
    labels: dict[str, str] = {}
    engine = engine_args or {}
    for key, text in engine.items():
        o = SPELLINGS[key]
        for spelling in (o.key, *o.aliases):  # the Options' spellings of it lose
            if spelling not in engine:
                raw.pop(spelling, None)
        raw[key] = text
        labels[key] = f"{key} (in {ENGINE_ARGS_FIELD})"
    values: dict[str, Any] = {}
    given: set[str] = set()
    for o in OPTIONS:
        # The key itself, else the first alias given (only the spelling read is checked).
        name = next((n for n in (o.key, *o.aliases) if n in raw), None)
        if name is None:
            values[o.key] = _env_default(o, environ)
        else:
            values[o.key] = _READERS[o.kind](labels.get(name, name), raw[name], o)
            given.add(o.key)
    unknown = tuple(sorted(k for k in raw if k not in KNOWN_KEYS))
    return ReadOptions(values, frozenset(given), unknown)


# --- ModelOptions.EngineArgs ---------------------------------------------------------------
ENGINE_ARGS_FIELD = "ModelOptions.EngineArgs"
SPELLINGS: Mapping[str, Option] = {n: o for o in OPTIONS for n in (o.key, *o.aliases)}


def _engine_arg_text(key: str, value: Any, o: Option) -> str:
    """One EngineArgs value as the text an ``Options`` entry would carry (the same reader
    then checks it): true/false, a number, a string; a JSON array only for an option
    that takes a list (``volatile_spans``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list) and o.kind == "patterns":
        return json.dumps(value)
    kind = "array" if isinstance(value, list) else "object"
    raise ValueError(
        f"{ENGINE_ARGS_FIELD}: {key} takes {_accepts(o)} (a JSON string, number or "
        f"true/false), not a JSON {kind}"
    )


def read_engine_args(raw: str) -> dict[str, str]:
    """``ModelOptions.EngineArgs`` (field 73) as load options: {key: text}.

    LocalAI marshals a model file's ``engine_args:`` map into this field as one JSON object
    (core/backend/options.go, ``ModelConfig.EngineArgs`` in core/config/model_config.go)
    and documents that unknown keys fail LoadModel (backend/backend.proto; its vLLM backend
    refuses them, backend/python/vllm/backend.py ``_apply_engine_args``). Here the engine's
    arguments are this backend's load options: the keys and aliases of `OPTIONS`, each
    value a JSON string, number or true/false read exactly as the same option in
    ``Options`` (a JSON array of patterns for ``volatile_spans``); null = not set.
    EngineArgs wins over ``Options`` for an option both set, as engine_args is applied
    last by LocalAI's vLLM, SGLang and vllm-cpp backends (backend/python/vllm/backend.py
    LoadModel, backend/go/vllm-cpp/options.go ``applyEngineArgs``). Raises ValueError
    naming the field: not a JSON object (bounded as every JSON field, `jsonfield`), a
    value of the wrong JSON type, or unknown keys (every one named, with the nearest known
    key, and the known keys listed)."""
    decoded = jsonfield.decode(raw, ENGINE_ARGS_FIELD, dict)
    if not decoded:
        return {}
    unknown = [k for k in decoded if k not in SPELLINGS]
    if unknown:
        named = []
        for key in unknown:
            near = difflib.get_close_matches(key, list(SPELLINGS), n=1)
            named.append(f"{key!r} (did you mean {near[0]!r}?)" if near else repr(key))
        raise ValueError(
            f"{ENGINE_ARGS_FIELD} has keys this backend does not know: {', '.join(named)}; "
            "EngineArgs takes this backend's load options (docs/FIELDS.md's options table): "
            f"{', '.join(sorted(SPELLINGS))}"
        )
    return {
        key: _engine_arg_text(key, value, SPELLINGS[key])
        for key, value in decoded.items()
        if value is not None
    }


# --- docs/FIELDS.md's list ----------------------------------------------------------------
def _accepts(o: Option) -> str:
    def bound(x: float | None) -> str:
        return f"{x:g}" if isinstance(x, float) else str(x)

    if o.kind in ("int", "float"):
        noun = "integer" if o.kind == "int" else "number"
        if o.key == "seed":
            return noun
        if o.lo is not None and o.hi is not None:
            return f"{noun} {bound(o.lo)}-{bound(o.hi)}"
        return f"{noun} ≥ {bound(o.lo)}" if o.lo is not None else noun
    if o.kind == "size":
        return "bytes, or a size (`8GiB`)"
    if o.kind == "switch":
        return "true/false"
    if o.kind == "auto_switch":
        return "auto/true/false"
    if o.kind == "choice":
        return "/".join(f"`{c}`" for c in o.choices if c)
    return {
        "text": "text",
        "path": "path",
        "normalize": "true/false/integer",
        "patterns": "regex, JSON array of regexes, or `none`",
    }[o.kind]


def _default(o: Option) -> str:
    if o.shown:
        text = o.shown
    elif isinstance(o.default, bool):
        text = "true" if o.default else "false"
    elif isinstance(o.default, int) and o.default >= 1 << 20 and o.default % (1 << 20) == 0:
        text = f"{o.default} ({o.default >> 20} MiB)"
    elif o.default is None or o.default == "":
        text = "none"
    else:
        text = str(o.default)
    return f"{text} (`${o.env}`)" if o.env else text


def options_markdown() -> str:
    """docs/FIELDS.md's table of load options, generated from `OPTIONS`."""
    lines = [
        "| option | accepts | default | what it does |",
        "|---|---|---|---|",
    ]
    group = None
    for o in OPTIONS:
        if o.group != group:
            group = o.group
            lines.append(f"| **{group}** | | | |")
        names = " / ".join(f"`{k}`" for k in (o.key, *o.aliases))
        lines.append(f"| {names} | {_accepts(o)} | {_default(o)} | {o.doc} |")
    return "\n".join(lines) + "\n"


README_BEGIN = (
    "<!-- options table: generated from parsing/options.py; edit the table there, then run\n"
    "     python -m parsing.fields docs/FIELDS.md -->\n"
)
README_END = "<!-- end of the options table -->\n"


def readme_with_table(text: str) -> str:
    """``text`` (docs/FIELDS.md) with the part between its two markers replaced by
    `options_markdown` (blank lines around it). ValueError when the markers are missing."""
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < start:
        raise ValueError("the text lacks the markers of the options table")
    start += len(README_BEGIN)
    return text[:start] + "\n" + options_markdown() + "\n" + text[end:]


def main(argv: list[str]) -> int:
    if argv == ["--markdown"]:
        sys.stdout.write(options_markdown())
        return 0
    if len(argv) == 2 and argv[0] == "--readme":
        with open(argv[1], encoding="utf-8") as f:
            text = f.read()
        with open(argv[1], "w", encoding="utf-8") as f:
            f.write(readme_with_table(text))
        return 0
    print("usage: python -m parsing.options --markdown | --readme docs/FIELDS.md", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
