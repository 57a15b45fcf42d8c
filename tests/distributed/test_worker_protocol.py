"""LocalAI's own distributed protocol: every rank started as ``local-ai worker
mlx-distributed`` starts it (the argv and environment that LocalAI's
core/cli/worker/worker_mlx_distributed.go builds and execs: ``run.sh --backend ring
--hostfile FILE --rank N`` then ``--worker`` for N > 0 or ``--addr HOST:PORT`` for rank 0,
in LocalAI's environment), workers first, rank 0 joining the group at LoadModel (its
``--hostfile``, or ``Options`` ``hostfile:FILE``).

Real processes on loopback over MLX's ring backend: two workers started before rank 0,
tiny random-weight models (SmolLM2's tokenizer) so three ranks on two cores stay quick.
Outputs are compared with the same model run by mlx-lm in this process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import grpc
import pytest
import tiny_models
from helpers import ROOT, free_ports, greedy, status, wait_until, write_hostfile

import backend_pb2
from backend_pb2_grpc import BackendStub
from clients.server_process import ServerProcess
from distributed import group as joining

WORKERS = 2
TOKENS = 4
StatusResponse = backend_pb2.StatusResponse


def _local_ai_argv(hostfile: Path, rank: int, addr: str = "") -> tuple[list[str], dict]:
    """The argv and environment ``local-ai worker mlx-distributed`` execs for ``rank``
    (rank 0 with its gRPC ``addr``; without one, the worker form)
    (core/cli/worker/worker_mlx_distributed.go, ``MLXDistributed.Run``: ``--backend``,
    ``--hostfile``, ``--rank``, then ``--addr`` for rank 0 or ``--worker``; its own
    environment, where kong read ``MLX_DISTRIBUTED_HOSTFILE``/``MLX_RANK``/... from).
    """
    argv = [str(ROOT / "run.sh"), "--backend", "ring", "--hostfile", str(hostfile)]
    argv += ["--rank", str(rank), *(["--addr", addr] if addr else ["--worker"])]
    env = {
        **os.environ,
        "MLX_DISTRIBUTED_HOSTFILE": str(hostfile),
        "MLX_RANK": str(rank),
        "MLX_DISTRIBUTED_BACKEND": "ring",
    }
    return argv, env


def _start_worker(hostfile: Path, rank: int, log: Path, *extra: str) -> subprocess.Popen:
    """A worker as ``local-ai worker mlx-distributed --rank N`` starts it (``extra``:
    our own flags after LocalAI's)."""
    argv, env = _local_ai_argv(hostfile, rank)
    with open(log, "ab") as out:
        return subprocess.Popen(
            [*argv, *extra], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )


class Rank0(ServerProcess):
    """Rank 0 as ``local-ai worker mlx-distributed --rank 0`` starts it (a gRPC backend
    that joins the hostfile's group at its first LoadModel)."""

    def __init__(self, hostfile: Path) -> None:
        # Kept open for the process's lifetime; closed in stop().
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            "w+", prefix="rank0-", suffix=".log", delete=False
        )
        argv, env = _local_ai_argv(hostfile, 0, f"127.0.0.1:{free_ports(1)[0]}")
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.address = self._wait_for_address(120)
        self.channel = grpc.insecure_channel(self.address)
        self.stub = BackendStub(self.channel)


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
        self.hostfile = write_hostfile(directory, WORKERS + 1)
        self.worker_logs = [directory / f"worker{r}.log" for r in range(1, WORKERS + 1)]
        self.workers = [
            _start_worker(self.hostfile, r, self.worker_logs[r - 1], "--join-timeout", "300")
            for r in range(1, WORKERS + 1)
        ]
        self.rank0 = Rank0(self.hostfile)
        self.stub = self.rank0.stub

    def logs(self) -> str:
        text = [self.rank0.logs()] + [p.read_text(errors="replace") for p in self.worker_logs]
        return "\n----\n".join(text)

    def load(self, path: Path, *options: str) -> backend_pb2.Result:
        """LoadModel as LocalAI sends it: the group comes from rank 0's --hostfile."""
        return self.stub.LoadModel(
            backend_pb2.ModelOptions(Model=str(path), Options=list(options)), timeout=300
        )

    def stop(self) -> list[int]:
        code = self.rank0.stop()
        return [code, *_stop(self.workers)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    llama = tiny_models.split_model(base / "llama", "llama", heads=6, kv_heads=3)
    qwen2 = tiny_models.split_model(base / "qwen2", "qwen2", heads=4, kv_heads=2)
    return {
        "llama": (llama, tiny_models.reference_text(llama, "Once upon a time", TOKENS)),
        "qwen2": (qwen2, tiny_models.reference_text(qwen2, "The weather today", TOKENS)),
    }


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    g = Group(tmp_path_factory.mktemp("group"))
    try:
        yield g
    finally:
        codes = g.stop()
        print(f"exit codes {codes}")


# ------------------------------------------------------------------ real processes
def test_a_worker_killed_during_a_large_prefill_ends_the_stream_within_seconds(tmp_path):
    """Two ranks, a 576-wide model, a 1,500-token prompt: the prefill's all_sums are large
    enough that MLX's ring splits each over both sockets, and a peer lost there left rank 0
    waiting for the 60 s step watchdog (59.3 s from the kill before the lifelines of
    distributed/lifeline.py). The kill may land in the decode on a fast machine: the
    bound holds either way."""
    model = tiny_models.split_model(tmp_path / "wide", "llama", heads=36, kv_heads=6, layers=6)
    hostfile = write_hostfile(tmp_path, 2)
    log = tmp_path / "worker1.log"
    worker = _start_worker(hostfile, 1, log, "--join-timeout", "120")
    rank0 = Rank0(hostfile)
    try:
        loaded = rank0.stub.LoadModel(backend_pb2.ModelOptions(Model=str(model)), timeout=300)
        assert loaded.success, loaded.message + rank0.logs()
        prompt = "The quick brown fox jumps over the lazy dog. " * 150
        stream = rank0.stub.PredictStream(greedy(prompt, tokens=20, IgnoreEOS=True), timeout=120)
        assert wait_until(lambda: status(rank0.stub)["requests_running"] == 1, 30, interval=0.02)
        worker.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            list(stream)
        seconds = time.monotonic() - killed
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
        assert "lost the distributed group" in info.value.details()
        assert seconds < 15, (seconds, info.value.details())
        wait_until(lambda: rank0.proc.poll() is not None, 30, explain=rank0.logs)
        assert rank0.proc.returncode == 1
    finally:
        rank0.stop()
        _stop([worker])


def test_a_worker_with_no_rank_0_gives_up_after_its_timeout(tmp_path):
    hostfile = write_hostfile(tmp_path, 2)
    log = tmp_path / "alone.log"
    proc = _start_worker(hostfile, 1, log, "--join-timeout", "3")
    assert _stop([proc], timeout=60) == [1], log.read_text()
    text = log.read_text()
    assert "rank 1 waited 3s for the other ranks of the 2-rank ring group" in text
    assert "giving up" in text and f"hostfile:{hostfile}" in text


def test_worker_arguments_are_checked(tmp_path):
    hostfile = write_hostfile(tmp_path, 2)
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
    hostfile = write_hostfile(tmp_path, 2)
    srv = ServerProcess(env={joining.JOIN_TIMEOUT_ENV: "2"})
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


def test_local_ais_p2p_mlx_worker_command_is_refused(tmp_path):
    """`local-ai worker p2p-mlx` runs `run.sh --worker --backend ring --hostfile F --rank 0`."""
    hostfile = write_hostfile(tmp_path, 2)
    log = tmp_path / "p2p.log"
    assert _stop([_start_worker(hostfile, 0, log)], timeout=60) == [2]
    text = log.read_text()
    assert "local-ai worker p2p-mlx" in text
    assert f"local-ai worker mlx-distributed --hostfile {hostfile} --rank N" in text


def test_a_plain_backend_with_an_inherited_hostfile_loads_alone(tmp_path, models):
    """What `local-ai run --p2p` does to every backend it spawns: the model loads in one
    process (a join would fail here: no worker runs, and the join timeout is 2 s)."""
    hostfile = write_hostfile(tmp_path, 2)
    srv = ServerProcess(env={joining.HOSTFILE_ENV: str(hostfile), joining.JOIN_TIMEOUT_ENV: "2"})
    try:
        result = srv.stub.LoadModel(
            backend_pb2.ModelOptions(Model=str(models["llama"][0])), timeout=120
        )
        assert result.success, result.message + srv.logs()
        breakdown = dict(srv.stub.Status(backend_pb2.HealthMessage()).memory.breakdown)
        assert "group_size" not in breakdown
        assert f"${joining.HOSTFILE_ENV}={hostfile} is ignored" in srv.logs()
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
    got = group.stub.Predict(greedy("Once upon a time", tokens=TOKENS, IgnoreEOS=True), timeout=300)
    assert got.message.decode() == want_llama and got.tokens == TOKENS

    assert group.stub.Free(backend_pb2.HealthMessage(), timeout=120).success
    assert group.stub.Status(backend_pb2.HealthMessage()).state == StatusResponse.UNINITIALIZED
    assert all(p.poll() is None for p in group.workers), group.logs()

    qwen2, want_qwen2 = models["qwen2"]  # 4 heads: split by layers over the 3 ranks
    result = group.load(qwen2, "distributed_mode:pipeline")
    assert result.success, result.message + group.logs()
    got = group.stub.Predict(
        greedy("The weather today", tokens=TOKENS, IgnoreEOS=True), timeout=300
    )
    assert got.message.decode() == want_qwen2

    # The group of a process is fixed: another hostfile is refused, the model keeps serving.
    other = write_hostfile(group.dir, WORKERS + 1, "other.json")
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
    stream = group.stub.PredictStream(
        greedy("Once upon a time", tokens=400, IgnoreEOS=True), timeout=300
    )
    killed = 0.0
    with pytest.raises(grpc.RpcError) as info:
        for i, _ in enumerate(stream):
            if i == 0:
                group.workers[-1].send_signal(signal.SIGKILL)
                killed = time.monotonic()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
    assert "lost the distributed group" in info.value.details()
    assert "Restart that rank" in info.value.details()  # and what to do
    assert time.monotonic() - killed < 15, "ended by the 60 s step watchdog, not at once"
    # LocalAI recreates a backend whose Health fails once its process is gone: rank 0
    # exits non-zero by itself (pkg/model/loader.go checks the process before recreating).
    wait_until(lambda: group.rank0.proc.poll() is not None, 30, explain=group.logs)
    assert group.rank0.proc.returncode == 1
    assert "exiting with status 1" in group.logs()
    # The other worker leaves too (its ring neighbour is gone, or rank 0 stopped it).
    assert _stop(group.workers[:-1], timeout=60) != [None]
