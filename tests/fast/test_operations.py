"""Production operation without a server: durations, the parent watch, log levels, the
auth interceptor's header rules, the Tokens cap. Against real backend processes:
tests/process/test_operations.py.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from helpers import AUTH_TOKEN, wait_until

import backend_pb2
import params
from edge import interceptors, lifecycle
from parsing.durations import parse_duration
from prompting import fit


# --------------------------------------------------------------------------- unit: ops
@pytest.mark.parametrize(
    "text, seconds",
    [("500ms", 0.5), ("2s", 2.0), ("1m", 60.0), ("1.5", 1.5), (" 3 ", 3.0), ("2S", 2.0)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "-1s", "2 days", "ms", "1e400", "nan", "1x"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    "env, interval",
    [
        ({}, 2.0),
        ({lifecycle.PARENT_WATCH_INTERVAL_ENV: "500ms"}, 0.5),
        ({lifecycle.PARENT_WATCH_INTERVAL_ENV: "1m"}, 60.0),
        ({lifecycle.PARENT_WATCH_INTERVAL_ENV: "garbage"}, 2.0),
        ({lifecycle.PARENT_WATCH_INTERVAL_ENV: "0"}, 2.0),
        ({lifecycle.PARENT_WATCH_ENV: "true"}, 2.0),
        ({lifecycle.PARENT_WATCH_ENV: "OFF"}, None),
        ({lifecycle.PARENT_WATCH_ENV: "false"}, None),
        ({lifecycle.PARENT_WATCH_ENV: "0"}, None),
        ({lifecycle.PARENT_WATCH_ENV: "no", lifecycle.PARENT_WATCH_INTERVAL_ENV: "1s"}, None),
    ],
)
def test_parent_watch_interval_from_env(env, interval):
    assert lifecycle.parent_watch_interval(env) == interval


def test_log_levels_accept_localai_names():
    assert lifecycle.log_level("trace") == lifecycle.log_level("DEBUG") == 10
    assert lifecycle.log_level("warn") == lifecycle.log_level("warning") == 30
    assert lifecycle.log_level("Error") == 40
    with pytest.raises(ValueError, match="unknown log level"):
        lifecycle.log_level("loud")


def test_auth_interceptor_header_rules():
    auth = interceptors.AuthInterceptor(AUTH_TOKEN)
    assert auth.authorized([("authorization", f"Bearer {AUTH_TOKEN}")])
    assert auth.authorized([("x-other", "1"), ("authorization", f"bearer {AUTH_TOKEN}")])
    assert auth.authorized([("authorization", f"Bearer {AUTH_TOKEN}".encode())])
    for bad in (
        None,
        [],
        [("authorization", AUTH_TOKEN)],  # no scheme
        [("authorization", f"Basic {AUTH_TOKEN}")],
        [("authorization", f"Bearer {AUTH_TOKEN}x")],
        [("authorization", f"Bearer {AUTH_TOKEN[:-1]}")],
        [("authorization", "Bearer ")],
        [
            ("authorization", "Bearer wrong"),
            ("authorization", f"Bearer {AUTH_TOKEN}"),
        ],  # first wins
    ):
        assert not auth.authorized(bad), bad
    kinds = [
        type(i) for i in interceptors.server_interceptors({interceptors.AUTH_TOKEN_ENV: "  \n"})
    ]
    assert kinds == [interceptors.DecodeErrorInterceptor]  # blank token: no auth
    kinds = [type(i) for i in interceptors.server_interceptors({interceptors.AUTH_TOKEN_ENV: "t"})]
    assert kinds == [interceptors.AuthInterceptor, interceptors.DecodeErrorInterceptor]


def test_parent_watcher_fires_once_on_reparenting():
    ppid = [4242]
    fired = threading.Event()
    calls = []

    def on_gone():
        calls.append(1)
        fired.set()

    checks = []  # one entry per getppid() call: at construction, then one per check

    def getppid() -> int:
        checks.append(ppid[0])
        return ppid[0]

    watcher = lifecycle.ParentWatcher(0.01, on_gone, getppid=getppid)
    assert watcher.start()
    assert wait_until(lambda: len(checks) >= 5, 2)  # four checks saw the same parent
    assert not fired.is_set()
    ppid[0] = 1  # re-parented to init
    assert fired.wait(2)
    watcher.stop()  # joins the thread: no second call can still come
    assert calls == [1]
    # Already orphaned at start: nothing to watch.
    assert not lifecycle.ParentWatcher(0.01, on_gone, initial_ppid=1).start()
    with pytest.raises(ValueError):
        lifecycle.ParentWatcher(0, on_gone)


def test_absurd_tokens_are_capped():
    gen = params.generation_params(backend_pb2.PredictOptions(Tokens=2**31 - 1))
    unknown_context = SimpleNamespace(params=params.load_params(backend_pb2.ModelOptions()))
    unknown_context.context_len = None
    assert fit.max_tokens(unknown_context, 10, gen.max_tokens) == params.MAX_TOKENS_CAP
