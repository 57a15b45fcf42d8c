"""G. Server decode speed over the matmul floor, with and without cpu_fuse (one run).

Starts two servers through ``run.sh`` (MKL preloaded) with the embedded SmolLM2-135M
GGUF, dense float32 (``cpu_dequantize:true``): one with the fused Q/K/V and gate/up
projections (``cpu_fuse:true``, the default) and one without (``cpu_fuse:false``). In
this process (same MKL preload) it loads the same dense weights and times the
"matmul floor": every linear layer's matmul and the tied output head alone, one decode
row (``bench/profile_step.py``'s ``Step.matmul_floor``), and the same at 8 rows.

Each round, on each server in rotated order: the floor at 1 row, one greedy stream
(``--new-tokens``, EOS biased away), the floor again (the request's floor is the median
of the two: the same host conditions), the floor at ``--streams`` rows, and
``--streams`` concurrent streams. Reported: server ms per generated token (1 stream,
decode window) / its floor (target <= 1.6), aggregate decode tok/s at ``--streams``
(fused not lower than plain: median of the per-round fused/plain ratios), load average.

    python bench/bench_decode.py                       # 3 rounds, ~5 minutes on 2 busy cores
    python bench/bench_decode.py --rounds 5 --new-tokens 96
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

import benchlib as bl


def aggregate(stub, prompts: list[str], new_tokens: int) -> float:
    """Aggregate decode tok/s of concurrent streams (tokens after each first token, over
    the window from the first first-token to the last last-token)."""
    results: list = [None] * len(prompts)

    def one(i: int) -> None:
        results[i] = bl.grpc_stream(stub, bl.predict_options(prompts[i], new_tokens))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    done = [r for r in results if r is not None and r.tokens]
    span = max(r.t_last for r in done) - min(r.t_first for r in done)
    return sum(r.k_last - r.k_first for r in done) / span if span > 0 else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds (each: all sides)")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="prompt length, tokens")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens per stream")
    ap.add_argument("--streams", type=int, default=8, help="concurrent streams for aggregate")
    ap.add_argument("--floor-repeats", type=int, default=15, help="floor timings per round")
    args = ap.parse_args(argv)
    env = bl.fast_env()
    if env.get("LD_PRELOAD", "") != os.environ.get("LD_PRELOAD", ""):
        # The BLAS must be preloaded before the process starts: run again with it.
        return subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env).returncode

    from profile_step import Step

    from loading import cpu_fast_path, model_loader

    print(bl.header("G. Decode step: server ms/token over the matmul floor", sys.argv))
    gguf = bl.embedded_gguf()
    pm = bl.PromptMaker(bl.converted_dir() / "tokenizer.json")
    model, tok = model_loader.load_model(str(model_loader.embedded_model_path()))
    cpu_fast_path.prepare_for_cpu(model, True)
    floors = {}
    for b in (1, args.streams):
        floors[b] = Step(model, tok, b, args.prompt_tokens)
        floors[b].prepare()
        floors[b].matmul_floor()

    def floor_ms(b: int) -> float:
        ts = []
        for _ in range(args.floor_repeats):
            t0 = time.perf_counter()
            floors[b].matmul_floor()
            ts.append((time.perf_counter() - t0) * 1000)
        return statistics.median(ts)

    servers: dict[str, bl.Backend] = {}
    try:
        for name, opt in (("plain", "cpu_fuse:false"), ("fused", "cpu_fuse:true")):
            servers[name] = bl.Backend(name)
            servers[name].load(gguf, ["cpu_dequantize:true", opt])
        for s in servers.values():  # warm-up
            bl.grpc_stream(s.stub, bl.predict_options(pm.prompt(args.prompt_tokens, "w"), 16))
        rows = []
        res: dict[str, list[tuple[float, float, float, float]]] = {n: [] for n in servers}
        paired: list[tuple[float, float]] = []  # per round: fused / plain (ms, aggregate)
        names = list(servers)
        for i in range(args.rounds):
            pair = {}
            for name in names[i % 2 :] + names[: i % 2]:
                stub = servers[name].stub
                f1 = floor_ms(1)  # right before the request: the same host conditions
                prompt = pm.prompt(args.prompt_tokens, f"G{i}{name}")
                r = bl.grpc_stream(stub, bl.predict_options(prompt, args.new_tokens))
                f1 = statistics.median([f1, floor_ms(1)])
                ms = 1000 / r.decode_tps
                f8 = floor_ms(args.streams)
                prompts = [
                    pm.prompt(args.prompt_tokens, f"G{i}{name}{k}-") for k in range(args.streams)
                ]
                agg = aggregate(stub, prompts, args.new_tokens)
                pair[name] = (ms, agg)
                res[name].append((ms, ms / f1, agg, f1))
                rows.append((i + 1, name, f1, f8, ms, ms / f1, agg, os.getloadavg()[0]))
            fused, plain = pair["fused"], pair["plain"]
            paired.append((fused[0] / plain[0], fused[1] / plain[1]))
        print(
            bl.table(
                [
                    "round",
                    "server",
                    "floor ms (1 row)",
                    f"floor ms ({args.streams} rows)",
                    "ms/token (1 stream)",
                    "ms/token / floor",
                    f"aggregate tok/s ({args.streams} streams)",
                    "load",
                ],
                rows,
            )
        )
        med = {n: [statistics.median(v[k] for v in res[n]) for k in range(4)] for n in res}
        print()
        print(
            bl.table(
                ["server", "ms/token", "ms/token / floor", f"aggregate tok/s @{args.streams}"],
                [(n, med[n][0], med[n][1], med[n][2]) for n in names],
            )
        )
        ratio = med["fused"][1]
        ms_pair = statistics.median(p[0] for p in paired)
        agg_pair = statistics.median(p[1] for p in paired)
        print(
            f"\ntarget ms/token / floor <= 1.6 (fused, median of requests): {ratio:.2f} -> "
            f"{bl.verdict(ratio <= 1.6)} (plain: {med['plain'][1]:.2f})"
        )
        print(
            f"target aggregate @{args.streams} fused >= plain (median of per-round ratios): "
            f"{agg_pair:.2f}x -> {bl.verdict(agg_pair >= 1.0)}"
        )
        print(f"fused / plain ms per token (median of per-round ratios): {ms_pair:.2f}")
        print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    finally:
        for s in servers.values():
            s.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
