"""Delivery in steps (issue 30): one hand-off to the event loop per engine step vs one per token.

Our backend (``run.sh``) serves the tiny random-weight llama of tests/tiny_models.py (2
layers, hidden 64: the host work per token dominates, as it does for small models on
Apple GPUs) to 1, 8 and 32 concurrent greedy streams of ``--new-tokens`` tokens each
(IgnoreEOS, unique prompts). Two builds side by side, alternating per round:

* **steps**: this tree;
* **per-token**: the tree given by ``--before`` (an export of the commit before delivery in
  steps, e.g. ``git archive 040310c | tar -x -C /tmp/before`` plus the generated
  ``backend_pb2*.py`` and a ``.venv`` link), whose engine hands every event to the event
  loop by itself.

Reported per build and level (medians over ``--rounds``): end-to-end tok/s (all tokens /
wall time from the first request to the last reply), replies per token (below 1 when
replies carry several tokens), and the server's CPU milliseconds per token on its main
thread (the asyncio event loop's, which the hand-offs wake) and on all its other threads
(the engine's, gRPC's, BLAS's).

    python bench/bench_delivery.py --before /tmp/before                 # ~3 minutes
    python bench/bench_delivery.py --before /tmp/before --rounds 3 --new-tokens 256
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib as bl
import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import tiny_models

import backend_pb2
import backend_pb2_grpc

SERVING = re.compile(r"serving on (\S+:\d+)")


class Tree:
    """Our backend started from ``root``'s ``run.sh`` on 127.0.0.1 port 0."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115  (closed in stop())
            "w+", prefix=f"bench-{name}-", suffix=".log", delete=False
        )
        self.proc = subprocess.Popen(
            [str(root / "run.sh"), "--addr", "127.0.0.1:0"],
            cwd=root,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 120
        while not (m := SERVING.search(Path(self.log.name).read_text(errors="replace"))):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start: {Path(self.log.name).read_text()}")
            time.sleep(0.05)
        self.channel = grpc.insecure_channel(m.group(1))
        self.stub = backend_pb2_grpc.BackendStub(self.channel)

    def load(self, model: Path) -> None:
        opts = backend_pb2.ModelOptions(Model=str(model), Options=["max_batch_size:32"])
        res = self.stub.LoadModel(opts, timeout=600)
        if not res.success:
            raise RuntimeError(f"{self.name}: LoadModel failed: {res.message}")

    def stop(self) -> None:
        self.channel.close()
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        os.unlink(self.log.name)


def stream(stub, prompt: str, new_tokens: int) -> tuple[int, int]:
    """One greedy PredictStream to the end: (tokens, replies)."""
    req = backend_pb2.PredictOptions(
        Prompt=prompt, Tokens=new_tokens, Temperature=0.0, IgnoreEOS=True
    )
    replies = list(stub.PredictStream(req, timeout=600))
    return replies[-1].tokens, len(replies)


def thread_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds so far of process ``pid``'s main thread (which runs the asyncio event
    loop, `edge.startup`) and of all its other threads (the engine's, gRPC's, BLAS's)."""
    loop = other = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        if task.name == str(pid):
            loop += cpu
        else:
            other += cpu
    return loop, other


def level(server: Tree, prompts: list[str], new_tokens: int) -> tuple[float, ...]:
    """All ``prompts`` streamed at once: (tok/s, replies/token, server CPU ms per token: the
    event loop's thread, the other threads)."""
    (e0, o0), t0 = thread_cpu(server.proc.pid), time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        done = list(pool.map(lambda p: stream(server.stub, p, new_tokens), prompts))
    wall, (e1, o1) = time.perf_counter() - t0, thread_cpu(server.proc.pid)
    tokens, replies = sum(t for t, _ in done), sum(r for _, r in done)
    return tokens / wall, replies / tokens, (e1 - e0) / tokens * 1000, (o1 - o0) / tokens * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="a tree of the code before (per-token)")
    ap.add_argument("--streams", default="1,8,32", help="concurrency levels, comma-separated")
    ap.add_argument("--new-tokens", type=int, default=128, help="tokens per stream")
    ap.add_argument("--prompt-tokens", type=int, default=32, help="prompt length, tokens")
    ap.add_argument("--rounds", type=int, default=2, help="rounds over builds and levels")
    args = ap.parse_args(argv)
    levels = [int(n) for n in args.streams.split(",")]
    print(bl.header("Delivery in steps vs per token (issue 30)", sys.argv))
    builds = {"steps": bl.ROOT}
    if args.before is not None:
        builds["per-token"] = args.before.resolve()
    servers: dict[str, Tree] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="tiny-models-") as root:
            model = tiny_models.build("llama", Path(root))
            pm = bl.PromptMaker(model / "tokenizer.json")
            for name, tree in builds.items():
                servers[name] = Tree(name, tree)
                servers[name].load(model)
                level(servers[name], [pm.prompt(args.prompt_tokens, "warm")] * 2, 8)
            per: dict[tuple[str, int], list[tuple[float, ...]]] = {}
            for rnd in range(args.rounds):
                order = list(builds) if rnd % 2 == 0 else list(reversed(builds))
                for n in levels:
                    for name in order:
                        prompts = [
                            pm.prompt(args.prompt_tokens, f"D{rnd}{n}{name}") for _ in range(n)
                        ]
                        per.setdefault((name, n), []).append(
                            level(servers[name], prompts, args.new_tokens)
                        )
    finally:
        for server in servers.values():
            server.stop()

    def med(name: str, n: int, k: int) -> float:
        return bl.median(v[k] for v in per[(name, n)])

    head = ["streams", "build", "tok/s", "replies / token", "event-loop thread CPU ms / token"]
    head += ["other threads CPU ms / token"]
    rows = [(n, name, *(med(name, n, k) for k in range(4))) for n in levels for name in builds]
    print(bl.table(head, rows))
    if "per-token" in builds:
        ratios = [
            (n, *(med("steps", n, k) / med("per-token", n, k) for k in (0, 2, 3))) for n in levels
        ]
        print("\nsteps / per-token, same run:\n")
        print(bl.table(["streams", "tok/s", "event-loop thread CPU", "other threads CPU"], ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
