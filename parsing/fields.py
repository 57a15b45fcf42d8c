"""The request and load fields: one table per message of backend.proto, `PREDICT_FIELDS`
(``PredictOptions``) and `MODEL_FIELDS` (``ModelOptions``), plus `METADATA_KEYS` (the
``PredictOptions.Metadata`` keys read here).

Every field of the two messages has exactly one row, saying what the backend does with
it: read (what an unset field, proto3's zero, means; what is accepted), refused (the row's
text is the refusal's reason: `params` refuses exactly the fields of these rows, from
`REFUSED_PREDICT` / `REFUSED_LOAD`) or ignored (a knob of another engine, with no meaning
on MLX). The bounds quoted come from the constants their checks use. docs/FIELDS.md's
field tables are generated from here, together with the load options' table
(``python -m parsing.fields docs/FIELDS.md``); tests/fast/test_docs_fields.py fails when
the page and the tables differ, when a proto field has no row, and when the code reads a
field or Metadata key that a row does not say it reads. Nothing here imports MLX.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

from parsing import bounds, options

DEFAULT_MAX_TOKENS = 512  # one default for Predict and PredictStream
MAX_TOKENS_CAP = 32768  # larger Tokens values are capped here, and to the context (prompting.fit)
MAX_TOP_LOGPROBS = 20  # OpenAI's cap; larger TopLogprobs is an error, as at OpenAI
DEFAULT_REPETITION_CONTEXT_SIZE = 20  # mlx-lm's default window, in tokens
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range is [-100, 100]
MAX_NDRAFT = 64  # PredictOptions.NDraft's bound (option num_draft_tokens has the same)
# ModelOptions.CacheTypeKey/Value: llama.cpp cache type names -> MLX KV quantization bits
# (None = not quantized).
KV_CACHE_TYPES = {
    "": None, "f32": None, "f16": None, "bf16": None,
    "q8_0": 8, "q6_k": 6, "q5_0": 5, "q5_1": 5, "q4_0": 4, "q4_1": 4,
}  # fmt: skip

Status = Literal["read", "refused", "ignored"]


@dataclass(frozen=True)
class Field:
    """One row: the proto fields it covers, what is done with them (for a refused row, the
    reason the refusal gives), and for a read row what an unset (zero) value means."""

    names: tuple[str, ...]
    does: str
    status: Status = "read"
    unset: str = ""


def _read(names: str, unset: str, does: str) -> Field:
    return Field(tuple(names.split()), does, "read", unset)


def _refused(names: str, reason: str) -> Field:
    return Field(tuple(names.split()), reason, "refused")


def _ignored(names: str, note: str = "") -> Field:
    return Field(tuple(names.split()), note, "ignored")


_ROPE = "RoPE is fixed by the model's config; convert the model with the RoPE you want"
_YARN = "YaRN parameters are fixed by the model's config"
_CFG = "negative prompts (classifier-free guidance) are not supported"
# Samplers whose "disabled" value is 1.0, which LocalAI sends by default: refused only
# when set to something else.
DISABLED_AT_ONE = frozenset({"TypicalP", "TailFreeSamplingZ"})

PREDICT_FIELDS: tuple[Field, ...] = (
    _read("Prompt", "no raw prompt (the `Messages` are rendered instead)",
          "raw prompt, used as is (no second BOS is added)"),
    _read("UseTokenizerTemplate Messages", "the raw `Prompt`",
          "rendered with the model's chat template (`add_generation_prompt`); `name`, "
          "`tool_call_id`, `reasoning_content`, `tool_calls` (JSON; arguments decoded to "
          "objects) forwarded; a trailing `assistant` message is continued, not answered "
          "(rendered without a generation prompt and cut after its content: prefill a JSON "
          "opening, a code fence or a think block); JSON fields are bounded in size and "
          "nesting; the content together is measured against the context before rendering "
          "(docs/OPERATING.md, \"Limits\")"),
    _read("Tools ToolChoice", "no tools; `auto`",
          f"`Tools` (JSON array, at most {bounds.MAX_TOOLS} tools) passed to the template; "
          "`ToolChoice` (as LocalAI sends it: JSON `\"none\"`, `\"required\"`, "
          "`{\"type\": \"function\", \"function\": {\"name\": ...}}`; bare words too; "
          "anything unreadable counts as `auto`) `none` offers no tools, `required` or a "
          "named function holds the output to a call of the declared tools (docs/DECODING.md, "
          "\"Tool-call grammars\"); a named function `Tools` does not declare is "
          "`INVALID_ARGUMENT`"),
    _read("Metadata", "none of the keys", "the keys of the Metadata table below"),
    _read("Grammar", "no constraint",
          "llama.cpp GBNF: constrains sampling (after the reasoning on a reasoning model; from "
          "the first trigger word on with `GrammarTriggers`)"),
    _read("Tokens", f"option `max_tokens`, else {DEFAULT_MAX_TOKENS}",
          f"max new tokens; capped at {MAX_TOKENS_CAP} and at the context left after the "
          f"prompt; -1 = until EOS, the context is full or {MAX_TOKENS_CAP} tokens, whichever "
          "comes first (llama.cpp's meaning, under the same cap); other negatives "
          "`INVALID_ARGUMENT`"),
    _read("Temperature", "option `temperature`, else 0 (greedy)", "≥ 0; 0 = greedy"),
    _read("TopP MinP", "options `top_p` / `min_p`, else off",
          "in [0, 1]; 1 (`TopP`) and 0 (`MinP`) are off"),
    _read("TopK", "option `top_k`, else off",
          "> 0 keeps that many tokens; < 0 = off even when the option `top_k` is set "
          "(LocalAI's model-family defaults send -1, llama.cpp's \"off\")"),
    _read("Penalty Repeat",
          "options `repetition_penalty` (else off) / `repetition_context_size` (else "
          f"{DEFAULT_REPETITION_CONTEXT_SIZE} tokens)",
          "repetition penalty (≥ 0; 1 is off) and its window over prompt and generated tokens "
          "(at most the context: larger is `INVALID_ARGUMENT`), as llama.cpp's "
          "`repeat_last_n`"),
    _read("PresencePenalty FrequencyPenalty",
          "options `presence_penalty` / `frequency_penalty`, else off",
          "as OpenAI, over the same window"),
    _read("Seed", "option `seed` when > 0, else random",
          "> 0: reproducible for this request, whatever else runs; < 0: random"),
    _read("StopPrompts", "no stop sequences",
          "stop sequences, matched on text; empty strings ignored; never streamed; at most "
          f"{bounds.MAX_STOP_PROMPTS} of {bounds.MAX_STOP_CHARS:,} characters"),
    _read("IgnoreEOS", "stop at EOS", "EOS is masked: generates up to `Tokens`"),
    _read("LogitBias", "no bias",
          f"JSON `{{\"token id\": bias}}`, bias in [-{LOGIT_BIAS_LIMIT:g}, "
          f"{LOGIT_BIAS_LIMIT:g}]"),
    _read("Logprobs TopLogprobs", "no logprobs",
          "per-token log-probabilities in OpenAI's format in `Reply.logprobs` (`Logprobs` "
          f"> 0, or `TopLogprobs` > 0); up to {MAX_TOP_LOGPROBS} alternatives"),
    _read("NDraft",
          f"option `num_draft_tokens`, else {options.DEFAULT_NUM_DRAFT_TOKENS} "
          f"({options.DEFAULT_NGRAM_DRAFT_TOKENS} with `speculative:ngram`)",
          f"draft tokens per step (at most {MAX_NDRAFT}) with a draft model or n-gram "
          "speculation"),
    _read("NKeep", "mlx-lm's 4",
          "with a rotating KV cache (option `max_kv_size`): prompt tokens always kept (at "
          "most the context)"),
    _read("PromptCacheRO", "the request's KV is cached",
          "read the prompt cache (both tiers), add nothing to it"),
    _read("PromptCachePath", "no disk tier (memory only)",
          "the prompt cache's disk tier directory (LocalAI sends the model directory joined "
          "with the model file's `prompt_cache_path`); it must resolve inside `ModelPath`, "
          "else `INVALID_ARGUMENT`; the load option `prompt_cache_dir` wins when set "
          "(docs/PROMPT_CACHE.md)"),
    _ignored("PromptCacheAll",
             "always true here: prompt and generated tokens are cached in memory"),
    _read("Embeddings EmbeddingTokens", "nothing to embed",
          "the text (or token ids) to embed, for the `Embedding` RPC"),
    _read("CorrelationId", "none (`-` in the log)", "logged with the request"),
    _read("ModelIdentity", "no check",
          "`NOT_FOUND` (\"model identity mismatch\") when it differs from the loaded model's "
          "`Model`"),
    _read("Images", "no images",
          "base64 image files (PNG, JPEG, WebP; a `data:image/...;base64,` prefix is "
          "accepted), one per media marker or image slot, in order: see docs/VISION.md. A "
          "URL is refused, never fetched; images to a text-only model, undecodable ones and "
          "ones over the bounds (options `max_images`, `max_image_bytes`, "
          "`max_image_pixels`) are `INVALID_ARGUMENT` naming `Images[i]`"),
    _read("Videos", "no videos",
          "base64 video files, for Qwen2-VL / Qwen2.5-VL: MP4, WebM, AVI (through mlx-vlm's "
          "reader, OpenCV), animated PNG, WebP or GIF, frames sampled as mlx-vlm samples "
          "them, bounded like images (`max_videos`, `max_video_bytes`, `max_video_frames`): "
          "see docs/VISION.md. Videos to another model, undecodable ones and ones over the "
          "bounds are `INVALID_ARGUMENT` naming `Videos[i]`"),
    _refused("Mirostat",
             "Mirostat sampling is not available in mlx-lm; use Temperature, TopP or MinP"),
    _ignored("MirostatETA MirostatTAU", "Mirostat's parameters (Mirostat itself is refused)"),
    _refused("TypicalP",
             "locally typical sampling is not available in mlx-lm; use TopP or MinP"),
    _refused("TailFreeSamplingZ",
             "tail-free sampling is not available in mlx-lm; use TopP or MinP"),
    _refused("NegativePrompt NegativePromptScale", _CFG),
    _refused("RopeFreqBase RopeFreqScale", _ROPE),
    _refused("Audios", "there is no audio input in this backend"),
    _ignored("Threads Batch F16KV MLock MMap MainGPU TensorSplit Debug DebugMode PenalizeNL",
             "newlines are always penalized, as `PenalizeNL` true"),
)  # fmt: skip

MODEL_FIELDS: tuple[Field, ...] = (
    _read("Model ModelFile ModelPath", "(a model is required)",
          "what to load, see docs/LOADING.md"),
    _read("ContextSize", "the model's own context length",
          "bounds prompt + generated tokens (LocalAI always sends one: 4096 when the model "
          "file has no `context_size`); a longer prompt gets `INVALID_ARGUMENT`"),
    _read("Options", "no options", "`key:value` load options: the options table below"),
    _read("EngineArgs", "none (`null` too)",
          "a JSON object (a model file's `engine_args:` map, as LocalAI sends it) of the same "
          "load options, with JSON values: `{\"max_batch_size\": 4, \"warmup\": false, "
          "\"volatile_spans\": [\"nonce=\\\\d+\"]}`; checked as in `Options`; an unknown key "
          "fails LoadModel naming it (LocalAI's rule for `engine_args`); an option set in "
          "both takes the `EngineArgs` value (LocalAI's vLLM backend applies `engine_args` "
          "last too)"),
    _read("TrustRemoteCode", "off (option `trust_remote_code` may turn it on)",
          "passed to the tokenizer loader"),
    _read("DraftModel", "no draft model",
          "speculative decoding with this model (same tokenizer required); greedy output is "
          "unchanged. LocalAI joins the model file's `draft_model` onto its models "
          "directory, so under LocalAI it is a local MLX directory (or `.gguf`) below the "
          "models directory, not a hub id"),
    _read("CacheTypeKey CacheTypeValue", "KV not quantized",
          "quantized KV cache: "
          + ", ".join(f"`{k}`" for k, bits in KV_CACHE_TYPES.items() if bits)
          + " (both must agree), "
          + "/".join(f"`{k}`" for k, bits in KV_CACHE_TYPES.items() if k and not bits)
          + " = not quantized; option `kv_bits` wins"),
    _read("LoraAdapter LoraAdapters LoraScale LoraScales", "no adapter; scale as trained",
          "one mlx-lm adapter directory, its trained scale multiplied by `LoraScale` (≥ 0; "
          "0 = as trained); merged into dense weights"),
    _read("Seed NBatch", f"random; option `prefill_step_size`, else {options.DEFAULT_PREFILL_STEP}",
          "default request seed (option `seed` wins); prefill chunk in tokens (option "
          "`prefill_step_size` wins)"),
    _read("GrammarTriggers", "the grammar applies from the first token",
          "lazy grammar, as llama.cpp: a request's `Grammar` (or JSON schema) applies from "
          "the first of these words in the output on, the word included; the text before it "
          f"is free; at most {bounds.MAX_GRAMMAR_TRIGGERS} words of "
          f"{bounds.MAX_TRIGGER_CHARS:,} characters"),
    _ignored("Reranking",
             "accepted (LocalAI sends it for a model file with `reranking: true`); Rerank is "
             "served on every model, the way chosen by the option `rerank`"),
    _refused("LoraBase",
             "the adapter is applied to the loaded model itself (kept in full precision "
             "beside quantized weights); leave lora_base empty, or fuse offline with "
             "`mlx_lm.fuse --dequantize`"),
    _refused("RopeFreqBase RopeFreqScale", _ROPE),
    _refused("RopeScaling", "RoPE scaling is fixed by the model's config"),
    _refused("YarnExtFactor YarnAttnFactor YarnBetaFast YarnBetaSlow", _YARN),
    _refused("RMSNormEps", "the norm epsilon is fixed by the model's config"),
    _refused("NGQA", "grouped-query attention is fixed by the model's config"),
    _refused("Tokenizer", "the tokenizer is read from the model directory or GGUF file"),
    _refused("MMProj",
             "MLX vision models carry their vision tower in the model directory (no separate "
             "projector file)"),
    _refused("Quantization",
             "load a quantized MLX model or GGUF instead (vLLM's quantization option)"),
    _refused("Overrides", "GGUF metadata overrides are not supported"),
    _ignored("F16Memory MLock MMap VocabOnly LowVRAM NUMA NGPULayers MainGPU TensorSplit "
             "Threads CUDA FlashAttention NoKVOffload NoMulMatQ DType Type LoadFormat "
             "SwapSpace MaxModelLen TensorParallelSize GPUMemoryUtilization EnforceEager "
             "Embeddings EnableScore DisableLogStatus Proxy"),
    _ignored("LimitImagePerPrompt LimitVideoPerPrompt LimitAudioPerPrompt",
             "vLLM's; the options `max_images` and `max_videos` bound a request here"),
    _ignored("PipelineType SchedulerType CFGScale IMG2IMG CLIPModel CLIPSubfolder CLIPSkip "
             "ControlNet AudioPath", "image, audio and diffusers fields"),
)  # fmt: skip


@dataclass(frozen=True)
class MetadataKey:
    key: str
    unset: str
    does: str


METADATA_KEYS: tuple[MetadataKey, ...] = (
    MetadataKey("enable_thinking", "the template's default",
                "`true`/`false`: the chat template's `enable_thinking`"),
    MetadataKey("chat_template_kwargs", "none",
                "JSON object of chat template variables, merged last (wins over the keys "
                "above and below)"),
    MetadataKey("reasoning_effort", "none",
                f"{', '.join(f'`{e}`' for e in options.REASONING_EFFORTS)} (any case, as "
                "vLLM accepts; what LocalAI sends from a model file's or request's "
                "`reasoning_effort`): the template variable `reasoning_effort` (gpt-oss "
                "reads it), and unless the request sets `enable_thinking`, `none` renders "
                "with thinking off and a level with it on (as vLLM)"),
    MetadataKey("json_schema", "no constraint",
                "a JSON schema (or OpenAI's `{\"name\": ..., \"schema\": {...}}`) the output "
                "is held to"),
    MetadataKey("response_format", "no constraint",
                "OpenAI's `response_format` (`json_object`, `json_schema`; LocalAI's JSON "
                "mode) the output is held to"),
    MetadataKey("reasoning_budget", "option `reasoning_budget`, else -1 (unlimited)",
                "an integer ≥ -1: reasoning tokens before the backend ends the think block; "
                "0 also renders with `enable_thinking` false unless the request sets it"),
    MetadataKey("grammar_scope", "option `grammar_scope`, else `after_reasoning`",
                f"{'/'.join(f'`{s}`' for s in options.GRAMMAR_SCOPES)}: what a constraint "
                "covers (docs/DECODING.md, \"Constraints and reasoning\")"),
    MetadataKey("tool_grammar", "option `tool_grammar`, else `required`",
                f"{'/'.join(f'`{s}`' for s in options.TOOL_GRAMMAR_MODES)}: when tool calls "
                "are held to the request's `Tools` (docs/DECODING.md, \"Tool-call "
                "grammars\")"),
)  # fmt: skip


def _refusals(rows: tuple[Field, ...]) -> dict[str, str]:
    return {name: f.does for f in rows if f.status == "refused" for name in f.names}


REFUSED_PREDICT = _refusals(PREDICT_FIELDS)
REFUSED_LOAD = _refusals(MODEL_FIELDS)


# --- docs/FIELDS.md's tables -------------------------------------------------------------
def _names(f: Field) -> str:
    return ", ".join(f"`{n}` (≠ 1)" if n in DISABLED_AT_ONE else f"`{n}`" for n in f.names)


def _what(f: Field) -> str:
    if f.status == "refused":
        return f"refused: {f.does}"
    if f.status == "ignored":
        return f"ignored: {f.does}" if f.does else "no meaning on MLX: ignored"
    return f.does


def fields_markdown(rows: tuple[Field, ...]) -> str:
    """One message's table: field, what unset means, what happens."""
    lines = ["| field | unset (zero) means | what happens |", "|---|---|---|"]
    lines += [f"| {_names(f)} | {f.unset} | {_what(f)} |" for f in rows]
    return "\n".join(lines) + "\n"


def metadata_markdown() -> str:
    lines = ["| key | unset means | what it does |", "|---|---|---|"]
    lines += [f"| `{k.key}` | {k.unset} | {k.does} |" for k in METADATA_KEYS]
    return "\n".join(lines) + "\n"


def _markers(name: str, source: str) -> tuple[str, str]:
    return (
        f"<!-- {name} table: generated from {source}; edit the table there, then run\n"
        "     python -m parsing.fields docs/FIELDS.md -->\n",
        f"<!-- end of the {name} table -->\n",
    )


TABLES = {
    "PredictOptions": (_markers("PredictOptions", "parsing/fields.py"),
                       lambda: fields_markdown(PREDICT_FIELDS)),
    "Metadata": (_markers("Metadata", "parsing/fields.py"), metadata_markdown),
    "ModelOptions": (_markers("ModelOptions", "parsing/fields.py"),
                     lambda: fields_markdown(MODEL_FIELDS)),
    "options": ((options.README_BEGIN, options.README_END), options.options_markdown),
}  # fmt: skip


def with_tables(text: str) -> str:
    """``text`` (docs/FIELDS.md) with each generated table replaced between its markers
    (blank lines around it). ValueError naming the table whose markers are missing."""
    for name, ((begin, end), make) in TABLES.items():
        start, stop = text.find(begin), text.find(end)
        if start < 0 or stop < start or text.count(begin) != 1:
            raise ValueError(f"the text lacks the markers of the {name} table (once each)")
        start += len(begin)
        text = text[:start] + "\n" + make() + "\n" + text[stop:]
    return text


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m parsing.fields docs/FIELDS.md", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        text = f.read()
    with open(argv[0], "w", encoding="utf-8") as f:
        f.write(with_tables(text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
