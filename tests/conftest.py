"""Shared fixtures: a real backend process on a free port, serving the embedded model
(``server_process.ServerProcess``, the harness the benchmarks use too)."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import backend_pb2  # noqa: E402
from clients.server_process import SERVING, ServerProcess  # noqa: E402, F401  (tests import them here)


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


# --- tiers ---------------------------------------------------------------------------
# `make test-fast` runs `pytest -m "not model and not slow"`: no model, no backend process,
# well under a minute. A test is in the model tier when its module always needs a model or
# processes, when it uses one of these fixtures, or when its body starts a process or loads
# a model itself. `distributed` marks the multi-process group tests (the slowest).
MODEL_FIXTURES = frozenset(
    {"server", "stub", "empty_server", "small_server", "auth_server", "fuzz_server", "other",
     "smol", "smollm2", "cluster", "lm", "france", "base", "tiny", "hub_server", "mlx_dir",
     "reference", "tree", "hf_cache"}
)  # fmt: skip
MODEL_MODULES = frozenset(
    {"test_batching", "test_cache_memory", "test_cpu_fast_path", "test_distributed",
     "test_features", "test_fuzz", "test_hub", "test_localai_launcher", "test_lora",
     "test_ngram", "test_prompt_disk", "test_scoring", "test_checkpoints", "test_isolation",
     "test_prompt_tiers", "test_worker_protocol"}
)  # fmt: skip
DISTRIBUTED_MODULES = frozenset({"test_distributed", "test_worker_protocol"})
_STARTS_HEAVY = ("ServerProcess(", "InProcessServer(", "load_model(", "subprocess.")


def _body_starts_heavy(item: pytest.Item) -> bool:
    try:
        source = inspect.getsource(item.function)
    except (OSError, TypeError, AttributeError):
        return False
    return any(marker in source for marker in _STARTS_HEAVY)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.module.__name__ if item.module is not None else ""
        if module in DISTRIBUTED_MODULES:
            item.add_marker(pytest.mark.distributed)
        if (
            module in MODEL_MODULES
            or MODEL_FIXTURES & set(getattr(item, "fixturenames", ()))
            or _body_starts_heavy(item)
        ):
            item.add_marker(pytest.mark.model)
