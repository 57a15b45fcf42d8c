"""LocalAI's job requests read into frozen specs: every check a request gets before a child
process is started, so a wrong field is INVALID_ARGUMENT naming it (no MLX here).

Defaults follow LocalAI's reference trainer (backend/python/trl/backend.py): rank 16,
alpha 16, learning rate 2e-4, 3 epochs, batch 2, gradient accumulation 4, warm-up 5, weight
decay 0.01, seed 3407 when 0. LoRA's ``adapter_alpha`` is PEFT's alpha: mlx-lm's LoRA layers
take ``scale`` (mlx_lm/tuner/lora.py multiplies the update by it), so scale = alpha / rank.
"""

from __future__ import annotations

import math
import os
import re
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training import quant_types

if TYPE_CHECKING:
    import backend_pb2

TRAINING_TYPES = ("lora", "dora", "full")  # mlx-lm's fine_tune_type values (mlx_lm/lora.py)
TRAINING_METHODS = ("sft",)
# mlx-lm's optimizers (mlx_lm/lora.py); the trl names LocalAI's UI sends map onto them.
OPTIMIZERS = ("adamw", "adam", "sgd", "adafactor", "muon")
OPTIMIZER_ALIASES = {
    "adamw_torch": "adamw",
    "adamw_torch_fused": "adamw",
    "adamw_hf": "adamw",
    "adamw_8bit": "adamw",  # no 8-bit optimizer state on MLX: plain AdamW
    "paged_adamw_8bit": "adamw",
    "paged_adamw_32bit": "adamw",
}
PRECISIONS = {"": "", "no": "", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
EXPORT_FORMATS = ("lora", "merged_16bit", "merged_4bit", "gguf")

# extra_options this backend reads, with what each does (unknown keys are refused).
FINETUNE_EXTRA = {
    "max_seq_length": "longest training sequence in tokens (default 2048); longer rows are cut",
    "num_layers": "how many of the last layers get adapters (default -1: all)",
    "mask_prompt": "true: loss on the answer only (default true for prompt/completion rows, "
    "false for messages and text rows, as trl's SFT)",
    "eval_steps": "evaluate on the dataset's valid split every N steps (default: save_steps)",
    "skip_memory_check": "true: start even when the estimate says it will not fit",
    "hf_token": "token for a gated Hugging Face model",
    "trust_remote_code": "true: allow the model's own tokenizer code",
    "save_total_limit": "keep only the newest N step checkpoints (0: all)",
}
# Keys LocalAI's UI may send for other backends' methods (eval/reward); read as no-ops
# would hide a mistake, so only those that mean nothing here without harm are accepted.
FINETUNE_IGNORED = ("eval_strategy", "eval_split", "eval_split_ratio", "save_strategy")


JOB_PROCESS_MESSAGE = "MLX backend ready for fine-tuning and quantization jobs (no model loaded)"
# The names LocalAI installs this backend under: mlx, metal-mlx, mlx-distributed,
# cuda12-mlx-development and the like (its gallery's backend names and aliases).
BACKEND_NAME = re.compile(r"^([a-z0-9]+-)*mlx(-[a-z0-9]+)*$")
ROOT = Path(__file__).resolve().parent.parent


def names_this_backend(model: str, model_file: str = "") -> bool:
    """True for the LoadModel LocalAI sends to a process it started for a job: ``Model``
    is the backend's own name (core/services/finetune/service.go loads the backend with
    ``WithModel(backendName)``), no such file exists, and nothing is to be loaded."""
    if not model or "/" in model or os.sep in model or model.endswith(".gguf"):
        return False
    if model_file and Path(model_file).exists():
        return False
    names = {ROOT.name.lower(), Path(os.environ.get("PWD", "")).name.lower()}
    return bool(BACKEND_NAME.match(model.lower())) or model.lower() in names


def _bool(name: str, text: str) -> bool:
    low = text.strip().lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off", ""):
        return False
    raise ValueError(f"extra_options.{name}: expected true or false, got {text!r}")


def _int(name: str, text: str, low: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"extra_options.{name}: expected an integer, got {text!r}") from None
    if value < low:
        raise ValueError(f"extra_options.{name}: must be >= {low}, got {value}")
    return value


def _positive(name: str, value: float, default: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return value if value > 0 else default


def _count(name: str, value: int, default: int) -> int:
    if value < 0:
        raise ValueError(f"{name} must be >= 0 (0 = default {default}), got {value}")
    return value or default


@dataclass(frozen=True)
class FineTuneSpec:
    job_id: str
    model: str
    output_dir: str
    dataset_source: str
    dataset_split: str = "train"
    training_type: str = "lora"
    rank: int = 16
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ()
    num_layers: int = -1
    learning_rate: float = 2e-4
    num_epochs: int = 3
    max_steps: int = 0
    batch_size: int = 2
    grad_accumulation: int = 4
    warmup_steps: int = 5
    weight_decay: float = 0.01
    grad_checkpoint: bool = False
    optimizer: str = "adamw"
    seed: int = 3407
    dtype: str = ""
    save_steps: int = 0
    save_total_limit: int = 0
    eval_steps: int = 0
    resume_from: str = ""
    max_seq_length: int = 2048
    mask_prompt: bool | None = None
    skip_memory_check: bool = False
    trust_remote_code: bool = False
    hf_token: str = field(default="", repr=False)

    @property
    def scale(self) -> float:
        """mlx-lm's LoRA scale for PEFT's alpha."""
        return self.alpha / self.rank

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "target_modules": list(self.target_modules)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FineTuneSpec:
        return cls(**{**data, "target_modules": tuple(data.get("target_modules", ()))})


def finetune_spec(req: backend_pb2.FineTuneRequest) -> FineTuneSpec:
    """A ``FineTuneRequest`` read and checked; ValueError names the field to change."""
    if not req.model:
        raise ValueError("model is required: an MLX model directory or a Hugging Face repo id")
    if not req.output_dir:
        raise ValueError("output_dir is required (LocalAI sets it to <data>/fine-tune/<job>)")
    if not req.dataset_source:
        raise ValueError("dataset_source is required: a local JSONL file or directory")
    if not Path(req.dataset_source).exists():
        raise ValueError(
            f"dataset_source {req.dataset_source!r} is not a local file or directory: the MLX "
            "backend trains on local JSONL (upload it with POST /api/fine-tuning/datasets; "
            "Hugging Face dataset ids are not downloaded)"
        )
    training_type = (req.training_type or "lora").lower()
    if training_type not in TRAINING_TYPES:
        raise ValueError(
            f"training_type {req.training_type!r} is not supported on MLX: use one of "
            f"{', '.join(TRAINING_TYPES)} (mlx-lm's fine-tune types)"
        )
    method = (req.training_method or "sft").lower()
    if method not in TRAINING_METHODS:
        raise ValueError(
            f"training_method {req.training_method!r} is not supported by the MLX backend: "
            "use sft (supervised fine-tuning, mlx-lm's tuner); dpo, orpo, grpo and the other "
            "preference/RL methods are not offered here (use backend trl)"
        )
    extra = dict(req.extra_options)
    unknown = sorted(set(extra) - set(FINETUNE_EXTRA) - set(FINETUNE_IGNORED) - {"reward_funcs"})
    if unknown:
        raise ValueError(
            f"extra_options {', '.join(unknown)} not known to the MLX backend; it reads: "
            + "; ".join(f"{k} ({v})" for k, v in FINETUNE_EXTRA.items())
        )
    if "reward_funcs" in extra:
        raise ValueError("reward functions are for grpo, which the MLX backend does not offer")
    optimizer = (req.optimizer or "adamw").lower()
    optimizer = OPTIMIZER_ALIASES.get(optimizer, optimizer)
    if optimizer not in OPTIMIZERS:
        raise ValueError(
            f"optimizer {req.optimizer!r} is not available on MLX: use one of "
            f"{', '.join(OPTIMIZERS)} (adamw_torch and adamw_8bit are read as adamw)"
        )
    precision = req.mixed_precision.lower()
    if precision not in PRECISIONS:
        raise ValueError(
            f"mixed_precision {req.mixed_precision!r} is not available on MLX: use bf16, fp16, "
            "fp32 or leave it empty (train in the model's own dtype)"
        )
    rank = _count("adapter_rank", req.adapter_rank, 16)
    resume = req.resume_from_checkpoint
    if resume and not Path(resume).is_dir():
        raise ValueError(f"resume_from_checkpoint {resume!r} is not a checkpoint directory")
    modules = tuple(m.strip() for m in req.target_modules if m.strip())
    if any(m in ("all-linear", "all_linear", "all") for m in modules):
        modules = ()  # PEFT's "all-linear": mlx-lm's default, every linear layer
    dropout = _positive("adapter_dropout", req.adapter_dropout, 0.0)
    if dropout >= 1:
        raise ValueError(f"adapter_dropout must be below 1, got {dropout}")
    return FineTuneSpec(
        job_id=req.job_id or str(uuid.uuid4()),
        model=req.model,
        output_dir=os.path.abspath(req.output_dir),
        dataset_source=os.path.abspath(req.dataset_source),
        dataset_split=req.dataset_split or "train",
        training_type=training_type,
        rank=rank,
        alpha=float(_count("adapter_alpha", req.adapter_alpha, 16)),
        dropout=dropout,
        target_modules=modules,
        num_layers=_int("num_layers", extra.get("num_layers", "-1"), -1),
        learning_rate=_positive("learning_rate", req.learning_rate, 2e-4),
        num_epochs=_count("num_epochs", req.num_epochs, 3),
        max_steps=_count("max_steps", req.max_steps, 0),
        batch_size=_count("batch_size", req.batch_size, 2),
        grad_accumulation=_count("gradient_accumulation_steps", req.gradient_accumulation_steps, 4),
        warmup_steps=_count("warmup_steps", req.warmup_steps, 5),
        weight_decay=_positive("weight_decay", req.weight_decay, 0.01),
        grad_checkpoint=req.gradient_checkpointing,
        optimizer=optimizer,
        seed=req.seed if req.seed > 0 else 3407,
        dtype=PRECISIONS[precision],
        save_steps=_count("save_steps", req.save_steps, 0),
        save_total_limit=_int("save_total_limit", extra.get("save_total_limit", "0"), 0),
        eval_steps=_int("eval_steps", extra.get("eval_steps", "0"), 0),
        resume_from=os.path.abspath(resume) if resume else "",
        max_seq_length=_int("max_seq_length", extra.get("max_seq_length", "2048"), 8),
        mask_prompt=_bool("mask_prompt", extra["mask_prompt"]) if "mask_prompt" in extra else None,
        skip_memory_check=_bool("skip_memory_check", extra.get("skip_memory_check", "")),
        trust_remote_code=_bool("trust_remote_code", extra.get("trust_remote_code", "")),
        hf_token=extra.get("hf_token", ""),
    )


@dataclass(frozen=True)
class ExportSpec:
    checkpoint: str
    output_path: str
    export_format: str
    model: str
    quantization_method: str = ""
    trust_remote_code: bool = False
    hf_token: str = field(default="", repr=False)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def export_spec(req: backend_pb2.ExportModelRequest) -> ExportSpec:
    """An ``ExportModelRequest`` read and checked."""
    fmt = (req.export_format or "lora").lower()
    if fmt not in EXPORT_FORMATS:
        raise ValueError(
            f"export_format {req.export_format!r} is not available on MLX: use one of "
            f"{', '.join(EXPORT_FORMATS)}"
        )
    if not req.output_path:
        raise ValueError("output_path is required")
    ckpt = Path(req.checkpoint_path) if req.checkpoint_path else None
    if ckpt is None or not (ckpt / "adapters.safetensors").is_file():
        raise ValueError(
            f"checkpoint_path {req.checkpoint_path!r} holds no adapters.safetensors: give a "
            "checkpoint ListCheckpoints names, or the job's output_dir (the final adapter)"
        )
    extra = dict(req.extra_options)
    model = req.model or _base_model(ckpt)
    if not model:
        raise ValueError("model (the base model of the adapter) is required")
    method = req.quantization_method.lower()
    if fmt == "gguf" and method not in ("", "auto", "f16", "fp16"):
        raise ValueError(
            f"quantization_method {req.quantization_method!r}: mlx-lm writes GGUF in f16 only "
            "(mlx_lm/gguf.py); quantize that file with llama.cpp's llama-quantize, or export "
            "merged_4bit for an MLX 4-bit model"
        )
    return ExportSpec(
        checkpoint=str(ckpt.resolve()),
        output_path=os.path.abspath(req.output_path),
        export_format=fmt,
        model=model,
        quantization_method=method,
        trust_remote_code=_bool("trust_remote_code", extra.get("trust_remote_code", "")),
        hf_token=extra.get("hf_token", ""),
    )


def _base_model(ckpt: Path) -> str:
    """The base model the job recorded in the adapter's config (``training.checkpoints``)."""
    import json

    try:
        config = json.loads((ckpt / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return ""
    return str(config.get("base_model_name_or_path", ""))


@dataclass(frozen=True)
class QuantizeSpec:
    job_id: str
    model: str
    output_dir: str
    quantization_type: str
    recipe: quant_types.Recipe
    trust_remote_code: bool = False
    hf_token: str = field(default="", repr=False)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "recipe": asdict(self.recipe)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QuantizeSpec:
        return cls(**{**data, "recipe": quant_types.Recipe(**data["recipe"])})


QUANT_EXTRA = ("group_size", "bits", "hf_token", "trust_remote_code")


def quantize_spec(req: backend_pb2.QuantizationRequest) -> QuantizeSpec:
    """A ``QuantizationRequest`` read and checked."""
    if not req.model:
        raise ValueError("model is required: an MLX/Hugging Face model directory or repo id")
    if not req.output_dir:
        raise ValueError("output_dir is required")
    extra = dict(req.extra_options)
    unknown = sorted(set(extra) - set(QUANT_EXTRA))
    if unknown:
        raise ValueError(
            f"extra_options {', '.join(unknown)} not known to the MLX backend; it reads "
            + ", ".join(QUANT_EXTRA)
        )
    group = _int("group_size", extra["group_size"], 1) if "group_size" in extra else None
    bits = _int("bits", extra["bits"], 1) if "bits" in extra else None
    qtype = req.quantization_type or "q4"
    recipe = quant_types.recipe(qtype, group_size=group, bits=bits)
    return QuantizeSpec(
        job_id=req.job_id or str(uuid.uuid4()),
        model=req.model,
        output_dir=os.path.abspath(req.output_dir),
        quantization_type=qtype.lower(),
        recipe=recipe,
        trust_remote_code=_bool("trust_remote_code", extra.get("trust_remote_code", "")),
        hf_token=extra.get("hf_token", ""),
    )
