"""Distributed mode: three ranks of one MLX ring group on loopback serve a model split over them.

Integration tests start the group either with MLX's launcher (``mlx.launch -n 3 --backend
ring``, as an operator would) or rank by rank with the same environment the launcher sets
(``MLX_RANK``, ``MLX_HOSTFILE``), so that killing one rank leaves rank 0 up to report it
(the launcher would stop everyone). The units without a group:
tests/fast/test_distributed.py.

Every group serves a tiny 3-layer llama (``tiny_llama``: random weights, SmolLM2's
tokenizer and chat template, 6 heads and 3 KV heads that split over 3 ranks), not the
30-layer SmolLM2: on a shared 2-core machine every collective waits for the scheduler and
a tensor-parallel step has two per layer, so the embedded model made each token cost
about a second. Nothing here depends on what the model says, only on the group saying
exactly what one process says: the healthy group's outputs are compared token for token
with a single-process server of the same model (``solo``, the same CPU weight mode).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import mlx.core as mx
import pytest
import tiny_models
from helpers import (
    ROOT,
    chat_request,
    code_of,
    free_ports,
    greedy,
    status,
    stream_text,
    wait_until,
)

import backend_pb2
from backend_pb2_grpc import BackendStub
from clients.server_process import ServerProcess
from engine.sharing import MIN_SHARED_PREFIX

RANKS = 3
TOKENS = 4
LAUNCHER = Path(sys.executable).parent / "mlx.launch"
FOLLOWING = re.compile(r"rank (\d+) of \d+ \(pid (\d+)\): following rank 0")
SERVING_PID = re.compile(r"serving on \S+ \(pid (\d+)\)")
StatusResponse = backend_pb2.StatusResponse


class Cluster(ServerProcess):
    """RANKS backends forming one MLX ring group on loopback; rank 0 serves gRPC."""

    def __init__(self, *args: str, launcher: bool = True) -> None:
        # Kept open for the group's lifetime; closed in stop().
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            "w+", prefix="cluster-", suffix=".log", delete=False
        )
        out = open(self.log.name, "ab")  # noqa: SIM115 - every rank appends to one file
        base = free_ports(RANKS, consecutive=True)[0]
        command = [str(ROOT / "run.sh"), "--addr", "127.0.0.1:0", "--distributed", "tensor"]
        command += args
        if launcher:
            launch = [str(LAUNCHER), "-n", str(RANKS), "--backend", "ring", "-p", str(base)]
            self.procs = [subprocess.Popen([*launch, *command], cwd=ROOT, stdout=out, stderr=out)]
        else:
            self.hostfile = Path(self.log.name).with_suffix(".hosts.json")
            self.hostfile.write_text(json.dumps([[f"127.0.0.1:{base + r}"] for r in range(RANKS)]))
            env = {**os.environ, "MLX_HOSTFILE": str(self.hostfile)}
            self.procs = [
                subprocess.Popen(
                    command, cwd=ROOT, stdout=out, stderr=out, env={**env, "MLX_RANK": str(r)}
                )
                for r in range(RANKS)
            ]
        out.close()
        self.proc = self.procs[0]
        self.address = self._wait_for_address(timeout=120.0)
        self.channel = grpc.insecure_channel(self.address)
        self.stub = BackendStub(self.channel)

    def pids(self, timeout: float = 60.0) -> dict[int, int]:
        """rank -> pid of every rank, from their start-up log lines."""

        def found() -> dict[int, int]:
            text = self.logs()
            pids = {int(r): int(p) for r, p in FOLLOWING.findall(text)}
            m = SERVING_PID.search(text)
            if m:
                pids[0] = int(m.group(1))
            return pids

        wait_until(lambda: len(found()) == RANKS, timeout, interval=0.1)
        return found()

    def stop(self, timeout: float = 60.0) -> list[int | None]:
        """SIGTERM rank 0 (it stops the others); kill whatever is left; exit codes."""
        pids = self.pids(timeout=0)
        self.channel.close()
        if 0 in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pids[0], signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.procs[0].wait(timeout)  # rank 0, or mlx.launch once every rank is gone
        for p in self.procs[1:]:  # followers leave when rank 0 does, unless stopped
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(15)
        for pid in pids.values():  # ranks still there (hung or stopped on purpose)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        self.log.close()
        if hasattr(self, "hostfile"):
            self.hostfile.unlink(missing_ok=True)
        return [p.returncode for p in self.procs]


needs_launcher = pytest.mark.skipif(not LAUNCHER.exists(), reason="mlx.launch is not installed")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """A 3-layer llama whose 6 heads and 3 KV heads split over the 3 ranks (every group's
    model; tests/distributed/test_worker_protocol.py serves the same one)."""
    return tiny_models.split_model(tmp_path_factory.mktemp("llama"), "llama", heads=6, kv_heads=3)


@pytest.fixture(scope="module")
def solo(tiny_llama):
    """The reference: ``tiny_llama`` served by one process, started as the ranks are."""
    srv = ServerProcess("--model", str(tiny_llama), entry="run.sh")
    try:
        srv.wait_state(StatusResponse.READY)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def cluster(solo, tiny_llama):
    """Three ranks started by mlx.launch, loaded like the single-process ``solo``."""
    if not LAUNCHER.exists():
        pytest.skip("mlx.launch is not installed")
    metrics = json.loads(solo.stub.GetMetrics(backend_pb2.MetricsRequest()).prompt_json_for_slot)
    group = Cluster(launcher=True)
    try:
        result = group.stub.LoadModel(
            backend_pb2.ModelOptions(
                Model=str(tiny_llama),
                # The same CPU weight mode as the reference, so outputs can be compared.
                Options=[f"cpu_dequantize:{metrics['cpu_mode']}"],
            ),
            timeout=300,
        )
        assert result.success, result.message + group.logs()
        yield group
    finally:
        codes = group.stop()
        print(f"cluster exit codes {codes}")
    assert codes == [0], group.logs()  # mlx.launch: every rank stopped cleanly


# ------------------------------------------------------------------ integration: failures
# The groups of their own come first: the shared ``cluster`` (module scope) lives until the
# end of the module, and even idle its ranks sync every 0.1 s (~0.4 of a core), which
# would slow the other groups down on a 2-core machine.
# Seconds: --distributed-timeout of the hung-rank group. A step of the tiny model's group
# takes ~0.2 s on a busy 2-core machine (the first, with its prefill, under 1 s).
WATCHDOG = 3


def _stream_until_error(stub, req, on_first) -> tuple[grpc.StatusCode, float, str]:
    """Stream ``req``; call ``on_first`` after the first reply; return the error's code,
    the seconds from ``on_first`` to the error, and its details."""
    stream = stub.PredictStream(req, timeout=300)
    t0 = None
    try:
        for _ in stream:
            if t0 is None:
                on_first()
                t0 = time.monotonic()
    except grpc.RpcError as exc:
        return exc.code(), time.monotonic() - (t0 or time.monotonic()), exc.details()
    raise AssertionError("the stream ended without an error")


def _assert_exits_to_be_restarted(group: Cluster) -> None:
    """Rank 0 ends itself with status 1 (a broken group cannot serve again): LocalAI's
    loader recreates a backend whose Health fails once its process is gone
    (pkg/model/loader.go), so nobody has to restart it by hand."""
    wait_until(lambda: group.procs[0].poll() is not None, 30, explain=group.logs)
    assert group.procs[0].returncode == 1, group.logs()
    assert "exiting with status 1" in group.logs()


def test_a_killed_rank_fails_the_stream_with_unavailable_and_rank_0_reports_it(tiny_llama):
    group = Cluster("--model", str(tiny_llama), launcher=False)
    try:
        group.wait_state(StatusResponse.READY)
        pids = group.pids()
        req = greedy("Once upon a time", tokens=400, IgnoreEOS=True)
        code, seconds, details = _stream_until_error(
            group.stub, req, lambda: os.kill(pids[2], signal.SIGKILL)
        )
        assert code == grpc.StatusCode.UNAVAILABLE, details
        # MLX's ring error or the rank's lifeline (distributed/lifeline.py), whichever first
        assert seconds < 15, seconds
        assert "lost the distributed group" in details and "Restart that rank" in details
        _assert_exits_to_be_restarted(group)
    finally:
        codes = group.stop()
    # Rank 0 exits 1 by itself; rank 1 waited on rank 0 and leaves when it goes.
    assert codes == [1, 1, -signal.SIGKILL], group.logs()


def test_a_hung_rank_is_caught_by_the_watchdog(tiny_llama):
    args = ("--model", str(tiny_llama), "--distributed-timeout", str(WATCHDOG))
    group = Cluster(*args, launcher=False)
    try:
        group.wait_state(StatusResponse.READY)
        pids = group.pids()
        req = greedy("Once upon a time", tokens=400, IgnoreEOS=True)
        code, seconds, details = _stream_until_error(
            group.stub, req, lambda: os.kill(pids[1], signal.SIGSTOP)
        )
        assert code == grpc.StatusCode.UNAVAILABLE, details
        assert f"waited more than {WATCHDOG}s" in details
        assert seconds < 60, seconds
        _assert_exits_to_be_restarted(group)
        os.kill(pids[1], signal.SIGKILL)  # the hung rank never exits by itself
    finally:
        group.stop()


# ------------------------------------------------------------------ a backend alone
def test_backend_without_a_launcher_explains_how_to_start_a_group(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLX_", "OMPI_", "PMI"))}
    args = ["--addr", "127.0.0.1:0", "--distributed", "tensor", "--distributed-backend", "ring"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "backend.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "mlx.launch" in proc.stderr


# ------------------------------------------------------------------ integration: healthy
@needs_launcher
def test_status_reports_group_size_and_each_ranks_weights(cluster, solo, tiny_llama):
    reply = cluster.stub.Status(backend_pb2.HealthMessage())
    assert reply.state == StatusResponse.READY
    b = dict(reply.memory.breakdown)
    assert b["group_size"] == RANKS
    weights = [b[f"weights_rank_{r}"] for r in range(RANKS)]
    assert len(set(weights)) == 1 and b["weights"] == weights[0]  # rank 0 serves Status
    # Layers and the (tied) embedding are split three ways; only the norms (1-D) are whole.
    tensors = mx.load(str(tiny_llama / "model.safetensors"))
    whole = sum(v.nbytes for v in tensors.values() if v.ndim == 1)
    split = {k: v.nbytes for k, v in tensors.items() if v.ndim > 1}
    single = status(solo.stub)["weights"]
    assert single == whole + sum(split.values())
    # Closer than any one matrix kept whole on every rank would leave it.
    tolerance = min(split.values()) * (RANKS - 1) / RANKS / 2
    expected = whole + sum(split.values()) / RANKS
    assert abs(weights[0] - expected) < tolerance, (weights, expected, tolerance)


@needs_launcher
def test_requests_decoded_together_match_a_single_process_and_a_cancel_leaves_no_trace(
    cluster, solo
):
    """Greedy Predict and PredictStream, a seeded sampled request and a stream cancelled
    mid-way, all in one batch."""
    chat = chat_request("What is the capital of France?", Tokens=TOKENS, Temperature=0.0)
    requests = [
        chat,
        greedy("The tallest mountain on Earth is", tokens=TOKENS + 2),
        # Sampled: every rank must draw the same token, or rank 0's sums mix sequences.
        backend_pb2.PredictOptions(
            Prompt="My favourite fruit is", Tokens=TOKENS, Temperature=0.8, Seed=7
        ),
    ]
    want = [solo.stub.Predict(r) for r in requests]
    # Long enough to be still decoding when the others end (the tiny model's steps are
    # quick); cancelled then.
    cancelled = cluster.stub.PredictStream(greedy("Cats and dogs are", tokens=1500, IgnoreEOS=True))
    first = next(cancelled)  # decoding together with the requests below
    with ThreadPoolExecutor(len(requests) + 1) as pool:
        streamed = pool.submit(stream_text, cluster.stub, chat)
        got = list(pool.map(lambda r: cluster.stub.Predict(r, timeout=300), requests))
        text, replies = streamed.result()
    cancelled.cancel()
    assert first.tokens >= 1
    assert code_of(lambda: list(cancelled)) == grpc.StatusCode.CANCELLED  # it had not ended
    assert [g.message for g in got] == [w.message for w in want]
    assert [g.tokens for g in got] == [w.tokens for w in want]
    assert text == want[0].message.decode("utf-8") and replies[-1].tokens == want[0].tokens
    wait_until(lambda: status(cluster.stub)["requests_running"] == 0, 60, interval=0.2)
    assert status(cluster.stub)["requests_running"] == 0
    # The group still agrees after the cancellation (the followers dropped it too), and
    # every rank's prompt cache serves the repeated prompt (2 tokens show the agreement).
    repeat = greedy("The tallest mountain on Earth is", tokens=2)
    again = cluster.stub.Predict(repeat, timeout=300)
    assert again.message == solo.stub.Predict(repeat).message and again.tokens == 2


def _prompt_cache(stub) -> dict:
    info = json.loads(stub.GetMetrics(backend_pb2.MetricsRequest()).prompt_json_for_slot)
    return info["prompt_cache"]


@needs_launcher
def test_requests_sent_together_share_their_new_prefix_on_every_rank(cluster, solo):
    """A burst sharing a new system prompt (engine/sharing.py): the followers repeat rank
    0's cut (distributed.plan.Share) and store the same entry, so the waiting requests
    join every rank with the same cache hit; outputs equal the single process's."""
    system = "You are the release agent. Read the changelog, tag, build, publish. " * 6
    requests = [
        chat_request(q, system, Tokens=2, Temperature=0.0)
        for q in ("Tag it.", "Build it.", "Publish it.")
    ]
    want = [solo.stub.Predict(r).message for r in requests]
    before = _prompt_cache(cluster.stub)  # no checkpoints in a group
    with ThreadPoolExecutor(len(requests)) as pool:
        got = list(pool.map(lambda r: cluster.stub.Predict(r, timeout=300).message, requests))
    assert got == want
    # The two that waited started from the shared entry (a strict prefix: its hits count
    # as checkpoint hits), on rank 0 and, or the group would have failed, on the others;
    # each reused more than the MIN_SHARED_PREFIX tokens that make waiting worth it.
    after = _prompt_cache(cluster.stub)
    assert after["hits_checkpoint"] - before["hits_checkpoint"] == len(requests) - 1
    reused = after["tokens_reused"] - before["tokens_reused"]
    assert reused >= (len(requests) - 1) * MIN_SHARED_PREFIX, reused
    assert cluster.stub.Status(backend_pb2.HealthMessage()).state == StatusResponse.READY


@needs_launcher
def test_a_model_that_cannot_be_split_fails_to_load_and_the_old_one_keeps_serving(
    cluster, tiny_llama
):
    result = cluster.stub.LoadModel(
        backend_pb2.ModelOptions(Model=str(tiny_llama), Options=["distributed_mode:pipeline"]),
        timeout=300,
    )
    assert not result.success
    assert "no pipeline split" in result.message and "llama" in result.message
    assert cluster.stub.Status(backend_pb2.HealthMessage()).state == StatusResponse.READY
    assert cluster.stub.Predict(greedy("Water boils at", tokens=2), timeout=300).tokens == 2


@needs_launcher
def test_pipeline_mode_splits_the_layers_and_matches_one_process(cluster, tmp_path):
    """Runs last on the shared group: it replaces the model with a tiny qwen2."""
    # A 4-layer qwen2: an architecture with ``pipeline()``.
    path = tiny_models.split_model(tmp_path, "qwen2", heads=4, kv_heads=2, layers=4)
    want = tiny_models.reference_text(path, "Once upon a time", TOKENS)

    # 4 attention heads do not split over 3 ranks: refused, naming why.
    tensor = cluster.stub.LoadModel(backend_pb2.ModelOptions(Model=str(path)), timeout=300)
    assert not tensor.success
    assert "4 attention heads and 2 KV heads cannot be split evenly over 3" in tensor.message
    result = cluster.stub.LoadModel(
        backend_pb2.ModelOptions(Model=str(path), Options=["distributed_mode:pipeline"]),
        timeout=300,
    )
    assert result.success, result.message
    b = status(cluster.stub)
    assert sum(b[f"weights_rank_{r}"] for r in range(RANKS)) > b["weights"]  # each a part
    got = cluster.stub.Predict(
        backend_pb2.PredictOptions(
            Prompt="Once upon a time", Tokens=TOKENS, Temperature=0.0, IgnoreEOS=True
        ),
        timeout=300,
    )
    assert got.message.decode("utf-8") == want
