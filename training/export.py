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
from typing import TYPE_CHECKING, Any

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
        from mlx_lm.gguf import convert_to_gguf

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
        convert_to_gguf(staging, weights, config, str(target))
        shutil.rmtree(staging)
    emit(status="completed", message=f"Model exported to {out}", progress_percent=100.0)
