"""Hostile files and inputs (issue 32, item 7), over real gRPC to the real engine in this
process (``inprocess.InProcessServer``) with a tiny random-weight model, each with an
innocent stream running beside it that must end OK with its solo text: a FIFO named like
a prompt-cache disk entry, a disk-tier read that stalls (a hung file system), a grammar
failing in the middle of a generation, a model directory whose config.json disagrees
with its weights, and large images to a tiny vision model.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shutil
import threading
import time

import grpc
import pytest
import tiny_models
from helpers import greedy, stream_text
from inprocess import InProcessServer

import backend_pb2
from caches import prompt_disk
from parsing import images

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


def test_a_stalled_disk_read_is_a_miss_within_its_bound(server, models, monkeypatch):
    # A disk-tier entry whose read hangs (a stuck network mount; stood in for by the
    # reader's read_file waiting on an event): the engine waits at most read_wait, serves
    # the request as a miss, and the innocent stream streams on.
    stub = server.stub
    solo = stream_text(stub, INNOCENT, CALL_TIMEOUT)[0]
    cache = models / "stalled"
    prompt = "The old ferry crossed the river twice a day"
    alone = stub.Predict(greedy(prompt, 8), timeout=CALL_TIMEOUT)
    hostile = greedy(prompt, 8, PromptCachePath=str(cache))
    assert stub.Predict(hostile, timeout=CALL_TIMEOUT).message == alone.message
    for _ in range(200):  # the writer thread saves the entry
        if list(cache.glob("*.safetensors")):
            break
        time.sleep(0.05)
    assert list(cache.glob("*.safetensors")), "no entry was written"
    # Reloading with another memory-tier bound empties the memory tier, so the next
    # request must go to the disk for its prefix.
    res = stub.LoadModel(
        backend_pb2.ModelOptions(
            Model=str(models / "llama"), ModelPath=str(models), Options=["max_cache_entries:31"]
        ),
        timeout=120,
    )
    assert res.success, res.message
    stall = threading.Event()
    real = prompt_disk.fmt.read_file
    monkeypatch.setattr(prompt_disk.fmt, "read_file", lambda p: stall.wait(60) and real(p))
    monkeypatch.setattr(prompt_disk, "_READ_WAIT_S", 0.5)
    try:
        with Beside(stub) as innocent:
            start = time.monotonic()
            reply = stub.Predict(hostile, timeout=CALL_TIMEOUT)
            took = time.monotonic() - start
            again = stub.Predict(hostile, timeout=CALL_TIMEOUT)  # from memory now
    finally:
        stall.set()
    assert innocent.error == "" and innocent.text == solo
    assert reply.message == again.message == alone.message and reply.tokens == 8
    assert took < 0.5 + 5.0, took  # the bound, plus this host's slowest 8 tokens
    info = json.loads(stub.GetMetrics(backend_pb2.MetricsRequest()).prompt_json_for_slot)
    disk = info["prompt_cache"]["disk"][str(cache)]
    assert (disk["late"], disk["hits"]) == (1, 0), disk


# -- a grammar that fails in the middle of a generation ----------------------------------
# 30 ambiguous rules side by side: llguidance's Earley row grows by ~60 items per "x", so
# the grammar passes validation (its first 8 bytes) and fails near 31 bytes of output
# ("Current row has 2011 items; max is 2000").
EXPLODING = (
    "root ::= "
    + " | ".join(f"a{k}" for k in range(30))
    + "\n"
    + "\n".join(f'a{k} ::= a{k} a{k} | "x"' for k in range(30))
)


def test_a_grammar_failing_mid_generation_ends_the_request_with_an_error(server):
    stub = server.stub
    solo = stream_text(stub, INNOCENT, CALL_TIMEOUT)[0]
    hostile = greedy("Say x:", 120, IgnoreEOS=True, Grammar=EXPLODING)
    with Beside(stub) as innocent:
        with pytest.raises(grpc.RpcError) as whole:
            stub.Predict(hostile, timeout=CALL_TIMEOUT)
        streamed = []
        with pytest.raises(grpc.RpcError) as stream:
            for reply in stub.PredictStream(hostile, timeout=CALL_TIMEOUT):
                streamed.append(reply.message.decode("utf-8"))
    assert innocent.error == "" and innocent.text == solo
    for err in (whole.value, stream.value):
        details = err.details() or ""
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), details)
        assert "PredictOptions.Grammar" in details and "max is 2000" in details, details
        assert "\n" not in details and "<state>" not in details and len(details) < 600
    # What was streamed before the failure is x's only (a prefix the grammar accepted).
    assert set("".join(streamed)) <= {"x"}
    assert stub.Health(backend_pb2.HealthMessage(), timeout=5).message == b"OK"


# -- a config.json that disagrees with the weights ---------------------------------------
@pytest.mark.parametrize(
    ("key", "value", "needles"),
    [
        ("num_hidden_layers", 40000, ("num_hidden_layers 40000", "hold 2 layers")),
        ("hidden_size", 128, ("hidden_size 128", "64")),
    ],
)
def test_a_config_disagreeing_with_its_weights_fails_the_load_short(
    server, models, tmp_path, key, value, needles
):
    stub = server.stub
    solo = stream_text(stub, INNOCENT, CALL_TIMEOUT)[0]
    bad = tmp_path / "bad"
    shutil.copytree(models / "llama", bad)
    config = json.loads((bad / "config.json").read_text())
    config[key] = value
    (bad / "config.json").write_text(json.dumps(config))
    with Beside(stub) as innocent:
        res = stub.LoadModel(backend_pb2.ModelOptions(Model=str(bad)), timeout=CALL_TIMEOUT)
    assert not res.success
    assert len(res.message) < 500, (len(res.message), res.message[:300])
    for needle in needles:
        assert needle in res.message, res.message
    # The model already loaded serves on, unharmed.
    assert innocent.error == "" and innocent.text == solo
    assert stream_text(stub, INNOCENT, CALL_TIMEOUT)[0] == solo


# -- large images --------------------------------------------------------------------------
def _rss_mib(key: str) -> int:
    """``VmRSS`` / ``VmHWM`` (peak) of this process (the server's) in MiB."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(key + ":"))
    return int(line.split()[1]) // 1024


@pytest.fixture(scope="module")
def vision(tmp_path_factory):
    """The tiny Gemma 3 vision model (its processor resizes to 64x64), served."""
    import vision_models as vm

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        path = vm.build("gemma3", tmp_path_factory.mktemp("vlm") / "gemma3")
        s = InProcessServer()
        res = s.stub.LoadModel(
            backend_pb2.ModelOptions(Model=str(path), Options=["warmup:false"]), timeout=120
        )
        assert res.success, res.message
        try:
            yield s
        finally:
            s.stop()


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_large_images_are_decoded_at_the_processors_size(vision, monkeypatch):
    # 4 JPEGs of 6300x6300 (0.6 MB each; under max_image_pixels): decoded whole, each
    # held 119 MB of RGB and its copies (measured: the server's RSS peaked +1,364 MiB, 16
    # PNGs +4,540 MiB); at the processor's 64x64, libjpeg decodes at 1/8 and the peak
    # stays near the size of one such picture.
    stub = vision.stub
    innocent = greedy("Once upon a time, in a small village,", 48, IgnoreEOS=True)
    solo = stream_text(stub, innocent, CALL_TIMEOUT)[0]
    buf = io.BytesIO()
    from PIL import Image

    Image.new("RGB", (6300, 6300), (120, 80, 40)).save(buf, format="JPEG", quality=10)
    big = base64.b64encode(buf.getvalue()).decode()
    del buf
    request = greedy("Describe these.", 8, Images=[big] * 4)
    base = _rss_mib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    with Beside(stub) as beside:
        reply = stub.Predict(request, timeout=CALL_TIMEOUT)
    peak = _rss_mib("VmHWM") - base
    assert reply.tokens == 8
    assert beside.error == "" and beside.text == solo
    assert peak < 300, f"RSS rose {peak} MiB for 4 images (at full size: 1,364 MiB)"
    # With a processor whose size is not known, the images would be held whole: 4 x 39.7 M
    # pixels is over the request's bound, refused from the headers, before decoding.
    monkeypatch.setattr(vision.engine.loaded.vision, "decode_target", images.DecodeTarget())
    with pytest.raises(grpc.RpcError) as refused:
        stub.Predict(request, timeout=CALL_TIMEOUT)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details() or ""
    assert "158760000 pixels once decoded" in details and "send fewer or smaller" in details
