"""ExportModel, in a job's child process: a checkpoint into what LocalAI imports and serves.

- ``lora``: the adapter in mlx-lm's format (``adapters.safetensors`` +
  ``adapter_config.json`` with ``base_model_name_or_path``): LoadModel's ``LoraAdapter``;
- ``merged_16bit``: the adapter fused into the base (``mlx_lm.fuse``'s steps), 16-bit
  weights, an MLX model directory;
- ``merged_4bit``: the same quantized to 4 bits in groups of 64 (``mlx_lm.convert -q``);
- ``gguf``: the fused model as one f16 GGUF (mlx_lm/gguf.py; llama, mistral and mixtral
  only, as ``mlx_lm.fuse --export-gguf``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from seam.arrays import flat_arrays
from training import checkpoints
from training.finetune import Emit, load_base, resolve
from training.spec import ExportSpec

if TYPE_CHECKING:
    import mlx.nn as nn

GGUF_TYPES = ("llama", "mistral", "mixtral")  # what mlx_lm/fuse.py lets convert_to_gguf write


def _adapter(spec: ExportSpec, out: Path) -> None:
    src = Path(spec.checkpoint)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / checkpoints.ADAPTERS, out / checkpoints.ADAPTERS)
    config = json.loads((src / checkpoints.ADAPTER_CONFIG).read_text())
    config["base_model_name_or_path"] = spec.model  # the key LocalAI's importer reads
    (out / checkpoints.ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))


def _fused(spec: ExportSpec, dequantize: bool) -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, config): the base with the adapter fused in."""
    import mlx.core as mx
    from mlx.utils import tree_unflatten
    from mlx_lm.utils import dequantize_model

    model, tokenizer, config = load_base(
        spec.model, spec.trust_remote_code, adapter_path=spec.checkpoint
    )
    quantized = "quantization" in config or "quantization_config" in config
    fused = [
        (n, m.fuse(dequantize=dequantize and quantized))
        for n, m in model.named_modules()
        if hasattr(m, "fuse")
    ]
    if fused:
        model.update_modules(tree_unflatten(fused))
    if dequantize and quantized:
        model = dequantize_model(model)
        config.pop("quantization", None)
        config.pop("quantization_config", None)
    mx.eval(model.parameters())
    return model, tokenizer, config


def _to_16bit(model: nn.Module) -> None:
    import mlx.core as mx
    from mlx.utils import tree_map

    model.update(
        tree_map(
            lambda p: p.astype(mx.float16) if p.dtype == mx.float32 else p,
            model.parameters(),
        )
    )


# Text whose encoding tells the pre-tokenizers apart (digits, contractions, spaces,
# newlines, punctuation, non-Latin letters), as llama.cpp's convert_hf_to_gguf.py
# identifies ``tokenizer.ggml.pre`` by how the tokenizer encodes a probe text.
_PRE_PROBE = (
    "Hello World! It's 2024, we'll see 1234567 items...\n\n  \tindented\r\n"
    "don't STOP ÄÖÜ straße 你好世界 🚀 x=y+3*(4-5) <tag> a  b   c\n"
)


def write_gguf(
    model_dir: Path, weights: dict[str, Any], config: dict[str, Any], target: Path
) -> None:
    """mlx_lm.gguf.convert_to_gguf, then its tokenizer metadata corrected.

    mlx_lm/gguf.py (``prepare_metadata``) always writes ``tokenizer.ggml.model`` "llama"
    (a SentencePiece vocabulary) with every score -1000 and no merges, no
    ``tokenizer.ggml.pre``, no ``add_bos_token``, no chat template. For a byte-level BPE
    tokenizer (SmolLM2, Llama 3, Qwen: tokens like "Ġthe") that file is wrong for any
    reader: llama.cpp's SPM path (src/llama-vocab.cpp) only turns "▁" into a space, so
    "Ġ"/"Ċ" come back literally, and prompts tokenize into the wrong ids. Such a
    vocabulary is rewritten as llama.cpp's convert_hf_to_gguf.py writes it: model
    "gpt2", the merges, the pre-tokenizer that encodes like the model's own tokenizer
    (identified on a probe text), add_bos_token and the chat template.
    """
    import mlx.core as mx
    from mlx_lm.gguf import convert_to_gguf

    convert_to_gguf(model_dir, weights, config, str(target))
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    model, decoder = tok.get("model") or {}, tok.get("decoder") or {}
    if model.get("type") != "BPE" or decoder.get("type") != "ByteLevel":
        return  # SentencePiece vocabularies are what mlx-lm's writer is made for
    # With return_metadata a GGUF file reads as (name -> array, key -> value); mlx types
    # the result as any of its load shapes.
    tensors, metadata = cast(
        tuple[dict[str, mx.array], dict[str, Any]], mx.load(str(target), return_metadata=True)
    )
    meta = {k: v for k, v in metadata.items() if k != "tokenizer.ggml.scores"}
    meta["tokenizer.ggml.model"] = "gpt2"
    meta["tokenizer.ggml.merges"] = [
        m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])
    ]
    meta.update(_tokenizer_extras(model_dir, meta))
    mx.save_gguf(str(target), tensors, meta)


def _tokenizer_extras(model_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """``tokenizer.ggml.pre`` / ``add_bos_token`` / ``chat_template`` for ``meta``: the
    pre-tokenizer (of those this backend's GGUF reader knows, loading/gguf_convert.py's
    table of llama.cpp's) whose encoding of the probe equals the model's tokenizer's."""
    import mlx.core as mx
    from transformers import AutoTokenizer

    from loading import gguf_convert

    hf = AutoTokenizer.from_pretrained(str(model_dir))
    want = hf.encode(_PRE_PROBE, add_special_tokens=False)
    plain = {k: gguf_convert._plain(v) for k, v in meta.items() if k.startswith("tokenizer.")}
    for name in gguf_convert._PRE_TOKENIZERS:
        built, _ = gguf_convert.build_tokenizer({**plain, "tokenizer.ggml.pre": name})
        if built.encode(_PRE_PROBE, add_special_tokens=False).ids == want:
            break
    else:
        raise ValueError(
            "GGUF export: this model's byte-level tokenizer splits text unlike every "
            "pre-tokenizer llama.cpp names that this backend knows, so its GGUF would "
            "tokenize prompts wrongly: export merged_16bit and convert it with llama.cpp's "
            "convert_hf_to_gguf.py"
        )
    extras: dict[str, Any] = {"tokenizer.ggml.pre": name}
    ids = hf.encode("a")
    add_bos = hf.bos_token_id is not None and bool(ids) and ids[0] == hf.bos_token_id
    extras["tokenizer.ggml.add_bos_token"] = mx.array(add_bos, dtype=mx.bool_)
    if isinstance(hf.chat_template, str):
        extras["tokenizer.chat_template"] = hf.chat_template
    return extras


def run(spec: ExportSpec, emit: Emit) -> None:
    from mlx_lm.utils import quantize_model, save

    out = Path(spec.output_path)
    fmt = spec.export_format
    emit(status="saving", message=f"Exporting {fmt} to {out}")
    if fmt == "lora":
        _adapter(spec, out)
    elif fmt in ("merged_16bit", "merged_4bit"):
        model, tokenizer, config = _fused(spec, dequantize=True)
        if fmt == "merged_16bit":
            _to_16bit(model)
        else:
            model, config = quantize_model(model, config, group_size=64, bits=4)
        out.mkdir(parents=True, exist_ok=True)
        save(out, resolve(spec.model), model, tokenizer, config, donate_model=False)
    else:
        model, tokenizer, config = _fused(spec, dequantize=True)
        model_type = config.get("model_type", "")
        if model_type not in GGUF_TYPES:
            raise ValueError(
                f"GGUF export: mlx-lm writes GGUF for {', '.join(GGUF_TYPES)} models only "
                f"(mlx_lm/fuse.py), this one is {model_type!r}: export merged_16bit or "
                "merged_4bit (MLX, served by this backend), or convert merged_16bit with "
                "llama.cpp's convert_hf_to_gguf.py"
            )
        _to_16bit(model)
        staging = out / "_merged"
        staging.mkdir(parents=True, exist_ok=True)
        save(staging, resolve(spec.model), model, tokenizer, config, donate_model=False)
        weights = dict(flat_arrays(model.parameters()))
        target = out / f"{out.name}-f16.gguf"
        write_gguf(staging, weights, config, target)
        shutil.rmtree(staging)
    emit(status="completed", message=f"Model exported to {out}", progress_percent=100.0)
