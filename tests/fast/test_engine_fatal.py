"""An engine thread that dies outside any one job's handling is a fatal state
(`Engine.fatal`): the server then ends every request UNAVAILABLE and exits 1 so that
LocalAI can start it again (edge/startup.py; exercised with real processes in
tests/distributed, where a killed rank breaks the group)."""

from __future__ import annotations

import asyncio

import pytest
from helpers import wait_until

from engine.core import TOKENIZE, Engine
from errors import FailedPrecondition


def test_a_dead_engine_thread_is_fatal_and_refuses_calls() -> None:
    engine = Engine()
    assert engine.fatal is None  # not started yet
    engine.start()
    assert engine.fatal is None

    def broken(throttle: bool = False) -> None:
        raise SystemExit("injected: a bug outside any job's handling")

    engine._snapshot_memory = broken  # runs after every mailbox call, outside its try

    async def call() -> None:
        await engine.call(TOKENIZE, "x")

    with pytest.raises(FailedPrecondition, match="no model loaded"):
        asyncio.run(call())  # the call itself is answered; the thread dies after it
    assert wait_until(lambda: engine.fatal, 5) == "the engine thread died"
    with pytest.raises(FailedPrecondition, match="engine thread died; retry once the backend"):
        asyncio.run(call())


def test_a_deliberate_stop_is_not_fatal() -> None:
    engine = Engine()
    engine.start()
    engine.stop()
    assert engine.fatal is None
    with pytest.raises(FailedPrecondition, match="shutting down; retry on another backend"):
        engine.serving()
