"""cpu_fast_path in other processes: the preloaded BLAS measured in a fresh interpreter,
the interpreter re-executed once with the preload, and backends started through run.sh or
as `python backend.py` serving on the fast BLAS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import LINUX, ROOT

import backend_pb2
from clients.server_process import ServerProcess
from loading import cpu_fast_path as cfp


def _check_blas_in_subprocess(env: dict[str, str]) -> dict:
    code = (
        "import dataclasses, json; from loading import cpu_fast_path as c;"
        "print(json.dumps(dataclasses.asdict(c.check_blas(384))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not LINUX, reason="the BLAS preload is Linux-only")
def test_check_blas_sees_preloaded_library():
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", cfp.BLAS_ENV)}
    fast = _check_blas_in_subprocess(cfp.preload_env(base))
    slow = _check_blas_in_subprocess(base)
    assert Path(fast["library"]).resolve() == cfp.blas_library_path()
    assert fast["fast"], fast
    assert "mlx" in slow["library"] and "libblas" in slow["library"], slow
    assert not slow["fast"], slow
    assert fast["gflops"] > 3 * slow["gflops"]


@pytest.mark.skipif(not LINUX, reason="the BLAS preload is Linux-only")
def test_run_sh_starts_the_server_on_the_fast_blas():
    env = {"LD_PRELOAD": "", cfp.BLAS_ENV: "auto"}
    srv = ServerProcess(entry="run.sh", env=env)
    try:
        maps = Path(f"/proc/{srv.proc.pid}/maps").read_text()
        assert str(cfp.blas_library_path()) in maps
    finally:
        srv.stop()


_SHOW_MAPS = (
    "import os; from loading import cpu_fast_path as c; c.ensure_preloaded();"
    "print(os.getpid(), os.environ.get(c.REEXEC_GUARD_ENV, '-'), open('/proc/self/maps').read())"
)


@pytest.mark.skipif(not LINUX, reason="the BLAS preload is Linux-only")
@pytest.mark.parametrize("setting", ["auto", "none"])
def test_ensure_preloaded_restarts_the_interpreter_once(setting):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", cfp.REEXEC_GUARD_ENV)}
    env[cfp.BLAS_ENV] = setting
    out = subprocess.run(
        [sys.executable, "-c", _SHOW_MAPS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    pid, guard, maps = out.split(" ", 2)
    lib = str(cfp.blas_library_path())
    if setting == "auto":
        assert guard == pid  # re-executed in place: same process id
        assert lib in maps
    else:
        assert guard == "-"
        assert lib not in maps


@pytest.mark.skipif(not LINUX, reason="the BLAS preload is Linux-only")
def test_backend_py_started_directly_serves_on_the_fast_blas():
    # As LocalAI's libbackend.sh starts it: `python backend.py --addr ...`, no preload.
    env = {"LD_PRELOAD": "", cfp.BLAS_ENV: "auto"}
    srv = ServerProcess("--model", "embedded", entry="backend.py", env=env)
    try:
        srv.wait_state(backend_pb2.StatusResponse.READY)
        info = json.loads(srv.stub.GetMetrics(backend_pb2.MetricsRequest()).prompt_json_for_slot)
        assert Path(info["blas"]["library"]).resolve() == cfp.blas_library_path(), info
        assert info["blas"]["fast"], info
        assert info["cpu_mode"] == "dense", info
        assert str(cfp.blas_library_path()) in Path(f"/proc/{srv.proc.pid}/maps").read_text()
    finally:
        assert srv.stop() == 0
