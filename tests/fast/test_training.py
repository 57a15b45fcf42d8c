"""The training RPCs' wire contract and request reading (no model, no process): LocalAI's
message fields and numbers, FineTuneRequest / ExportModelRequest / QuantizationRequest
read into specs or refused naming what is supported, quantization_type names mapped to
MLX recipes, JSONL rows checked with their line numbers, the checkpoint listing, and the
LoadModel a job's process gets. The jobs themselves: tests/process/test_training.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import backend_pb2
from training import checkpoints, datasets, quant_types, spec

# LocalAI's backend/backend.proto at 82c191a (fields: name -> number).
LOCALAI = {
    "FineTuneRequest": {
        "model": 1,
        "training_type": 2,
        "training_method": 3,
        "adapter_rank": 10,
        "adapter_alpha": 11,
        "adapter_dropout": 12,
        "target_modules": 13,
        "learning_rate": 20,
        "num_epochs": 21,
        "batch_size": 22,
        "gradient_accumulation_steps": 23,
        "warmup_steps": 24,
        "max_steps": 25,
        "save_steps": 26,
        "weight_decay": 27,
        "gradient_checkpointing": 28,
        "optimizer": 29,
        "seed": 30,
        "mixed_precision": 31,
        "dataset_source": 40,
        "dataset_split": 41,
        "output_dir": 50,
        "job_id": 51,
        "resume_from_checkpoint": 55,
        "extra_options": 60,
    },
    "FineTuneJobResult": {"job_id": 1, "success": 2, "message": 3},
    "FineTuneProgressRequest": {"job_id": 1},
    "FineTuneProgressUpdate": {
        "job_id": 1,
        "current_step": 2,
        "total_steps": 3,
        "current_epoch": 4,
        "total_epochs": 5,
        "loss": 6,
        "learning_rate": 7,
        "grad_norm": 8,
        "eval_loss": 9,
        "eta_seconds": 10,
        "progress_percent": 11,
        "status": 12,
        "message": 13,
        "checkpoint_path": 14,
        "sample_path": 15,
        "extra_metrics": 16,
    },
    "FineTuneStopRequest": {"job_id": 1, "save_checkpoint": 2},
    "ListCheckpointsRequest": {"output_dir": 1},
    "ListCheckpointsResponse": {"checkpoints": 1},
    "CheckpointInfo": {"path": 1, "step": 2, "epoch": 3, "loss": 4, "created_at": 5},
    "ExportModelRequest": {
        "checkpoint_path": 1,
        "output_path": 2,
        "export_format": 3,
        "quantization_method": 4,
        "model": 5,
        "extra_options": 6,
    },
    "QuantizationRequest": {
        "model": 1,
        "quantization_type": 2,
        "output_dir": 3,
        "job_id": 4,
        "extra_options": 5,
    },
    "QuantizationJobResult": {"job_id": 1, "success": 2, "message": 3},
    "QuantizationProgressRequest": {"job_id": 1},
    "QuantizationProgressUpdate": {
        "job_id": 1,
        "progress_percent": 2,
        "status": 3,
        "message": 4,
        "output_file": 5,
        "extra_metrics": 6,
    },
    "QuantizationStopRequest": {"job_id": 1},
}
RPCS = {
    "StartFineTune": ("FineTuneRequest", "FineTuneJobResult", False),
    "FineTuneProgress": ("FineTuneProgressRequest", "FineTuneProgressUpdate", True),
    "StopFineTune": ("FineTuneStopRequest", "Result", False),
    "ListCheckpoints": ("ListCheckpointsRequest", "ListCheckpointsResponse", False),
    "ExportModel": ("ExportModelRequest", "Result", False),
    "StartQuantization": ("QuantizationRequest", "QuantizationJobResult", False),
    "QuantizationProgress": ("QuantizationProgressRequest", "QuantizationProgressUpdate", True),
    "StopQuantization": ("QuantizationStopRequest", "Result", False),
}


@pytest.mark.parametrize("name", sorted(LOCALAI))
def test_messages_have_localais_fields(name):
    fields = backend_pb2.DESCRIPTOR.message_types_by_name[name].fields
    assert {f.name: f.number for f in fields} == LOCALAI[name]


def test_rpcs_have_localais_types():
    service = backend_pb2.DESCRIPTOR.services_by_name["Backend"]
    for rpc, (request, reply, streams) in RPCS.items():
        method = service.methods_by_name[rpc]
        assert (method.input_type.name, method.output_type.name) == (request, reply)
        assert method.server_streaming is streams and not method.client_streaming


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    return path


def _ft(data: Path, **fields) -> backend_pb2.FineTuneRequest:
    return backend_pb2.FineTuneRequest(
        model="m", dataset_source=str(data), output_dir="/tmp/out", **fields
    )


def test_finetune_defaults_follow_localais_trainer(data):
    s = spec.finetune_spec(_ft(data, job_id="j", optimizer="adamw_torch"))
    assert (s.rank, s.alpha, s.scale, s.learning_rate, s.num_epochs) == (16, 16.0, 1.0, 2e-4, 3)
    assert (s.batch_size, s.grad_accumulation, s.warmup_steps, s.weight_decay) == (2, 4, 5, 0.01)
    assert (s.seed, s.optimizer, s.training_type, s.num_layers) == (3407, "adamw", "lora", -1)
    s = spec.finetune_spec(
        _ft(data, adapter_rank=8, adapter_alpha=32, target_modules=["q_proj", "v_proj"])
    )
    assert s.scale == 4.0 and s.target_modules == ("q_proj", "v_proj")
    assert spec.finetune_spec(_ft(data, target_modules=["all-linear"])).target_modules == ()
    assert spec.FineTuneSpec.from_json(json.loads(json.dumps(s.to_json()))) == s


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"training_type": "loha"}, "lora, dora, full"),
        ({"training_method": "dpo"}, "use sft"),
        ({"optimizer": "prodigy"}, "adamw, adam, sgd"),
        ({"mixed_precision": "fp8"}, "bf16, fp16"),
        ({"extra_options": {"lora_bias": "x"}}, "lora_bias"),
        ({"extra_options": {"max_seq_length": "x"}}, "max_seq_length"),
        ({"learning_rate": float("nan")}, "learning_rate"),
        ({"adapter_rank": -1}, "adapter_rank"),
        ({"resume_from_checkpoint": "/no/such/dir"}, "resume_from_checkpoint"),
    ],
)
def test_finetune_refusals_name_the_field(data, fields, says):
    with pytest.raises(ValueError) as err:
        spec.finetune_spec(_ft(data, **fields))
    assert says in str(err.value)


def test_finetune_needs_a_local_dataset():
    with pytest.raises(ValueError) as err:
        spec.finetune_spec(
            backend_pb2.FineTuneRequest(model="m", dataset_source="org/ds", output_dir="/o")
        )
    assert "local JSONL" in str(err.value)


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("q4_k_m", ("mixed_4_6", 64, 4, "affine")),
        ("q8_0", ("", 32, 8, "affine")),
        ("q4_0", ("", 32, 4, "affine")),
        ("q6_k", ("", 64, 6, "affine")),
        ("q2_k", ("mixed_2_6", 64, 4, "affine")),
        ("q4", ("", 64, 4, "affine")),
        ("mixed_3_6", ("mixed_3_6", 64, 4, "affine")),
        ("mxfp4", ("", 32, 4, "mxfp4")),
        ("nvfp4", ("", 16, 4, "nvfp4")),
    ],
)
def test_quantization_types_map_to_mlx(name, want):
    r = quant_types.recipe(name)
    assert r.quantize and (r.predicate, r.group_size, r.bits, r.mode) == want


def test_quantization_dtypes_and_refusals():
    assert quant_types.recipe("bf16") == quant_types.Recipe(quantize=False, dtype="bfloat16")
    assert quant_types.recipe("q4", group_size=32).group_size == 32
    for bad, says in (("iq2_xxs", "mixed_4_6"), ("dwq", "mlx_lm.dwq"), ("awq", "calibration")):
        with pytest.raises(ValueError) as err:
            quant_types.recipe(bad)
        assert says in str(err.value)
    with pytest.raises(ValueError, match="group_size"):
        quant_types.recipe("q4", group_size=48)
    req = backend_pb2.QuantizationRequest(model="m", output_dir="/o", extra_options={"x": "1"})
    with pytest.raises(ValueError, match="group_size, bits"):
        spec.quantize_spec(req)


def test_export_refusals(tmp_path):
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    req = backend_pb2.ExportModelRequest(
        checkpoint_path=str(ckpt), output_path=str(tmp_path / "o"), model="m"
    )
    with pytest.raises(ValueError, match=r"adapters\.safetensors"):
        spec.export_spec(req)
    (ckpt / "adapters.safetensors").write_bytes(b"")
    (ckpt / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "base"}))
    assert spec.export_spec(req).export_format == "lora"
    req.model = ""
    assert spec.export_spec(req).model == "base"  # the job recorded its base model
    req.export_format = "merged_8bit"
    with pytest.raises(ValueError, match="merged_4bit"):
        spec.export_spec(req)


def test_bad_rows_are_named_by_line(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [
        json.dumps({"prompt": "p", "completion": "c"}),
        "{not json",
        "",
        json.dumps({"text": "t"}),
        json.dumps({"prompt": "p", "completion": 3}),
        json.dumps(["x"]),
    ]
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(ValueError) as err:
        datasets.read(path)
    message = str(err.value)
    assert "line 2: not valid JSON" in message
    assert "line 4: a text row in a completions dataset" in message
    assert "line 5: 'completion' must be a string" in message
    assert "line 6: expected a JSON object" in message
    assert "line 1" not in message and "line 3" not in message


def test_formats_read(tmp_path):
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    for row, fmt in (
        (chat, "chat"),
        ({"text": "t"}, "text"),
        ({"prompt": "a", "completion": "b"}, "completions"),
    ):
        path = tmp_path / f"{fmt}.jsonl"
        path.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
        assert datasets.read(path) == (fmt, [(1, row), (2, row)])
    (tmp_path / "dir").mkdir()
    with pytest.raises(ValueError, match=r"no train\.jsonl"):
        datasets.locate(str(tmp_path / "dir"), "train")


def test_checkpoints_listed_by_step(tmp_path):
    for step in (20, 5):
        d = checkpoints.checkpoint_dir(tmp_path, step)
        d.mkdir()
        (d / checkpoints.ADAPTERS).write_bytes(b"")
        (d / checkpoints.STATE).write_text(
            json.dumps({"step": step, "epoch": step / 2, "loss": 1.5})
        )
    (tmp_path / "checkpoint-7.partial").mkdir()  # a save that was cut: never listed
    found = checkpoints.list_checkpoints(str(tmp_path))
    assert [(c["step"], c["epoch"], c["loss"]) for c in found] == [(5, 2.5, 1.5), (20, 10.0, 1.5)]
    assert found[0]["path"] == str(tmp_path / "checkpoint-5")
    assert checkpoints.list_checkpoints(str(tmp_path / "none")) == []


def test_a_jobs_process_loads_with_the_backend_name(tmp_path):
    for name in ("mlx", "metal-mlx", "mlx-distributed", "cuda12-mlx-development"):
        assert spec.names_this_backend(name, os.path.join("/models", name))
    for name in ("owner/name", "gpt2", "/abs/path", "model.gguf", ""):
        assert not spec.names_this_backend(name)
    (tmp_path / "mlx").mkdir()  # a model of that name in the models directory wins
    assert not spec.names_this_backend("mlx", str(tmp_path / "mlx"))
