"""The process tier: tests that start backend processes (``ServerProcess``, run.sh,
LocalAI's libbackend.sh, other interpreters), send them signals or restart them. Every test
under this folder is marked ``process``."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.server_process import ServerProcess

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.process)


@pytest.fixture(scope="module")
def srv():
    """A backend started as LocalAI starts it (run.sh), no model loaded; one per module
    that asks for it (a module may define its own ``srv``)."""
    server = ServerProcess(entry="run.sh")
    try:
        yield server
    finally:
        server.stop()
