"""One fine-tuning run, in the job's child process: load, check memory, train, checkpoint.

The model is prepared as ``mlx_lm.lora.train_model`` prepares it (freeze, then
``linear_to_lora_layers`` for lora/dora or unfreeze the last layers for full), batches come
from mlx-lm's ``iterate_batches``, the loss is its ``default_loss`` and a step is the
compiled step of ``mlx_lm.tuner.trainer.train``. The loop itself is ours because ``train``
offers no way to stop between steps, reports no gradient norm and saves no optimizer state
(so a resumed run would restart Adam and the schedule): LocalAI's progress, stop and resume
need all three. With the same seed, data and optimizer the weights match ``train``'s
(tests/model/test_training.py compares them).

A "step" is an optimizer update (LocalAI's and trl's meaning): ``gradient_accumulation_steps``
batches each. The learning rate warms up linearly over ``warmup_steps`` and then decays
linearly to 0, trl's default schedule.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol, cast

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_map, tree_unflatten

from loading import host_memory
from seam.arrays import flat_arrays, real, scalar
from training import checkpoints, datasets
from training.spec import FineTuneSpec

Emit = Callable[..., None]
GIB = 1 << 30


class Stopped(Exception):
    """The job was asked to stop; raised out of the loop after the checkpoint is saved."""


def resolve(model: str) -> str:
    """The local MLX directory of ``model``, found as LoadModel finds one
    (``loading.model_loader.resolve_model``: a directory, a GGUF file converted once, a
    Hugging Face id in any form LocalAI writes, downloaded when not cached)."""
    from loading import gguf_convert, model_loader

    found = model_loader.resolve_model(model)
    if found.kind == "gguf":
        return str(gguf_convert.cached_conversion(found.path))
    return str(found.path)


def load_base(
    model: str, trust_remote_code: bool = False, lazy: bool = False, adapter_path: str = ""
) -> tuple[nn.Module, Any, dict[str, Any]]:
    """(model, tokenizer, config) of a model directory, Hugging Face id or GGUF file."""
    from mlx_lm.utils import load

    # With return_config mlx-lm returns (model, tokenizer, config); it types both shapes.
    return cast(
        tuple[nn.Module, Any, dict[str, Any]],
        load(
            resolve(model),
            adapter_path=adapter_path or None,
            tokenizer_config={"trust_remote_code": trust_remote_code},
            return_config=True,
            lazy=lazy,
        ),
    )


def _lora_keys(model: nn.Module, wanted: tuple[str, ...]) -> list[str] | None:
    """mlx-lm's LoRA keys (module paths inside a layer) for PEFT-style ``target_modules``
    (``q_proj``, or ``self_attn.q_proj``); None = mlx-lm's default (every linear)."""
    if not wanted:
        return None
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

    kinds = (nn.Linear, nn.QuantizedLinear, SwitchLinear, QuantizedSwitchLinear)
    paths = sorted(
        {k for layer in model.layers for k, m in layer.named_modules() if isinstance(m, kinds)}
    )
    keys = [p for p in paths if p in wanted or p.rsplit(".", 1)[-1] in wanted]
    missing = [w for w in wanted if not any(p == w or p.rsplit(".", 1)[-1] == w for p in paths)]
    if missing:
        names = sorted({p.rsplit(".", 1)[-1] for p in paths})
        raise ValueError(
            f"target_modules {', '.join(missing)} are not linear layers of this model; it has: "
            + ", ".join(names)
        )
    return keys


def prepare(model: nn.Module, spec: FineTuneSpec) -> dict[str, Any]:
    """Freeze the base and add the trainable part, as mlx_lm.lora.train_model does; returns
    the adapter config written beside the weights (mlx-lm's adapter_config.json keys)."""
    from mlx_lm.tuner.utils import linear_to_lora_layers

    if spec.num_layers > len(model.layers):
        raise ValueError(
            f"extra_options.num_layers {spec.num_layers}: the model has {len(model.layers)} layers"
        )
    mx.random.seed(spec.seed)
    model.freeze()
    lora: dict[str, Any] | None = None
    if spec.training_type == "full":
        for layer in model.layers[-max(spec.num_layers, 0) :]:
            layer.unfreeze()
    else:
        lora = {"rank": spec.rank, "scale": spec.scale, "dropout": spec.dropout}
        keys = _lora_keys(model, spec.target_modules)
        if keys is not None:
            lora["keys"] = keys
        linear_to_lora_layers(model, spec.num_layers, lora, use_dora=spec.training_type == "dora")
    return {
        "fine_tune_type": spec.training_type,
        "num_layers": spec.num_layers,
        "lora_parameters": lora,
        "base_model_name_or_path": spec.model,
        "learning_rate": spec.learning_rate,
        "seed": spec.seed,
    }


def build_schedule(spec: FineTuneSpec, total_steps: int) -> Callable[[Any], Any]:
    """trl's default schedule: linear warm-up from 0, then linear decay to 0."""
    lr = spec.learning_rate
    warmup = min(spec.warmup_steps, max(total_steps - 1, 0))
    decay = optim.linear_schedule(lr, 0.0, max(total_steps - warmup, 1))
    if not warmup:
        return decay
    return optim.join_schedules([optim.linear_schedule(0.0, lr, warmup), decay], [warmup])


def build_optimizer(spec: FineTuneSpec, schedule: Callable[[Any], Any]) -> optim.Optimizer:
    """The mlx optimizer ``spec.optimizer`` names, driven by ``schedule``."""
    if spec.optimizer == "adamw":
        return optim.AdamW(learning_rate=schedule, weight_decay=spec.weight_decay)
    if spec.optimizer == "adam":
        return optim.Adam(learning_rate=schedule)
    if spec.optimizer == "sgd":
        return optim.SGD(learning_rate=schedule, weight_decay=spec.weight_decay)
    if spec.optimizer == "muon":
        return optim.Muon(learning_rate=schedule, weight_decay=spec.weight_decay)
    return optim.Adafactor(learning_rate=schedule)


# ------------------------------------------------------------------------------ memory
OPTIMIZER_COPIES = {"adamw": 2, "adam": 2, "muon": 1, "sgd": 0, "adafactor": 1}


def estimate(
    model: nn.Module, spec: FineTuneSpec, tokens: int, config: dict[str, Any]
) -> dict[str, int]:
    """Bytes a run needs: weights, gradients and optimizer state of the trainable
    parameters, and activations of one batch of ``tokens`` per row. Activations per layer
    follow Korthikanti et al. 2022 ("Reducing Activation Recomputation"): 34·s·b·h + 5·a·s²·b
    bytes at 16 bits, scaled to the weights' width; with gradient checkpointing only each
    layer's input is kept, plus one layer's full set. Logits: 3 float32 copies."""
    params = flat_arrays(model.parameters())
    weights = sum(p.nbytes for _, p in params)
    trainable = sum(p.nbytes for _, p in flat_arrays(model.trainable_parameters()))
    width = max((p.dtype.size for _, p in params if mx.issubdtype(p.dtype, mx.floating)), default=4)
    text = config.get("text_config", config)
    hidden = int(text.get("hidden_size", 0) or 0)
    heads = int(text.get("num_attention_heads", 1) or 1)
    vocab = int(text.get("vocab_size", 0) or 0)
    layers = len(model.layers)
    b, s = spec.batch_size, tokens
    per_layer = (34 * s * b * hidden + 5 * heads * s * s * b) * width // 2
    if spec.grad_checkpoint:
        activations = layers * s * b * hidden * width + per_layer
    else:
        activations = layers * per_layer
    accumulated = trainable if spec.grad_accumulation > 1 else 0
    return {
        "weights": weights,
        "gradients": trainable + accumulated,
        "optimizer": trainable * OPTIMIZER_COPIES.get(spec.optimizer, 2),
        "activations": activations,
        "logits": 3 * b * s * vocab * 4,
    }


def available_memory() -> int:
    """Bytes a run may use: Metal's recommended working set, else the memory the OS
    reports available (MemAvailable: what the serving process and others leave)."""
    if mx.metal.is_available():
        return int(mx.device_info().get("max_recommended_working_set_size", 0))
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return host_memory.usable_memory()


def check_memory(need: dict[str, int], spec: FineTuneSpec, tokens: int) -> None:
    total = sum(need.values())
    have = available_memory()
    if total <= have or spec.skip_memory_check:
        return
    parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in need.items())
    raise MemoryError(
        f"this run needs about {total / GIB:.2f} GiB ({parts} GiB at batch_size "
        f"{spec.batch_size} x {tokens} tokens) but {have / GIB:.2f} GiB is available: lower "
        "batch_size or extra_options.max_seq_length, turn on gradient_checkpointing, use "
        "training_type lora, or pass extra_options.skip_memory_check=true to try anyway"
    )


# ------------------------------------------------------------------------------ checkpoints
def save(
    path: Path,
    model: nn.Module,
    opt: optim.Optimizer,
    adapter_config: dict[str, Any],
    state: dict[str, Any],
) -> None:
    """Write a checkpoint (adapter, config, optimizer state, trainer state) atomically:
    into a temporary sibling first, so a stop or crash never leaves a half-written one."""
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    mx.save_safetensors(
        str(tmp / checkpoints.ADAPTERS), dict(flat_arrays(model.trainable_parameters()))
    )
    mx.save_safetensors(str(tmp / checkpoints.OPTIMIZER), dict(flat_arrays(opt.state)))
    (tmp / checkpoints.ADAPTER_CONFIG).write_text(json.dumps(adapter_config, indent=2))
    (tmp / checkpoints.STATE).write_text(json.dumps(state, indent=2))
    if path.exists():
        for item in tmp.iterdir():  # output_dir itself: replace the files, keep the rest
            os.replace(item, path / item.name)
        tmp.rmdir()
    else:
        os.replace(tmp, path)


def restore(path: Path, model: nn.Module, opt: optim.Optimizer) -> dict[str, Any]:
    """Load a checkpoint's adapter and optimizer state; returns its trainer state."""
    state = checkpoints.read_state(path)
    if not (path / checkpoints.ADAPTERS).is_file() or "step" not in state:
        raise ValueError(f"resume_from_checkpoint {path}: not a checkpoint of this backend")
    model.load_weights(str(path / checkpoints.ADAPTERS), strict=False)
    if (path / checkpoints.OPTIMIZER).is_file():
        # A safetensors file loads as name -> array (mlx types every load shape).
        saved = cast(dict[str, mx.array], mx.load(str(path / checkpoints.OPTIMIZER)))
        opt.state = tree_unflatten(list(saved.items()))
        opt.init(model.trainable_parameters())
    return state


def _prune(output_dir: Path, keep: int) -> None:
    if keep <= 0:
        return
    for old in checkpoints.list_checkpoints(str(output_dir))[:-keep]:
        shutil.rmtree(old["path"], ignore_errors=True)


# ------------------------------------------------------------------------------ the run
class StopFlag(Protocol):
    """Set by the worker when the job is asked to stop; ``save``: keep a checkpoint."""

    save: bool

    def is_set(self) -> bool: ...


def run(spec: FineTuneSpec, emit: Emit, stop: StopFlag) -> None:
    """Train as ``spec`` says, emitting progress; raises Stopped after a stop's checkpoint."""
    from mlx_lm.tuner.trainer import default_loss, evaluate, grad_checkpoint, iterate_batches

    if spec.hf_token:
        os.environ["HF_TOKEN"] = spec.hf_token
    emit(status="loading_model", message=f"Loading model {spec.model}")
    model, tokenizer, config = load_base(spec.model, spec.trust_remote_code, lazy=True)
    if spec.dtype:
        dtype = getattr(mx, spec.dtype)
        model.update(
            tree_map(
                lambda p: p.astype(dtype) if mx.issubdtype(p.dtype, mx.floating) else p,
                model.parameters(),
            )
        )
    emit(status="loading_dataset", message=f"Loading dataset {spec.dataset_source}")
    train_path, valid_path = datasets.locate(spec.dataset_source, spec.dataset_split)
    train_rows = datasets.tokenize(train_path, tokenizer, spec.mask_prompt)
    valid_rows = datasets.tokenize(valid_path, tokenizer, spec.mask_prompt) if valid_path else None
    if len(train_rows) < spec.batch_size:
        raise ValueError(
            f"dataset {train_path} has {len(train_rows)} rows, fewer than batch_size "
            f"{spec.batch_size}: lower batch_size or add rows"
        )
    adapter_config = prepare(model, spec)
    tokens = min(train_rows.longest, spec.max_seq_length)
    need = estimate(model, spec, tokens, config)
    check_memory(need, spec, tokens)
    mx.eval(model.parameters())

    batches_per_epoch = len(train_rows) // spec.batch_size
    accum = spec.grad_accumulation
    per_epoch = math.ceil(spec.num_epochs * batches_per_epoch / accum)
    total_steps = spec.max_steps or max(1, per_epoch)
    total_epochs = total_steps * accum / batches_per_epoch
    schedule = build_schedule(spec, total_steps)
    opt = build_optimizer(spec, schedule)
    output = Path(spec.output_dir)
    output.mkdir(parents=True, exist_ok=True)

    start_step = 0
    if spec.resume_from:
        start_step = int(restore(Path(spec.resume_from), model, opt)["step"])
        if start_step >= total_steps:
            raise ValueError(
                f"resume_from_checkpoint is at step {start_step}, the run has {total_steps} "
                "steps: raise max_steps or num_epochs"
            )
    if spec.grad_checkpoint:
        grad_checkpoint(model.layers[0])

    loss_value_and_grad = nn.value_and_grad(model, default_loss)
    state = [model.state, opt.state, mx.random.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(
        batch: mx.array, lengths: mx.array, prev_grad: Any, do_update: bool
    ) -> tuple[mx.array, mx.array, Any, mx.array | None]:
        # mlx_lm.tuner.trainer.train's step, plus the global gradient norm.
        (lvalue, toks), grad = loss_value_and_grad(model, batch, lengths)
        if prev_grad is not None:
            grad = tree_map(lambda x, y: x + y, grad, prev_grad)
        norm = None
        if do_update:
            if accum > 1:
                grad = tree_map(lambda x: x / accum, grad)
            squares = sum(mx.sum(g.astype(mx.float32) ** 2) for _, g in flat_arrays(grad))
            norm = mx.sqrt(cast(mx.array, squares))  # a sum of arrays (grad is never empty)
            opt.update(model, grad)
            grad = None
        return lvalue, toks, grad, norm

    np.random.seed(spec.seed)
    batches = iterate_batches(
        dataset=train_rows,
        batch_size=spec.batch_size,
        max_seq_length=spec.max_seq_length,
        loop=True,
    )
    for _ in range(start_step * accum):  # a resumed run continues the same batch order
        next(batches)

    def trainer_state(done: int, loss: float) -> dict[str, Any]:
        return {
            "step": done,
            "total_steps": total_steps,
            "epoch": done * accum / batches_per_epoch,
            "loss": loss,
            "base_model": spec.model,
            "job_id": spec.job_id,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    eval_every = spec.eval_steps or spec.save_steps

    def eval_loss() -> float:
        if valid_rows is None or len(valid_rows) < spec.batch_size:
            return 0.0
        value = evaluate(model, valid_rows, spec.batch_size, -1, max_seq_length=spec.max_seq_length)
        model.train()
        return float(value)

    model.train()
    emit(
        status="training",
        message=f"Training {spec.training_type} for {total_steps} steps",
        current_step=start_step,
        total_steps=total_steps,
        total_epochs=total_epochs,
    )
    started = time.perf_counter()
    trained_tokens = 0
    last_loss = 0.0
    done = start_step
    grad = None
    while done < total_steps:
        losses, ntoks = [], 0
        norm = None
        lr_used = real(schedule(mx.array(done)))  # the rate this step's update uses
        for micro in range(1, accum + 1):
            if stop.is_set():
                break
            batch, lengths = next(batches)
            lvalue, toks, grad, norm = step(batch, lengths, grad, micro == accum)
            mx.eval(state, lvalue, toks, grad, norm)
            losses.append(lvalue.item())
            ntoks += scalar(toks)
        if stop.is_set():
            state_now = trainer_state(done, last_loss)
            _stop(output, model, opt, adapter_config, state_now, emit, done, stop.save)
        done += 1
        last_loss = float(np.mean(losses))
        trained_tokens += ntoks
        elapsed = time.perf_counter() - started
        per_step = elapsed / (done - start_step)
        ev = eval_loss() if eval_every and done % eval_every == 0 else 0.0
        emit(
            status="training",
            current_step=done,
            total_steps=total_steps,
            current_epoch=done * accum / batches_per_epoch,
            total_epochs=total_epochs,
            loss=last_loss,
            learning_rate=lr_used,
            grad_norm=real(norm) if norm is not None else 0.0,
            eval_loss=ev,
            eta_seconds=per_step * (total_steps - done),
            progress_percent=100.0 * done / total_steps,
            extra_metrics={
                "tokens_per_second": trained_tokens / elapsed if elapsed else 0.0,
                "trained_tokens": float(trained_tokens),
                "peak_memory_gb": mx.get_peak_memory() / 1e9,
            },
        )
        if spec.save_steps and done % spec.save_steps == 0 and done < total_steps:
            path = checkpoints.checkpoint_dir(output, done)
            save(path, model, opt, adapter_config, trainer_state(done, last_loss))
            _prune(output, spec.save_total_limit)
            emit(
                status="saving",
                current_step=done,
                total_steps=total_steps,
                message=f"Checkpoint saved at step {done}",
                checkpoint_path=str(path),
            )
    emit(status="saving", current_step=done, total_steps=total_steps, message="Saving adapter")
    save(output, model, opt, adapter_config, trainer_state(done, last_loss))
    emit(
        status="completed",
        current_step=done,
        total_steps=total_steps,
        current_epoch=done * accum / batches_per_epoch,
        total_epochs=total_epochs,
        loss=last_loss,
        eval_loss=eval_loss() if valid_rows is not None else 0.0,
        progress_percent=100.0,
        message=f"Training completed: adapter in {output}",
        checkpoint_path=str(output),
    )


def _stop(
    output: Path,
    model: nn.Module,
    opt: optim.Optimizer,
    adapter_config: dict[str, Any],
    state: dict[str, Any],
    emit: Emit,
    done: int,
    keep: bool,
) -> None:
    """Save the last completed step as a checkpoint (the weights only change at an
    update, so a half-accumulated step is dropped) and end the run."""
    if not keep:
        emit(status="stopped", current_step=done, message="Training stopped; nothing saved")
        raise Stopped
    if done == 0:
        emit(status="stopped", message="Training stopped before the first step; nothing saved")
        raise Stopped
    path = checkpoints.checkpoint_dir(output, done)
    save(path, model, opt, adapter_config, state)
    emit(
        status="stopped",
        current_step=done,
        total_steps=state["total_steps"],
        current_epoch=state["epoch"],
        loss=state["loss"],
        message=f"Training stopped at step {done}; checkpoint saved",
        checkpoint_path=str(path),
    )
    raise Stopped
