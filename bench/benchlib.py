"""Shared helpers for the benchmarks in ``bench/``: processes, prompts, clients, statistics.

Owns what every benchmark needs and nothing it measures:

* starting our backend (``run.sh --addr 127.0.0.1:0``, as LocalAI starts it, so MKL is
  preloaded) and loading a model with explicit options;
* starting ``mlx_lm.server`` from the installed mlx-lm on a free 127.0.0.1 port with the
  same MKL preload, serving a dense float32 MLX directory saved once from the same GGUF
  (``dense_model_dir``);
* prompts of a given token length that never share a prefix across requests (a nonce
  first), built with the model's own ``tokenizer.json``;
* timed streaming clients for gRPC ``PredictStream`` and HTTP ``/v1/completions`` (SSE);
* medians, percentiles and Markdown tables.

The driver processes never import MLX: the model runs only in the processes measured.
All traffic goes to 127.0.0.1; every wait has a deadline, so a script always stops.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


import grpc  # noqa: E402

import backend_pb2  # noqa: E402
from clients.server_process import ServerProcess  # noqa: E402  (the harness the tests use)
from loading import cpu_fast_path  # noqa: E402  (standard library only: no MLX in the driver)

HOST = "127.0.0.1"
SERVING = re.compile(r"serving on (\S+:\d+)")
# SmolLM2's end-of-generation ids (<|im_end|> 2, <|endoftext|> 0). Every benchmark biases
# them by -100 on every side it compares, so all runs generate exactly max_tokens tokens
# and do the same work (one logits processor) whichever server or API runs them.
EOS_IDS = (2, 0)
EOS_BIAS = dict.fromkeys(EOS_IDS, -100.0)

_WORD_TEXT = (
    "river mountain lantern copper harbor meadow signal orchard violet engine quartz "
    "falcon timber glacier saddle ember canyon pepper marble thunder willow beacon "
    "compass pebble velvet cobalt prairie tunnel basket anchor silver garden rocket "
    "island ladder candle feather bridge puzzle jungle cactus walnut ribbon planet"
)
_WORDS = _WORD_TEXT.split()


# --------------------------------------------------------------------------- model files


def embedded_gguf() -> Path:
    """The embedded SmolLM2-135M GGUF (``model_loader.embedded_model_path``)."""
    from loading import model_loader

    return Path(model_loader.embedded_model_path())


def python_exe() -> str:
    return sys.executable


def fast_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment plus the MKL preload that ``run.sh`` applies (``preload_env``)."""
    env = cpu_fast_path.preload_env(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.update(extra or {})
    return env


def converted_dir(timeout: float = 600.0) -> Path:
    """The MLX directory converted from the embedded GGUF (converting once if needed)."""
    code = (
        "from loading import gguf_convert, model_loader;"
        "print(gguf_convert.cached_conversion(model_loader.embedded_model_path()))"
    )
    out = subprocess.run(
        [python_exe(), "-c", code],
        cwd=ROOT,
        env=fast_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


_DENSE_CODE = r"""
import json, shutil, sys
from pathlib import Path
import mlx.core as mx
from mlx_lm.utils import save_model
from loading import cpu_fast_path, model_loader, gguf_convert
src = gguf_convert.cached_conversion(model_loader.embedded_model_path())
out, tmp = Path(sys.argv[1]), Path(sys.argv[2])
model, _ = model_loader.load_model(str(model_loader.embedded_model_path()))
mode = cpu_fast_path.prepare_for_cpu(model, "true")
assert mode == "dense", mode
save_model(tmp, model)
config = json.loads((src / "config.json").read_text())
config.pop("quantization", None)
config.pop("quantization_config", None)
config["torch_dtype"] = "float32"
(tmp / "config.json").write_text(json.dumps(config, indent=2))
for f in src.iterdir():
    if f.name.startswith("tokenizer") or f.name == "generation_config.json":
        shutil.copy(f, tmp / f.name)
tmp.rename(out)
print(out)
"""


def dense_model_dir(timeout: float = 600.0) -> Path:
    """A dense float32 MLX copy of the embedded model, for ``mlx_lm.server``.

    Built once, next to the GGUF conversion cache: the converted model loaded by our
    loader, ``prepare_for_cpu(model, "true")`` (the exact weights our server decodes
    with), saved with ``mlx_lm.utils.save_model``; the config loses its quantization
    section; tokenizer files are copied.
    """
    src = converted_dir()
    out = src.parent.parent / "bench" / f"{src.name}-dense-f32"
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    tmp.rmdir()
    subprocess.run(
        [python_exe(), "-c", _DENSE_CODE, str(out), str(tmp)],
        cwd=ROOT,
        env=fast_env(),
        check=True,
        timeout=timeout,
        stdout=subprocess.DEVNULL,
    )
    return out


# --------------------------------------------------------------------------- prompts


class PromptMaker:
    """Raw-text prompts of a given length in tokens: a random word, then a unique nonce.

    Uses the converted model's ``tokenizer.json`` through the ``tokenizers`` library,
    the same ids our server and mlx-lm compute (the model adds no BOS).
    """

    def __init__(self, tokenizer_json: Path, seed: int = 1234) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(tokenizer_json))
        self._rng = random.Random(seed)
        self._count = 0

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def words(self, n_tokens: int) -> str:
        """Plain words totalling ``n_tokens`` tokens (exact: trimmed word by word)."""
        words: list[str] = []
        # Each word is one or two tokens; grow, then trim to the exact count.
        while self.count(" ".join(words)) < n_tokens:
            words.extend(self._rng.choice(_WORDS) for _ in range(max(1, n_tokens // 4)))
        while words and self.count(" ".join(words)) > n_tokens:
            words.pop()
        return " ".join(words)

    def prompt(self, n_tokens: int, tag: str = "") -> str:
        """A prompt of ``n_tokens`` tokens that shares at most its first token with others."""
        self._count += 1
        # A random first word: distinct prompts rarely share even their first token.
        first = self._rng.choice(_WORDS).capitalize()
        head = f"{first} {tag}{self._count}-{self._rng.randrange(10**9)}: "
        words = self.words(max(1, n_tokens - self.count(head))).split()
        # Token merges across the joint can shift the count by one or two: fix it up.
        for _ in range(8):
            n = self.count(head + " ".join(words))
            if n < n_tokens:
                words.append(self._rng.choice(_WORDS))
            elif n > n_tokens and len(words) > 1:
                words.pop()
            else:
                break
        return head + " ".join(words)


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class _Proc:
    """A child process whose output goes to a temporary log file."""

    def __init__(self, cmd: Sequence[str], env: dict[str, str], name: str) -> None:
        self.name = name
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115  (closed in stop())
            "w+", prefix=f"bench-{name}-", suffix=".log", delete=False
        )
        self.proc = subprocess.Popen(
            list(cmd), cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )

    def logs(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{self.logs()[-4000:]}")

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)


class Backend(ServerProcess):
    """Our backend started through ``run.sh`` on 127.0.0.1 port 0, as LocalAI starts it
    (the tests' harness, ``server_process.ServerProcess``); its log is removed at stop."""

    def __init__(self, name: str = "ours", env: dict[str, str] | None = None) -> None:
        self.name = name
        super().__init__(env=env, entry="run.sh", start_timeout=120.0)

    def load(self, model: Path, options: Iterable[str] = (), timeout: float = 600.0) -> float:
        """LoadModel with ``options``; returns the seconds it took. Raises on failure."""
        return super().load(str(model), options, timeout)

    def stop(self, timeout: float = 20.0) -> None:
        super().stop(timeout)
        self.remove_log()


class MlxLmServer(_Proc):
    """``python -m mlx_lm.server`` from the installed mlx-lm on a free 127.0.0.1 port."""

    def __init__(self, model_dir: Path, extra_args: Sequence[str] = ()) -> None:
        self.port = free_port()
        super().__init__(
            [
                python_exe(),
                "-m",
                "mlx_lm.server",
                "--model",
                str(model_dir),
                "--host",
                HOST,
                "--port",
                str(self.port),
                "--log-level",
                "WARNING",
                *extra_args,
            ],
            fast_env(),
            "mlx_lm.server",
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 300.0) -> None:
        # /v1/models answers once the HTTP server is up; one tiny completion then makes
        # sure the model is loaded (mlx_lm.server loads it lazily on its thread).
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                conn = http.client.HTTPConnection(HOST, self.port, timeout=5)
                conn.request("GET", "/v1/models")
                conn.getresponse().read()
                conn.close()
                break
            except OSError:
                time.sleep(0.2)
        else:
            raise TimeoutError(f"mlx_lm.server did not start:\n{self.logs()}")
        http_stream(self.port, "warm up", 2, timeout=max(1.0, deadline - time.monotonic()))


class Worker:
    """A child that answers one JSON line on stdout for each JSON line sent on stdin.

    Used for the in-process sides (``inproc_worker.py``, ``llamacpp_bench.py``): the
    model lives in the child, so the driver never imports MLX and the child's
    environment (MKL preload) is set before any library loads. stderr goes to a log.
    """

    def __init__(self, cmd: Sequence[str], env: dict[str, str], name: str) -> None:
        self.name = name
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115  (closed in stop())
            "w+", prefix=f"bench-{name}-", suffix=".log", delete=False
        )
        self.proc = subprocess.Popen(
            list(cmd),
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            bufsize=1,
        )

    def logs(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def call(self, timeout: float = 900.0, **command) -> dict:
        """Send ``command``; return the child's answer. Raises on error, exit or timeout."""
        import select

        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.stop()
            raise RuntimeError(f"{self.name} gave no answer to {command.get('op')}:\n{self.logs()}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"{self.name}: {answer['error']}\n{self.logs()[-4000:]}")
        return answer

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)


def inproc_worker(name: str = "inproc") -> Worker:
    """``inproc_worker.py`` with the MKL preload ``run.sh`` uses (``preload_env``)."""
    return Worker([python_exe(), str(ROOT / "bench" / "inproc_worker.py")], fast_env(), name)


# --------------------------------------------------------------------------- clients


@dataclass
class StreamResult:
    """Client-side timings of one streamed generation (``time.perf_counter`` seconds).

    ``t_first``/``k_first``: arrival and running token count of the first chunk that
    carried generated tokens; ``t_last``/``k_last``: the same for the last chunk;
    ``tokens``: generated tokens in all (as the server reports them).
    """

    t_start: float
    t_first: float = 0.0
    k_first: int = 0
    t_last: float = 0.0
    k_last: int = 0
    tokens: int = 0
    server_prompt_ms: float = 0.0
    server_gen_ms: float = 0.0
    text: str = ""
    extra: dict = field(default_factory=dict)
    marks: list[tuple[float, int]] = field(default_factory=list)  # (arrival, running count)
    error: str = ""  # the status code that ended the stream, where expected (`grpc_stream`)

    def count_at(self, t: float) -> int:
        """Tokens received by time ``t`` (0 before the first chunk)."""
        count = 0
        for when, k in self.marks:
            if when > t:
                break
            count = k
        return count

    @property
    def ttft(self) -> float:
        return self.t_first - self.t_start

    @property
    def decode_tps(self) -> float:
        """Tokens per second after the first chunk: (k_last - k_first) / (t_last - t_first)."""
        span = self.t_last - self.t_first
        return (self.k_last - self.k_first) / span if span > 0 else 0.0


def predict_options(prompt: str, max_tokens: int, **fields) -> backend_pb2.PredictOptions:
    """Greedy raw-prompt request with the EOS ids biased away (runs to ``max_tokens``)."""
    return backend_pb2.PredictOptions(
        Prompt=prompt,
        Tokens=max_tokens,
        Temperature=0.0,
        LogitBias=json.dumps({str(k): v for k, v in EOS_BIAS.items()}),
        **fields,
    )


def grpc_stream(
    stub, req: backend_pb2.PredictOptions, timeout: float = 600.0, ends: Sequence = ()
) -> StreamResult:
    """Run one PredictStream and time it from the client side. ``ends``: gRPC status codes
    that end the stream as expected (e.g. RESOURCE_EXHAUSTED for a tool call the token
    limit cuts): what arrived before is returned, with ``error`` set to the code."""
    res = StreamResult(t_start=time.perf_counter())
    parts: list[str] = []
    replies = stub.PredictStream(req, timeout=timeout)
    try:
        for reply in replies:
            _take(res, parts, reply)
    except grpc.RpcError as exc:
        if exc.code() not in ends:
            raise
        res.error = exc.code().name
    res.text = "".join(parts)
    return res


def _take(res: StreamResult, parts: list[str], reply) -> None:
    """One PredictStream reply into ``res`` (`grpc_stream`)."""
    now = time.perf_counter()
    if reply.tokens and not res.t_first:
        res.t_first, res.k_first = now, reply.tokens
    if reply.tokens:
        res.t_last, res.k_last, res.tokens = now, reply.tokens, reply.tokens
        res.marks.append((now, reply.tokens))
    res.server_prompt_ms = reply.timing_prompt_processing
    res.server_gen_ms = reply.timing_token_generation
    parts.append(reply.message.decode("utf-8", errors="replace"))


def memory_breakdown(stub) -> dict[str, int]:
    """Status's memory breakdown (weights, KV, ``requests_running``, ``mlx_peak``, ...)."""
    return dict(stub.Status(backend_pb2.HealthMessage()).memory.breakdown)


def streams_at_once(
    stub, requests: Sequence[backend_pb2.PredictOptions]
) -> tuple[list[StreamResult], int, float]:
    """Send ``requests`` as PredictStreams at once: (their results, the most requests
    Status showed running meanwhile (polled every 50 ms), wall seconds)."""
    seen = [0]
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            seen[0] = max(seen[0], memory_breakdown(stub)["requests_running"])
            stop.wait(0.05)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(lambda r: grpc_stream(stub, r), requests))
    elapsed = time.perf_counter() - start
    stop.set()
    watcher.join()
    return results, seen[0], elapsed


def http_stream(
    port: int,
    prompt: str,
    max_tokens: int,
    timeout: float = 600.0,
    model: str = "default_model",
    fields: dict | None = None,
) -> StreamResult:
    """Run one streamed ``/v1/completions`` on mlx_lm.server and time it.

    ``fields``: request fields instead of the default EOS logit bias (e.g. a scenario's
    penalties). Each SSE chunk with text counts as one token for the decode rate
    (mlx_lm.server writes one chunk per token whose text is not empty); the usage chunk
    (``stream_options.include_usage``) gives the exact total in ``tokens``. Connection
    resets are retried: its HTTP server's accept queue is 5, so a burst of 32 connects
    gets some.
    """
    if fields is None:
        fields = {"logit_bias": {str(k): v for k, v in EOS_BIAS.items()}}
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **fields,
        }
    )
    res = StreamResult(t_start=time.perf_counter())
    for attempt in range(20):
        conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
        try:
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            break
        except ConnectionError:
            conn.close()
            if attempt == 19:
                raise
            time.sleep(0.05 * (attempt + 1))
    try:
        if resp.status != 200:
            raise RuntimeError(f"mlx_lm.server answered {resp.status}: {resp.read()[:500]!r}")
        chunks, parts = 0, []
        for raw in resp:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            msg = json.loads(data)
            now = time.perf_counter()
            usage = msg.get("usage")
            if usage:
                res.extra["usage"] = usage  # prompt_tokens_details.cached_tokens, where given
            if usage and not msg.get("choices"):
                res.tokens = usage.get("completion_tokens", chunks)
                continue
            text = "".join(c.get("text", "") for c in msg.get("choices", []))
            if text:
                chunks += 1
                parts.append(text)
                if not res.t_first:
                    res.t_first, res.k_first = now, 1
                res.t_last, res.k_last = now, chunks
                res.marks.append((now, chunks))
        res.tokens = res.tokens or chunks
        res.text = "".join(parts)
    finally:
        conn.close()
    return res


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid``, all its threads (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def blas_mapped(pid: int) -> str:
    """Which fast BLAS process ``pid`` has mapped (MKL/OpenBLAS), or "bundled BLAS only"."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return "unknown"
    names = sorted(
        {
            line.rsplit("/", 1)[-1]
            for line in maps.splitlines()
            if re.search(r"libmkl_rt|libopenblas", line)
        }
    )
    return ", ".join(names) or "bundled BLAS only"


# --------------------------------------------------------------------------- statistics


def median(values: Iterable[float]) -> float:
    vals = list(values)
    return statistics.median(vals) if vals else float("nan")


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0-100), nearest-rank on sorted values."""
    vals = sorted(values)
    if not vals:
        return float("nan")
    rank = max(1, min(len(vals), int(-(-q * len(vals) // 100))))
    return vals[rank - 1]


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table; floats get 3 significant digits (2 decimals when < 100)."""

    def fmt(v: object) -> str:
        if isinstance(v, float):
            if v != v:  # NaN
                return "-"
            return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def header(title: str, argv: Sequence[str]) -> str:
    """A title line plus the exact command that produced the results."""
    script = Path(argv[0]).resolve() if argv else Path()
    with contextlib.suppress(ValueError):
        argv = [str(script.relative_to(ROOT)), *argv[1:]]
    cmd = " ".join([Path(sys.executable).name, *argv])
    load = os.getloadavg()
    return (
        f"## {title}\n\ncommand: `{cmd}`\n"
        f"host: {os.cpu_count()} CPUs, load average {load[0]:.2f} at start\n"
    )
