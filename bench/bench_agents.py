"""Agent sessions at scale (issue 38): replayed multi-turn tool-calling sessions, side by side.

Systems, each with its default options (as a new user starts it), on one model:

* **ours**: this checkout's backend through ``run.sh`` (gRPC ``PredictStream``, ``Prompt``);
* **mlx_lm.server**: ``python -m mlx_lm.server`` from the installed mlx-lm (HTTP
  ``/v1/completions``, streamed);
* **vllm-mlx**: ``vllm-mlx serve --continuous-batching`` from another Python environment
  (``--vllm-mlx-python``; vllm-mlx 0.6.0 pins mlx-lm < 0.32, so it cannot share our venv:
  ``python3 -m venv /work/peers/vllm-mlx && /work/peers/vllm-mlx/bin/pip install
  vllm-mlx==0.6.0 'mlx[cpu]==0.32.4'``). Skipped with a note when not given.

The model is the host-cost proxy: a tiny random-weight llama (``tests/tiny_models.py``
"llama": 2 layers, the embedded SmolLM2 tokenizer), so what is measured is the servers'
scheduling, prompt caching and host work, which dominate on Apple GPUs for small models.

The sessions (seeded, the same token for token on every system): every session starts from
one system prompt with a tool list (``--system-tokens``, shared by all sessions, as the
agents of one application share theirs), then a user task of its own; each turn appends the
assistant's tool call (scripted text, not the model's reply, so that histories are the same
on every system) and the tool's result (``--result-tokens`` range), and sends the whole
history again (``--new-tokens`` generated, EOS biased off). Every ``--fork-every``-th
session forks ``--subagents`` sub-agents after its third turn: each sends the history so far
plus its own sub-task for two turns, all sub-agents together, then the session goes on.
Prompts are rendered once in ChatML (the tokenizer's template) and sent as raw text, so every
system sees the same tokens.

At each concurrency level C, C sessions run at once (a worker takes the next session when
its session ends; a session's requests go one after another, as an agent waits for each
reply; sub-agents add threads of their own). Each system is started fresh for each level.

Reported per system and level: makespan, TTFT p50 / p95, request latency p50 / p95, prompt
tokens sent and computed (prefilled, not served by a prompt cache: ours from the Prometheus
``prompt_tokens{source}`` counters in GetMetrics; the peers from ``usage.prompt_tokens -
usage.prompt_tokens_details.cached_tokens`` (mlx_lm.server), the ``tokens_to_prefill`` its
scheduler logs for each request (vllm-mlx)), and, for ours,
how many outputs equal the same request's output at concurrency 1 (greedy: they all should).

Targets (issue 38): TTFT p50 at 16 and 32 sessions within 2x of one session's and p95 within
4x; prompt tokens computed at one session no more than vllm-mlx's; makespan at 8-32 sessions
ahead of both peers.

    flock /tmp/heavy.lock .venv/bin/python bench/bench_agents.py            # ~30+ min on 2 cores
    flock /tmp/heavy.lock .venv/bin/python bench/bench_agents.py --sessions 8 --levels 1,8 \\
        --systems ours,mlx_lm.server                                         # a few minutes
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import benchlib as bl

sys.path.insert(0, str(bl.ROOT / "tests"))
import tiny_models

SYSTEMS = ("ours", "mlx_lm.server", "vllm-mlx")
TOOLS = [
    ("read_file", "Read a file of the repository and return its text.", ["path"]),
    ("write_file", "Replace a file's whole text.", ["path", "text"]),
    ("run", "Run a shell command in the repository and return its output.", ["command"]),
    ("search", "Search the repository for a regular expression.", ["pattern", "path"]),
    ("list_dir", "List a folder of the repository.", ["path"]),
]


@dataclass
class Request:
    """One request of a replayed session: its id, the whole prompt text, its token count."""

    rid: str
    prompt: str
    tokens: int


@dataclass
class Session:
    """A session's requests in order; ``forks[i]``: sub-agent sessions sent together after
    request ``i``."""

    sid: str
    requests: list[Request]
    forks: dict[int, list[Session]] = field(default_factory=dict)

    def all_requests(self) -> list[Request]:
        out = list(self.requests)
        for subs in self.forks.values():
            for sub in subs:
                out += sub.all_requests()
        return out


def _turn(role: str, text: str) -> str:
    return f"<|im_start|>{role}\n{text}<|im_end|>\n"


def _system_prompt(pm: bl.PromptMaker, tokens: int) -> str:
    tools = "\n".join(
        json.dumps(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": desc,
                    "parameters": {
                        "type": "object",
                        "properties": {a: {"type": "string"} for a in args},
                        "required": args,
                    },
                },
            }
        )
        for name, desc, args in TOOLS
    )
    head = "You are a coding agent working in a repository. Use the tools below.\n"
    tool_text = f"# Tools\n<tools>\n{tools}\n</tools>\n"
    guide = pm.words(max(0, tokens - pm.count(head + tool_text)))
    return _turn("system", head + guide + "\n" + tool_text)


def _call(rng: random.Random, pm: bl.PromptMaker) -> str:
    name, _, args = rng.choice(TOOLS)
    body = json.dumps({"name": name, "arguments": {a: pm.words(6) for a in args}})
    return _turn("assistant", f"<tool_call>\n{body}\n</tool_call>")


def build_sessions(args: argparse.Namespace, pm: bl.PromptMaker) -> list[Session]:
    """The replayed sessions (seeded: the same text on every run and system)."""
    rng = random.Random(args.seed)
    system = _system_prompt(pm, args.system_tokens)
    lo, hi = (int(x) for x in args.result_tokens.split(","))
    tmin, tmax = (int(x) for x in args.turns.split(","))

    def grow(sid: str, history: str, turns: int) -> tuple[list[Request], list[str]]:
        reqs: list[Request] = []
        histories: list[str] = []
        for t in range(turns):
            if t:
                result = pm.words(rng.randint(lo, hi))
                history += _call(rng, pm) + _turn("tool", result)
            prompt = history + "<|im_start|>assistant\n"
            reqs.append(Request(f"{sid}.{t}", prompt, pm.count(prompt)))
            histories.append(history)
        return reqs, histories

    sessions = []
    for s in range(args.sessions):
        sid = f"s{s}"
        task = _turn("user", f"Task {s}: " + pm.words(rng.randint(80, 240)))
        reqs, histories = grow(sid, system + task, rng.randint(tmin, tmax))
        session = Session(sid, reqs)
        if args.fork_every and s % args.fork_every == args.fork_every - 1 and len(reqs) > 3:
            subs = []
            for k in range(args.subagents):
                words = pm.words(rng.randint(40, 120))
                sub_task = _turn("user", f"Sub-task {k} of {sid}: {words}")
                sub_reqs, _ = grow(f"{sid}.sub{k}", histories[2] + sub_task, 2)
                subs.append(Session(f"{sid}.sub{k}", sub_reqs))
            session.forks[2] = subs
        sessions.append(session)
    return sessions


@dataclass
class Sample:
    rid: str
    start: float
    ttft: float
    latency: float
    text: str
    computed: int | None  # prompt tokens the server prefilled, where it reports them


def _computed(usage: dict) -> int | None:
    details = usage.get("prompt_tokens_details") or {}
    if "prompt_tokens" not in usage or "cached_tokens" not in details:
        return None
    return int(usage["prompt_tokens"]) - int(details["cached_tokens"] or 0)


def _prompt_counter(stub) -> dict[str, int]:
    info = json.loads(stub.GetMetrics(bl.backend_pb2.MetricsRequest()).prompt_json_for_slot)
    return {k: int(v) for k, v in info["metrics"]["prompt_tokens"].items()}


class VllmMlxServer(bl._Proc):
    """``vllm-mlx serve MODEL --continuous-batching`` from ``python`` on a free port."""

    def __init__(self, python: str, model_dir: Path) -> None:
        self.port = bl.free_port()
        super().__init__(
            [
                python,
                "-m",
                "vllm_mlx.cli",
                "serve",
                str(model_dir),
                "--host",
                bl.HOST,
                "--port",
                str(self.port),
                "--continuous-batching",
            ],
            bl.fast_env(),
            "vllm-mlx",
        )
        deadline = time.monotonic() + 300
        while True:
            self.check_alive()
            try:
                bl.http_stream(self.port, "warm up", 2, model=str(model_dir))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"vllm-mlx did not start:\n{self.logs()}") from None
                time.sleep(0.5)
        self._warm = self.prefilled()

    def prefilled(self) -> int:
        """Prompt tokens prefilled since the warm-up: its usage reports no cached tokens,
        its scheduler logs ``tokens_to_prefill=N`` for every request it starts."""
        found = re.findall(r"tokens_to_prefill=(\d+)", self.logs())
        return sum(int(n) for n in found) - getattr(self, "_warm", 0)

    def scheduled(self) -> tuple[int, int]:
        """(requests its scheduler logged, their prompt tokens), warm-up included: that
        its computed count covers every request sent, each whole."""
        found = re.findall(r"prompt_tokens=(\d+) tokens_to_prefill=", self.logs())
        return len(found), sum(int(n) for n in found)


def replay(
    sessions: list[Session], concurrency: int, send: Callable[[Request], Sample]
) -> tuple[list[Sample], float]:
    """Run ``sessions`` with ``concurrency`` at once; (every request's sample, makespan s)."""
    samples: list[Sample] = []
    lock = threading.Lock()

    def run(session: Session) -> None:
        for i, req in enumerate(session.requests):
            sample = send(req)
            with lock:
                samples.append(sample)
            subs = session.forks.get(i)
            if subs:
                with ThreadPoolExecutor(len(subs)) as pool:
                    list(pool.map(run, subs))

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(run, sessions))
    return samples, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--levels", default="1,8,16,32")
    ap.add_argument("--sessions", type=int, default=40)
    ap.add_argument("--turns", default="5,9", help="turns per session: min,max")
    ap.add_argument("--system-tokens", type=int, default=3000)
    ap.add_argument("--result-tokens", default="150,700", help="tool result tokens: min,max")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--fork-every", type=int, default=5, help="0: no sub-agents")
    ap.add_argument("--subagents", type=int, default=4)
    ap.add_argument("--seed", type=int, default=38)
    ap.add_argument("--vllm-mlx-python", help="a python with vllm-mlx installed")
    ap.add_argument(
        "--options", default="", help="ours: load options, comma-separated (cpu_attention:false)"
    )
    ap.add_argument(
        "--samples", help="write every request's timings here (JSON lines: system, level, ...)"
    )
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    systems = [s for s in args.systems.split(",") if s]
    if "vllm-mlx" in systems and not args.vllm_mlx_python:
        print("vllm-mlx skipped: no --vllm-mlx-python given")
        systems.remove("vllm-mlx")

    print(bl.header("Agent sessions at scale (issue 38)", sys.argv))
    root = Path(tempfile.mkdtemp(prefix="bench-agents-"))
    model = tiny_models.build("llama", root)
    pm = bl.PromptMaker(tiny_models.tokenizer_dir() / "tokenizer.json")
    sessions = build_sessions(args, pm)
    requests = [r for s in sessions for r in s.all_requests()]
    sizes = sorted(r.tokens for r in requests)
    print(
        f"{len(sessions)} sessions, {len(requests)} requests, prompts {sizes[0]}-{sizes[-1]} "
        f"tokens (p50 {bl.percentile(sizes, 50):.0f}), {sum(sizes)} prompt tokens sent\n"
    )

    results: dict[tuple[str, int], tuple[list[Sample], float, int | None]] = {}
    for turn, level in enumerate(levels):
        order = systems[turn % len(systems) :] + systems[: turn % len(systems)]
        for name in order:
            if name == "ours":
                # Metrics on: GetMetrics then carries the prompt_tokens{source} counters.
                server = bl.Backend(
                    "ours", env=bl.fast_env({"LOCALAI_MLX_METRICS_ADDR": "127.0.0.1:0"})
                )
                server.load(model, [o for o in args.options.split(",") if o])
                stub = server.stub
                before = _prompt_counter(stub)

                def send(req: Request, stub=stub) -> Sample:
                    start = time.perf_counter()
                    res = bl.grpc_stream(stub, bl.predict_options(req.prompt, args.new_tokens))
                    end = time.perf_counter()
                    ttft = (res.t_first or end) - start
                    return Sample(req.rid, start, ttft, end - start, res.text, None)

            else:
                if name == "mlx_lm.server":
                    server = bl.MlxLmServer(model)
                    label = "default_model"
                else:
                    server = VllmMlxServer(args.vllm_mlx_python, model)
                    label = str(model)

                def send(req: Request, port=server.port, label=label) -> Sample:
                    start = time.perf_counter()
                    res = bl.http_stream(port, req.prompt, args.new_tokens, model=label)
                    end = time.perf_counter()
                    ttft = (res.t_first or end) - start
                    usage = res.extra.get("usage", {})
                    return Sample(req.rid, start, ttft, end - start, res.text, _computed(usage))

            try:
                samples, makespan = replay(sessions, level, send)
                if name == "ours":
                    after = _prompt_counter(stub)
                    computed: int | None = after.get("prefill", 0) - before.get("prefill", 0)
                elif isinstance(server, VllmMlxServer):
                    computed = server.prefilled()
                    logged, logged_tokens = server.scheduled()
                    print(
                        f"  vllm-mlx at {level}: {logged} requests logged (warm-up included), "
                        f"{logged_tokens} prompt tokens in them",
                        flush=True,
                    )
                else:
                    parts = [s.computed for s in samples]
                    computed = None if None in parts else sum(p for p in parts if p is not None)
            finally:
                server.stop()
            results[(name, level)] = (samples, makespan, computed)
            print(f"  {name} at {level}: makespan {makespan:.1f} s", flush=True)

    if args.samples:
        with open(args.samples, "w") as f:
            for (name, level), (samples, _, _) in results.items():
                for s in samples:
                    f.write(
                        json.dumps(
                            dict(
                                system=name,
                                level=level,
                                rid=s.rid,
                                start=s.start,
                                ttft=s.ttft,
                                latency=s.latency,
                            )
                        )
                        + "\n"
                    )
    sent = sum(r.tokens for r in requests)
    rows = []
    for level in levels:
        for name in systems:
            samples, makespan, computed = results[(name, level)]
            ttfts = [s.ttft for s in samples]
            lats = [s.latency for s in samples]
            same = ""
            if name == "ours" and ("ours", levels[0]) in results:
                solo = {s.rid: s.text for s in results[("ours", levels[0])][0]}
                same = f"{sum(solo.get(s.rid) == s.text for s in samples)}/{len(samples)}"
            rows.append(
                (
                    level,
                    name,
                    f"{makespan:.1f}",
                    f"{bl.percentile(ttfts, 50) * 1000:.0f}",
                    f"{bl.percentile(ttfts, 95) * 1000:.0f}",
                    f"{bl.percentile(lats, 50):.2f}",
                    f"{bl.percentile(lats, 95):.2f}",
                    sent,
                    "-" if computed is None else computed,
                    same,
                )
            )
    print(
        bl.table(
            [
                "sessions",
                "system",
                "makespan s",
                "TTFT p50 ms",
                "TTFT p95 ms",
                "latency p50 s",
                "latency p95 s",
                "prompt sent",
                "prompt computed",
                f"ours = at {levels[0]}",
            ],
            rows,
        )
    )
    if "ours" in systems and 1 in levels:
        base = results[("ours", 1)][0]
        p50 = bl.percentile([s.ttft for s in base], 50)
        p95 = bl.percentile([s.ttft for s in base], 95)
        for level in levels:
            if level >= 16:
                cur = [s.ttft for s in results[("ours", level)][0]]
                r50, r95 = bl.percentile(cur, 50) / p50, bl.percentile(cur, 95) / p95
                print(
                    f"target ours TTFT at {level} vs 1: p50 {r50:.2f}x (<= 2x: "
                    f"{bl.verdict(r50 <= 2)}), p95 {r95:.2f}x (<= 4x: {bl.verdict(r95 <= 4)})"
                )
        for level in levels:
            if level < 8:
                continue
            ours = results[("ours", level)][1]
            for peer in systems:
                if peer != "ours":
                    rel = results[(peer, level)][1] / ours
                    verdict = bl.verdict(rel > 1)
                    print(f"makespan at {level}: {peer} / ours = {rel:.2f}x ({verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
