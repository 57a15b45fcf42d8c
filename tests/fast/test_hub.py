"""Model resolution refuses a FIFO named as a model without opening it (no model, no hub)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loading.model_loader import ModelLoadError, resolve_model


def test_fifo_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ModelLoadError, match=r"model\.gguf is a FIFO \(named pipe\), not a model"):
        resolve_model(str(fifo))
    with pytest.raises(ModelLoadError, match="is a FIFO"):
        resolve_model("whatever", "model.gguf", str(tmp_path))
