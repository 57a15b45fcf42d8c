"""Tiny random-weight mlx-lm models of several cache families, with the embedded tokenizer.

Each family is an mlx-lm architecture built from a config dict (``mlx_lm.utils._get_classes``),
a few layers of width 64, random weights from a fixed seed, saved as an ordinary MLX model
directory (config.json, model.safetensors, the embedded SmolLM2 tokenizer files) so the
real loader (``model_loader.load_model`` / LoadModel) serves it. Used by
tests/model/test_checkpoints.py and bench/bench_checkpoints.py; nothing is downloaded.
``make``: the same model in memory (tests/fast/test_cpu_attention.py).
``split_model`` / ``reference_text``: the distributed tests' models and their expected text.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.utils import _get_classes, save_model

from loading import gguf_convert, model_loader

VOCAB = 49152  # the embedded SmolLM2 tokenizer's vocabulary
_COMMON = {"vocab_size": VOCAB, "hidden_size": 64, "tie_word_embeddings": True}

# Minimal configs, one per cache family (window 32: shorter than the test prompts).
CONFIGS: dict[str, dict] = {
    "llama": {
        **_COMMON,
        "model_type": "llama",
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
    },
    "gemma3_text": {
        **_COMMON,
        "model_type": "gemma3_text",
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "sliding_window": 32,
        "sliding_window_pattern": 2,  # layers 0, 2 sliding; 1, 3 global
        "max_position_embeddings": 8192,
    },
    "gpt_oss": {
        **_COMMON,
        "model_type": "gpt_oss",
        "num_hidden_layers": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "intermediate_size": 64,
        "head_dim": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "sliding_window": 32,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "qwen3_5": {
        **_COMMON,
        "model_type": "qwen3_5",
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "linear_num_value_heads": 2,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "full_attention_interval": 2,  # layer 0 gated delta, layer 1 attention
        "max_position_embeddings": 8192,
    },
    "lfm2": {
        **_COMMON,
        "model_type": "lfm2",
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 8192,
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_dim": 64,
        "block_ff_dim": 128,
        "block_multiple_of": 16,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": False,
        "layer_types": ["conv", "full_attention"],
    },
    "mamba2": {
        **_COMMON,
        "model_type": "mamba2",
        "num_heads": 4,
        "head_dim": 32,
        "intermediate_size": 128,
        "state_size": 16,
        "num_hidden_layers": 2,
        "layer_norm_epsilon": 1e-5,
        "conv_kernel": 4,
        "n_groups": 1,
        "use_bias": False,
        "use_conv_bias": True,
        "time_step_limit": [0.0, float("inf")],
        "time_step_rank": "auto",
        "max_position_embeddings": 8192,
    },
}

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def tokenizer_dir() -> Path:
    """The embedded GGUF's converted MLX directory (converted once, then cached)."""
    return gguf_convert.cached_conversion(model_loader.embedded_model_path())


def make(family: str, seed: int = 0) -> nn.Module:
    """The tiny ``family`` model in memory (what `build` saves): normal(0, 0.3) weights
    from ``seed`` (norm weights included), float32."""
    config = CONFIGS[family]
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    mx.random.seed(seed)
    params = tree_map(
        lambda p: (
            mx.random.normal(p.shape, scale=0.3).astype(mx.float32)
            if mx.issubdtype(p.dtype, mx.floating)
            else p
        ),
        model.parameters(),
    )
    model.update(params)
    mx.eval(dict(tree_flatten(model.parameters())))
    return model


def build(family: str, root: Path, seed: int = 0) -> Path:
    """Write the tiny ``family`` model under ``root / family`` (once) and return its dir.

    Weights: `make`'s.
    """
    out = root / family
    if (out / "config.json").is_file():
        return out
    save_model(out, make(family, seed))
    (out / "config.json").write_text(json.dumps(CONFIGS[family]))
    src = tokenizer_dir()
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    return out


def save_scaled(config: dict, path: Path, seed: int = 0, scale: float = 4.0) -> Path:
    """Save an mlx-lm model of ``config`` under ``path``: default initialisation from
    ``seed`` with every matrix multiplied by ``scale`` (larger weights than the default, so
    greedy decoding does not repeat one token), float32, ``eos_token_id`` [2, 0] and the
    embedded tokenizer. For the distributed tests, whose configs must split evenly."""
    path.mkdir(parents=True, exist_ok=True)
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    model.set_dtype(mx.float32)
    model.update(tree_map(lambda a: a * scale if a.ndim == 2 else a, model.parameters()))
    mx.eval(model.parameters())
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (path / "config.json").write_text(json.dumps({**config, "eos_token_id": [2, 0]}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir() / name, path / name)
    return path


def split_model(path: Path, model_type: str, heads: int, kv_heads: int, layers: int = 3) -> Path:
    """A ``layers``-layer ``model_type`` of width ``16 * heads`` saved by ``save_scaled``
    under ``path`` (SmolLM2's vocabulary and tokenizer; heads divisible by a group's size
    split over its ranks)."""
    config = dict(
        model_type=model_type,
        hidden_size=16 * heads,
        num_hidden_layers=layers,
        intermediate_size=32 * heads,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        rms_norm_eps=1e-5,
        vocab_size=VOCAB,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    return save_scaled(config, path)


def reference_text(path: Path, prompt: str, tokens: int) -> str:
    """Greedy text of ``tokens`` new tokens of the model at ``path``, by mlx-lm alone in
    this process (no server)."""
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, tokenizer = load(str(path))
    ids = tokenizer.encode(prompt)
    steps = generate_step(
        mx.array(ids), model, max_tokens=tokens, sampler=lambda x: mx.argmax(x, -1)
    )
    return tokenizer.decode([int(t) for t, _ in steps])
