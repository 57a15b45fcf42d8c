"""LoadModel of a Hugging Face id in a backend process: downloaded from the local hub
stand-in (the ``hub`` fixture, tests/hubserver.py), then served."""

from __future__ import annotations

from pathlib import Path

from hubserver import REPO, HubServer

import backend_pb2
from clients.server_process import ServerProcess

PROMPT = "The capital of France is"


def test_grpc_load_model_downloads(hub: HubServer, tmp_path: Path) -> None:
    home = tmp_path / "backend-hf-home"
    srv = ServerProcess(env={"HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_HUB_OFFLINE": "0"})
    try:
        result = srv.stub.LoadModel(backend_pb2.ModelOptions(Model=REPO), timeout=300)
        assert result.success, result.message
        assert (home / "hub" / "models--test-org--smollm2-mlx").is_dir()
        assert f"downloaded {REPO}: " in srv.logs()
        reply = srv.stub.Predict(
            backend_pb2.PredictOptions(Prompt=PROMPT, Tokens=8, Temperature=0), timeout=120
        )
        assert reply.tokens == 8 and reply.message.decode().strip()
        bad = srv.stub.LoadModel(backend_pb2.ModelOptions(Model="test-org/missing"), timeout=60)
        assert not bad.success
        assert "Hugging Face repo 'test-org/missing' not found" in bad.message
    finally:
        srv.stop()
