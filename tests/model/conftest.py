"""The model tier: tests that load a real model in this process (the embedded SmolLM2,
or tiny random-weight models with its tokenizer) or read the embedded model's files.
Every test under this folder is marked ``model``."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest
import tiny_models
from inprocess import InProcessServer
from mlx_lm import tokenizer_utils

from loading import cpu_fast_path, model_loader

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.model)


@pytest.fixture(scope="module")
def smol():
    """The embedded SmolLM2 as the engine prepares it: float32 dense weights when a fast
    BLAS is preloaded (e.g. under `eval "$(python -m loading.cpu_fast_path --exports)"`),
    else the quantized model with float32 scales; (model, tokenizer)."""
    model, tok = model_loader.load_model(str(model_loader.embedded_model_path()))
    cpu_fast_path.prepare_for_cpu(model, None)
    mx.eval(model.parameters())
    return model, tok


@pytest.fixture(scope="module")
def smollm():
    """The embedded SmolLM2's tokenizer (its GGUF converted once, then cached)."""
    return tokenizer_utils.load(tiny_models.tokenizer_dir())


@pytest.fixture(scope="session")
def model_root(tmp_path_factory) -> Path:
    """Where `tiny_models.build` writes the tiny models (each built once per session)."""
    return tmp_path_factory.mktemp("tiny_models")


@pytest.fixture(scope="module")
def srv():
    """A real Engine behind real gRPC in this process (`inprocess.InProcessServer`), no
    model loaded; one per module."""
    s = InProcessServer()
    try:
        yield s
    finally:
        s.stop()
