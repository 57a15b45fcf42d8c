"""Prometheus metrics: the series, the recording methods, the scrape endpoint.

Owns every ``localai_mlx_*`` series (latency histograms, load gauges, token, cache,
speculation, finish and error counters, memory gauges), the HTTP endpoint that serves
them (off by default; ``--metrics-addr HOST:PORT`` or ``$LOCALAI_MLX_METRICS_ADDR``
turns it on), and ``snapshot()``, the same figures as a plain dict for GetMetrics' JSON.
``NullMetrics`` has the same methods and does nothing, so callers never branch.

Threads: the recording methods are called from the engine thread (and the servicer's
event loop for errors); each is a few locked additions, with no I/O and nothing that
waits on another thread. The endpoint serves from its own thread and reads only this
module's values: gauges are pushed (``set_load``, ``set_memory``), never pulled from
the engine or MLX. It is one thread whatever the number of connections (an asyncio
loop; an idle connection is closed after ``IDLE_TIMEOUT``). Each ``Metrics`` has a
private ``CollectorRegistry``, so several can live in one process (tests). The endpoint
has no authentication (the gRPC bearer token does not cover it): a bare port binds
127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import threading
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector

from decoding.finish import FinishReason

logger = logging.getLogger("localai.mlx." + __name__)

ADDR_ENV = "LOCALAI_MLX_METRICS_ADDR"
DEFAULT_HOST = "127.0.0.1"  # the endpoint has no auth: loopback unless told otherwise
PREFIX = "localai_mlx_"

# Seconds. A CPU or Apple-silicon server: a cached short prompt answers in milliseconds,
# a long cold prefill on a CPU takes tens of seconds.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
)  # fmt: skip
# Seconds between two tokens of one request: decode steps live in 5-200 ms; finer there.
TOKEN_GAP_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
)  # fmt: skip
# Seconds for a whole request: 512 tokens at a CPU's 5 tok/s is ~100 s, hence past 60.
E2E_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
# Sequences decoded together in one step (up to max_batch_size, default 256).
BATCH_ROW_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)

TIERS = ("memory", "disk")
PROMPT_SOURCES = ("prefill", *TIERS)  # where a prompt token's KV came from
FINISH_REASONS = (*(reason.value for reason in FinishReason), "error")
MEMORY_KINDS = (
    "weights", "kv", "prompt_cache", "prompt_cache_disk", "mlx_active", "mlx_peak", "mlx_cache",
    "budget", "reserved",
)  # fmt: skip
# grpc.StatusCode names; anything else counts as UNKNOWN (labels stay bounded).
STATUS_CODES = frozenset(
    {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
     "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
     "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
     "UNAUTHENTICATED"}
)  # fmt: skip
# Why a request's prompt was mostly prefilled although the prompt cache is on
# (engine/divergence.py says when and how each is told).
MISS_REASONS = ("cold", "diverged", "evicted", "untrimmable")
# Which way preemption moved a sequence's KV (engine/preemption.py).
PREEMPTION_DIRECTIONS = ("to_cache", "from_cache")
OTHER = "other"  # the label value of a finish reason or tier this module does not know


# ---------------------------------------------------------------------- address
def parse_addr(text: str, what: str = "--metrics-addr") -> tuple[str, int]:
    """``(host, port)`` of ``text``: ``HOST:PORT``, ``[IPv6]:PORT``, ``:PORT`` or ``PORT``.

    A missing host is 127.0.0.1 (the endpoint has no authentication); port 0 picks a
    free port when serving. Raises ValueError naming ``what`` and the expected form.
    """
    raw = text.strip()

    def bad(why: str) -> ValueError:
        return ValueError(
            f"{what} {text!r}: {why}; expected HOST:PORT (e.g. 127.0.0.1:9090, "
            f"[::1]:9090, localhost:9090, 0.0.0.0:9090 for every interface, or a bare "
            f"port for {DEFAULT_HOST}; port 0 picks a free one)"
        )

    if not raw:
        raise bad("empty")
    if "://" in raw or "/" in raw:
        raise bad("give the address alone, without a scheme or path")
    if raw.startswith("["):
        host, sep, rest = raw[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise bad("an IPv6 address in brackets needs a port after it: [::1]:9090")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise bad(f"{host!r} is not an IPv6 address") from None
        port_text = rest[1:]
    elif raw.count(":") > 1:
        raise bad("write an IPv6 address in brackets: [::1]:9090")
    elif ":" in raw:
        host, _, port_text = raw.partition(":")
        host = host or DEFAULT_HOST
    else:
        host, port_text = DEFAULT_HOST, raw
    if not host.replace("-", "").replace(".", "").replace("_", "").isalnum() and ":" not in host:
        raise bad(f"{host!r} is not a host name or IP address")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise bad(f"the port {port_text!r} is not a number from 0 to 65535")
    return host, int(port_text)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---------------------------------------------------------------------- endpoint
# Own server, not prometheus_client's start_http_server: that one starts a thread per
# connection with no idle timeout (300 idle connections: 300 threads). Here one thread
# runs an asyncio loop; an idle connection costs a socket, never a thread, and is closed
# after IDLE_TIMEOUT or when MAX_IDLE newer ones wait. The reply is prometheus_client's
# own exposition (``choose_encoder``: text format or OpenMetrics, as the scraper asks).
IDLE_TIMEOUT = 10.0  # seconds a connection may take to send its request or read the reply
MAX_IDLE = 64  # connections waiting for their request at once; the oldest goes first
MAX_HEAD = 16 * 1024  # bytes of request line and headers


class _Endpoint:
    """``/metrics`` of ``registry`` over HTTP/1.1 on ``host:port`` (IPv4 or IPv6, as the
    name resolves), served from one daemon thread. Raises OSError when binding fails."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        family, *_, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        self.sock = socket.create_server(sockaddr[:2], family=family)
        self.address = (str(self.sock.getsockname()[0]), int(self.sock.getsockname()[1]))
        self.registry = registry
        self.loop = asyncio.new_event_loop()
        self.stopping = asyncio.Event()
        self.open: dict[asyncio.StreamWriter, asyncio.Task] = {}  # a task per connection
        self.idle: dict[asyncio.StreamWriter, None] = {}  # waiting for a request, oldest first
        self.thread = threading.Thread(target=self._run, name="metrics-http", daemon=True)
        self.thread.start()

    def stop(self, timeout: float) -> None:
        """Close the socket and end the thread (waits up to ``timeout`` seconds)."""
        with contextlib.suppress(RuntimeError):  # the loop has already ended
            self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(timeout)

    def _run(self) -> None:
        try:
            self.loop.run_until_complete(self._serve())
        finally:
            self.loop.close()
            self.sock.close()

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._answer, sock=self.sock, limit=MAX_HEAD)
        async with server:
            await self.stopping.wait()
        tasks = list(self.open.values())
        for writer in list(self.open):
            writer.close()  # the handler's read or write ends; it returns
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.open[writer] = task
        self.idle[writer] = None
        while len(self.idle) > MAX_IDLE:  # too many wait: close the oldest (its read ends)
            oldest = next(iter(self.idle))
            del self.idle[oldest]
            oldest.close()
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT)
            finally:
                self.idle.pop(writer, None)
            writer.write(self._reply(head))
            await asyncio.wait_for(writer.drain(), IDLE_TIMEOUT)
        except (
            TimeoutError,
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ):
            pass  # idle too long, closed early, or a head over MAX_HEAD: drop it
        finally:
            writer.close()
            self.open.pop(writer, None)

    def _reply(self, head: bytes) -> bytes:
        """The whole HTTP response to a request ``head`` (any path answers)."""
        lines = head.decode("latin-1").split("\r\n")
        method = lines[0].split(" ", 1)[0]
        if method not in ("GET", "HEAD"):
            return _response(
                "405 Method Not Allowed", "text/plain", b"GET only\n", "Allow: GET, HEAD\r\n"
            )
        accept = ""
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "accept":
                accept = value.strip()
        encoder, content_type = choose_encoder(accept)
        body = encoder(self.registry)
        return _response("200 OK", content_type, body, head_only=method == "HEAD")


def _response(
    status: str, content_type: str, body: bytes, extra: str = "", head_only: bool = False
) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
    )
    return head.encode("latin-1") + (b"" if head_only else body)


# ---------------------------------------------------------------------- metrics
def _n(value: float) -> int | float:
    """A sample as JSON shows it: whole numbers (counts, tokens, bytes) as int."""
    return int(value) if float(value).is_integer() else value


class Metrics:
    """The backend's Prometheus series, in a private registry, and their endpoint.

    Build it, ``start(host, port)`` to serve ``/metrics`` (any path answers), record
    from the engine thread, ``stop()`` at shutdown. Every recording method is cheap,
    thread-safe, never raises on odd values (negative counts count as 0; an unknown
    finish reason or tier is labelled ``other``; an unknown status code ``UNKNOWN``)
    and does no I/O.
    """

    enabled = True

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # Standard process_* series (RSS, CPU seconds, open fds) from /proc, read on the
        # scrape thread; on a CPU server RSS is the real memory figure. None on macOS.
        ProcessCollector(registry=self.registry)
        r = self.registry
        self._ttft = Histogram(
            PREFIX + "time_to_first_token_seconds",
            "Seconds from a request's arrival to its first generated token.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._gap = Histogram(
            PREFIX + "inter_token_latency_seconds",
            "Seconds between two consecutive generated tokens of one request.",
            buckets=TOKEN_GAP_BUCKETS,
            registry=r,
        )
        self._e2e = Histogram(
            PREFIX + "e2e_request_latency_seconds",
            "Seconds from a request's arrival to its end (finished, cancelled or failed).",
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self._queue = Histogram(
            PREFIX + "request_queue_time_seconds",
            "Seconds a request waited before the scheduler admitted it.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._rows = Histogram(
            PREFIX + "decode_batch_rows",
            "Sequences decoded together per decode step (count = steps).",
            buckets=BATCH_ROW_BUCKETS,
            registry=r,
        )
        self._running = Gauge(
            PREFIX + "requests_running", "Requests being decoded now.", registry=r
        )
        self._waiting = Gauge(
            PREFIX + "requests_waiting", "Requests queued, not yet admitted.", registry=r
        )
        prompt = Counter(
            PREFIX + "prompt_tokens",
            "Prompt tokens of finished requests, by where their KV came from: computed "
            "(prefill) or served by the prompt cache's memory or disk tier.",
            ["source"],
            registry=r,
        )
        self._prompt = {s: prompt.labels(source=s) for s in PROMPT_SOURCES}
        self._prompt_family = prompt
        self._generated = Counter(
            PREFIX + "generation_tokens", "Tokens generated by finished requests.", registry=r
        )
        self._finished_family = Counter(
            PREFIX + "requests_finished",
            "Requests ended, by finish reason (stop, length, cancelled, error).",
            ["finish_reason"],
            registry=r,
        )
        self._finished = {f: self._finished_family.labels(finish_reason=f) for f in FINISH_REASONS}
        self._errors = Counter(
            PREFIX + "request_errors",
            "Calls that ended with a gRPC error, by status code.",
            ["code"],
            registry=r,
        )
        hits = Counter(
            PREFIX + "prompt_cache_hits",
            "Prompt-cache lookups that served part of the prompt, by the tier that served it.",
            ["tier"],
            registry=r,
        )
        self._hits = {t: hits.labels(tier=t) for t in TIERS}
        self._misses = Counter(
            PREFIX + "prompt_cache_misses",
            "Prompt-cache lookups that served nothing.",
            registry=r,
        )
        reasons = Counter(
            PREFIX + "prompt_cache_miss_reasons",
            "Requests the prompt cache served less than half the prompt of, by reason: "
            "cold (nothing stored for the model), diverged (the nearest stored prompt "
            "parts early; the debug log shows where), evicted (an entry evicted to honour the "
            "cache's bounds would have served half), untrimmable (a stored prompt shares "
            "more but its KV cannot be cut back).",
            ["reason"],
            registry=r,
        )
        self._reasons = {m: reasons.labels(reason=m) for m in MISS_REASONS}
        self._reasons_family = reasons
        evictions = Counter(
            PREFIX + "prompt_cache_evictions",
            "Prompt-cache entries dropped to stay within the cache's bounds, by tier.",
            ["tier"],
            registry=r,
        )
        self._evictions = {t: evictions.labels(tier=t) for t in TIERS}
        self._cache = {"hit": self._hits, "eviction": self._evictions}
        self._hits_family, self._evictions_family = hits, evictions
        self._drafted = Counter(
            PREFIX + "spec_decode_draft_tokens",
            "Draft tokens proposed for verification (draft model or n-gram speculation).",
            registry=r,
        )
        self._accepted = Counter(
            PREFIX + "spec_decode_accepted_tokens",
            "Draft tokens the model accepted.",
            registry=r,
        )
        self._preemptions = Counter(
            PREFIX + "preemptions",
            "Sequences preempted because the memory budget could not hold the running "
            "set's KV after the next step (the newest gives way; it resumes later).",
            registry=r,
        )
        self._resumes = Counter(
            PREFIX + "preemption_resumes",
            "Preempted sequences resumed (from the prompt cache, or recomputed).",
            registry=r,
        )
        moved = Counter(
            PREFIX + "preemption_kv_bytes",
            "KV bytes preemption moved, by direction: to_cache (a preempted sequence's KV "
            "stored in the prompt cache) and from_cache (what a resumed one took back).",
            ["direction"],
            registry=r,
        )
        self._moved = {d: moved.labels(direction=d) for d in PREEMPTION_DIRECTIONS}
        memory = Gauge(
            PREFIX + "memory_bytes",
            "Memory in bytes, by kind: weights, kv (running batch), prompt_cache (memory "
            "tier), prompt_cache_disk (bytes on disk), mlx_active, mlx_peak, mlx_cache.",
            ["kind"],
            registry=r,
        )
        self._memory = {k: memory.labels(kind=k) for k in MEMORY_KINDS}
        # What snapshot() reports, under these keys (the names without prefix and _total).
        self._snapshot_of: dict[str, Any] = {
            "time_to_first_token_seconds": self._ttft,
            "inter_token_latency_seconds": self._gap,
            "e2e_request_latency_seconds": self._e2e,
            "request_queue_time_seconds": self._queue,
            "decode_batch_rows": self._rows,
            "requests_running": self._running,
            "requests_waiting": self._waiting,
            "requests_finished": self._finished_family,
            "request_errors": self._errors,
            "prompt_tokens": prompt,
            "generation_tokens": self._generated,
            "prompt_cache_hits": hits,
            "prompt_cache_misses": self._misses,
            "prompt_cache_evictions": evictions,
            "prompt_cache_miss_reasons": reasons,
            "spec_decode_draft_tokens": self._drafted,
            "spec_decode_accepted_tokens": self._accepted,
            "memory_bytes": memory,
            "preemptions": self._preemptions,
            "preemption_resumes": self._resumes,
            "preemption_kv_bytes": moved,
        }
        self._totals: dict[tuple[str, str], int] = {}  # cache_totals' last readings
        self._totals_lock = threading.Lock()
        self._endpoint: _Endpoint | None = None
        self._thread: threading.Thread | None = None
        self.address: tuple[str, int] | None = None  # (host, port) bound once serving

    # ------------------------------------------------------------------ endpoint
    def start(self, host: str = DEFAULT_HOST, port: int = 0) -> tuple[str, int]:
        """Serve the registry over HTTP on ``host:port`` from a daemon thread; returns
        the bound ``(host, port)`` (port 0 picks a free one). Raises OSError saying
        which address could not be bound, RuntimeError when already serving."""
        if self._endpoint is not None:
            raise RuntimeError(f"metrics already served on {_join(*self._endpoint.address)}")
        try:
            self._endpoint = _Endpoint(self.registry, host, port)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"cannot serve metrics on {_join(host, port)}: {exc.strerror or exc}; "
                "choose another --metrics-addr (port 0 picks a free one)",
            ) from exc
        self._thread = self._endpoint.thread
        self.address = self._endpoint.address
        return self.address

    @property
    def url(self) -> str:
        """``http://host:port/metrics`` once serving; "" before."""
        return f"http://{_join(*self.address)}/metrics" if self.address else ""

    def stop(self, timeout: float = 2.0) -> None:
        """Shut the endpoint down and close its socket (waits up to ``timeout`` seconds
        for its thread; connections still open are dropped); idempotent."""
        endpoint, self._endpoint = self._endpoint, None
        if endpoint is not None:
            endpoint.stop(timeout)

    # ------------------------------------------------------------------ requests
    def request_started(self, queue_s: float) -> None:
        """The scheduler admitted a request that waited ``queue_s`` seconds."""
        self._queue.observe(max(0.0, queue_s))

    def first_token(self, ttft_s: float) -> None:
        """A request's first token, ``ttft_s`` seconds after it arrived."""
        self._ttft.observe(max(0.0, ttft_s))

    def token_gap(self, seconds: float) -> None:
        """A token came ``seconds`` after the previous token of the same request."""
        self._gap.observe(max(0.0, seconds))

    def request_finished(
        self,
        e2e_s: float,
        finish_reason: str | None,
        prompt_tokens: int = 0,
        cached_tokens: int = 0,
        tier: str = "memory",
        generated_tokens: int = 0,
    ) -> None:
        """A request ended ``e2e_s`` seconds after it arrived.

        ``finish_reason``: stop, length, cancelled, or None / "error" for an error.
        ``prompt_tokens``: the whole prompt; ``cached_tokens`` of them came from the
        prompt cache's ``tier`` ("memory" or "disk"), the rest were prefilled.
        ``generated_tokens``: tokens generated.
        """
        self._e2e.observe(max(0.0, e2e_s))
        reason = finish_reason or "error"
        child = self._finished.get(reason)
        if child is None:
            child = self._finished_family.labels(finish_reason=OTHER)
        child.inc()
        prompt = max(0, prompt_tokens)
        cached = min(prompt, max(0, cached_tokens))
        self._prompt["prefill"].inc(prompt - cached)
        if cached:
            source = self._prompt.get(tier) if tier in TIERS else None
            if source is None:
                source = self._prompt_family.labels(source=OTHER)
            source.inc(cached)
        self._generated.inc(max(0, generated_tokens))

    def request_failed(self, code_name: str) -> None:
        """A call ended with gRPC status ``code_name`` (a ``grpc.StatusCode`` name, e.g.
        ``INVALID_ARGUMENT``; case does not matter)."""
        code = str(code_name).upper()
        self._errors.labels(code=code if code in STATUS_CODES else "UNKNOWN").inc()

    # ------------------------------------------------------------------ steps and caches
    def step(self, batch_rows: int) -> None:
        """One decode step over ``batch_rows`` sequences (batch rows and solo runs)."""
        self._rows.observe(max(0, batch_rows))

    def cache_event(self, kind: str, tier: str = "memory", count: int = 1) -> None:
        """``count`` prompt-cache events of ``kind``: "hit" (``tier`` served part of a
        prompt), "miss" (no tier served anything; ``tier`` is ignored) or "eviction"
        (``tier`` dropped entries). Other kinds are ignored."""
        n = max(0, count)
        if kind == "miss":
            self._misses.inc(n)
            return
        by_tier = self._cache.get(kind)
        if by_tier is None:
            return
        child = by_tier.get(tier)
        if child is None:
            family = self._hits_family if kind == "hit" else self._evictions_family
            child = family.labels(tier=OTHER)
        child.inc(n)

    def cache_miss(self, reason: str) -> None:
        """One request the prompt cache mostly missed, for ``reason`` (one of
        `MISS_REASONS`; another counts as ``other``)."""
        child = self._reasons.get(reason)
        if child is None:
            child = self._reasons_family.labels(reason=OTHER)
        child.inc()

    def cache_totals(
        self,
        tier: str = "memory",
        *,
        hits: int | None = None,
        misses: int | None = None,
        evictions: int | None = None,
    ) -> None:
        """Mirror cumulative counts a cache keeps itself (``CacheStats.evictions``,
        ``DiskCacheStats.evictions``): the counters grow by what grew since the last
        call for this ``tier``. A total lower than last time means a new cache (a model
        reload): its whole value counts. Use this or ``cache_event`` for a counter,
        not both."""
        for kind, total in (("hit", hits), ("miss", misses), ("eviction", evictions)):
            if total is None:
                continue
            with self._totals_lock:
                last = self._totals.get((kind, tier), 0)
                self._totals[(kind, tier)] = total
            grown = total - last if total >= last else total
            if grown > 0:
                self.cache_event(kind, tier, grown)

    def speculation(self, drafted: int, accepted: int) -> None:
        """Speculative decoding proposed ``drafted`` draft tokens, ``accepted`` kept."""
        self._drafted.inc(max(0, drafted))
        self._accepted.inc(max(0, accepted))

    def preempted(self, nbytes: int) -> None:
        """A sequence was preempted; ``nbytes`` of its KV went to the prompt cache."""
        self._preemptions.inc()
        self._moved["to_cache"].inc(max(0, nbytes))

    def resumed(self, nbytes: int) -> None:
        """A preempted sequence resumed; ``nbytes`` of its KV came from the prompt cache."""
        self._resumes.inc()
        self._moved["from_cache"].inc(max(0, nbytes))

    # ------------------------------------------------------------------ gauges
    def set_load(self, running: int, waiting: int) -> None:
        """Requests decoding now (``running``) and queued (``waiting``)."""
        self._running.set(running)
        self._waiting.set(waiting)

    def set_memory(
        self,
        *,
        weights: int | None = None,
        kv: int | None = None,
        prompt_cache: int | None = None,
        prompt_cache_disk: int | None = None,
        mlx_active: int | None = None,
        mlx_peak: int | None = None,
        mlx_cache: int | None = None,
        budget: int | None = None,
        reserved: int | None = None,
    ) -> None:
        """Memory in bytes (None leaves a value as it was): model ``weights``, ``kv`` of
        the running batch, the prompt cache's memory tier and its disk tier (bytes on
        disk), MLX's active, peak (since the last LoadModel) and cache memory, the memory
        ``budget`` (0: off) and the KV ``reserved`` by admitted requests."""
        values = (
            weights, kv, prompt_cache, prompt_cache_disk, mlx_active, mlx_peak, mlx_cache,
            budget, reserved,
        )  # fmt: skip
        for kind, value in zip(MEMORY_KINDS, values, strict=True):
            if value is not None:
                self._memory[kind].set(value)

    # ------------------------------------------------------------------ reading
    def snapshot(self) -> dict[str, Any]:
        """Every series as plain values, for JSON: histograms as ``{"count", "sum"}``
        (sum in the series' unit), labelled series as ``{label value: value}``, others
        as a number. Keys are the series names without ``localai_mlx_`` and ``_total``."""
        out: dict[str, Any] = {}
        for key, metric in self._snapshot_of.items():
            for family in metric.collect():
                if family.type == "histogram":
                    got = {s.name.rsplit("_", 1)[1]: s.value for s in family.samples}
                    out[key] = {"count": int(got.get("count", 0)), "sum": got.get("sum", 0.0)}
                    continue
                values = [s for s in family.samples if not s.name.endswith("_created")]
                if values and values[0].labels:
                    out[key] = {next(iter(s.labels.values())): _n(s.value) for s in values}
                else:
                    out[key] = _n(values[0].value) if values else 0
        return out


class NullMetrics:
    """``Metrics`` when metrics are off: the same methods, doing nothing."""

    enabled = False
    address: tuple[str, int] | None = None
    url = ""

    def start(self, host: str = DEFAULT_HOST, port: int = 0) -> tuple[str, int]:
        raise RuntimeError("metrics are off: set --metrics-addr or $" + ADDR_ENV)

    def stop(self, timeout: float = 2.0) -> None:
        pass

    def request_started(self, queue_s: float) -> None:
        pass

    def first_token(self, ttft_s: float) -> None:
        pass

    def token_gap(self, seconds: float) -> None:
        pass

    def request_finished(
        self,
        e2e_s: float,
        finish_reason: str | None,
        prompt_tokens: int = 0,
        cached_tokens: int = 0,
        tier: str = "memory",
        generated_tokens: int = 0,
    ) -> None:
        pass

    def request_failed(self, code_name: str) -> None:
        pass

    def step(self, batch_rows: int) -> None:
        pass

    def cache_event(self, kind: str, tier: str = "memory", count: int = 1) -> None:
        pass

    def cache_miss(self, reason: str) -> None:
        pass

    def cache_totals(
        self,
        tier: str = "memory",
        *,
        hits: int | None = None,
        misses: int | None = None,
        evictions: int | None = None,
    ) -> None:
        pass

    def speculation(self, drafted: int, accepted: int) -> None:
        pass

    def preempted(self, nbytes: int) -> None:
        pass

    def resumed(self, nbytes: int) -> None:
        pass

    def set_load(self, running: int, waiting: int) -> None:
        pass

    def set_memory(
        self,
        *,
        weights: int | None = None,
        kv: int | None = None,
        prompt_cache: int | None = None,
        prompt_cache_disk: int | None = None,
        mlx_active: int | None = None,
        mlx_peak: int | None = None,
        mlx_cache: int | None = None,
        budget: int | None = None,
        reserved: int | None = None,
    ) -> None:
        pass

    def snapshot(self) -> dict[str, Any]:
        return {}


NULL = NullMetrics()
Recorder = Metrics | NullMetrics  # what engine, scheduler and servicer hold


# ---------------------------------------------------------------------- start-up
def add_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--metrics-addr`` to ``parser`` (default None: ``$LOCALAI_MLX_METRICS_ADDR``)."""
    parser.add_argument(
        "--metrics-addr",
        default=None,
        metavar="HOST:PORT",
        help=f"serve Prometheus metrics over HTTP on HOST:PORT ([::1]:PORT for IPv6; a "
        f"bare PORT binds {DEFAULT_HOST}; 0 picks a free port). No authentication: keep "
        f'it on loopback or a trusted network. Default ${ADDR_ENV}, else off; "" = off',
    )


def from_settings(addr: str | None, environ: Mapping[str, str] | None = None) -> Recorder:
    """The metrics for this process: ``addr`` (the flag's value) or, when None,
    ``$LOCALAI_MLX_METRICS_ADDR``; empty or unset means off (``NULL``). Otherwise a
    started ``Metrics``, its address logged. Raises ValueError for a malformed address
    (naming the flag or the variable), OSError when it cannot be bound."""
    env = os.environ if environ is None else environ
    what = "--metrics-addr"
    if addr is None:
        addr, what = env.get(ADDR_ENV, ""), "$" + ADDR_ENV
    if not addr.strip():
        return NULL
    host, port = parse_addr(addr, what)
    metrics = Metrics()
    metrics.start(host, port)
    logger.info("Prometheus metrics on %s", metrics.url)
    return metrics
