"""GGUF -> mlx-lm model directory conversion, and the on-disk cache of converted models.

Owns: reading a GGUF file (through ``mx.load``), mapping llama.cpp tensor names and
metadata to an mlx-lm ``llama`` model directory (``config.json``, ``model.safetensors``),
rebuilding the tokenizer from the GGUF vocabulary with the ``tokenizers`` library
(``tokenizer.json``, ``tokenizer_config.json`` with the chat template), and caching
each conversion under a key derived from the source file's identity.

Quantized tensors are copied as they are: ``mx.load`` already returns GGUF Q4_0 / Q4_1 /
Q8_0 blocks as MLX affine triples (weight, scales, biases; group size 32), and any other
GGUF type as dense float16. Q/K rows keep llama.cpp's rotary layout and the config says
``rope_traditional: true`` (see ``build_config``).

Never downloads anything.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import numpy as np
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from errors import ModelLoadError

logger = logging.getLogger("localai.mlx.gguf_convert")

# Bump when the layout of a converted directory changes: old cache entries are ignored.
CONVERTER_VERSION = 1

SUPPORTED_ARCHITECTURES = ("llama",)
SUPPORTED_TOKENIZER_MODELS = ("gpt2", "llama")  # byte-level BPE, SentencePiece (SPM)

# ggml block size of Q4_0 / Q4_1 / Q8_0 (QK4_0 = QK4_1 = QK8_0 = 32 in ggml-common.h);
# mx.load turns each block into one MLX quantization group.
GGUF_GROUP_SIZE = 32

# GGUF token types (llama.cpp ``llama_token_type``); 5 (unused) and 6 (byte) need no care.
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4

# Per-tensor name mapping, llama.cpp ``LLM_TENSOR_NAMES`` (llama arch) -> mlx-lm llama.
_TOP_LEVEL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
# "weight"/"bias" are the layer's own parameters; "scales"/"biases" are the MLX
# quantization companions mx.load adds next to a quantized "weight".
_SUFFIXES = ("weight", "bias", "scales", "biases")
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.([a-z]+)$")
_TOP_RE = re.compile(r"^([a-z_]+)\.([a-z]+)$")

# Tensors that carry no weights for the mlx-lm model (handled via the config instead).
_CONFIG_ONLY_TENSORS = ("rope_freqs.weight",)

# Pre-tokenizer regexes per ``tokenizer.ggml.pre``, copied from llama.cpp
# src/llama-vocab.cpp (``llm_tokenizer_bpe`` constructor and the pre-type table in
# ``llama_vocab::impl::load``). llama.cpp applies the list in order, each regex splitting
# the pieces of the previous one and keeping unmatched text as pieces: the ``tokenizers``
# equivalent is a chain of ``Split(..., behavior="isolated")``. Values: (regexes,
# ignore_merges, add_bos default).
_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_RE = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_RE = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Tekken (Mistral Nemo): the original tokenizer.json regex; llama.cpp rewrites it only
# because std::regex lacks \p{Lu}, which Oniguruma (used by ``tokenizers``) has.
_TEKKEN_RE = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEFAULT_RES = (
    r"[\p{P}\$\+<=>\^~\|]+",
    _GPT2_RE,
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
)
_PRE_TOKENIZERS: dict[str, tuple[tuple[str, ...], bool, bool]] = {
    "default": (_DEFAULT_RES, False, False),
    **{name: ((_LLAMA3_RE,), True, True) for name in ("llama3", "llama-v3", "llama-bpe")},
    **{name: ((_LLAMA3_RE,), True, True) for name in ("falcon3", "pixtral")},
    **{name: ((_LLAMA3_RE,), False, False) for name in ("dbrx", "smaug-bpe")},
    **{name: ((_GPT2_RE,), False, False) for name in ("gpt-2", "phi-2", "mpt", "olmo", "jais")},
    **{
        name: ((r"\p{N}", _GPT2_RE), False, False)
        for name in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone")
    },
    **{
        name: ((_QWEN2_RE,), False, False)
        for name in ("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2")
    },
    "tekken": ((_TEKKEN_RE,), True, True),
}

# Token texts llama.cpp treats as end-of-generation besides the eos/eot/eom ids
# (``llama_vocab::impl::load``, "auto-detect special tokens by text").
_EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "<|end_of_text|>",
        "<end_of_utterance>",
    }
)

# Llama 3.x rope scalings that llama.cpp bakes into a ``rope_freqs`` tensor; we recognise
# the tensor by recomputing it (HF config values of Llama 3.1 / 3.2 respectively).
_LLAMA3_ROPE_SCALINGS = (
    {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
)


# --------------------------------------------------------------------------- reading
def read_gguf(gguf_path: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """Load a GGUF file: (tensors by GGUF name, metadata as plain Python values).

    Quantized Q4_0/Q4_1/Q8_0 tensors come back as ``name.weight`` (uint32, packed),
    ``name.scales`` and ``name.biases`` (float16, one per 32 values); other quantized
    types as dense float16. Raises ``ModelLoadError`` if the file cannot be parsed.
    """
    try:
        tensors, raw = mx.load(str(gguf_path), return_metadata=True)
    except Exception as exc:  # mx.load raises ValueError/RuntimeError with a terse text
        raise ModelLoadError(
            f"cannot read GGUF file {gguf_path}: {exc}. Check that it is a complete, "
            "valid .gguf file (re-download it if it is truncated)."
        ) from exc
    # With return_metadata a GGUF file reads as (name -> array, key -> value); mlx types
    # the result as any of its load shapes.
    tensors_by_name = cast(dict[str, mx.array], tensors)
    return tensors_by_name, {k: _plain(v) for k, v in cast(dict[str, Any], raw).items()}


def _plain(value: Any) -> Any:
    """An mx.array metadata value as int/float/bool/list; float32 rounded to its repr."""
    if isinstance(value, mx.array):
        if value.ndim == 0:
            item = cast(float, value.item())
            if value.dtype == mx.float32:
                # float(np.float32) prints 1e-05 as 9.99999974e-06; keep the short form.
                return float(str(np.float32(item)))
            return item
        return value.tolist()
    return value


# --------------------------------------------------------------------------- names
def gguf_to_mlx_name(name: str) -> str:
    """Map one GGUF tensor name to its mlx-lm llama parameter path.

    ``token_embd.weight`` -> ``model.embed_tokens.weight``,
    ``blk.3.attn_q.scales`` -> ``model.layers.3.self_attn.q_proj.scales``,
    ``output.weight`` -> ``lm_head.weight``. Raises ``ModelLoadError`` for a tensor the
    llama architecture does not have (names it).
    """
    if m := _BLOCK_RE.match(name):
        layer, base, suffix = m.groups()
        if base in _BLOCK_NAMES and suffix in _SUFFIXES:
            return f"model.layers.{layer}.{_BLOCK_NAMES[base]}.{suffix}"
    elif m := _TOP_RE.match(name):
        base, suffix = m.groups()
        if base in _TOP_LEVEL_NAMES and suffix in _SUFFIXES:
            return f"{_TOP_LEVEL_NAMES[base]}.{suffix}"
    raise ModelLoadError(
        f"GGUF tensor '{name}' has no counterpart in the mlx-lm llama model; this file "
        "is not a plain llama-architecture model (mixture-of-experts and multimodal "
        "variants are not supported). Use an MLX model directory instead."
    )


def map_tensor_names(tensors: dict[str, mx.array]) -> dict[str, mx.array]:
    """All GGUF tensors renamed for mlx-lm, minus config-only ones (``rope_freqs``)."""
    return {gguf_to_mlx_name(k): v for k, v in tensors.items() if k not in _CONFIG_ONLY_TENSORS}


# --------------------------------------------------------------------------- config
def _require(metadata: dict[str, Any], key: str) -> Any:
    if key not in metadata:
        raise ModelLoadError(
            f"GGUF metadata lacks '{key}', which the conversion needs; the file was "
            "probably written by an old or non-standard converter. Re-convert it with a "
            "current llama.cpp convert_hf_to_gguf.py."
        )
    return metadata[key]


def quantization_config(weights: dict[str, mx.array]) -> dict[str, Any] | None:
    """mlx-lm ``quantization`` entry for MLX-named weights; None if nothing is quantized.

    The most common (bits, group_size) becomes the default; every quantized module that
    differs gets its own ``{"group_size", "bits"}`` entry (mlx-lm's per-module format),
    e.g. the 8-bit token embedding of a Q4_1 file. Bits are read off the packed shapes:
    ``bits = 32 * packed_cols / (scale_cols * group_size)``.
    """
    per_module: dict[str, tuple[int, int]] = {}
    for name, scales in weights.items():
        if not name.endswith(".scales"):
            continue
        module = name[: -len(".scales")]
        in_dims = scales.shape[-1] * GGUF_GROUP_SIZE
        bits = weights[f"{module}.weight"].shape[-1] * 32 // in_dims
        per_module[module] = (bits, GGUF_GROUP_SIZE)
    if not per_module:
        return None
    (bits, group), _ = Counter(per_module.values()).most_common(1)[0]
    quant: dict[str, Any] = {"group_size": group, "bits": bits}
    for module, (b, g) in sorted(per_module.items()):
        if (b, g) != (bits, group):
            quant[module] = {"group_size": g, "bits": b}
    return quant


def _rope_scaling(
    metadata: dict[str, Any], arch: str, head_dim: int, rope_freqs: mx.array | None
) -> dict[str, Any] | None:
    """HF-style ``rope_scaling`` from GGUF metadata / the ``rope_freqs`` tensor, or None."""
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    if rope_freqs is not None:
        if kind not in ("none", "llama3"):
            raise ModelLoadError(
                f"GGUF has both rope_freqs and rope scaling '{kind}'; not supported."
            )
        base = float(metadata.get(f"{arch}.rope.freq_base", 10000.0))
        orig = int(metadata.get(f"{arch}.context_length", 8192))
        got = np.array(rope_freqs.astype(mx.float32))
        for cand in _LLAMA3_ROPE_SCALINGS:
            for orig_ctx in (8192, orig):
                want = _llama3_rope_factors(head_dim, base, orig_ctx, **cand)
                if got.shape == want.shape and np.allclose(got, want, rtol=1e-3):
                    return {
                        "rope_type": "llama3",
                        **cand,
                        "original_max_position_embeddings": orig_ctx,
                    }
        raise ModelLoadError(
            "GGUF rope_freqs tensor does not match a known Llama 3 rope scaling "
            f"(tried factors {[c['factor'] for c in _LLAMA3_ROPE_SCALINGS]}); this "
            "rope variant is not supported. Use an MLX model directory instead."
        )
    if kind in ("none", None):
        return None
    factor = metadata.get(f"{arch}.rope.scaling.factor")
    if kind == "linear" and factor:
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn" and factor:
        yarn_orig = metadata.get(f"{arch}.rope.scaling.original_context_length")
        out: dict[str, Any] = {"rope_type": "yarn", "factor": float(factor)}
        if yarn_orig:
            out["original_max_position_embeddings"] = int(yarn_orig)
        return out
    raise ModelLoadError(
        f"GGUF rope scaling '{kind}' (factor {factor}) is not supported; supported: "
        "linear, yarn, llama3 (rope_freqs)."
    )


def _llama3_rope_factors(
    dims: int,
    base: float,
    orig_ctx: int,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
) -> np.ndarray:
    """llama.cpp's rope_freqs for Llama 3 scaling (convert_hf_to_gguf.py, LlamaModel)."""
    freqs = 1.0 / (base ** (np.arange(0, dims, 2, dtype=np.float64) / dims))
    low_wavelen = orig_ctx / low_freq_factor
    high_wavelen = orig_ctx / high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (orig_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def check_architecture(metadata: dict[str, Any]) -> str:
    """``general.architecture`` if supported, else ``ModelLoadError`` naming it and the list."""
    arch = metadata.get("general.architecture", "<missing>")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"GGUF architecture '{arch}' is not supported by the GGUF converter "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)}). Convert the original "
            "Hugging Face model with `mlx_lm.convert` and load that directory instead."
        )
    return str(arch)


def build_config(
    metadata: dict[str, Any],
    weights: dict[str, mx.array],
    rope_freqs: mx.array | None = None,
) -> dict[str, Any]:
    """mlx-lm ``config.json`` for a GGUF's metadata and its MLX-named weights.

    Reads ``general.architecture`` and ``<arch>.context_length``, ``embedding_length``,
    ``block_count``, ``feed_forward_length``, ``attention.head_count``,
    ``attention.head_count_kv``, ``attention.key_length``, ``rope.dimension_count``,
    ``rope.freq_base``, ``attention.layer_norm_rms_epsilon`` and the vocabulary size
    (rows of the token embedding). ``tie_word_embeddings`` is true when the file has no
    ``output`` tensor. ``rope_traditional`` is true because llama.cpp's converter
    permutes Q/K rows into the interleaved-pair rotary layout, which is exactly MLX's
    "traditional" RoPE: the weights stay byte-identical (no requantization), and this is
    the setting the pinned reference outputs were verified with.

    Raises ``ModelLoadError`` naming the architecture and the supported list for any
    architecture other than llama, and for llama variants mlx-lm's llama cannot run
    (mixture of experts, partial rotary, unknown rope scaling).
    """
    arch = check_architecture(metadata)
    if metadata.get(f"{arch}.expert_count", 0):
        raise ModelLoadError(
            f"GGUF is a mixture-of-experts {arch} model (expert_count "
            f"{metadata[f'{arch}.expert_count']}), which the GGUF converter does not "
            "support. Convert the original model with `mlx_lm.convert` instead."
        )
    hidden = int(_require(metadata, f"{arch}.embedding_length"))
    n_heads = int(_require(metadata, f"{arch}.attention.head_count"))
    n_kv = int(metadata.get(f"{arch}.attention.head_count_kv", n_heads))
    head_dim = int(metadata.get(f"{arch}.attention.key_length", hidden // n_heads))
    rope_dims = int(metadata.get(f"{arch}.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ModelLoadError(
            f"GGUF uses partial rotary embeddings (rope dims {rope_dims} of head dim "
            f"{head_dim}), which mlx-lm's llama model does not implement."
        )
    embed = weights.get("model.embed_tokens.weight")
    if embed is None:
        raise ModelLoadError("GGUF has no token_embd tensor; the file is incomplete.")
    vocab_size = int(embed.shape[0])
    config: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": int(_require(metadata, f"{arch}.block_count")),
        "intermediate_size": int(_require(metadata, f"{arch}.feed_forward_length")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "rms_norm_eps": float(metadata.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        "vocab_size": vocab_size,
        "max_position_embeddings": int(metadata.get(f"{arch}.context_length", 2048)),
        "rope_theta": float(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
        "rope_traditional": True,
        "tie_word_embeddings": "lm_head.weight" not in weights,
        "attention_bias": any(
            k.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias"))
            for k in weights
        ),
        "mlp_bias": any(k.endswith(("_proj.bias",)) and ".mlp." in k for k in weights),
    }
    if (scaling := _rope_scaling(metadata, arch, head_dim, rope_freqs)) is not None:
        config["rope_scaling"] = scaling
    if (quant := quantization_config(weights)) is not None:
        config["quantization"] = quant
        config["quantization_config"] = quant
    tokens = metadata.get("tokenizer.ggml.tokens")
    if "tokenizer.ggml.bos_token_id" in metadata:
        config["bos_token_id"] = int(metadata["tokenizer.ggml.bos_token_id"])
    if tokens is not None:
        config["eos_token_id"] = end_of_generation_ids(metadata)
    config["gguf"] = {
        key.split(".", 1)[1]: metadata[key]
        for key in ("general.name", "general.file_type", "general.quantization_version")
        if key in metadata
    }
    return config


def end_of_generation_ids(metadata: dict[str, Any]) -> list[int]:
    """Token ids that end generation, as llama.cpp decides (eos first).

    eos, eot and eom ids from the metadata, plus control tokens whose text llama.cpp's
    loader recognises as end-of-turn (``<|im_end|>``, ``<|eot_id|>``, ``<|endoftext|>``,
    ...). For SmolLM2 this is ``[2, 0]`` (``<|im_end|>``, ``<|endoftext|>``).
    """
    tokens: list[str] = metadata.get("tokenizer.ggml.tokens", [])
    types = _token_types(metadata, tokens)
    ids: list[int] = []
    for key in ("eos", "eot", "eom"):
        tid = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if tid is not None and 0 <= int(tid) < len(tokens) and int(tid) not in ids:
            ids.append(int(tid))
    for tid, (text, ttype) in enumerate(zip(tokens, types, strict=True)):
        if text in _EOG_TEXTS and ttype in (TOKEN_CONTROL, TOKEN_USER_DEFINED) and tid not in ids:
            ids.append(tid)
    return ids


# --------------------------------------------------------------------------- tokenizer
def _token_types(metadata: dict[str, Any], tokens: list[str]) -> list[int]:
    """``tokenizer.ggml.token_type`` (all normal when absent); one per token or an error."""
    types = metadata.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise ModelLoadError(
            f"GGUF tokenizer has {len(tokens)} tokens but {len(types)} token types; the "
            "file's tokenizer metadata is corrupt."
        )
    return list(types)


def build_tokenizer(metadata: dict[str, Any]) -> tuple[Tokenizer, dict[str, Any]]:
    """A ``tokenizers.Tokenizer`` and its HF ``tokenizer_config.json`` dict from GGUF.

    ``tokenizer.ggml.model`` "gpt2": byte-level BPE from ``tokens`` / ``merges`` with
    the pre-tokenizer regexes llama.cpp uses for ``tokenizer.ggml.pre`` (no prefix
    space). "llama": SentencePiece BPE rebuilt from ``tokens`` / ``scores`` with byte
    fallback. Control tokens (type 3) become special added tokens, user-defined tokens
    (type 4) plain added tokens (matched in text, kept on decode, e.g. ``<think>``).
    A BOS token is prepended when ``tokenizer.ggml.add_bos_token`` says so (default per
    pre-tokenizer, as in llama.cpp). Raises ``ModelLoadError`` for other tokenizer
    models or unknown pre-tokenizers, naming the supported ones.
    """
    kind = metadata.get("tokenizer.ggml.model", "<missing>")
    tokens: list[str] | None = metadata.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ModelLoadError("GGUF has no tokenizer.ggml.tokens; it carries no tokenizer.")
    types = _token_types(metadata, tokens)
    if kind == "gpt2":
        tokenizer, add_bos_default = _byte_level_bpe(metadata, tokens)
    elif kind == "llama":
        tokenizer, add_bos_default = _sentencepiece_bpe(metadata, tokens, types)
    else:
        raise ModelLoadError(
            f"GGUF tokenizer model '{kind}' is not supported (supported: "
            f"{', '.join(SUPPORTED_TOKENIZER_MODELS)}). Use an MLX model directory with "
            "its own tokenizer.json instead."
        )

    # The unknown token of SPM vocabularies is special too (never produced from text).
    added = [
        AddedToken(
            text,
            special=ttype in (TOKEN_CONTROL, TOKEN_UNKNOWN),
            normalized=False,
            single_word=False,
            lstrip=False,
            rstrip=False,
        )
        for text, ttype in zip(tokens, types, strict=True)
        if ttype in (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN)
    ]
    if added:
        tokenizer.add_tokens(added)

    def token_text(key: str) -> str | None:
        tid = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[int(tid)] if tid is not None and 0 <= int(tid) < len(tokens) else None

    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", add_bos_default))
    bos = token_text("bos")
    if add_bos and bos is not None:
        bos_id = int(metadata["tokenizer.ggml.bos_token_id"])
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0",
            pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, bos_id)],
        )
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos and bos is not None,
        "add_eos_token": False,
        # Keep decoded text byte-exact (" ." stays " ."), as llama.cpp's smollm/qwen do.
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(
            metadata.get(f"{metadata.get('general.architecture', 'llama')}.context_length") or 2048
        ),
    }
    for key in ("bos", "eos", "unknown", "padding"):
        if (text := token_text(key)) is not None:
            name = {"unknown": "unk_token", "padding": "pad_token"}.get(key, f"{key}_token")
            config[name] = text
    if template := metadata.get("tokenizer.chat_template"):
        config["chat_template"] = template
    return tokenizer, config


def _byte_level_bpe(metadata: dict[str, Any], tokens: list[str]) -> tuple[Tokenizer, bool]:
    pre = metadata.get("tokenizer.ggml.pre") or "default"
    if pre not in _PRE_TOKENIZERS:
        raise ModelLoadError(
            f"GGUF pre-tokenizer '{pre}' is not supported (supported: "
            f"{', '.join(sorted(_PRE_TOKENIZERS))}). Use an MLX model directory with its "
            "own tokenizer.json instead."
        )
    regexes, ignore_merges, add_bos_default = _PRE_TOKENIZERS[pre]
    vocab = {text: i for i, text in enumerate(tokens)}
    merges = [_split_merge(m) for m in metadata.get("tokenizer.ggml.merges", [])]
    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges, fuse_unk=False)
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer, add_bos_default


def _split_merge(merge: str) -> tuple[str, str]:
    # llama.cpp splits at the first space after position 0 (``word.find(' ', 1)``).
    pos = merge.find(" ", 1)
    if pos < 0:
        raise ModelLoadError(f"GGUF merge {merge!r} has no space separator; corrupt tokenizer.")
    return merge[:pos], merge[pos + 1 :]


def _sentencepiece_bpe(
    metadata: dict[str, Any], tokens: list[str], types: list[int]
) -> tuple[Tokenizer, bool]:
    """SPM vocab -> ``tokenizers`` BPE, as transformers' LlamaConverter builds it."""
    scores: list[float] = metadata.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    vocab = {text: i for i, text in enumerate(tokens)}
    # Merges ranked by the merged piece's score (SentencePiece BPE picks the highest-
    # scoring merge first), the method of transformers' SentencePieceExtractor.
    ranked: list[tuple[float, int, int, str, str]] = []
    for text, tid in vocab.items():
        if types[tid] != TOKEN_NORMAL:
            continue
        for i in range(1, len(text)):
            left, right = text[:i], text[i:]
            if left in vocab and right in vocab:
                ranked.append((-scores[tid], vocab[left], vocab[right], left, right))
    ranked.sort()
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[int(unk_id)] if unk_id is not None else None
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=[(left, right) for *_, left, right in ranked],
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    # llama.cpp adds the "▁" prefix to every text fragment that follows a special token
    # (or starts the text): that is exactly the per-segment normalizer behaviour.
    add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    norm: list[normalizers.Normalizer] = [normalizers.Replace(" ", "\u2581")]
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        norm.insert(0, normalizers.Prepend("\u2581"))
        steps.append(decoders.Strip(" ", 1, 0))  # drop the prefix space again on decode
    tokenizer.normalizer = normalizers.Sequence(norm)
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer, True


# --------------------------------------------------------------------------- convert
def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Write an mlx-lm model directory for a llama-architecture GGUF; returns ``out_dir``.

    Files: ``config.json`` (see ``build_config``), ``model.safetensors`` (tensors as
    loaded: packed uint32 weights with float16 scales/biases for Q4_0/Q4_1/Q8_0,
    float32 norms), ``tokenizer.json``, ``tokenizer_config.json`` (special tokens, chat
    template) and ``generation_config.json`` (end-of-generation ids). ``out_dir`` is
    created if needed; existing files in it are overwritten.

    Raises ``ModelLoadError`` for unreadable files, unsupported architectures (naming
    the architecture and the supported list), tokenizers or tensors.
    """
    gguf_path = Path(gguf_path)
    tensors, metadata = read_gguf(gguf_path)
    write_mlx_dir(tensors, metadata, Path(out_dir))
    logger.info("converted GGUF %s into %s", gguf_path, out_dir)
    return Path(out_dir)


def write_mlx_dir(tensors: dict[str, mx.array], metadata: dict[str, Any], out_dir: Path) -> None:
    """Write the mlx-lm directory for already-loaded GGUF tensors and metadata.

    The body of ``convert_gguf`` after reading, separate so tests can feed edited
    tensors (e.g. an untied ``output``) without a GGUF writer. Same errors.
    """
    arch = check_architecture(metadata)
    tokenizer, tok_config = build_tokenizer(metadata)
    weights = map_tensor_names(tensors)
    config = build_config(metadata, weights, tensors.get("rope_freqs.weight"))

    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    _write_json(out_dir / "config.json", config)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "tokenizer_config.json", tok_config)
    generation = {"eos_token_id": config.get("eos_token_id", [])}
    if "bos_token_id" in config:
        generation["bos_token_id"] = config["bos_token_id"]
    _write_json(out_dir / "generation_config.json", generation)
    logger.debug(
        "%s (%s): %d tensors, %d tokens, quantization %s",
        out_dir,
        metadata.get("general.name", arch),
        len(weights),
        config["vocab_size"],
        config.get("quantization"),
    )


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- cache
def default_cache_dir() -> Path:
    """``$LOCALAI_MLX_CACHE_DIR`` if set, else ``~/.cache/localai-mlx/gguf``."""
    env = os.environ.get("LOCALAI_MLX_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "localai-mlx" / "gguf"


def cache_key(gguf_path: Path) -> str:
    """``<stem>-<16 hex>``: sha256 of resolved path, size, mtime_ns and converter version.

    Any change to the file (replaced, touched, moved) or to the converter gives a new
    key, so a stale conversion is never reused. Raises ``ModelLoadError`` if the file
    does not exist.
    """
    path = Path(gguf_path).expanduser().resolve()
    try:
        st = path.stat()
    except OSError as exc:
        raise ModelLoadError(f"GGUF file {path} cannot be read: {exc.strerror}") from exc
    ident = f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0v{CONVERTER_VERSION}"
    digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem)[:80]
    return f"{stem}-{digest}"


def cached_conversion(gguf_path: Path, cache_dir: Path | None = None) -> Path:
    """The converted mlx-lm directory for ``gguf_path``, converting on first use.

    The directory is ``cache_dir / cache_key(gguf_path)`` (``cache_dir`` defaults to
    ``default_cache_dir()``). A conversion is written to a temporary sibling directory
    and renamed into place, so a directory under its final name is always complete;
    when two processes race, the loser discards its copy and uses the winner's.
    Raises ``ModelLoadError``: conversion failures (see ``convert_gguf``), a missing
    source file, or an unwritable cache (naming it and ``LOCALAI_MLX_CACHE_DIR``).
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = cache_dir / cache_key(gguf_path)
    if (final / "config.json").is_file():
        logger.info("using cached conversion %s", final)
        return final
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=cache_dir))
    except OSError as exc:
        raise ModelLoadError(
            f"cannot create the GGUF conversion cache in {cache_dir}: {exc.strerror}. "
            "Set LOCALAI_MLX_CACHE_DIR to a writable directory."
        ) from exc
    try:
        convert_gguf(Path(gguf_path), tmp)
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the cache may be shared by users
        if final.exists() and not (final / "config.json").is_file():
            shutil.rmtree(final, ignore_errors=True)  # debris not made by this module
        try:
            os.rename(tmp, final)
        except OSError as exc:
            if not (final / "config.json").is_file():
                raise ModelLoadError(
                    f"cannot move the converted model into {final}: {exc.strerror}. "
                    "Set LOCALAI_MLX_CACHE_DIR to a writable directory."
                ) from exc
            logger.info("another process converted %s first; using its copy", final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
