"""Commands the docs give a newcomer, run as written (what the reader types)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

from loading import model_loader

LOCALAI = (ROOT / "docs" / "LOCALAI.md").read_text(encoding="utf-8")


def test_the_command_that_prints_the_embedded_models_path_works() -> None:
    """docs/LOCALAI.md 2: ``.venv/bin/python -c '...'`` in this backend's directory."""
    found = re.findall(r"python -c '([^']*embedded_model_path[^']*)'", LOCALAI)
    assert len(found) == 1, found
    run = subprocess.run(
        [sys.executable, "-c", found[0]], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert Path(run.stdout.strip()) == model_loader.embedded_model_path()
