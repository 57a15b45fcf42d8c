"""The project inside LocalAI's tree: install.sh / run.sh / test.sh through LocalAI's own
``libbackend.sh``.

A temporary tree shaped like LocalAI's source (``backend/backend.proto``,
``backend/python/common/libbackend.sh``, ``backend/python/mlx/`` = a copy of this project)
with the real ``libbackend.sh`` as LocalAI ships it (``../shared/localai/``, or the file
named by ``LOCALAI_LIBBACKEND``). The tree's ``venv`` is this test run's own virtual
environment, so ``installRequirements`` finds every requirement satisfied (nothing is
downloaded but the throw-away protoc environment ``runProtogen`` builds).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from helpers import LINUX, ROOT, wait_until

import backend_pb2
import backend_pb2_grpc
from clients.server_process import SERVING
from loading import cpu_fast_path as cfp
from loading import model_loader

_SKIP = {".git", ".venv", "venv", "tests", "bench", "__pycache__", ".pytest_cache"}
_SKIP |= {".ruff_cache", ".hypothesis", ".cache", "backend_pb2.py", "backend_pb2_grpc.py"}


def _libbackend() -> Path | None:
    """LocalAI's ``backend/python/common/libbackend.sh``: $LOCALAI_LIBBACKEND, else the copy
    in ``shared/localai/`` beside this checkout."""
    named = os.environ.get("LOCALAI_LIBBACKEND")
    candidates = [Path(named)] if named else []
    candidates += [ROOT.parent / "shared" / "localai" / "libbackend.sh"]
    return next((c for c in candidates if c.is_file()), None)


LIBBACKEND = _libbackend()
IN_VENV = (Path(sys.prefix) / "pyvenv.cfg").is_file()

pytestmark = [
    pytest.mark.skipif(not LINUX, reason="these tests drive LocalAI's Linux launcher"),
    pytest.mark.skipif(
        LIBBACKEND is None,
        reason="LocalAI's libbackend.sh not found: set LOCALAI_LIBBACKEND or put it in "
        "../shared/localai/",
    ),
    pytest.mark.skipif(not IN_VENV, reason="needs a virtual environment to lend the tree"),
]


def _env(**extra: str) -> dict[str, str]:
    drop = {"LD_PRELOAD", "VIRTUAL_ENV", "BUILD_TYPE", "CUDA_MAJOR_VERSION", "PYTHONPATH"}
    env = {k: v for k, v in os.environ.items() if k not in drop and k != cfp.REEXEC_GUARD_ENV}
    env.update(**extra)
    return env


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """``backend/python/mlx`` of a LocalAI-shaped tree; install.sh already ran (cpu)."""
    top = tmp_path_factory.mktemp("localai") / "backend"
    (top / "python" / "common").mkdir(parents=True)
    shutil.copy(ROOT / "backend.proto", top / "backend.proto")  # LocalAI's own contract
    shutil.copy(LIBBACKEND, top / "python" / "common" / "libbackend.sh")
    mlx = top / "python" / "mlx"
    shutil.copytree(ROOT, mlx, ignore=lambda _dir, names: [n for n in names if n in _SKIP])
    (mlx / "venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    out = subprocess.run(
        ["bash", "install.sh"],
        cwd=mlx,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "Requirement already satisfied: mlx-lm==" in out.stdout, out.stdout[-4000:]
    return mlx


# Runs LocalAI's installRequirements on the tree with `pip` replaced by a function that
# only names the file it was given: which files LocalAI installs for a build profile.
_PROFILE_PROBE = """
USE_PIP=true
source ../common/libbackend.sh
pip() { echo "requirements file: ${@: -1}"; }
runProtogen() { :; }
installRequirements
"""


def _files_read(tree: Path, **env: str) -> list[str]:
    probe = tree / "probe_profile.sh"
    probe.write_text(_PROFILE_PROBE)
    try:
        out = subprocess.run(
            ["bash", probe.name],
            cwd=tree,
            env=_env(**env),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    finally:
        probe.unlink()
    return [Path(m).name for m in re.findall(r"^requirements file: (\S+)$", out, re.M)]


@pytest.mark.skipif(Path("/opt/intel").is_dir(), reason="libbackend.sh picks the intel profile")
@pytest.mark.parametrize(
    ("build_type", "cuda", "profile_file"),
    [
        ("", "", "requirements-cpu.txt"),
        ("mps", "", "requirements-mps.txt"),
        ("cublas", "12", "requirements-cublas12.txt"),
        ("cublas", "13", "requirements-cublas13.txt"),
        ("l4t", "12", "requirements-l4t12.txt"),
        ("l4t", "13", "requirements-l4t13.txt"),
    ],
)
def test_each_build_profile_finds_its_mlx_build(tree, build_type, cuda, profile_file):
    files = _files_read(tree, BUILD_TYPE=build_type, CUDA_MAJOR_VERSION=cuda)
    assert files[0] == "requirements.txt"
    assert set(files[1:]) == {profile_file}, files
    lines = [ln.split("#")[0].strip() for ln in (tree / profile_file).read_text().splitlines()]
    assert any(ln.startswith("mlx") and "==" in ln for ln in lines), lines


def test_install_generates_stubs_from_localais_proto(tree):
    assert (tree / "backend_pb2.py").is_file() and (tree / "backend_pb2_grpc.py").is_file()
    # protoc refuses two backend.proto on its -I../../ -I./ path: ours is moved aside.
    assert not (tree / "backend.proto").exists()
    assert (tree / "backend.proto.standalone").is_file()
    assert (tree / "venv" / "bin" / "python").exists()


def _wait_for_address(proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> str:
    """The address of the "serving on" log line; RuntimeError if the backend exits first."""
    found = wait_until(
        lambda: SERVING.search(log.read_text(errors="replace")) or proc.poll() is not None,
        timeout,
        explain=lambda: f"backend did not start:\n{log.read_text()}",
    )
    if isinstance(found, re.Match):
        return found.group(1)
    raise RuntimeError(f"backend exited {proc.returncode}:\n{log.read_text()}")


def test_run_sh_serves_through_libbackend_on_the_fast_blas(tree, tmp_path):
    log = tmp_path / "backend.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            ["bash", "run.sh", "--addr", "127.0.0.1:0"],
            cwd=tree,
            env=_env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        address = _wait_for_address(proc, log)
        # startBackend exec'd the venv's interpreter on backend.py in place of run.sh.
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[0].decode() == str(tree / "venv" / "bin" / "python"), cmdline
        assert cmdline[1].decode() == str(tree / "backend.py"), cmdline
        with grpc.insecure_channel(address) as channel:
            stub = backend_pb2_grpc.BackendStub(channel)
            assert stub.Health(backend_pb2.HealthMessage()).message == b"OK"
            model_file = str(model_loader.embedded_model_path())
            loaded = stub.LoadModel(backend_pb2.ModelOptions(Model="x", ModelFile=model_file))
            assert loaded.success, loaded.message
            assert loaded.message == "MLX model loaded successfully"
            reply = stub.Predict(
                backend_pb2.PredictOptions(
                    Prompt="The capital of France is", Tokens=8, Temperature=0
                ),
                timeout=300,
            )
            assert reply.tokens > 0 and reply.message.strip(), reply
            metrics = stub.GetMetrics(backend_pb2.MetricsRequest())
            info = json.loads(metrics.prompt_json_for_slot)
        blas = Path(info["blas"]["library"]).resolve()
        assert blas.name.startswith("libmkl_rt"), info
        assert info["blas"]["fast"] and info["cpu_mode"] == "dense", info
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, log.read_text()


def test_test_sh_runs_test_py_in_the_venv(tree):
    out = subprocess.run(
        ["bash", "test.sh"],
        cwd=tree,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    assert re.search(r"^Ran (\d+) tests", out.stderr, re.M), out.stderr[-2000:]
    assert re.search(r"^OK$", out.stderr, re.M), out.stderr[-2000:]
