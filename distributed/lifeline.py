"""Lifelines: one idle TCP connection from every other rank to rank 0, so that a rank
that dies is noticed at once, whatever MLX's collectives do.

Why our own: a lost peer does not reliably reach rank 0 through MLX. The ring backend's
per-socket I/O thread fails the tasks it holds when the peer's socket closes and then
ends (mlx/distributed/ring/ring.cpp, ``SocketThread::worker``), so a collective that
queues on that socket afterwards waits for ever, and the error of a failed collective
stays on the stream until the step's last op has run; rank 0 was then freed only by the
step watchdog (60 s). A lifeline carries nothing after its hello: the kernel closes it
when its process ends (SIGKILL included) and ``select`` on rank 0 sees that at once.
TCP keepalive covers a machine that vanishes without closing it (about 11 s).
A rank that hangs keeps its lifeline open: that is still the watchdog's job.

Every rank calls ``connect`` at the same point after the group forms (it exchanges one
integer over MLX: rank 0's listening port, 0 when it has none). Rank 0 listens on its
own address in the group's hostfile (``MLX_HOSTFILE`` for ring, set by ``mlx.launch``
and by ``distributed/group.py``; ``MLX_JACCL_COORDINATOR`` for JACCL). Without one (MPI,
NCCL), or when a rank cannot connect in time, there are no lifelines (logged) and the
group relies on MLX's errors and the watchdog, as before.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distributed.collectives import Collectives

logger = logging.getLogger("localai.mlx.distributed")

CONNECT_TIMEOUT = 10.0  # seconds rank 0 waits for every rank's lifeline after the exchange
KEEPALIVE = (5, 2, 3)  # TCP keepalive: idle seconds, interval seconds, probes (~11 s in all)
ORPHAN_GRACE = 5.0  # seconds a rank waits, once rank 0's lifeline closed, before it exits


def rank0_host(environ: dict[str, str] | None = None) -> str:
    """Rank 0's IP address in the group's description ("" when there is none): the
    first entry of the ring hostfile ``$MLX_HOSTFILE`` or ``$MLX_JACCL_COORDINATOR``."""
    env = os.environ if environ is None else environ
    path = env.get("MLX_HOSTFILE", "")
    address = ""
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                entries = json.load(f)
            first = entries[0]
            address = first if isinstance(first, str) else first[0]
        except (OSError, ValueError, TypeError, IndexError, KeyError):
            address = ""
    address = address or env.get("MLX_JACCL_COORDINATOR", "")
    if not isinstance(address, str) or ":" not in address:
        return ""
    return address.rsplit(":", 1)[0].strip("[]")


class Lifelines:
    """One rank's lifelines: on rank 0 one socket per other rank, elsewhere the one to
    rank 0. A thread waits on them; ``on_lost(reason)`` is called once when one closes
    or fails, unless ``close`` came first (a clean shutdown)."""

    def __init__(self, socks: dict[int, socket.socket], on_lost: Callable[[str], None]) -> None:
        self.socks = socks
        self.on_lost = on_lost
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="mlx-dist-lifeline", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching and close every lifeline (the other ends see them close)."""
        self._closing.set()
        for sock in self.socks.values():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _watch(self) -> None:
        with selectors.DefaultSelector() as sel:
            for rank, sock in self.socks.items():
                sel.register(sock, selectors.EVENT_READ, rank)
            while not self._closing.is_set():
                try:
                    ready = sel.select(timeout=1.0)
                except (OSError, ValueError):  # closed under us by close()
                    return
                for key, _ in ready:
                    reason = _read(key.fileobj, key.data)  # type: ignore[arg-type]
                    if reason is None:
                        continue
                    if not self._closing.is_set():
                        self.on_lost(reason)
                    return


def _read(sock: socket.socket, rank: int) -> str | None:
    """Why the lifeline of ``rank`` ended, or None when it is still open."""
    try:
        data = sock.recv(64)
    except BlockingIOError:
        return None
    except OSError as exc:
        return f"rank {rank}'s connection to this rank failed ({exc})"
    if data:
        return None  # nothing is sent after the hello; ignore it
    return f"rank {rank} is gone (its process ended: its connection to this rank closed)"


def connect(net: Collectives, on_lost: Callable[[str], None]) -> Lifelines | None:
    """Every rank, right after the group formed and before any other collective:
    set up the lifelines (one MLX ``all_sum``). Returns None without them (logged)."""
    host = rank0_host()
    if net.leader:
        server = _listen(host)
        port = net.broadcast_int(server.getsockname()[1] if server else 0)
        if server is None:
            return None
        with server:
            socks = _accept(server, net.size - 1)
        if len(socks) < net.size - 1:
            missing = sorted(set(range(1, net.size)) - set(socks))
            logger.warning(
                "ranks %s did not open their lifeline to rank 0 on port %d: a lost rank "
                "is noticed by MLX's errors or the step watchdog only",
                missing,
                port,
            )
        return Lifelines(socks, on_lost) if socks else None
    port = net.broadcast_int(0)
    if not port:
        return None
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
        sock.sendall(f"{net.rank}\n".encode())
    except OSError as exc:
        logger.warning(
            "rank %d cannot open its lifeline to rank 0 at %s:%d: %s", net.rank, host, port, exc
        )
        return None
    _keepalive(sock)
    return Lifelines({0: sock}, on_lost)


def _listen(host: str) -> socket.socket | None:
    if not host:
        logger.info("no rank 0 address in the group's description: no lifelines")
        return None
    try:
        return socket.create_server((host, 0))
    except OSError as exc:
        logger.warning("rank 0 cannot listen for lifelines on %s: %s", host, exc)
        return None


def _accept(server: socket.socket, count: int) -> dict[int, socket.socket]:
    """Up to ``count`` lifelines, each opened by a hello naming its rank."""
    socks: dict[int, socket.socket] = {}
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while len(socks) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        server.settimeout(left)
        try:
            conn, _ = server.accept()
        except OSError:
            continue
        try:
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            rank = _hello(conn)
        except (OSError, ValueError):
            rank = 0
        if not 0 < rank <= count:
            conn.close()
            continue
        conn.settimeout(None)
        _keepalive(conn)
        socks[rank] = conn
    return socks


def _hello(conn: socket.socket) -> int:
    """The rank a new lifeline's hello names (``"<rank>\\n"``); ValueError otherwise."""
    data = b""
    while not data.endswith(b"\n") and len(data) < 16:
        chunk = conn.recv(16 - len(data))
        if not chunk:
            break
        data += chunk
    return int(data)


def _keepalive(sock: socket.socket) -> None:
    """TCP keepalive, so a peer machine that vanished without closing shows too."""
    idle, interval, probes = KEEPALIVE
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        # Linux names the idle time TCP_KEEPIDLE, macOS TCP_KEEPALIVE.
        for name, value in (
            ("TCP_KEEPIDLE", idle),
            ("TCP_KEEPALIVE", idle),
            ("TCP_KEEPINTVL", interval),
            ("TCP_KEEPCNT", probes),
        ):
            option = getattr(socket, name, None)
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
