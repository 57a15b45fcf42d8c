"""Where a fine-tune job writes, and ``ListCheckpoints`` (no MLX here).

``output_dir/checkpoint-<step>/`` every ``save_steps`` and when a job is stopped, and the
final adapter in ``output_dir`` itself (LocalAI's export form defaults ``checkpoint_path``
to the job's ``output_dir``). Each holds mlx-lm's adapter format (``adapters.safetensors``
+ ``adapter_config.json``, what ``mlx_lm.utils.load(adapter_path=...)`` and so our LoadModel
``LoraAdapter`` read), the optimizer state (``optimizer.safetensors``, for resuming), and
``trainer_state.json`` (step, epoch, loss: what ListCheckpoints reports). The adapter
config also names the base model as ``base_model_name_or_path``, the key LocalAI's
importer reads (core/gallery/importers/local.go).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

PREFIX = "checkpoint-"
STATE = "trainer_state.json"
ADAPTERS = "adapters.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
OPTIMIZER = "optimizer.safetensors"


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / f"{PREFIX}{step}"


def read_state(path: Path) -> dict[str, Any]:
    try:
        data = json.loads((path / STATE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def list_checkpoints(output_dir: str) -> list[dict[str, Any]]:
    """The step checkpoints under ``output_dir``, oldest step first: path, step, epoch,
    loss, created_at (UTC, RFC 3339). A directory that does not exist has none."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        if not entry.name.startswith(PREFIX) or not (entry / ADAPTERS).is_file():
            continue
        try:
            step = int(entry.name[len(PREFIX) :])
        except ValueError:
            continue
        state = read_state(entry)
        found.append(
            {
                "path": str(entry),
                "step": step,
                "epoch": float(state.get("epoch", 0.0)),
                "loss": float(state.get("loss", 0.0)),
                "created_at": time.strftime(
                    "%Y-%m-%dT%H:%M:%SZ", time.gmtime((entry / ADAPTERS).stat().st_mtime)
                ),
            }
        )
    return sorted(found, key=lambda c: c["step"])
