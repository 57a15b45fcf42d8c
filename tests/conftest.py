"""Shared fixtures: a real backend process on a free port, serving the embedded model
(``server_process.ServerProcess``, the harness the benchmarks use too)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import backend_pb2  # noqa: E402
from server_process import SERVING, ServerProcess  # noqa: E402, F401  (tests import them here)


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
