"""LocalAI's own distributed protocol: rank 0 started like any backend, workers started
alone with ``run.sh --worker --hostfile FILE --rank N`` (what ``local-ai worker
mlx-distributed`` runs), the group formed at LoadModel through ``Options``
``hostfile:FILE`` and ``distributed_backend:ring``.

Real processes on loopback over MLX's ring backend: two workers started before rank 0,
tiny random-weight models (SmolLM2's tokenizer) so three ranks on two cores stay quick.
Outputs are compared with the same model run by mlx-lm in this process.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import socket
import subprocess
from pathlib import Path

import grpc
import mlx.core as mx
import pytest
import tiny_models
from conftest import ROOT, ServerProcess

import backend_pb2
import params
from distributed import coordinator as distributed

pytestmark = pytest.mark.distributed

WORKERS = 2
TOKENS = 4
StatusResponse = backend_pb2.StatusResponse


def _free_ports(n: int) -> list[int]:
    """n distinct ports free on loopback now (each rank listens on its own)."""
    for _ in range(100):
        ports = random.sample(range(20000, 60000), n)
        socks = []
        try:
            for p in ports:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return ports
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports")


def _hostfile(directory: Path, ranks: int, name: str = "hosts.json") -> Path:
    """A LocalAI ring hostfile: a JSON array, entry i = rank i's "ip:port"."""
    path = directory / name
    path.write_text(json.dumps([f"127.0.0.1:{p}" for p in _free_ports(ranks)]))
    return path


def _tiny_model(path: Path, model_type: str, heads: int, kv_heads: int) -> Path:
    """A 3-layer ``model_type`` with random float32 weights and SmolLM2's tokenizer,
    saved as an MLX model directory (heads divisible by 3 split over three ranks)."""
    config = dict(
        model_type=model_type,
        hidden_size=16 * heads,
        num_hidden_layers=3,
        intermediate_size=32 * heads,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        rms_norm_eps=1e-5,
        vocab_size=49152,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    return tiny_models.save_scaled(config, path)


def _reference(path: Path, prompt: str, tokens: int = TOKENS) -> str:
    """Greedy text of ``tokens`` new tokens from one process (mlx-lm, no server)."""
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, tokenizer = load(str(path))
    ids = tokenizer.encode(prompt)
    steps = generate_step(
        mx.array(ids), model, max_tokens=tokens, sampler=lambda x: mx.argmax(x, -1)
    )
    return tokenizer.decode([int(t) for t, _ in steps])


def _greedy(prompt: str, tokens: int = TOKENS) -> backend_pb2.PredictOptions:
    return backend_pb2.PredictOptions(Prompt=prompt, Tokens=tokens, Temperature=0.0, IgnoreEOS=True)


def _start_worker(hostfile: Path, rank: int, log: Path, *extra: str) -> subprocess.Popen:
    """``run.sh --worker ...`` as ``local-ai worker mlx-distributed`` starts it."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                *(str(ROOT / "run.sh"), "--worker", "--backend", "ring"),
                *("--hostfile", str(hostfile), "--rank", str(rank), *extra),
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _stop(procs: list[subprocess.Popen], timeout: float = 20.0) -> list[int]:
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout)
        if p.poll() is None:
            p.kill()
            p.wait()
    return [p.returncode for p in procs]


class Group:
    """Two workers (started first, as LocalAI's docs say) and rank 0 on loopback."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.hostfile = _hostfile(directory, WORKERS + 1)
        self.worker_logs = [directory / f"worker{r}.log" for r in range(1, WORKERS + 1)]
        self.workers = [
            _start_worker(self.hostfile, r, self.worker_logs[r - 1], "--join-timeout", "300")
            for r in range(1, WORKERS + 1)
        ]
        self.rank0 = ServerProcess()  # plain backend.py --addr, as LocalAI starts it
        self.stub = self.rank0.stub

    def logs(self) -> str:
        text = [self.rank0.logs()] + [p.read_text(errors="replace") for p in self.worker_logs]
        return "\n----\n".join(text)

    def load(self, path: Path, *options: str) -> backend_pb2.Result:
        opts = [f"hostfile:{self.hostfile}", "distributed_backend:ring", *options]
        return self.stub.LoadModel(
            backend_pb2.ModelOptions(Model=str(path), Options=opts), timeout=300
        )

    def stop(self) -> list[int]:
        code = self.rank0.stop()
        return [code, *_stop(self.workers)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    llama = _tiny_model(base / "llama", "llama", heads=6, kv_heads=3)
    qwen2 = _tiny_model(base / "qwen2", "qwen2", heads=4, kv_heads=2)
    return {
        "llama": (llama, _reference(llama, "Once upon a time")),
        "qwen2": (qwen2, _reference(qwen2, "The weather today")),
    }


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    g = Group(tmp_path_factory.mktemp("group"))
    try:
        yield g
    finally:
        codes = g.stop()
        print(f"exit codes {codes}")


# ------------------------------------------------------------------ without processes
def test_load_options_name_the_group_and_are_validated():
    p = params.load_params(
        backend_pb2.ModelOptions(Options=["hostfile: /etc/h.json", "distributed_backend:JACCL"])
    )
    assert (p.hostfile, p.distributed_backend) == ("/etc/h.json", "jaccl")
    assert params.load_params(backend_pb2.ModelOptions()).hostfile == ""
    with pytest.raises(ValueError, match="distributed_backend must be one of ring, jaccl"):
        params.load_params(backend_pb2.ModelOptions(Options=["distributed_backend:mpi"]))
    with pytest.raises(ValueError, match="option hostfile needs a file path"):
        params.load_params(backend_pb2.ModelOptions(Options=["hostfile:"]))


def test_hostfiles_are_checked_before_any_rank_waits(tmp_path):
    ring = _hostfile(tmp_path, 3)
    spec = distributed.group_spec(str(ring), "ring", 2)
    assert (spec.size, spec.rank, spec.backend) == (3, 2, "ring")
    with pytest.raises(ValueError, match=r"rank 3 is outside hostfile .* ranks 0\.\.2"):
        distributed.group_spec(str(ring), "ring", 3)
    with pytest.raises(ValueError, match="cannot read hostfile"):
        distributed.group_spec(str(tmp_path / "missing.json"), "ring", 1)
    bad = tmp_path / "bad.json"
    bad.write_text('{"hosts": 1}')
    with pytest.raises(ValueError, match='JSON array of "ip:port" strings'):
        distributed.group_spec(str(bad), "ring", 1)
    with pytest.raises(ValueError, match="square JSON matrix"):
        distributed.group_spec(str(ring), "jaccl", 1)
    jaccl = tmp_path / "devices.json"
    jaccl.write_text(json.dumps([[None, "rdma_en2"], ["rdma_en2", None]]))
    assert distributed.group_spec(str(jaccl), "jaccl", 1, "10.0.0.1:5555").coordinator
    one = tmp_path / "one.json"
    one.write_text('["127.0.0.1:5555"]')
    with pytest.raises(ValueError, match="at least 2"):
        distributed.group_spec(str(one), "ring", 0)
    with pytest.raises(ValueError, match="must be one of ring, jaccl"):
        distributed.group_spec(str(ring), "mpi", 1)


# ------------------------------------------------------------------ real processes
def test_a_worker_with_no_rank_0_gives_up_after_its_timeout(tmp_path):
    hostfile = _hostfile(tmp_path, 2)
    log = tmp_path / "alone.log"
    proc = _start_worker(hostfile, 1, log, "--join-timeout", "3")
    assert _stop([proc], timeout=60) == [1], log.read_text()
    text = log.read_text()
    assert "rank 1 waited 3s for the other ranks of the 2-rank ring group" in text
    assert "giving up" in text and f"hostfile:{hostfile}" in text


def test_worker_arguments_are_checked(tmp_path):
    hostfile = _hostfile(tmp_path, 2)
    log = tmp_path / "bad.log"
    procs = [
        _start_worker(hostfile, 0, log),  # rank 0 is not a worker
        _start_worker(hostfile, 2, log),  # outside the hostfile
    ]
    assert _stop(procs, timeout=60) == [2, 2]
    text = log.read_text()
    assert "rank 0 serves gRPC and is not a worker" in text
    assert "rank 2 is outside hostfile" in text


def test_rank_0_without_its_workers_fails_the_load_clearly(tmp_path, models):
    hostfile = _hostfile(tmp_path, 2)
    srv = ServerProcess(env={distributed.JOIN_TIMEOUT_ENV: "2"})
    try:
        result = srv.stub.LoadModel(
            backend_pb2.ModelOptions(
                Model=str(models["llama"][0]), Options=[f"hostfile:{hostfile}"]
            ),
            timeout=120,
        )
        assert not result.success
        assert "rank 0 waited 2s for the other ranks of the 2-rank ring group" in result.message
        assert "start ranks 1 first" in result.message
    finally:
        srv.stop()


def test_group_serves_like_one_process_across_free_and_model_changes(group, models):
    llama, want_llama = models["llama"]
    result = group.load(llama)
    assert result.success, result.message + group.logs()
    b = dict(group.stub.Status(backend_pb2.HealthMessage()).memory.breakdown)
    assert b["group_size"] == WORKERS + 1
    weights = [b[f"weights_rank_{r}"] for r in range(WORKERS + 1)]
    assert all(w > 0 for w in weights) and sum(weights) > b["weights"]  # each holds a part
    got = group.stub.Predict(_greedy("Once upon a time"), timeout=300)
    assert got.message.decode() == want_llama and got.tokens == TOKENS

    assert group.stub.Free(backend_pb2.HealthMessage(), timeout=120).success
    assert group.stub.Status(backend_pb2.HealthMessage()).state == StatusResponse.UNINITIALIZED
    assert all(p.poll() is None for p in group.workers), group.logs()

    qwen2, want_qwen2 = models["qwen2"]  # 4 heads: split by layers over the 3 ranks
    result = group.load(qwen2, "distributed_mode:pipeline")
    assert result.success, result.message + group.logs()
    got = group.stub.Predict(_greedy("The weather today"), timeout=300)
    assert got.message.decode() == want_qwen2

    # The group of a process is fixed: another hostfile is refused, the model keeps serving.
    other = _hostfile(group.dir, WORKERS + 1, "other.json")
    refused = group.stub.LoadModel(
        backend_pb2.ModelOptions(Model=str(qwen2), Options=[f"hostfile:{other}"]), timeout=60
    )
    assert not refused.success
    assert "restart the backend" in refused.message and str(other) in refused.message
    assert group.stub.Status(backend_pb2.HealthMessage()).state == StatusResponse.READY


def test_a_worker_killed_mid_stream_fails_the_stream_unavailable(group, models):
    """Runs last: it breaks the group."""
    llama, _ = models["llama"]
    result = group.load(llama)
    assert result.success, result.message + group.logs()
    stream = group.stub.PredictStream(_greedy("Once upon a time", tokens=400), timeout=300)
    with pytest.raises(grpc.RpcError) as info:
        for i, _ in enumerate(stream):
            if i == 0:
                group.workers[-1].send_signal(signal.SIGKILL)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
    assert "lost the distributed group" in info.value.details()
    assert group.stub.Status(backend_pb2.HealthMessage()).state == StatusResponse.ERROR
    with pytest.raises(grpc.RpcError) as again:
        group.stub.Predict(_greedy("Hello"), timeout=60)
    assert again.value.code() == grpc.StatusCode.UNAVAILABLE
    # The other worker leaves too (its ring neighbour is gone, or rank 0 stops it).
    group.rank0.stop()
    assert _stop(group.workers[:-1], timeout=60) != [None]
