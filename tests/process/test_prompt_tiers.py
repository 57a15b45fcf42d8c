"""The prompt cache's disk tier in serving: real backend processes restarted over gRPC.

Each server loads the embedded SmolLM2 GGUF through LoadModel with option
``prompt_cache_dir`` (or a request's ``PromptCachePath``) and is stopped with SIGTERM or
SIGKILL; the next one on the same directory must serve the same greedy output, from disk
when the entry was written.
"""

from __future__ import annotations

import hashlib
import json
import signal
from pathlib import Path

import grpc
import pytest
from helpers import never, wait_until

import backend_pb2
from clients.server_process import ServerProcess
from loading import model_loader

GGUF = str(model_loader.embedded_model_path())


# ~300 tokens of plain text (raw prompt, no template), distinct openings per test.
BODY = (
    "The lighthouse keeper kept a log of every ship that passed the rocky point, "
    "noting the weather, the wind and the colour of the sea. "
) * 11


def start(directory: Path | None = None, model_path: Path | None = None) -> ServerProcess:
    srv = ServerProcess(entry="run.sh")
    options = [f"prompt_cache_dir:{directory}"] if directory is not None else []
    res = srv.stub.LoadModel(
        backend_pb2.ModelOptions(Model=GGUF, ModelPath=str(model_path or ""), Options=options),
        timeout=300,
    )
    assert res.success, res.message
    return srv


def ask(srv: ServerProcess, prompt: str, **fields) -> tuple[str, int, int]:
    """(text, prompt tokens, prompt tokens prefilled) of a greedy 8-token reply."""
    reply = srv.stub.Predict(
        backend_pb2.PredictOptions(Prompt=prompt, Tokens=8, Temperature=0.0, **fields),
        timeout=300,
    )
    metrics = srv.stub.GetMetrics(backend_pb2.MetricsRequest())
    return reply.message.decode(), reply.prompt_tokens, metrics.prompt_tokens_processed


def entries(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.safetensors"))


def wait_for_files(directory: Path, n: int, timeout: float = 30.0) -> list[Path]:
    """The entries of ``directory`` once there are ``n`` (TimeoutError after ``timeout`` s)."""
    wait_until(lambda: len(entries(directory)) >= n, timeout)
    return entries(directory)


def test_restarts_sigterm_sigkill_corruption_read_only(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    cache = models / "cache"  # created by the server
    # 1. Load option prompt_cache_dir; SIGTERM flushes the queued write.
    p = "Log one. " + BODY
    first = start(cache)
    try:
        cold_p, n_p, processed = ask(first, p)
        assert n_p > 250 and processed == n_p
        status = first.stub.Status(backend_pb2.HealthMessage()).memory.breakdown
        assert "prompt_cache_disk" in status and "prompt_cache_disk_entries" in status
    finally:
        assert first.stop() == 0
    assert len(entries(cache)) == 1

    # 2. Same directory through the request's PromptCachePath, as LocalAI sends it.
    via = {"PromptCachePath": str(cache)}
    q, r = "Journal two. " + BODY, "Diary three. " + BODY
    second = start(model_path=models)
    try:
        warm, n2, processed = ask(second, p, **via)
        assert (warm, n2) == (cold_p, n_p) and processed <= 1
        status = second.stub.Status(backend_pb2.HealthMessage()).memory.breakdown
        assert status["prompt_cache_disk_entries"] == 1
        (p_file,) = entries(cache)
        assert status["prompt_cache_disk"] == p_file.stat().st_size
        # A follow-up extending it prefills only the new part.
        extra = " The next morning a storm came in from the west."
        extra_tokens = second.stub.TokenizeString(backend_pb2.PredictOptions(Prompt=extra)).length
        _, n3, processed = ask(second, p + extra, **via)
        assert n3 > n_p and processed <= extra_tokens + 2
        info = json.loads(second.stub.GetMetrics(backend_pb2.MetricsRequest()).prompt_json_for_slot)
        (disk,) = info["prompt_cache"]["disk"].values()
        assert disk["hits"] == 1 and disk["loads"] == 1 and disk["corrupt"] == 0
        assert "disk_hit=1" in second.logs()
        before = wait_for_files(cache, 2)  # p's and the follow-up's (p+reply is no prefix)
        assert len(before) == 2
        # PromptCacheRO reads but writes nothing, on disk too.
        cold_q, n_q, _ = ask(second, q, PromptCacheRO=True, **via)
        again, _, processed = ask(second, q, **via)
        assert again == cold_q and processed > 1  # the read-only request stored nothing
        assert len(wait_for_files(cache, 3)) == 3
        # No fourth file within 0.3 s: a write the read-only request queued would land.
        assert never(lambda: len(entries(cache)) > 3, 0.3)
        files = entries(cache)
        assert len(files) == 3  # p's, the follow-up's and the second q's; none from RO
        (q_file,) = [f for f in files if f not in before]
        # A PromptCachePath outside ModelPath is refused.
        with pytest.raises(grpc.RpcError) as err:
            ask(second, p, PromptCachePath=str(tmp_path / "elsewhere"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "PromptCachePath" in err.value.details()
        cold_r, _, _ = ask(second, r, **via)
        second.proc.send_signal(signal.SIGKILL)  # the write of r may be in flight
        second.proc.wait()
    finally:
        second.stop()

    # 3. After SIGKILL, with q's entry corrupted (bytes of its tensor data flipped).
    data = bytearray(q_file.read_bytes())
    data[-100:-90] = bytes(b ^ 0xFF for b in data[-100:-90])
    q_file.write_bytes(bytes(data))
    third = start(model_path=models)
    try:
        got_r, _, _ = ask(third, r, **via)
        assert got_r == cold_r  # from disk or cold: the same output
        got_q, _, processed = ask(third, q, **via)
        assert got_q == cold_q and processed >= n_q - 1  # the corrupt entry was not used
        logs = third.logs()
        assert logs.count("prompt disk cache: skipping") == 1
        assert "Traceback" not in logs
    finally:
        third.stop()
    # The corrupt file was deleted (q's entry may have been written again, intact).
    for path in entries(cache):
        assert hashlib.sha256(path.read_bytes()).hexdigest() in path.name
