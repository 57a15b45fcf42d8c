"""The process tier: tests that start backend processes (``ServerProcess``, run.sh,
LocalAI's libbackend.sh, other interpreters), send them signals or restart them. Every test
under this folder is marked ``process``."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.process)
