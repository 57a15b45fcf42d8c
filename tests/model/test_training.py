"""The fine-tuning loop against mlx-lm's own trainer on the same inputs, the memory check's
refusal, and the datasets' tokenizing (mlx-lm's dataset classes, prompt masking), in the
test process on a tiny random llama (tests/tiny_models.py) with the embedded tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import tiny_models
from mlx.utils import tree_flatten

from training import datasets, finetune
from training.spec import FineTuneSpec
from training.worker import Stop

ROWS = [
    {"prompt": "Name the red fruit.", "completion": "Apple!"},
    {"prompt": "What do bees make?", "completion": "Honey, of course."},
    {"prompt": "Sky colour?", "completion": "Blue."},
    {"prompt": "Two plus two?", "completion": "Four."},
]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("train")
    model = tiny_models.save_scaled(tiny_models.CONFIGS["llama"], root / "base", scale=4.0)
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return {"root": root, "model": model, "data": data}


def _spec(work, out: str, **fields) -> FineTuneSpec:
    base = dict(
        job_id=out,
        model=str(work["model"]),
        output_dir=str(work["root"] / out),
        dataset_source=str(work["data"]),
        rank=8,
        alpha=16,
        learning_rate=1e-3,
        batch_size=2,
        grad_accumulation=2,
        max_steps=3,
        warmup_steps=1,
    )
    base.update(fields)
    return FineTuneSpec(**base)


def test_weights_match_mlx_lms_trainer(work):
    """Our loop and mlx_lm.tuner.trainer.train, same model, seed, batches and optimizer:
    the same adapter after 3 updates of 2 accumulated batches each."""
    from mlx_lm.tuner.trainer import TrainingArgs, train

    spec = _spec(work, "ours")
    updates: list[dict] = []
    finetune.run(spec, lambda **u: updates.append(u), Stop())
    ours = mx.load(str(work["root"] / "ours" / "adapters.safetensors"))
    assert updates[-1]["status"] == "completed" and updates[-1]["current_step"] == 3

    model, tokenizer, _ = finetune.load_base(spec.model)
    rows = datasets.tokenize(work["data"], tokenizer, None)
    finetune.prepare(model, spec)
    opt = finetune.build_optimizer(spec, finetune.build_schedule(spec, 3))
    np.random.seed(spec.seed)
    train(
        model,
        opt,
        rows,
        args=TrainingArgs(
            batch_size=2,
            iters=6,
            grad_accumulation_steps=2,
            steps_per_save=1000,
            steps_per_report=1000,
            adapter_file=str(work["root"] / "theirs.safetensors"),
        ),
    )
    theirs = dict(tree_flatten(model.trainable_parameters()))
    assert ours.keys() == theirs.keys() and len(ours) == 2 * 7 * 2  # 2 layers x 7 linears
    for name, value in theirs.items():
        assert mx.allclose(ours[name], value, atol=1e-5).item(), name
    # and the run moved them: lora_b starts at zero
    assert any(mx.abs(v).max().item() > 0 for k, v in ours.items() if k.endswith("lora_b"))


def test_resume_continues_the_same_run(work):
    """3 steps, stop-free resume to 6 == 6 steps straight (optimizer state and batch
    order restored from the checkpoint)."""
    straight = _spec(work, "six", max_steps=6, grad_accumulation=1)
    finetune.run(straight, lambda **u: None, Stop())
    first = _spec(work, "half", max_steps=6, grad_accumulation=1, save_steps=3)
    stop = Stop()
    seen: list[dict] = []

    def emit(**u):
        seen.append(u)
        if u.get("status") == "saving" and u.get("checkpoint_path"):
            stop.set(True)

    with pytest.raises(finetune.Stopped):
        finetune.run(first, emit, stop)
    assert seen[-1]["status"] == "stopped" and seen[-1]["current_step"] == 3
    resumed = _spec(
        work,
        "resumed",
        max_steps=6,
        grad_accumulation=1,
        resume_from=str(work["root"] / "half" / "checkpoint-3"),
    )
    steps: list[int] = []

    def record(**u):
        if u["status"] == "training" and "loss" in u:
            steps.append(u["current_step"])

    finetune.run(resumed, record, Stop())
    assert steps == [4, 5, 6]
    a = mx.load(str(work["root"] / "six" / "adapters.safetensors"))
    b = mx.load(str(work["root"] / "resumed" / "adapters.safetensors"))
    for name in a:
        assert mx.allclose(a[name], b[name], atol=1e-5).item(), name


def test_memory_check_refuses_with_the_figures(work, monkeypatch):
    monkeypatch.setattr(finetune, "available_memory", lambda: 1 << 20)
    updates: list[dict] = []
    with pytest.raises(MemoryError) as err:
        finetune.run(_spec(work, "big"), lambda **u: updates.append(u), Stop())
    message = str(err.value)
    for part in ("weights", "optimizer", "activations", "batch_size 2", "0.00 GiB is available"):
        assert part in message
    assert not (work["root"] / "big").exists()  # refused before anything was written


def test_target_modules_and_prompt_masking(work):
    model, tokenizer, _ = finetune.load_base(str(work["model"]))
    spec = _spec(work, "t", target_modules=("q_proj", "mlp.down_proj"))
    finetune.prepare(model, spec)
    names = {k for k, _ in tree_flatten(model.trainable_parameters())}
    assert names == {
        f"model.layers.{i}.{m}.{ab}"
        for i in range(2)
        for m in ("self_attn.q_proj", "mlp.down_proj")
        for ab in ("lora_a", "lora_b")
    }
    model, _, _ = finetune.load_base(str(work["model"]))
    with pytest.raises(ValueError, match="gate_proj"):  # the message lists the model's linears
        finetune.prepare(model, _spec(work, "t", target_modules=("c_attn",)))
    masked = datasets.tokenize(work["data"], tokenizer, None)  # prompt/completion: masked
    whole = datasets.tokenize(work["data"], tokenizer, False)
    assert all(0 < off < len(toks) for toks, off in masked.items)
    assert [t for t, _ in masked.items] == [t for t, _ in whole.items]
    assert all(off == 0 for _, off in whole.items)
