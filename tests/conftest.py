"""Fixtures shared by the tiers (each tier's conftest.py marks its folder's tests).

- ``server`` / ``stub``: a real backend process on a free port serving the embedded model
  (``clients.server_process.ServerProcess``, the harness the benchmarks use too), shared by
  the whole session; ``empty_server``: one with no model loaded.
- ``mlx_dir`` / ``hub_server``: the embedded model as an MLX directory, served by the local
  Hugging Face Hub stand-in (tests/hubserver.py); ``hub``: that hub with a clean request
  log, HF_ENDPOINT pointing at it and HF_HOME in the test's tmp_path.

Helpers to import live beside this file: helpers.py, inprocess.py, scripted.py,
toy_tokenizer.py, tiny_models.py, hubserver.py; data/ holds the pinned reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_models
from hubserver import HubServer, serve_embedded

import backend_pb2
from clients.server_process import ServerProcess


@pytest.fixture(scope="session", autouse=True)
def no_warmup():
    """Backends started by the tests skip the warm-up at LoadModel (it only saves the first
    request's kernel compilation, ~0.7 s a load once MLX's kernel cache is warm);
    tests/process/test_serving_under_load.py turns it on with the option and checks it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALAI_MLX_WARMUP", "false")
        yield


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


@pytest.fixture(scope="session")
def mlx_dir() -> Path:
    """The embedded GGUF converted once into an mlx-lm directory (the served repo)."""
    return tiny_models.tokenizer_dir()


@pytest.fixture(scope="module")
def hub_server(mlx_dir: Path):
    """The hub stand-in serving the embedded model (``hubserver.serve_embedded``)."""
    server: HubServer = serve_embedded(mlx_dir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def hub(hub_server: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HubServer:
    """The hub stand-in with a clean request log, HF_ENDPOINT on it and HF_HOME in tmp."""
    hub_server.requests.clear()
    hub_server.drops.clear()
    hub_server.failures.clear()
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    for name in ("HF_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "no-token"))
    return hub_server
