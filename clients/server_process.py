"""A backend process on a free port, for tests and benchmarks alike.

``ServerProcess`` starts ``backend.py`` (or ``run.sh``, as LocalAI does) with
``--addr 127.0.0.1:0``, waits for its "serving on HOST:PORT" log line, and gives a stub on
that address; ``stop()`` sends SIGTERM and waits (SIGKILL past the timeout). The log goes
to a temporary file (``logs()``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc

import backend_pb2
import backend_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
SERVING = re.compile(r"serving on (\S+:\d+)")


class ServerProcess:
    """``backend.py`` (or ``run.sh``) in a subprocess on port 0; its stderr goes to a file."""

    def __init__(
        self,
        *args: str,
        env: dict | None = None,
        entry: str = "backend.py",
        start_timeout: float = 60.0,
    ) -> None:
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
        self.address = self._wait_for_address(start_timeout)
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

    def load(
        self, model: str, options: Iterable[str] = (), timeout: float = 600.0, **fields: Any
    ) -> float:
        """LoadModel ``model`` with ``options``; the seconds it took. RuntimeError on failure."""
        start = time.perf_counter()
        res = self.stub.LoadModel(
            backend_pb2.ModelOptions(Model=str(model), Options=list(options), **fields),
            timeout=timeout,
        )
        if not res.success:
            raise RuntimeError(f"LoadModel failed: {res.message}\n{self.logs()[-4000:]}")
        return time.perf_counter() - start

    def remove_log(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)

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
