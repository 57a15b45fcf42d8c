"""The serving process's side of jobs: one child process per job (``training.worker``),
its progress lines read on the event loop, stop, and one job at a time (no MLX here).

The child owns all the job's MLX work, so the engine thread and the event loop are never
held by training: Health, Status and generation keep answering. A second job while one
runs is refused FAILED_PRECONDITION naming the running one (LocalAI starts a backend
process per job, with its own model ID, so its jobs never meet in one process).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from errors import BackendError, FailedPrecondition, NotFound, invalid_argument

logger = logging.getLogger("localai.mlx." + __name__)

ROOT = Path(__file__).resolve().parent.parent
FINAL = ("completed", "failed", "stopped")
KEEP = 512  # progress updates kept per job for late subscribers (the newest)
STOP_WAIT = 60.0  # seconds a stopped child gets to save its checkpoint before SIGTERM
KILL_WAIT = 10.0  # then this long after SIGTERM before SIGKILL

T = TypeVar("T")


def parse(read: Callable[[Any], T], request: Any) -> T:
    """``read(request)`` with its ValueError answered INVALID_ARGUMENT."""
    try:
        return read(request)
    except ValueError as exc:
        raise invalid_argument(exc) from None


class JobFailed(BackendError):
    """A job's child reported failure; ``status`` is the code the child named."""

    def __init__(self, message: str, status: str = "INTERNAL") -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Job:
    id: str
    kind: str  # finetune, quantize, export
    proc: asyncio.subprocess.Process
    updates: deque[tuple[int, dict[str, Any]]] = field(default_factory=lambda: deque(maxlen=KEEP))
    seq: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    reader: asyncio.Task | None = None

    @property
    def latest(self) -> dict[str, Any]:
        return self.updates[-1][1] if self.updates else {"status": "queued"}

    @property
    def final(self) -> dict[str, Any] | None:
        last = self.latest
        return last if last.get("status") in FINAL else None

    def add(self, update: dict[str, Any]) -> None:
        self.seq += 1
        self.updates.append((self.seq, update))
        self.changed.set()
        self.changed = asyncio.Event()

    def describe(self) -> str:
        noun = {"finetune": "fine-tune", "quantize": "quantization", "export": "export"}[self.kind]
        return f"{noun} job {self.id} ({self.latest.get('status', 'queued')})"


class JobManager:
    """Jobs of this process: at most one running; finished ones kept for their progress."""

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        self.jobs: dict[str, Job] = {}
        self.running: Job | None = None

    async def start(self, kind: str, job_id: str, spec: dict[str, Any]) -> Job:
        """Start ``kind`` in a child; FAILED_PRECONDITION while another job runs."""
        if self.running is not None and self.running.final is None:
            raise FailedPrecondition(
                f"{self.running.describe()} is running in this backend process; it runs one "
                "job at a time (LocalAI starts a backend process per job): stop it or wait "
                "for it to end"
            )
        if job_id in self.jobs and kind != "export":
            raise FailedPrecondition(f"job {job_id} already ran in this process: use a new job_id")
        proc = await asyncio.create_subprocess_exec(
            self.python,
            "-m",
            "training.worker",
            cwd=str(ROOT),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        job = Job(job_id, kind, proc)
        job.add({"status": "queued", "message": f"{kind} job queued"})
        assert proc.stdin is not None
        proc.stdin.write((json.dumps({"kind": kind, "spec": spec}) + "\n").encode())
        await proc.stdin.drain()
        job.reader = asyncio.create_task(self._read(job))
        if kind != "export":
            self.jobs[job_id] = job
        self.running = job
        logger.info("%s started (pid %d)", job.describe(), proc.pid)
        return job

    async def _read(self, job: Job) -> None:
        assert job.proc.stdout is not None
        async for raw in job.proc.stdout:
            try:
                update = json.loads(raw)
            except ValueError:
                continue
            if isinstance(update, dict) and update.get("status"):
                if update["status"] in ("failed", "stopped", "completed"):
                    logger.info("%s: %s", job.describe(), update.get("message", ""))
                job.add(update)
        code = await job.proc.wait()
        if job.final is None:
            job.add(
                {
                    "status": "failed",
                    "message": f"the job's process ended (exit status {code}) before "
                    "reporting an end; see the backend log",
                }
            )
        if self.running is job:
            self.running = None

    def get(self, job_id: str, kind: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None or job.kind != kind:
            raise NotFound(f"no {kind} job {job_id!r} in this backend process")
        return job

    async def follow(self, job_id: str, kind: str) -> AsyncIterator[dict[str, Any]]:
        """The job's latest update, then each new one, until the final one."""
        job = self.get(job_id, kind)
        seen = job.updates[-1][0] - 1 if job.updates else 0
        while True:
            fresh = [(s, u) for s, u in job.updates if s > seen]
            for s, u in fresh:
                seen = s
                yield u
                if u.get("status") in FINAL:
                    return
            if not fresh:
                await job.changed.wait()

    async def stop(self, job_id: str, kind: str, save: bool = True) -> dict[str, Any]:
        """Ask the job to stop (saving a checkpoint when ``save``); returns its final
        update. A child that does not end in STOP_WAIT seconds is terminated."""
        job = self.get(job_id, kind)
        if job.final is None:
            await self._stop(job, save)
        return job.latest

    async def _stop(
        self, job: Job, save: bool, wait: float = STOP_WAIT, escalate: bool = True
    ) -> None:
        proc = job.proc
        if proc.returncode is None and proc.stdin is not None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                proc.stdin.write((json.dumps({"cmd": "stop", "save": save}) + "\n").encode())
                await proc.stdin.drain()
        steps = ((None, wait), (proc.terminate, KILL_WAIT), (proc.kill, None))
        for signal_it, seconds in steps if escalate else steps[:1]:
            if signal_it is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    signal_it()
            try:
                await asyncio.wait_for(asyncio.shield(job.reader), seconds)  # type: ignore[arg-type]
                return
            except TimeoutError:
                continue

    async def run(self, kind: str, job_id: str, spec: dict[str, Any]) -> dict[str, Any]:
        """Start ``kind`` and wait for its end; the final update, or JobFailed."""
        job = await self.start(kind, job_id, spec)
        try:
            await asyncio.shield(job.reader)  # type: ignore[arg-type]
        except asyncio.CancelledError:
            await self._stop(job, save=False, wait=5.0)  # the caller left: end the job
            raise
        final = job.latest
        if final.get("status") != "completed":
            raise JobFailed(final.get("message", "failed"), final.get("code", "INTERNAL"))
        return final

    async def shutdown(self, grace: float) -> None:
        """The server stops: the running job is asked to stop and save, and given ``grace``
        seconds. It is not killed: a child whose parent is gone still saves and exits
        (its stdin closes), and LocalAI signals the whole process group anyway."""
        job = self.running
        if job is not None and job.final is None:
            await self._stop(job, save=True, wait=grace, escalate=False)
