"""The distributed tier: groups of backend processes (MLX ring groups on loopback, LocalAI's
worker protocol), the slowest tests. Every test under this folder is marked ``distributed``."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.distributed)
