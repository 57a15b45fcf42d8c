"""StartQuantization's work, in a job's child process: ``mlx_lm.convert.convert`` with the
recipe ``training.quant_types`` read from ``quantization_type``.

The result is an MLX model directory (config.json with its ``quantization`` entry,
safetensors, tokenizer) under ``output_dir``: what LoadModel loads. ``output_file`` names
that directory. convert() is one call with no progress hook, so progress moves by phase
(downloading, converting, quantizing, completed); a stop ends the child and removes the
half-written directory.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from training.finetune import Emit, StopFlag, resolve
from training.spec import QuantizeSpec


def output_path(spec: QuantizeSpec) -> Path:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(spec.model.rstrip("/")).name).strip("-")
    return Path(spec.output_dir) / f"{name or 'model'}-{spec.quantization_type}-mlx"


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*.safetensors"))


def run(spec: QuantizeSpec, emit: Emit, stop: StopFlag) -> None:
    from mlx_lm.convert import convert

    if spec.hf_token:
        os.environ["HF_TOKEN"] = spec.hf_token
    recipe = spec.recipe
    if not Path(spec.model).exists():
        emit(status="downloading", message=f"Fetching {spec.model}", progress_percent=5.0)
    source = resolve(spec.model)
    if stop.is_set():
        emit(status="stopped", message="Quantization stopped")
        return
    out = output_path(spec)
    if out.exists():
        shutil.rmtree(out)  # a previous attempt of this job; convert() refuses an existing dir
    Path(spec.output_dir).mkdir(parents=True, exist_ok=True)
    emit(
        status="quantizing" if recipe.quantize else "converting",
        message=f"{spec.model} -> {recipe.describe()}",
        progress_percent=20.0,
    )
    try:
        convert(
            source,
            mlx_path=str(out),
            quantize=recipe.quantize,
            q_group_size=recipe.group_size or None,
            q_bits=recipe.bits or None,
            q_mode=recipe.mode,
            dtype=recipe.dtype or None,
            quant_predicate=recipe.predicate or None,
            trust_remote_code=spec.trust_remote_code,
        )
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    if stop.is_set():
        shutil.rmtree(out, ignore_errors=True)
        emit(status="stopped", message="Quantization stopped; output removed")
        return
    before, after = _size(Path(source)), _size(out)
    emit(
        status="completed",
        message=f"Quantized {spec.model} ({recipe.describe()}) into {out}",
        progress_percent=100.0,
        output_file=str(out),
        extra_metrics={
            "file_size_mb": after / 1e6,
            "compression_ratio": before / after if after else 0.0,
        },
    )
