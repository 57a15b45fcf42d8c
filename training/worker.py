"""The child process of one job: ``python -m training.worker``.

Reads one JSON line from stdin, ``{"kind": "finetune" | "export" | "quantize", "spec":
{...}}``, runs it, and writes progress as JSON lines (the fields of LocalAI's progress
messages) to what was its stdout; everything else it or a library prints goes to stderr,
the backend's log. The last line has a final status: completed, failed or stopped.

Stopping: a ``{"cmd": "stop", "save": true|false}`` line on stdin, stdin closing (the
serving process is gone), or SIGTERM (LocalAI stops a job by stopping its backend process
group: core/services/finetune/service.go StopJob -> ShutdownModel) all set the stop flag;
training checks it between batches and saves a checkpoint of the last completed step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import traceback
from typing import Any, TextIO

from errors import BackendError

logger = logging.getLogger("localai.mlx.training.worker")


class Interrupted(BaseException):
    """Raised in the main thread to end a job with no steps to stop between (a
    quantization: ``mlx_lm.convert`` is one call); its output is removed."""


def _interrupt(*_: object) -> None:
    raise Interrupted


class Stop:
    """The stop flag the job reads between steps; ``interrupt``: also interrupt the main
    thread (through SIGUSR1, whose handler raises Interrupted there)."""

    def __init__(self, interrupt: bool = False) -> None:
        self._event = threading.Event()
        self.save = True
        self.interrupt = interrupt

    def set(self, save: bool = True) -> None:
        self.save = (self.save and save) if self._event.is_set() else save
        self._event.set()
        if self.interrupt:
            os.kill(os.getpid(), signal.SIGUSR1)

    def is_set(self) -> bool:
        return self._event.is_set()


class Emitter:
    """Writes one JSON object per line to the progress pipe; a gone reader is ignored."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.lock = threading.Lock()

    def __call__(self, **fields: Any) -> None:
        line = json.dumps(fields)
        with self.lock:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass


def _watch_stdin(stop: Stop) -> None:
    for line in sys.stdin:
        try:
            cmd = json.loads(line)
        except ValueError:
            continue
        if isinstance(cmd, dict) and cmd.get("cmd") == "stop":
            stop.set(bool(cmd.get("save", True)))
    stop.set(True)  # stdin closed: the serving process is gone; save and end


def _code(exc: Exception) -> str:
    """The gRPC status a synchronous caller (ExportModel) answers with."""
    if isinstance(exc, MemoryError):
        return "RESOURCE_EXHAUSTED"
    if isinstance(exc, FileNotFoundError):
        return "NOT_FOUND"
    return "FAILED_PRECONDITION"  # a ValueError: the job cannot be done as asked


def run(kind: str, spec: dict[str, Any], emit: Emitter, stop: Stop) -> int:
    """Run one job; returns the exit status (0 completed or stopped, 1 failed)."""
    try:
        if kind == "finetune":
            from training import finetune
            from training.spec import FineTuneSpec

            with contextlib.suppress(finetune.Stopped):  # its checkpoint is saved
                finetune.run(FineTuneSpec.from_json(spec), emit, stop)
        elif kind == "export":
            from training import export
            from training.spec import ExportSpec

            export.run(ExportSpec(**spec), emit)
        elif kind == "quantize":
            from training import quantize
            from training.spec import QuantizeSpec

            quantize.run(QuantizeSpec.from_json(spec), emit, stop)
        else:
            raise ValueError(f"unknown job kind {kind!r}")
    except Interrupted:
        emit(status="stopped", message=f"{kind} stopped; its partial output was removed")
    except BackendError as exc:  # a model that cannot be found or loaded, as LoadModel says
        logger.error("%s job failed: %s", kind, exc)
        emit(status="failed", message=str(exc), code=exc.status)
        return 1
    except (ValueError, MemoryError, FileNotFoundError) as exc:
        logger.error("%s job failed: %s", kind, exc)
        emit(status="failed", message=str(exc), code=_code(exc))
        return 1
    except Exception as exc:  # a library failure: report it, with the trace in the log
        traceback.print_exc()
        emit(status="failed", message=f"{type(exc).__name__}: {exc}", code="INTERNAL")
        return 1
    return 0


def main() -> None:
    # The progress pipe is fd 1 as started; every later print (mlx-lm's, a library's) is
    # sent to stderr so that no stray line is read as progress.
    progress = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    emit = Emitter(progress)
    first = sys.stdin.readline()
    try:
        job = json.loads(first)
        kind, spec = job["kind"], job["spec"]
    except (ValueError, KeyError, TypeError):
        emit(status="failed", message=f"worker: bad job line {first[:200]!r}")
        raise SystemExit(2) from None
    stop = Stop(interrupt=kind == "quantize")
    signal.signal(signal.SIGUSR1, _interrupt)
    signal.signal(signal.SIGTERM, lambda *_: stop.set(True))
    signal.signal(signal.SIGINT, lambda *_: stop.set(True))
    threading.Thread(target=_watch_stdin, args=(stop,), daemon=True, name="stdin").start()
    code = run(kind, spec, emit, stop)
    progress.close()
    sys.stderr.flush()
    os._exit(code)  # MLX's threads may sit in native code: skip interpreter finalization


if __name__ == "__main__":
    main()
