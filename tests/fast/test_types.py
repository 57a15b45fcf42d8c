"""The type checker: mypy, with the project's configuration (pyproject.toml's [tool.mypy]:
edge/, engine/, caches/, decoding/), must find nothing. Fails with mypy's own report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_is_clean_on_the_checked_folders() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = (run.stdout + run.stderr).strip()
    assert run.returncode == 0, f"mypy found errors:\n{report}"
    assert report.startswith("Success: no issues found"), report
