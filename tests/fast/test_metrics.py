"""engine.metrics: the Prometheus series over real HTTP, snapshot(), NullMetrics, addresses.

Fast tier: no model, no backend process; every endpoint binds port 0.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import socket
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine import metrics as metrics_mod
from engine.metrics import ADDR_ENV, NULL, Metrics, NullMetrics, from_settings, parse_addr


def scrape(m: Metrics) -> dict[str, list]:
    """{family name: samples} of ``m``'s endpoint, fetched over HTTP and parsed."""
    with urllib.request.urlopen(m.url, timeout=5) as reply:
        assert reply.status == 200
        text = reply.read().decode("utf-8")
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(families: dict[str, list], sample: str, **labels: str) -> float:
    """The value of the sample named ``sample`` with exactly ``labels``."""
    for samples in families.values():
        for s in samples:
            if s.name == sample and s.labels == labels:
                return s.value
    raise AssertionError(f"no sample {sample}{labels or ''}")


@pytest.fixture
def served():
    m = Metrics()
    host, port = m.start("127.0.0.1", 0)
    assert host == "127.0.0.1" and port > 0
    try:
        yield m
    finally:
        m.stop()


def record_known_sequence(m: Metrics) -> None:
    """Three requests (stop, stop, length), one cancelled, errors, steps, caches, gauges."""
    for queue_s, ttft in ((0.0, 0.1), (0.5, 0.2), (1.0, 0.3)):
        m.request_started(queue_s)
        m.first_token(ttft)
    for gap in (0.01, 0.02, 0.03, 0.04):
        m.token_gap(gap)
    m.request_finished(1.0, "stop", prompt_tokens=100, cached_tokens=60, generated_tokens=5)
    m.request_finished(2.0, "stop", 50, 40, "disk", 7)
    m.request_finished(4.0, "length", 10, 0, "memory", 16)
    m.request_finished(0.25, "cancelled", 0, 0, generated_tokens=0)
    m.request_failed("INVALID_ARGUMENT")
    m.request_failed("invalid_argument")
    m.request_failed("RESOURCE_EXHAUSTED")
    for rows in (1, 2, 2, 8):
        m.step(rows)
    m.cache_event("hit", "memory")
    m.cache_event("hit", "disk")
    m.cache_event("miss")
    m.cache_event("miss", "disk")  # a miss has no tier
    m.cache_event("eviction", "memory", 3)
    m.speculation(drafted=12, accepted=9)
    m.speculation(4, 1)
    m.set_memory(weights=1000, kv=200, prompt_cache=300, mlx_active=1500, mlx_peak=2000)
    m.set_memory(budget=4096, reserved=512)
    m.set_memory(kv=250)  # the others stay
    m.set_load(running=2, waiting=5)


def test_scrape_reports_exact_counts_and_sums(served):
    record_known_sequence(served)
    f = scrape(served)
    p = "localai_mlx_"

    assert value(f, p + "time_to_first_token_seconds_count") == 3
    assert value(f, p + "time_to_first_token_seconds_sum") == pytest.approx(0.6)
    # Cumulative buckets: 0.1 and 0.2 fall at or below 0.25, all three at or below 0.5.
    assert value(f, p + "time_to_first_token_seconds_bucket", le="0.25") == 2
    assert value(f, p + "time_to_first_token_seconds_bucket", le="0.5") == 3
    assert value(f, p + "time_to_first_token_seconds_bucket", le="+Inf") == 3
    assert value(f, p + "request_queue_time_seconds_count") == 3
    assert value(f, p + "request_queue_time_seconds_sum") == pytest.approx(1.5)
    assert value(f, p + "inter_token_latency_seconds_count") == 4
    assert value(f, p + "inter_token_latency_seconds_sum") == pytest.approx(0.1)
    assert value(f, p + "e2e_request_latency_seconds_count") == 4
    assert value(f, p + "e2e_request_latency_seconds_sum") == pytest.approx(7.25)

    assert value(f, p + "requests_finished_total", finish_reason="stop") == 2
    assert value(f, p + "requests_finished_total", finish_reason="length") == 1
    assert value(f, p + "requests_finished_total", finish_reason="cancelled") == 1
    assert value(f, p + "requests_finished_total", finish_reason="error") == 0
    assert value(f, p + "request_errors_total", code="INVALID_ARGUMENT") == 2
    assert value(f, p + "request_errors_total", code="RESOURCE_EXHAUSTED") == 1

    # 100 + 50 + 10 prompt tokens: 60 from memory, 40 from disk, 60 prefilled.
    assert value(f, p + "prompt_tokens_total", source="prefill") == 60
    assert value(f, p + "prompt_tokens_total", source="memory") == 60
    assert value(f, p + "prompt_tokens_total", source="disk") == 40
    assert value(f, p + "generation_tokens_total") == 28

    assert value(f, p + "decode_batch_rows_count") == 4
    assert value(f, p + "decode_batch_rows_sum") == 13
    assert value(f, p + "decode_batch_rows_bucket", le="2.0") == 3

    assert value(f, p + "prompt_cache_hits_total", tier="memory") == 1
    assert value(f, p + "prompt_cache_hits_total", tier="disk") == 1
    assert value(f, p + "prompt_cache_misses_total") == 2
    assert value(f, p + "prompt_cache_evictions_total", tier="memory") == 3
    assert value(f, p + "prompt_cache_evictions_total", tier="disk") == 0
    assert value(f, p + "spec_decode_draft_tokens_total") == 16
    assert value(f, p + "spec_decode_accepted_tokens_total") == 10

    assert value(f, p + "memory_bytes", kind="weights") == 1000
    assert value(f, p + "memory_bytes", kind="kv") == 250
    assert value(f, p + "memory_bytes", kind="prompt_cache") == 300
    assert value(f, p + "memory_bytes", kind="mlx_active") == 1500
    assert value(f, p + "memory_bytes", kind="mlx_peak") == 2000
    assert value(f, p + "memory_bytes", kind="mlx_cache") == 0
    assert value(f, p + "memory_bytes", kind="budget") == 4096
    assert value(f, p + "memory_bytes", kind="reserved") == 512
    assert value(f, p + "requests_running") == 2
    assert value(f, p + "requests_waiting") == 5


def test_series_follow_prometheus_naming(served):
    f = scrape(served)
    ours = {name: samples for name, samples in f.items() if name.startswith("localai_mlx_")}
    assert len(ours) >= 17
    for name in ours:
        assert name == name.lower() and "__" not in name
    # Counters are exposed with _total; durations in seconds, memory in bytes.
    sample_names = {s.name for samples in ours.values() for s in samples}
    assert "localai_mlx_generation_tokens_total" in sample_names
    assert "localai_mlx_memory_bytes" in sample_names
    assert "localai_mlx_e2e_request_latency_seconds_bucket" in sample_names


def test_snapshot_matches_the_scrape(served):
    record_known_sequence(served)
    snap = served.snapshot()
    assert snap["time_to_first_token_seconds"]["count"] == 3
    assert snap["time_to_first_token_seconds"]["sum"] == pytest.approx(0.6)
    assert snap["e2e_request_latency_seconds"]["count"] == 4
    assert snap["decode_batch_rows"] == {"count": 4, "sum": 13}
    assert snap["requests_finished"] == {"stop": 2, "length": 1, "cancelled": 1, "error": 0}
    assert snap["request_errors"] == {"INVALID_ARGUMENT": 2, "RESOURCE_EXHAUSTED": 1}
    assert snap["prompt_tokens"] == {"prefill": 60, "memory": 60, "disk": 40}
    assert snap["generation_tokens"] == 28
    assert snap["prompt_cache_hits"] == {"memory": 1, "disk": 1}
    assert snap["prompt_cache_misses"] == 2
    assert snap["prompt_cache_evictions"] == {"memory": 3, "disk": 0}
    assert snap["spec_decode_draft_tokens"] == 16
    assert snap["spec_decode_accepted_tokens"] == 10
    assert snap["memory_bytes"]["kv"] == 250
    assert snap["requests_running"] == 2 and snap["requests_waiting"] == 5
    assert isinstance(snap["generation_tokens"], int)
    json.dumps(snap)  # GetMetrics puts it in its JSON
    f = scrape(served)
    assert value(f, "localai_mlx_generation_tokens_total") == snap["generation_tokens"]


def test_snapshot_without_server_and_registries_are_private():
    a, b = Metrics(), Metrics()
    a.request_finished(1.0, "stop", 3, 0, "memory", 2)
    assert a.snapshot()["requests_finished"]["stop"] == 1
    assert b.snapshot()["requests_finished"]["stop"] == 0
    assert a.snapshot()["generation_tokens"] == 2 and b.snapshot()["generation_tokens"] == 0
    assert a.url == "" and a.address is None


def test_odd_values_never_raise_and_labels_stay_bounded():
    m = Metrics()
    m.request_finished(-1.0, "weird", -5, 10, "tape", -3)
    m.request_finished(1.0, None, 4, 9, "disk", 1)  # cached > prompt: capped at the prompt
    m.request_finished(1.0, "stop", 10, 4, "tape", 0)
    m.request_failed("NOT_A_CODE")
    m.cache_event("bogus")
    m.cache_event("hit", "tape", -2)
    m.cache_event("eviction", "tape")
    m.speculation(-1, -1)
    m.step(-3)
    m.first_token(-0.5)
    m.token_gap(-0.5)
    m.request_started(-1.0)
    snap = m.snapshot()
    assert snap["requests_finished"] == {
        "stop": 1,
        "length": 0,
        "cancelled": 0,
        "error": 1,
        "other": 1,
    }
    assert snap["prompt_tokens"] == {"prefill": 6, "memory": 0, "disk": 4, "other": 4}
    assert snap["request_errors"] == {"UNKNOWN": 1}
    assert snap["prompt_cache_hits"] == {"memory": 0, "disk": 0, "other": 0}
    assert snap["prompt_cache_evictions"]["other"] == 1
    assert snap["spec_decode_draft_tokens"] == 0
    assert snap["time_to_first_token_seconds"] == {"count": 1, "sum": 0.0}
    assert snap["decode_batch_rows"] == {"count": 1, "sum": 0}


def test_cache_totals_mirror_cumulative_counts():
    m = Metrics()
    m.cache_totals("memory", evictions=3)
    m.cache_totals("memory", evictions=5)  # +2
    m.cache_totals("memory", evictions=5)  # +0
    m.cache_totals("memory", evictions=2)  # a new cache (model reload): +2
    m.cache_totals("disk", evictions=4, hits=1, misses=6)
    m.cache_totals("disk", hits=1)
    snap = m.snapshot()
    assert snap["prompt_cache_evictions"] == {"memory": 7, "disk": 4}
    assert snap["prompt_cache_hits"] == {"memory": 0, "disk": 1}
    assert snap["prompt_cache_misses"] == 6


def test_recording_while_scraping(served):
    # Recording from one thread while the endpoint serves another: nothing lost.
    def record():
        for _ in range(2000):
            served.token_gap(0.01)
            served.step(4)

    worker = threading.Thread(target=record)
    worker.start()
    while worker.is_alive():
        scrape(served)
    worker.join()
    f = scrape(served)
    assert value(f, "localai_mlx_inter_token_latency_seconds_count") == 2000
    assert value(f, "localai_mlx_decode_batch_rows_sum") == 8000


def test_stop_closes_the_endpoint():
    m = Metrics()
    m.start("127.0.0.1", 0)
    url, thread = m.url, m._thread
    scrape(m)
    m.stop()
    m.stop()  # idempotent
    assert not thread.is_alive()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)


def test_idle_connections_take_no_thread_and_the_endpoint_still_answers(
    served, monkeypatch, caplog
):
    """300 connections that send nothing (issue 32: 300 threads before): the endpoint
    stays one thread, keeps at most MAX_IDLE of them (the oldest are closed), and a
    scrape still answers."""
    monkeypatch.setattr(metrics_mod, "MAX_IDLE", 16)
    threads_before = threading.active_count()
    idle = []
    try:
        for _ in range(300):
            idle.append(socket.create_connection(served.address, timeout=5))
        assert "localai_mlx_requests_running" in scrape(served)
        assert threading.active_count() <= threads_before  # no thread per connection
        idle[0].settimeout(5)
        assert idle[0].recv(1) == b""  # the oldest idle connection was closed
        idle[-1].sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while chunk := idle[-1].recv(65536):
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"localai_mlx_generation_tokens_total" in reply
    finally:
        for sock in idle:
            sock.close()
    served.stop()  # with connections still open on its side: they are closed, not leaked
    assert not served._thread.is_alive()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]  # closing them logged nothing


def test_an_idle_connection_is_closed_after_the_timeout(served, monkeypatch):
    monkeypatch.setattr(metrics_mod, "IDLE_TIMEOUT", 0.2)
    with socket.create_connection(served.address, timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")  # the headers never end
        assert sock.recv(1) == b""  # closed by the server, without a reply


def test_openmetrics_head_and_other_methods(served):
    served.request_finished(1.0, "stop", 3, 0, "memory", 2)
    accept = "application/openmetrics-text; version=1.0.0"
    req = urllib.request.Request(served.url, headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=5) as reply:
        assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
        text = reply.read().decode()
    assert "localai_mlx_generation_tokens_total 2.0" in text and text.endswith("# EOF\n")
    head = urllib.request.Request(served.url, method="HEAD")
    with urllib.request.urlopen(head, timeout=5) as reply:
        assert reply.status == 200 and reply.read() == b""
        assert int(reply.headers["Content-Length"]) > 0
    post = urllib.request.Request(served.url, data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(post, timeout=5)
    assert err.value.code == 405


def test_start_twice_and_busy_port():
    m = Metrics()
    m.start("127.0.0.1", 0)
    try:
        with pytest.raises(RuntimeError, match="already served"):
            m.start("127.0.0.1", 0)
        other = Metrics()
        with pytest.raises(OSError, match=r"cannot serve metrics on 127\.0\.0\.1:\d+.*--metrics"):
            other.start("127.0.0.1", m.address[1])
    finally:
        m.stop()


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_ipv6_endpoint():
    m = from_settings("[::1]:0", environ={})
    try:
        assert m.address[0] == "::1" and m.address[1] > 0
        assert m.url == f"http://[::1]:{m.address[1]}/metrics"
        assert "localai_mlx_requests_running" in scrape(m)
    finally:
        m.stop()


# ---------------------------------------------------------------------- NullMetrics
def _public(cls) -> dict[str, object]:
    return {n: v for n, v in vars(cls).items() if not n.startswith("_")}


def test_null_metrics_has_every_public_method_of_metrics():
    real = {n for n, v in _public(Metrics).items() if callable(v) or isinstance(v, property)}
    real |= {"enabled", "address"}  # attributes callers read
    null = _public(NullMetrics)
    missing = real - set(null)
    assert not missing, f"NullMetrics lacks {sorted(missing)}"
    for name, fn in _public(Metrics).items():
        if callable(fn):
            assert inspect.signature(fn) == inspect.signature(null[name]), name


def test_null_metrics_does_nothing():
    n = NullMetrics()
    assert n.enabled is False and n.url == "" and n.address is None
    n.request_started(0.1)
    n.first_token(0.1)
    n.token_gap(0.1)
    n.request_finished(1.0, "stop", 1, 0, "memory", 1)
    n.request_failed("INTERNAL")
    n.step(3)
    n.cache_event("hit", "disk")
    n.cache_totals("memory", evictions=1)
    n.speculation(3, 2)
    n.set_load(running=1, waiting=2)
    n.set_memory(weights=1, kv=2)
    n.stop()
    assert n.snapshot() == {}
    with pytest.raises(RuntimeError, match="--metrics-addr"):
        n.start()


# ---------------------------------------------------------------------- addresses
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9090", ("127.0.0.1", 9090)),
        ("0.0.0.0:9090", ("0.0.0.0", 9090)),
        ("localhost:0", ("localhost", 0)),
        ("metrics-host.example:8000", ("metrics-host.example", 8000)),
        ("[::1]:9090", ("::1", 9090)),
        ("[::]:65535", ("::", 65535)),
        (":9090", ("127.0.0.1", 9090)),
        ("9090", ("127.0.0.1", 9090)),
        ("  9090 ", ("127.0.0.1", 9090)),
        ("0", ("127.0.0.1", 0)),
    ],
)
def test_parse_addr(text, expected):
    assert parse_addr(text) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("::1:9090", "brackets"),
        ("[::1]", "needs a port"),
        ("[::1]9090", "needs a port"),
        ("[not-v6]:9090", "not an IPv6 address"),
        ("localhost", "not a number"),
        ("host:", "not a number"),
        ("host:http", "not a number"),
        ("host:65536", "from 0 to 65535"),
        ("host:-1", "not a number"),
        ("http://localhost:9090", "without a scheme"),
        ("localhost:9090/metrics", "without a scheme"),
        ("bad host:9090", "not a host name"),
    ],
)
def test_parse_addr_refuses_malformed(text, why):
    with pytest.raises(ValueError, match=why) as err:
        parse_addr(text)
    assert "expected HOST:PORT" in str(err.value)
    assert "--metrics-addr" in str(err.value)


def test_from_settings_flag_env_and_off():
    assert from_settings(None, environ={}) is NULL
    assert from_settings("", environ={ADDR_ENV: "127.0.0.1:0"}) is NULL  # "" = off
    assert from_settings(None, environ={ADDR_ENV: "  "}) is NULL
    with pytest.raises(ValueError, match=r"\$LOCALAI_MLX_METRICS_ADDR 'nope'"):
        from_settings(None, environ={ADDR_ENV: "nope"})
    with pytest.raises(ValueError, match="--metrics-addr 'nope'"):
        from_settings("nope", environ={ADDR_ENV: "127.0.0.1:0"})
    from_env = from_settings(None, environ={ADDR_ENV: "127.0.0.1:0"})
    from_flag = from_settings("0", environ={ADDR_ENV: "bad"})  # the flag wins
    try:
        assert isinstance(from_env, Metrics) and from_env.address[0] == "127.0.0.1"
        assert isinstance(from_flag, Metrics) and from_flag.address[0] == "127.0.0.1"
        assert from_env.address[1] != from_flag.address[1]
        assert "localai_mlx_requests_waiting" in scrape(from_flag)
    finally:
        from_env.stop()
        from_flag.stop()


def test_add_argument():
    parser = argparse.ArgumentParser()
    metrics_mod.add_argument(parser)
    assert parser.parse_args([]).metrics_addr is None
    assert parser.parse_args(["--metrics-addr", "[::1]:9"]).metrics_addr == "[::1]:9"
