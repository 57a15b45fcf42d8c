"""Serving under load, over real gRPC on one backend process (run.sh, the embedded model,
Prometheus metrics on a free loopback port):

- the metrics endpoint, scraped over HTTP, counts exactly the traffic sent;
- a long prompt prefilled beside running streams (the per-step budget cuts its prefill
  into chunks between their decode steps) leaves every stream its solo greedy output;
- LoadModel of what is loaded, with the same options, interrupts nobody; a real model
  change ends in-flight requests with UNAVAILABLE (gRPC's retryable code), saying to retry.
"""

from __future__ import annotations

import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import tiny_models
from helpers import greedy, status, wait_until
from prometheus_client.parser import text_string_to_metric_families

import backend_pb2
from clients.server_process import ServerProcess
from loading import model_loader

METRICS_URL = re.compile(r"Prometheus metrics on (http://\S+)")
EMBEDDED = str(model_loader.embedded_model_path())


@pytest.fixture(scope="module")
def srv():
    server = ServerProcess("--metrics-addr", "127.0.0.1:0", entry="run.sh")
    try:
        server.load(EMBEDDED)
        yield server
    finally:
        server.stop()


def _scrape(srv) -> dict[tuple[str, tuple], float]:
    url = METRICS_URL.search(srv.logs()).group(1)
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


P = "localai_mlx_"


@pytest.fixture(scope="module")
def traffic(srv):
    """Three requests answered and one refused, then the metrics endpoint scraped and
    Status read: (replies, the refusal, the samples, Status)."""
    replies = [srv.stub.Predict(greedy(f"Count to {n}:", 5 + n)) for n in range(3)]
    with pytest.raises(grpc.RpcError) as bad:
        srv.stub.Predict(backend_pb2.PredictOptions(Prompt="x", Temperature=-1))
    return replies, bad.value, _scrape(srv), status(srv.stub)


def _total(samples: dict, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == P + name)


def test_the_metrics_endpoint_counts_each_request_once(traffic) -> None:
    m = traffic[2]
    assert m[(P + "time_to_first_token_seconds_count", ())] == 3
    assert m[(P + "e2e_request_latency_seconds_count", ())] == 3
    assert _total(m, "requests_finished_total") == 3


def test_the_metrics_endpoint_counts_the_tokens_the_replies_report(traffic) -> None:
    replies, _, m, _ = traffic
    assert m[(P + "generation_tokens_total", ())] == sum(r.tokens for r in replies)
    assert _total(m, "prompt_tokens_total") == sum(r.prompt_tokens for r in replies)


def test_the_metrics_endpoint_counts_a_refusal_by_its_code(traffic) -> None:
    _, bad, m, _ = traffic
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert m[(P + "request_errors_total", (("code", "INVALID_ARGUMENT"),))] == 1


def test_the_memory_gauges_are_what_status_reports(traffic) -> None:
    _, _, m, st = traffic
    assert m[(P + "memory_bytes", (("kind", "weights"),))] == st["weights"]
    # The budget (issue 32: visible in Status and Prometheus alike), 0 when off.
    assert st["memory_budget"] > 0  # on by default (75% of RAM on a CPU)
    assert m[(P + "memory_bytes", (("kind", "budget"),))] == st["memory_budget"]
    assert m[(P + "memory_bytes", (("kind", "reserved"),))] == 0  # nothing runs now
    assert m[(P + "requests_running", ())] == 0


def test_a_long_prefill_beside_running_streams_leaves_each_its_solo_output(srv) -> None:
    streams = [greedy(f"Story {i}: once upon a time", 32, IgnoreEOS=True) for i in range(3)]
    # ~700 tokens: more than one step's budget beside three decoding streams here.
    long = greedy("Chapter one. " + "The river ran past the old stone mill. " * 70, 8)
    solo = [srv.stub.Predict(r).message for r in [*streams, long]]
    with ThreadPoolExecutor(4) as pool:
        running = [pool.submit(srv.stub.Predict, r) for r in streams]
        assert wait_until(lambda: status(srv.stub)["requests_running"] == 3, 60)
        beside = pool.submit(srv.stub.Predict, long)
        together = [f.result().message for f in [*running, beside]]
    assert together == solo


def test_reloading_the_same_model_interrupts_nobody(srv) -> None:
    req = greedy("Name three colours:", 48, IgnoreEOS=True)
    alone = srv.stub.Predict(req).message
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(srv.stub.Predict, req)
        assert wait_until(lambda: status(srv.stub)["requests_running"], 30)
        again = srv.stub.LoadModel(backend_pb2.ModelOptions(Model=EMBEDDED))
        assert again.success, again.message
        assert running.result().message == alone
    assert "already loaded with these options" in srv.logs()


def test_a_model_change_ends_in_flight_requests_unavailable(srv, tmp_path) -> None:
    req = greedy("Name three colours:", 400, IgnoreEOS=True)
    other = str(tiny_models.build("llama", tmp_path))
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(srv.stub.Predict, req)
        assert wait_until(lambda: status(srv.stub)["requests_running"], 30)
        changed = srv.stub.LoadModel(backend_pb2.ModelOptions(Model=other))
        assert changed.success, changed.message
        with pytest.raises(grpc.RpcError) as err:
            running.result()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "retry" in err.value.details()


def test_the_warm_up_runs_at_load_when_asked(srv) -> None:
    """Option warmup:true wins over LOCALAI_MLX_WARMUP (off in this suite): LoadModel runs
    the request path once, logs it, and requests are served as before."""
    reply = srv.stub.LoadModel(backend_pb2.ModelOptions(Model=EMBEDDED, Options=["warmup:true"]))
    assert reply.success, reply.message
    assert re.search(r"warm-up: \d+\.\d+ s", srv.logs()), srv.logs()[-2000:]
    assert srv.stub.Predict(greedy("Hello", 4, IgnoreEOS=True)).tokens == 4
