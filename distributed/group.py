"""Joining a group of processes: which group (``GroupSpec``), and getting every rank in.

Two ways to form one. MLX's launcher (``mlx.launch``) sets up the environment of every
rank itself: ``init_group`` joins it. LocalAI's worker protocol (``local-ai worker
mlx-distributed``) starts each process alone with a hostfile and a rank: ``group_spec``
checks that description, ``Joiner`` joins it once per process in a background thread,
after every rank met on rank 0's hostfile address (``_rendezvous``: plain sockets, so
every wait is bounded). LocalAI's environment names live here too.

MLX is imported only by the functions that join, so a hostfile can be checked without it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parsing.durations import parse_duration

if TYPE_CHECKING:
    import mlx.core as mx

logger = logging.getLogger("localai.mlx.distributed")

BACKENDS = ("ring", "jaccl")
HOSTFILE_ENV = "MLX_DISTRIBUTED_HOSTFILE"  # LocalAI's names (core/cli/worker)
RANK_ENV = "MLX_RANK"
BACKEND_ENV = "MLX_DISTRIBUTED_BACKEND"
COORDINATOR_ENV = "MLX_JACCL_COORDINATOR"
JOIN_TIMEOUT_ENV = "LOCALAI_MLX_JOIN_TIMEOUT"  # ours: seconds a rank waits for the others
JOIN_TIMEOUT = 600.0  # default of JOIN_TIMEOUT_ENV / --join-timeout
_RETRY_PAUSE = 1.0  # seconds between connection attempts while peers are not up


class JoinTimeout(TimeoutError):
    """The other ranks of the hostfile did not connect in time."""


def init_group(backend: str = "any") -> mx.distributed.Group:
    """Join the group MLX's launcher set up (``MLX_RANK``/``MLX_HOSTFILE`` for ring).

    Raises RuntimeError naming ``mlx.launch`` when this process was not launched as
    part of a group.
    """
    import mlx.core as mx

    try:
        return mx.distributed.init(strict=True, backend=backend)
    except RuntimeError as exc:
        raise RuntimeError(
            f"--distributed needs a process group ({exc}); start every rank with MLX's "
            "launcher, e.g. `mlx.launch -n 3 --backend ring ./run.sh --addr HOST:PORT "
            "--distributed tensor`, or `mlx.launch --hostfile hosts.json ...` for machines"
        ) from exc


# ---------------------------------------------------------------------- LocalAI's worker protocol
@dataclass(frozen=True)
class GroupSpec:
    """Which group a process joins: hostfile path (absolute), MLX backend, this rank,
    the JACCL coordinator ``ip:port`` ("" for ring), and the group size the file gives."""

    hostfile: str
    backend: str
    rank: int
    size: int
    coordinator: str = ""
    rendezvous: str = ""  # rank 0's "ip:port" where the ranks meet before MLX's init

    def describe(self) -> str:
        return f"the {self.size}-rank {self.backend} group of {self.hostfile}"


def group_spec(hostfile: str, backend: str, rank: int, coordinator: str = "") -> GroupSpec:
    """Check a worker-protocol group description and read the hostfile's size.

    ``hostfile``: ring, a JSON array whose entry i is rank i's ``"ip:port"`` (MLX's
    list-of-lists form is accepted too); JACCL, a square JSON matrix of RDMA device names
    (``null`` on the diagonal). Raises ValueError naming what to change.
    """
    backend = (backend or "ring").strip().lower()
    if backend not in BACKENDS:
        raise ValueError(
            f"distributed backend must be one of {', '.join(BACKENDS)}, got {backend!r}"
        )
    if not hostfile:
        raise ValueError(
            "a distributed group needs a hostfile (--hostfile or option hostfile:PATH)"
        )
    path = os.path.abspath(os.path.expanduser(hostfile))
    try:
        with open(path, encoding="utf-8") as f:
            entries = json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read hostfile {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"hostfile {path} is not valid JSON: {exc}") from None
    example = '["192.168.1.10:5555", "192.168.1.11:5555"]'
    if backend == "ring":
        ok = isinstance(entries, list) and all(
            _is_address(e) or (isinstance(e, list) and e and all(_is_address(a) for a in e))
            for e in entries
        )
        if not ok:
            raise ValueError(
                f'ring hostfile {path} must be a JSON array of "ip:port" strings, entry i '
                f"being rank i's listen address, e.g. {example}"
            )
    else:
        ok = isinstance(entries, list) and all(
            isinstance(row, list)
            and len(row) == len(entries)
            and all(d is None or isinstance(d, str) for d in row)
            for row in entries
        )
        if not ok:
            raise ValueError(
                f"JACCL hostfile {path} must be a square JSON matrix of RDMA device names "
                'with null on the diagonal, e.g. [[null, "rdma_en2"], ["rdma_en2", null]]'
            )
    size = len(entries)
    if size < 2:
        raise ValueError(f"hostfile {path} lists {size} rank(s); a group needs at least 2")
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside hostfile {path}, which has ranks 0..{size - 1}")
    coordinator = (coordinator or "").strip() if backend == "jaccl" else ""
    if coordinator and not _is_address(coordinator):
        raise ValueError(f"the JACCL coordinator must be ip:port, got {coordinator!r}")
    if backend == "ring":
        meet = entries[0] if isinstance(entries[0], str) else entries[0][0]
    else:
        meet = coordinator
    return GroupSpec(path, backend, rank, size, coordinator, meet)


def _is_address(text: Any) -> bool:
    if not isinstance(text, str) or ":" not in text:
        return False
    host, port = text.rsplit(":", 1)
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def env_defaults() -> dict[str, str]:
    """The worker-protocol settings LocalAI passes through the environment."""
    return {
        "hostfile": os.environ.get(HOSTFILE_ENV, ""),
        "backend": os.environ.get(BACKEND_ENV, ""),
        "coordinator": os.environ.get(COORDINATOR_ENV, ""),
    }


def join_timeout_default() -> float:
    """``LOCALAI_MLX_JOIN_TIMEOUT`` (seconds, or "10m") or JOIN_TIMEOUT; ValueError names it."""
    text = os.environ.get(JOIN_TIMEOUT_ENV, "").strip()
    if not text:
        return JOIN_TIMEOUT
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ValueError(f"{JOIN_TIMEOUT_ENV}: {exc}") from None


def _init_spec(spec: GroupSpec, deadline: float) -> mx.distributed.Group:
    """Set the environment MLX's backend reads and join; retry while peers refuse
    connections, until ``deadline`` (monotonic). Raises RuntimeError from MLX."""
    import mlx.core as mx

    os.environ[RANK_ENV] = str(spec.rank)
    if spec.backend == "ring":
        os.environ["MLX_HOSTFILE"] = spec.hostfile
    else:
        os.environ["MLX_IBV_DEVICES"] = spec.hostfile
        if spec.coordinator:
            os.environ[COORDINATOR_ENV] = spec.coordinator
    if spec.rendezvous:
        _rendezvous(spec, deadline)
    else:
        logger.warning("JACCL without --coordinator: the wait for the other ranks is unbounded")
    while True:
        try:
            return mx.distributed.init(strict=True, backend=spec.backend)
        except RuntimeError as exc:
            # The ring backend's connecting side gives up after ~30 s ("Couldn't
            # connect"); a peer that is not up yet is normal here, so try again.
            if "connect" not in str(exc).lower() or time.monotonic() > deadline:
                raise
            logger.info("rank %d: the other ranks are not up yet (%s); retrying", spec.rank, exc)
            time.sleep(_RETRY_PAUSE)


def _rendezvous(spec: GroupSpec, deadline: float) -> None:
    """Meet every rank on rank 0's address before MLX's ``init``; JoinTimeout at
    ``deadline``.

    Why our own: MLX's ``init`` holds the GIL while its listening side waits for peers,
    with no timeout, which would freeze rank 0's gRPC server; these plain sockets wait
    without it. Rank 0 listens on its own hostfile address (MLX binds it right after),
    workers connect and send ``rank size``; once all ranks are in, rank 0 answers
    ``go`` and everyone calls ``init`` (whose connecting side retries for ~30 s).
    """
    host, port = spec.rendezvous.rsplit(":", 1)
    host = host.strip("[]")
    hello = f"{spec.rank} {spec.size}\n".encode()
    if spec.rank == 0:
        _gather(spec, host, int(port), deadline)
        return
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise JoinTimeout(f"rank {spec.rank} waited for rank 0 at {spec.rendezvous}")
        try:
            with socket.create_connection((host, int(port)), timeout=min(left, 5.0)) as conn:
                conn.sendall(hello)
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                reply = conn.makefile("rb").readline().decode(errors="replace").strip()
        except (ConnectionError, OSError):  # rank 0 not up yet, or it dropped us
            time.sleep(_RETRY_PAUSE)
            continue
        if reply == "go":
            return
        if reply:
            raise RuntimeError(f"rank 0 at {spec.rendezvous} refused this rank: {reply}")
        time.sleep(_RETRY_PAUSE)


def _gather(spec: GroupSpec, host: str, port: int, deadline: float) -> None:
    """Rank 0's side of ``_rendezvous``: wait for ranks 1..size-1, then answer go."""
    peers: dict[int, Any] = {}
    with socket.create_server((host, port), reuse_port=False) as server:
        server.settimeout(0.5)
        try:
            while len(peers) < spec.size - 1:
                if time.monotonic() > deadline:
                    raise JoinTimeout("rank 0 waited for the other ranks")
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                conn.settimeout(5.0)
                try:
                    rank, size = (int(x) for x in conn.makefile("rb").readline().split())
                except (OSError, ValueError):
                    conn.close()
                    continue
                if size != spec.size or not 0 < rank < spec.size:
                    conn.sendall(f"rank {rank} of {size} does not fit {spec.describe()}\n".encode())
                    conn.close()
                    continue
                if rank in peers:
                    peers.pop(rank).close()  # a restarted worker replaces its old link
                peers[rank] = conn
        except BaseException:
            for conn in peers.values():
                conn.close()
            raise
    for conn in peers.values():
        with contextlib.suppress(OSError):
            conn.sendall(b"go\n")
        conn.close()


class Joiner:
    """Joins one group for the life of the process, in a background thread.

    MLX's ``init`` has no timeout (the ring backend's listening side waits for its peers
    for ever), so it runs in a daemon thread and callers wait a bounded time. A wait
    that times out leaves the attempt running: the next ``join`` of the same spec waits
    for that same attempt; a different spec is refused (MLX joins one group per process).
    """

    def __init__(self) -> None:
        self.spec: GroupSpec | None = None
        self._future: concurrent.futures.Future[mx.distributed.Group] | None = None
        self._lock = threading.Lock()

    def join(self, spec: GroupSpec, timeout: float) -> mx.distributed.Group:
        """The group of ``spec`` (waiting up to ``timeout`` seconds).

        Raises JoinTimeout when the other ranks did not all connect in time, ValueError
        when this process already joins another group, RuntimeError from MLX otherwise.
        """
        with self._lock:
            if self.spec is not None and self.spec != spec:
                raise ValueError(
                    f"this process already joins {self.spec.describe()} as rank "
                    f"{self.spec.rank}; a process belongs to one group for its lifetime: "
                    "restart it to use another hostfile or backend"
                )
            if self._future is None or (self._future.done() and self._future.exception()):
                self.spec = spec
                self._future = concurrent.futures.Future()
                threading.Thread(
                    target=self._attempt,
                    args=(spec, self._future, time.monotonic() + timeout),
                    name="mlx-dist-join",
                    daemon=True,
                ).start()
            future = self._future
        try:
            return future.result(timeout=timeout)
        except (concurrent.futures.TimeoutError, JoinTimeout):
            raise JoinTimeout(
                f"rank {spec.rank} waited {timeout:g}s for the other ranks of {spec.describe()}"
            ) from None

    @staticmethod
    def _attempt(spec: GroupSpec, future: concurrent.futures.Future, deadline: float) -> None:
        try:
            future.set_result(_init_spec(spec, deadline))
        except BaseException as exc:  # handed to the waiting caller
            future.set_exception(exc)
