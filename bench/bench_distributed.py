"""F. Distributed mode: one process vs a 3-rank tensor-parallel group on this machine.

Two setups serve the embedded SmolLM2, loaded with the same ``cpu_dequantize`` option:

* **1 rank**: our backend via ``run.sh`` (as LocalAI starts it);
* **3 ranks**: ``mlx.launch -n 3 --backend ring -p PORT run.sh --distributed tensor``,
  every rank on 127.0.0.1 (the ring backend over loopback).

Per setup: the LoadModel time; each rank's weight bytes (``weights_rank_<i>`` in Status,
``weights`` for one process) and resident memory (VmRSS from ``/proc``); one greedy
stream of ``--new-tokens`` tokens after a ``--prompt-tokens`` prompt (EOS biased away):
TTFT and decode tok/s; ``--streams`` concurrent streams: aggregate tok/s (prefill
included). The greedy texts of the two setups are compared. Medians over ``--rounds``.

On one machine the group cannot be faster: each decode step needs two all-reduces per
layer, the ring backend's I/O threads busy-poll while they wait, and three ranks share
the same cores. The point is memory per rank and that the output is unchanged.

    python bench/bench_distributed.py                      # ~3-6 minutes on 2 busy cores
    python bench/bench_distributed.py --new-tokens 64 --rounds 3
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import benchlib as bl
import grpc

import backend_pb2
import backend_pb2_grpc

RANKS = 3
LAUNCHER = Path(sys.executable).parent / "mlx.launch"
FOLLOWING = re.compile(r"rank (\d+) of \d+ \(pid (\d+)\): following rank 0")
SERVING_PID = re.compile(r"serving on \S+ \(pid (\d+)\)")


class Group(bl.Backend):
    """A 3-rank group started by mlx.launch on loopback; rank 0 serves gRPC."""

    def __init__(self) -> None:
        port = _free_base_port(RANKS)
        cmd = [str(LAUNCHER), "-n", str(RANKS), "--backend", "ring", "-p", str(port)]
        cmd += [str(bl.ROOT / "run.sh"), "--addr", f"{bl.HOST}:0", "--distributed", "tensor"]
        bl._Proc.__init__(self, cmd, dict(os.environ), "group")  # run.sh adds MKL
        try:
            self.address = self._wait_for_address(120.0)  # clients/server_process.py
        except BaseException:
            self.stop()  # the launcher and its ranks go too
            raise
        self.channel = grpc.insecure_channel(self.address)
        self.stub = backend_pb2_grpc.BackendStub(self.channel)

    def pids(self) -> dict[int, int]:
        text = self.logs()
        pids = {int(r): int(p) for r, p in FOLLOWING.findall(text)}
        m = SERVING_PID.search(text)
        if m:
            pids[0] = int(m.group(1))
        return pids

    def stop(self, timeout: float = 60.0) -> None:
        # SIGTERM to rank 0: it tells the other ranks to exit; mlx.launch then exits.
        if hasattr(self, "channel"):  # not where the group never came up
            self.channel.close()
        rank0 = self.pids().get(0)
        if rank0 is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank0, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            for pid in self.pids().values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        bl._Proc.stop(self, timeout)


def _free_base_port(n: int) -> int:
    for _ in range(100):
        base = bl.free_port()
        try:
            socks = [socket.create_server((bl.HOST, base + i)) for i in range(n)]
        except OSError:
            continue
        for s in socks:
            s.close()
        return base
    raise RuntimeError("no free port range")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(server: bl.Backend, pids: dict[int, int], args, maker: bl.PromptMaker) -> dict:
    load_s = server.load(bl.embedded_gguf(), [f"cpu_dequantize:{args.cpu_dequantize}"])
    status = server.stub.Status(backend_pb2.HealthMessage())
    b = dict(status.memory.breakdown)
    weights = [b.get(f"weights_rank_{r}", b["weights"]) / 1e6 for r in range(len(pids))]
    rss = [rss_mb(pids[r]) for r in range(len(pids))]
    single, aggregate, texts = [], [], []
    fixed = args.fixed_prompt
    for _ in range(args.rounds):
        res = bl.grpc_stream(server.stub, bl.predict_options(fixed, args.new_tokens))
        single.append(res)
        texts.append(res.text)
        prompts = [maker.prompt(args.prompt_tokens) for _ in range(args.streams)]
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.streams) as pool:
            results = list(
                pool.map(
                    lambda p: bl.grpc_stream(server.stub, bl.predict_options(p, args.new_tokens)),
                    prompts,
                )
            )
        wall = time.perf_counter() - start
        aggregate.append(sum(r.tokens for r in results) / wall)
    return {
        "load_s": load_s,
        "weights": weights,
        "rss": rss,
        "ttft": bl.median(r.ttft for r in single),
        "decode": bl.median(r.decode_tps for r in single),
        "aggregate": bl.median(aggregate),
        "text": texts[0],
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cpu-dequantize", default="true", help="true (dense) or false")
    args = parser.parse_args(argv)
    if not LAUNCHER.exists():
        sys.exit(f"{LAUNCHER} not found: install mlx with its launcher")
    out = [bl.header("F. Distributed: 1 process vs 3 tensor-parallel ranks", sys.argv)]
    maker = bl.PromptMaker(bl.converted_dir() / "tokenizer.json")
    # The same prompt for both setups (the maker's prompts are unique per call).
    args.fixed_prompt = maker.prompt(args.prompt_tokens, tag="fixed")
    results = {}
    one = bl.Backend("one")
    try:
        results["1 rank"] = measure(one, {0: one.proc.pid}, args, maker)
    finally:
        one.stop()
    group = Group()
    try:
        deadline = time.monotonic() + 120
        while len(group.pids()) < RANKS and time.monotonic() < deadline:
            time.sleep(0.2)
        results["3 ranks"] = measure(group, group.pids(), args, maker)
    finally:
        group.stop()
    rows = []
    for name, r in results.items():
        rows.append(
            [
                name,
                r["load_s"],
                " / ".join(f"{w:.0f}" for w in r["weights"]),
                " / ".join(f"{m:.0f}" for m in r["rss"]),
                r["ttft"],
                r["decode"],
                r["aggregate"],
            ]
        )
    out.append(
        f"prompt {args.prompt_tokens} tokens, {args.new_tokens} new tokens, "
        f"{args.streams} concurrent streams, cpu_dequantize={args.cpu_dequantize}, "
        f"{args.rounds} round(s)\n"
    )
    out.append(
        bl.table(
            [
                "setup",
                "load s",
                "weights MB per rank",
                "RSS MB per rank",
                "TTFT s",
                "decode tok/s (1 stream)",
                f"aggregate tok/s ({args.streams} streams)",
            ],
            rows,
        )
    )
    one_w, group_w = results["1 rank"]["weights"][0], results["3 ranks"]["weights"]
    same = results["1 rank"]["text"] == results["3 ranks"]["text"]
    out.append(
        f"\nweights per rank: {max(group_w) / one_w:.2f}x one process's; greedy text "
        f"identical: {same}"
    )
    if not same:
        for name, r in results.items():
            out.append(f"{name}: {r['text']!r}")
    print("\n".join(out))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
