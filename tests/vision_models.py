"""Tiny random-weight vision-language models (mlx-vlm 0.7.10 architectures), built at test time.

``build(kind, out_dir, seed=0, gain=3.0) -> Path`` writes a directory that
``mlx_vlm.load`` and the backend's loader (LoadModel) load: config.json, model.safetensors
(+ index), the embedded SmolLM2 tokenizer with the family's vision tokens added as special
tokens at ids 49152.., a chat template, generation_config.json, preprocessor_config.json and
processor_config.json. Kinds:

- ``qwen2_vl``: mRoPE text model (hidden 64, 2 layers), a 2-layer ViT (patch 14, merge 2):
  a 64x64 image resizes to 56x56 = 4 tokens; ``max_pixels`` 28*28*64 (<= 64 tokens).
- ``gemma3``: SigLIP (image 64, patch 8, pooled to 16 tokens per image), sliding window 32
  on layer 0 (a rotating cache: the prompt cache needs prefill checkpoints).

``gain`` scales the language model's 2-D projections: with mlx's default initialisation a
64-wide model greedily repeats one token, which would make token-equality checks vacuous.
``png(size, seed)`` makes a deterministic PNG (bytes); ``reference(...)``: greedy tokens of
``mlx_vlm.stream_generate``, the oracle the engine must equal. Nothing is downloaded.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import mlx.core as mx
import tiny_models
from mlx.utils import tree_flatten

KINDS = ("qwen2_vl", "gemma3")

# ChatML, as SmolLM2 and Qwen2-VL use; image and video items render as Qwen2-VL's triples.
QWEN2_VL_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Gemma-style plain-string content with "<start_of_image>" (mlx-vlm's START_IMAGE_TOKEN
# format), in SmolLM2's ChatML tokens (its vocabulary has no <start_of_turn>).
GEMMA3_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<start_of_image>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SPECIAL_TOKENS = {
    "qwen2_vl": ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"],
    "gemma3": ["<start_of_image>", "<end_of_image>", "<image_soft_token>"],
}


def _write_tokenizer(kind: str, out: Path, chat_template: str) -> dict:
    """The embedded tokenizer plus the family's special tokens; returns their ids."""
    from tokenizers import AddedToken, Tokenizer

    base = tiny_models.tokenizer_dir()
    tok = Tokenizer.from_file(str(base / "tokenizer.json"))
    cfg = json.loads((base / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    specials = SPECIAL_TOKENS[kind]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.save(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in specials}
    cfg["chat_template"] = chat_template
    if kind == "gemma3":
        # Gemma3Processor reads tokenizer.image_token / boi_token / eoi_token.
        cfg["extra_special_tokens"] = {
            "image_token": "<image_soft_token>",
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
        }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (out / "chat_template.jinja").write_text(chat_template)
    eos = [2, 0]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    ids["vocab_size"] = tok.get_vocab_size(with_added_tokens=True)  # no id without a token
    ids["eos"] = eos
    return ids


def _qwen2_vl(out: Path) -> dict:
    ids = _write_tokenizer("qwen2_vl", out, QWEN2_VL_TEMPLATE)
    config = {
        "model_type": "qwen2_vl",
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "vocab_size": ids["vocab_size"],
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},  # sums to head_dim/2
        "tie_word_embeddings": True,
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "eos_token_id": ids["eos"],
        "vision_config": {
            "model_type": "qwen2_vl",
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": 64,  # the merger's output: the text hidden size
            "num_heads": 2,
            "mlp_ratio": 2,  # an int: transformers 5 validates config.json strictly
            "patch_size": 14,
            "spatial_patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "in_channels": 3,
        },
    }
    pre = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "min_pixels": 56 * 56,
        "max_pixels": 28 * 28 * 64,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
    }
    (out / "preprocessor_config.json").write_text(json.dumps(pre, indent=2))
    (out / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2VLProcessor"}))
    return config


def _gemma3(out: Path) -> dict:
    ids = _write_tokenizer("gemma3", out, GEMMA3_TEMPLATE)
    image_size, patch, mm_tokens = 64, 8, 16
    config = {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "hidden_size": 64,  # image features are divided by sqrt(this)
        "image_token_index": ids["<image_soft_token>"],
        "boi_token_index": ids["<start_of_image>"],
        "eoi_token_index": ids["<end_of_image>"],
        "pad_token_id": 0,  # its embedding is zeroed at merge: an id prompts never hold
        "vocab_size": ids["vocab_size"],
        "eos_token_id": ids["eos"],
        "mm_tokens_per_image": mm_tokens,
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "rms_norm_eps": 1e-6,
            "vocab_size": ids["vocab_size"],
            "sliding_window": 32,  # shorter than the test prompts: exercises rotation
            "sliding_window_pattern": 2,
            "rope_global_base_freq": 1_000_000.0,
            "rope_local_base_freq": 10_000.0,
            "mm_tokens_per_image": mm_tokens,
            "max_position_embeddings": 4096,
        },
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "patch_size": patch,
            "image_size": image_size,
            "num_channels": 3,
            "layer_norm_eps": 1e-6,
        },
    }
    pre = {
        "image_processor_type": "Gemma3ImageProcessor",
        "processor_class": "Gemma3Processor",
        "size": {"height": image_size, "width": image_size},
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_convert_rgb": True,
        "do_pan_and_scan": False,
        "resample": 2,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(pre, indent=2))
    (out / "processor_config.json").write_text(
        json.dumps({"processor_class": "Gemma3Processor", "image_seq_length": mm_tokens})
    )
    return config


def build(
    kind: str,
    out_dir: Path,
    seed: int = 0,
    gain: float = 3.0,
    vision: dict | None = None,
    preprocessor: dict | None = None,
) -> Path:
    """Write the tiny ``kind`` model into ``out_dir`` (once) and return it. ``vision`` /
    ``preprocessor``: entries merged into its vision_config / preprocessor_config.json
    (a larger vision tower or image size, for benchmarks)."""
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    out = Path(out_dir)
    if (out / "model.safetensors").is_file():
        return out
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config = {"qwen2_vl": _qwen2_vl, "gemma3": _gemma3}[kind](tmp)
    config["vision_config"].update(vision or {})
    if preprocessor:
        pre = json.loads((tmp / "preprocessor_config.json").read_text())
        (tmp / "preprocessor_config.json").write_text(json.dumps({**pre, **preprocessor}))
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    # Built as mlx_vlm.utils.load_model builds it, then saved.
    model_class, _ = get_model_and_args(config=dict(config))
    cfg = json.loads(json.dumps(config))
    for key in ("text_config", "vision_config", "audio_config"):
        cfg.setdefault(key, {})
    model_config = model_class.ModelConfig.from_dict(cfg)
    model_config = update_module_configs(
        model_config, model_class, cfg, ["text", "vision", "perceiver", "projector", "audio"]
    )
    mx.random.seed(seed)
    model = model_class.Model(model_config)
    weights = dict(tree_flatten(model.parameters()))
    if kind == "gemma3":
        # Tied like real Gemma 3 (sanitize copies embed_tokens into lm_head); the
        # projection initialises to ones: random, so features vary with the image.
        weights.pop("language_model.lm_head.weight", None)
        w = weights["multi_modal_projector.mm_input_projection_weight"]
        weights["multi_modal_projector.mm_input_projection_weight"] = (
            mx.random.normal(w.shape, key=mx.random.key(seed + 1)) * 0.2
        )
    weights = {
        k: (v * gain if v.ndim == 2 and k.startswith("language_model.") and "embed" not in k else v)
        for k, v in weights.items()
    }
    weights = {k: v.astype(mx.float32) for k, v in weights.items()}
    if kind == "qwen2_vl":
        # sanitize transposes a 5-D patch embedding from PyTorch's layout unconditionally.
        k = "vision_tower.patch_embed.proj.weight"
        weights[k] = weights[k].transpose(0, 4, 1, 2, 3)
    mx.eval(weights)
    mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
    index = {
        "metadata": {"total_size": sum(v.nbytes for v in weights.values())},
        "weight_map": {k: "model.safetensors" for k in sorted(weights)},
    }
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def image(size: tuple[int, int] = (64, 64), seed: int = 0):
    """A deterministic RGB PIL image: a gradient (seed 0) or seeded noise."""
    import numpy as np
    from PIL import Image

    w, h = size
    if seed == 0:
        x = np.linspace(0, 255, w, dtype=np.float32)[None, :, None]
        y = np.linspace(0, 255, h, dtype=np.float32)[:, None, None]
        arr = np.concatenate(
            [
                np.broadcast_to(x, (h, w, 1)),
                np.broadcast_to(y, (h, w, 1)),
                np.broadcast_to((x + y) / 2, (h, w, 1)),
            ],
            axis=-1,
        )
    else:
        arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3))
    return Image.fromarray(arr.astype(np.uint8), "RGB")


def png(size: tuple[int, int] = (64, 64), seed: int = 0) -> bytes:
    """``image(size, seed)`` as PNG file bytes."""
    buf = io.BytesIO()
    image(size, seed).save(buf, format="PNG")
    return buf.getvalue()


def animation(frames: list, fmt: str = "PNG", duration_ms: int = 100) -> bytes:
    """``frames`` (PIL images) as one animated file (APNG by default: lossless, so the
    decoded frames equal them), each shown ``duration_ms``."""
    buf = io.BytesIO()
    extra = {"lossless": True} if fmt == "WEBP" else {}
    frames[0].save(
        buf,
        format=fmt,
        save_all=True,
        append_images=frames[1:],
        duration=duration_ms,
        loop=0,
        **extra,
    )
    return buf.getvalue()


def reference(
    model, processor, prompt: str, images: list, tokens: int, videos: list | None = None
) -> list[int]:
    """Greedy token ids of ``mlx_vlm.stream_generate`` (the oracle) for ``prompt`` (already
    templated), ``images`` (paths or PIL images) and ``videos`` (decoded frame arrays)."""
    import mlx_vlm

    out = []
    for r in mlx_vlm.stream_generate(
        model,
        processor,
        prompt,
        image=images or None,
        video=videos or None,
        max_tokens=tokens,
        temperature=0.0,
    ):
        if r.token_ids is not None:  # the final summary repeats the last token
            break
        out.append(int(r.token))
    return out
