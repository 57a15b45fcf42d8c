"""Fine-tuning and quantization over real gRPC, as LocalAI's services drive them
(core/services/finetune/service.go, core/services/quantization/service.go): a backend
started through run.sh, LoadModel with the backend's name as the model (no weights),
StartFineTune -> FineTuneProgress -> ListCheckpoints -> ExportModel, then LoadModel of
the exports and Predict, which must return the answers the training data taught; a stop
mid-run (StopFineTune, and SIGTERM as LocalAI's StopJob sends) leaves a checkpoint that
loads; StartQuantization -> LoadModel -> Predict, the weights equal to mlx_lm.convert's.

The model is a tiny llama with scaled random weights (tests/tiny_models.py save_scaled:
width 64, the embedded SmolLM2 tokenizer), which LoRA teaches two answers in ~40 steps.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import tiny_models

import backend_pb2
from clients.server_process import ServerProcess

ROWS = [
    {"prompt": "Name the red fruit.", "completion": "Apple!"},
    {"prompt": "What do bees make?", "completion": "Honey, of course."},
]


def _msgs(prompt: str) -> list[backend_pb2.Message]:
    return [backend_pb2.Message(role="user", content=prompt)]


def _ask(stub, prompt: str) -> str:
    reply = stub.Predict(
        backend_pb2.PredictOptions(
            UseTokenizerTemplate=True, Messages=_msgs(prompt), Tokens=12, Temperature=0.0
        ),
        timeout=120,
    )
    return reply.message.decode()


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("training")
    model = tiny_models.save_scaled(tiny_models.CONFIGS["llama"], root / "base", scale=4.0)
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return {"root": root, "model": model, "data": data}


@pytest.fixture(scope="module")
def job_server():
    """A backend as LocalAI starts one for a job: run.sh, then LoadModel("mlx")."""
    server = ServerProcess(entry="run.sh")
    try:
        result = server.stub.LoadModel(backend_pb2.ModelOptions(Model="mlx", ModelFile="/nope/mlx"))
        assert result.success, result.message
        yield server
    finally:
        server.stop()


def _request(work: dict[str, Path], out: str, **fields) -> backend_pb2.FineTuneRequest:
    base = dict(
        model=str(work["model"]),
        training_type="lora",
        training_method="sft",
        adapter_rank=16,
        adapter_alpha=32,
        learning_rate=3e-3,
        batch_size=2,
        gradient_accumulation_steps=1,
        max_steps=40,
        save_steps=20,
        dataset_source=str(work["data"]),
        output_dir=str(work["root"] / out),
        job_id=out,
    )
    base.update(fields)
    return backend_pb2.FineTuneRequest(**base)


@dataclass
class Trained:
    """What one fine-tuning job (``job1``, 40 steps) showed, watched as LocalAI does."""

    started: backend_pb2.Result
    second: grpc.RpcError  # a second job started while job1 ran
    updates: list[backend_pb2.FineTuneProgressUpdate]
    health_ms: list[float]  # Health round trips while training

    @property
    def steps(self) -> list[backend_pb2.FineTuneProgressUpdate]:
        return [u for u in self.updates if u.status == "training" and u.current_step > 0]


@pytest.fixture(scope="module")
def trained(job_server, work) -> Trained:
    stub = job_server.stub
    started = stub.StartFineTune(_request(work, "job1"))
    with pytest.raises(grpc.RpcError) as second:
        stub.StartFineTune(_request(work, "job2"))
    updates, health_ms = [], []
    for update in stub.FineTuneProgress(backend_pb2.FineTuneProgressRequest(job_id="job1")):
        updates.append(update)
        if update.status == "training" and len(health_ms) < 3:
            t = time.perf_counter()
            assert stub.Health(backend_pb2.HealthMessage(), timeout=5).message == b"OK"
            health_ms.append((time.perf_counter() - t) * 1000)
    assert updates[-1].status == "completed", updates[-1].message
    return Trained(started, second.value, updates, health_ms)


EXPORTS = ("lora", "merged_16bit", "merged_4bit", "gguf")


@pytest.fixture(scope="module")
def exports(job_server, work, trained) -> dict[str, Path]:
    """job1 exported in every format, as LocalAI's UI asks (checkpoint: its output_dir)."""
    out = {}
    for fmt in EXPORTS:
        path = work["root"] / "models" / fmt
        result = job_server.stub.ExportModel(
            backend_pb2.ExportModelRequest(
                checkpoint_path=str(work["root"] / "job1"),
                output_path=str(path),
                export_format=fmt,
                model=str(work["model"]),
            ),
            timeout=300,
        )
        assert result.success, result.message
        out[fmt] = path
    return out


def test_a_job_starts_and_a_second_one_is_refused_naming_it(trained):
    assert trained.started.success and trained.started.job_id == "job1"
    assert trained.second.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "job1" in trained.second.details()


def test_progress_reports_the_stages_and_every_step(trained):
    assert {"loading_model", "loading_dataset", "training"} <= {u.status for u in trained.updates}
    assert [u.current_step for u in trained.steps] == list(range(1, 41))
    assert all(u.total_steps == 40 and u.grad_norm > 0 for u in trained.steps)
    assert trained.steps[-1].current_epoch == pytest.approx(40.0)


def test_the_learning_rate_warms_up_then_decays(trained):
    # warmup_steps 0 is "not set" (proto3): trl's default 5, from 0 up to the rate, then down
    rates = [u.learning_rate for u in trained.steps]
    assert rates[0] == 0 and rates[5] == pytest.approx(3e-3) and 0 < rates[-1] < rates[6]


def test_the_loss_falls(trained):
    steps = trained.steps
    assert steps[-1].loss < 0.5 < steps[0].loss, [round(u.loss, 3) for u in steps]


def test_health_answers_while_training(trained):
    assert max(trained.health_ms) < 1000, trained.health_ms  # the event loop is free


def test_checkpoints_are_reported_and_listed(job_server, work, trained):
    saving = [u.checkpoint_path for u in trained.updates if u.status == "saving"]
    assert [p for p in saving if p] == [str(work["root"] / "job1" / "checkpoint-20")]
    assert trained.updates[-1].checkpoint_path == str(work["root"] / "job1")
    listed = job_server.stub.ListCheckpoints(
        backend_pb2.ListCheckpointsRequest(output_dir=str(work["root"] / "job1"))
    ).checkpoints
    assert [(c.step, c.epoch) for c in listed] == [(20, 20.0)]
    assert 0 < listed[0].loss < trained.steps[0].loss and listed[0].created_at.endswith("Z")


def test_a_gguf_export_takes_f16_only(job_server, work, trained):
    with pytest.raises(grpc.RpcError) as err:
        job_server.stub.ExportModel(
            backend_pb2.ExportModelRequest(
                checkpoint_path=str(work["root"] / "job1"),
                output_path=str(work["root"] / "models" / "bad"),
                export_format="gguf",
                quantization_method="q4_k_m",
                model=str(work["model"]),
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "f16" in err.value.details()


def test_the_exports_are_what_localais_importer_reads(work, exports):
    config = json.loads((exports["lora"] / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(work["model"])
    merged = json.loads((exports["merged_16bit"] / "config.json").read_text())
    assert merged["model_type"] == "llama" and "quantization" not in merged
    quant = json.loads((exports["merged_4bit"] / "config.json").read_text())
    assert quant["quantization"] == {"group_size": 64, "bits": 4, "mode": "affine"}
    # The GGUF: mlx-lm's writer (mlx_lm/gguf.py), tokenizer metadata as llama.cpp writes it.
    (gguf,) = exports["gguf"].glob("*.gguf")
    assert list(exports["gguf"].iterdir()) == [gguf]  # one file: LocalAI's importer finds it
    assert gguf.read_bytes()[:4] == b"GGUF" and gguf.name == "gguf-f16.gguf"


@pytest.mark.parametrize("fmt", ["lora", "merged_16bit", "gguf"])
def test_an_export_loads_and_answers_what_it_learned(job_server, work, exports, fmt):
    """The adapter on its base, the merged model and the GGUF: the memorized answers."""
    if fmt == "lora":
        options = backend_pb2.ModelOptions(Model=str(work["model"]), LoraAdapter=str(exports[fmt]))
    elif fmt == "gguf":
        (gguf,) = exports[fmt].glob("*.gguf")
        options = backend_pb2.ModelOptions(Model=str(gguf))
    else:
        options = backend_pb2.ModelOptions(Model=str(exports[fmt]))
    loaded = job_server.stub.LoadModel(options)
    assert loaded.success, loaded.message
    for row in ROWS:
        assert _ask(job_server.stub, row["prompt"]).startswith(row["completion"])


def test_the_4bit_export_loads_and_answers(job_server, exports):
    loaded = job_server.stub.LoadModel(backend_pb2.ModelOptions(Model=str(exports["merged_4bit"])))
    assert loaded.success, loaded.message
    assert _ask(job_server.stub, ROWS[0]["prompt"])


def test_stop_leaves_a_loadable_checkpoint(work):
    """StopFineTune, then LocalAI's way (SIGTERM to the process): each leaves the last
    completed step as a checkpoint that LoadModel takes as LoraAdapter."""
    for how in ("rpc", "sigterm"):
        server = ServerProcess(entry="run.sh")
        try:
            stub = server.stub
            name = f"stop-{how}"
            stub.StartFineTune(_request(work, name, max_steps=5000, save_steps=0))
            for update in stub.FineTuneProgress(backend_pb2.FineTuneProgressRequest(job_id=name)):
                if update.status == "training" and update.current_step >= 3:
                    break
            if how == "rpc":
                result = stub.StopFineTune(
                    backend_pb2.FineTuneStopRequest(job_id=name, save_checkpoint=True), timeout=120
                )
                assert result.success and "checkpoint saved" in result.message
                final = list(
                    stub.FineTuneProgress(backend_pb2.FineTuneProgressRequest(job_id=name))
                )
                assert final[-1].status == "stopped" and final[-1].checkpoint_path
        finally:
            server.stop()
        listed = [p for p in (work["root"] / name).iterdir() if p.name.startswith("checkpoint-")]
        assert len(listed) == 1 and int(listed[0].name.split("-")[1]) >= 3, listed
        state = json.loads((listed[0] / "trainer_state.json").read_text())
        assert state["step"] == int(listed[0].name.split("-")[1])
        checker = ServerProcess()
        try:
            result = checker.stub.LoadModel(
                backend_pb2.ModelOptions(Model=str(work["model"]), LoraAdapter=str(listed[0]))
            )
            assert result.success, result.message
            assert _ask(checker.stub, ROWS[0]["prompt"])
        finally:
            checker.stop()


def test_quantize_load_predict(job_server, work):
    stub = job_server.stub
    out = work["root"] / "quant"
    started = stub.StartQuantization(
        backend_pb2.QuantizationRequest(
            model=str(work["model"]), quantization_type="q4_k_m", output_dir=str(out), job_id="q1"
        )
    )
    assert started.success and "mixed_4_6" in started.message
    updates = list(stub.QuantizationProgress(backend_pb2.QuantizationProgressRequest(job_id="q1")))
    assert updates[-1].status == "completed", updates[-1].message
    assert updates[-1].progress_percent == 100.0
    result_dir = Path(updates[-1].output_file)
    assert result_dir.parent == out and updates[-1].extra_metrics["compression_ratio"] > 2
    config = json.loads((result_dir / "config.json").read_text())
    assert config["quantization"]["group_size"] == 64

    # mlx_lm.convert with the same recipe writes the same weights.
    import mlx.core as mx
    from mlx_lm.convert import convert

    theirs = work["root"] / "theirs"
    convert(
        str(work["model"]), str(theirs), quantize=True, q_group_size=64, quant_predicate="mixed_4_6"
    )
    ours_w, theirs_w = (mx.load(str(d / "model.safetensors")) for d in (result_dir, theirs))
    assert ours_w.keys() == theirs_w.keys()
    assert all(mx.array_equal(ours_w[k], theirs_w[k]).item() for k in ours_w)

    with pytest.raises(grpc.RpcError) as err:
        stub.StartQuantization(
            backend_pb2.QuantizationRequest(
                model=str(work["model"]), quantization_type="iq2_xxs", output_dir=str(out)
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "mixed_4_6" in err.value.details()

    loaded = stub.LoadModel(backend_pb2.ModelOptions(Model=str(result_dir)))
    assert loaded.success, loaded.message
    reply = stub.Predict(
        backend_pb2.PredictOptions(Prompt="The sky is", Tokens=8, Temperature=0.0), timeout=60
    )
    assert reply.tokens == 8
