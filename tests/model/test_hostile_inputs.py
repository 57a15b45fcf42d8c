"""Hostile files and inputs (issue 32, item 7), over real gRPC to the real engine in this
process (``inprocess.InProcessServer``) with a tiny random-weight model, each with an
innocent stream running beside it that must end OK with its solo text: a FIFO named like
a prompt-cache disk entry.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading

import grpc
import pytest
import tiny_models
from helpers import greedy, stream_text
from inprocess import InProcessServer

import backend_pb2

CALL_TIMEOUT = 30.0  # seconds; a frozen engine thread fails the test with DEADLINE_EXCEEDED
INNOCENT = greedy("Once upon a time, in a small village,", 48, IgnoreEOS=True)


class Beside:
    """An innocent stream in a thread, started before the block's body (entering waits
    for its first reply); leaving waits for it and returns nothing: read ``text`` /
    ``error``."""

    def __init__(self, stub) -> None:
        self.stub = stub
        self.text = ""
        self.error = ""
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            for reply in self.stub.PredictStream(INNOCENT, timeout=CALL_TIMEOUT):
                self.started.set()
                self.text += reply.message.decode("utf-8")
        except grpc.RpcError as err:
            self.error = f"{err.code().name}: {err.details()}"
        finally:
            self.started.set()

    def __enter__(self) -> Beside:
        self.thread.start()
        assert self.started.wait(CALL_TIMEOUT), "the innocent stream never started"
        return self

    def __exit__(self, *exc) -> None:
        self.thread.join(CALL_TIMEOUT * 2)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A models directory holding the tiny llama (LocalAI's ModelPath)."""
    root = tmp_path_factory.mktemp("models")
    shutil.copytree(tiny_models.build("llama", tmp_path_factory.mktemp("tiny")), root / "llama")
    return root


@pytest.fixture(scope="module")
def server(models):
    s = InProcessServer()
    res = s.stub.LoadModel(
        backend_pb2.ModelOptions(Model=str(models / "llama"), ModelPath=str(models)),
        timeout=120,
    )
    assert res.success, res.message
    try:
        yield s
    finally:
        s.stop()


def _release(fifo) -> None:
    """Unblock a reader stuck opening ``fifo`` (the state before the fix), so the engine
    thread, and the test's teardown, go on."""
    with contextlib.suppress(OSError):  # nobody is waiting on it
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_named_like_a_disk_entry_is_a_miss_and_freezes_nothing(server, models):
    stub = server.stub
    solo = stream_text(stub, INNOCENT, CALL_TIMEOUT)[0]
    cache = models / "cache"
    cache.mkdir()
    fifo = cache / f"{'0' * 32}-{'1' * 64}.safetensors"
    os.mkfifo(fifo)
    hostile = greedy("The lighthouse keeper kept a log", 8, PromptCachePath=str(cache))
    alone = stub.Predict(greedy("The lighthouse keeper kept a log", 8), timeout=CALL_TIMEOUT)
    try:
        with Beside(stub) as innocent:
            reply = stub.Predict(hostile, timeout=CALL_TIMEOUT)
            again = stub.Predict(hostile, timeout=CALL_TIMEOUT)
    finally:
        _release(fifo)
    assert innocent.error == "" and innocent.text == solo
    assert reply.message == alone.message == again.message and reply.tokens == 8
    assert stub.Health(backend_pb2.HealthMessage(), timeout=5).message == b"OK"
    # Served as a miss: the directory holds the FIFO, untouched, and the new entries.
    assert fifo.exists()
