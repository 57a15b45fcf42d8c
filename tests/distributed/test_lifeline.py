"""Lifelines (distributed/lifeline.py) between threads of this process: a rank whose end
closes is reported to rank 0 at once, rank 0 closing is reported to the others, the side
that closes reports nothing. No MLX group: the one integer the ranks exchange over MLX goes
through a stand-in. The real groups: test_worker_protocol.py, test_distributed.py."""

from __future__ import annotations

import json
import queue
import threading
import time

import pytest

from distributed import lifeline


class _Net:
    """The part of ``Collectives`` that ``lifeline.connect`` uses, for ``size`` threads:
    ``broadcast_int`` hands rank 0's value to the others."""

    def __init__(self, rank: int, size: int, box: queue.Queue) -> None:
        self.rank, self.size, self.leader = rank, size, rank == 0
        self.box = box

    def broadcast_int(self, value: int) -> int:
        if self.leader:
            for _ in range(self.size - 1):
                self.box.put(value)
            return value
        return self.box.get(timeout=10)


def _group(size: int, monkeypatch, tmp_path) -> tuple[list, list[queue.Queue]]:
    """Lifelines of ranks 0..size-1 (each ``connect`` on its own thread, as every rank
    calls it at once); each rank's losses go to its own queue."""
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([f"127.0.0.1:{5000 + r}" for r in range(size)]))
    monkeypatch.setenv("MLX_HOSTFILE", str(hostfile))
    box: queue.Queue = queue.Queue()
    losses: list[queue.Queue] = [queue.Queue() for _ in range(size)]
    lines: list = [None] * size

    def run(rank: int) -> None:
        lines[rank] = lifeline.connect(_Net(rank, size, box), losses[rank].put)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert all(line is not None for line in lines)
    return lines, losses


def test_a_rank_whose_lifeline_closes_is_reported_to_rank_0_at_once(monkeypatch, tmp_path):
    lines, losses = _group(3, monkeypatch, tmp_path)
    assert sorted(lines[0].socks) == [1, 2]
    t0 = time.monotonic()
    lines[2].close()  # what the kernel does to a process that dies, SIGKILL included
    reason = losses[0].get(timeout=5)
    assert time.monotonic() - t0 < 2
    assert reason.startswith("rank 2 is gone")
    assert losses[1].empty() and losses[2].empty()
    lines[0].close()  # rank 0 leaves: rank 1 hears of it; rank 0, closing, reports nothing
    assert losses[1].get(timeout=5).startswith("rank 0 is gone")
    time.sleep(0.2)
    assert losses[0].empty()
    lines[1].close()


def test_without_rank_0_s_address_there_are_no_lifelines(monkeypatch):
    monkeypatch.delenv("MLX_HOSTFILE", raising=False)
    monkeypatch.delenv("MLX_JACCL_COORDINATOR", raising=False)
    box: queue.Queue = queue.Queue()
    assert lifeline.connect(_Net(0, 2, box), print) is None
    assert list(box.queue) == [0]  # the others are told: no lifelines
    assert lifeline.connect(_Net(1, 2, box), print) is None


@pytest.mark.parametrize(
    ("environ", "host"),
    [
        ({"MLX_HOSTFILE": '["10.0.0.1:5555", "10.0.0.2:5555"]'}, "10.0.0.1"),  # LocalAI's
        ({"MLX_HOSTFILE": '[["10.0.0.3:5000", "10.0.1.3:5001"], ["10.0.0.4:5000"]]'}, "10.0.0.3"),
        ({"MLX_JACCL_COORDINATOR": "10.0.0.5:3000"}, "10.0.0.5"),
        ({}, ""),
    ],
)
def test_rank_0_s_host_comes_from_the_group_s_description(tmp_path, environ, host):
    if "MLX_HOSTFILE" in environ:
        path = tmp_path / "hosts.json"
        path.write_text(environ["MLX_HOSTFILE"])
        environ = {"MLX_HOSTFILE": str(path)}
    assert lifeline.rank0_host(environ) == host
