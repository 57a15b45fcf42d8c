"""Shared fixtures: a real backend process on a free port, serving the embedded model."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import backend_pb2  # noqa: E402
import backend_pb2_grpc  # noqa: E402

SERVING = re.compile(r"serving on (\S+:\d+)")


class ServerProcess:
    """``backend.py`` (or ``run.sh``) in a subprocess on port 0; its stderr goes to a file."""

    def __init__(self, *args: str, env: dict | None = None, entry: str = "backend.py") -> None:
        # Kept open for the process's lifetime; closed in stop().
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            "w+", prefix="backend-", suffix=".log", delete=False
        )
        cmd = [str(ROOT / "run.sh")] if entry == "run.sh" else [sys.executable, str(ROOT / entry)]
        self.proc = subprocess.Popen(
            [*cmd, "--addr", "127.0.0.1:0", *args],
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        self.address = self._wait_for_address()
        self.channel = grpc.insecure_channel(
            self.address,
            options=[("grpc.max_receive_message_length", 64 << 20)],
        )
        self.stub = backend_pb2_grpc.BackendStub(self.channel)

    def logs(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def _wait_for_address(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = SERVING.search(self.logs())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                raise RuntimeError(f"backend exited {self.proc.returncode}:\n{self.logs()}")
            time.sleep(0.05)
        raise TimeoutError(f"backend did not start:\n{self.logs()}")

    def wait_state(self, state: int, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.stub.Status(backend_pb2.HealthMessage()).state == state:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"backend exited {self.proc.returncode}:\n{self.logs()}")
            time.sleep(0.1)
        raise TimeoutError(f"backend never reached state {state}:\n{self.logs()}")

    def stop(self, timeout: float = 30.0) -> int:
        self.channel.close()
        self.log.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="session")
def server():
    """A backend with the embedded SmolLM2 preloaded, shared by the whole session."""
    # Through run.sh, as LocalAI starts it (fast BLAS preloaded, dense weights on CPU).
    srv = ServerProcess("--model", "embedded", entry="run.sh")
    try:
        srv.wait_state(backend_pb2.StatusResponse.READY)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def stub(server):
    return server.stub


@pytest.fixture(scope="session")
def empty_server():
    """A backend with no model loaded."""
    srv = ServerProcess()
    try:
        yield srv
    finally:
        srv.stop()


def chat_request(user: str, system: str = "", **fields) -> backend_pb2.PredictOptions:
    """A chat request as LocalAI sends it: template on, messages, explicit sampling fields."""
    req = backend_pb2.PredictOptions(UseTokenizerTemplate=True, **fields)
    if system:
        req.Messages.add(role="system", content=system)
    req.Messages.add(role="user", content=user)
    return req


def stream_text(stub, req) -> tuple[str, list]:
    replies = list(stub.PredictStream(req))
    return "".join(r.message.decode("utf-8") for r in replies), replies
