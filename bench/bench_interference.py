"""M. Running streams while a long prompt prefills: inter-token gaps, and that prompt's TTFT.

One backend (``run.sh``, the embedded SmolLM2 GGUF, default options, so dense float32 on
MKL here) serves ``--streams`` greedy streams of ``--new-tokens`` tokens each; once they
all decode, a ``--long-tokens`` prompt arrives. Reported per configuration:

* the running streams' **worst** and **p99 inter-token gap** while the long prompt
  prefills (from its send to its first token), against their median gap before it came;
* the long prompt's **TTFT beside the streams**, and **alone** (no other request), and the
  ratio of the two.

Configurations, side by side in one run, on one server (LoadModel again between them):
``budget`` (the default: the scheduler's per-step time budget ``step_budget_ms``) and
``no budget`` (``step_budget_ms:0``: one full ``prefill_step_size`` chunk per step, the
behaviour before the budget). Targets (issue 24): worst gap <= 1.5 s, TTFT beside the
streams <= 1.5x alone.

    python bench/bench_interference.py                    # ~4 minutes on 2 cores
    python bench/bench_interference.py --configs budget --rounds 2
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import sys
import threading
import time

import benchlib as bl

CONFIGS = {"budget": [], "no budget": ["step_budget_ms:0"]}


def gaps_between(marks: list[tuple[float, int]], t0: float, t1: float) -> list[float]:
    """Inter-arrival gaps (s) of a stream's token messages that end inside [t0, t1]; a gap
    that started before t0 counts too (that is the freeze a user sees)."""
    out = []
    for (a, _), (b, _) in itertools.pairwise(marks):
        if t0 < b <= t1 or (a < t0 < b):
            out.append(b - a)
    return out


def run_config(server: bl.Backend, maker: bl.PromptMaker, args, options: list[str]) -> dict:
    server.load(bl.embedded_gguf(), options)
    stub = server.stub
    # Warm-up: the kernels of this load (first request pays for them otherwise).
    bl.grpc_stream(stub, bl.predict_options(maker.prompt(64), 4))
    long_prompt = maker.prompt(args.long_tokens, "long")
    alone = bl.grpc_stream(stub, bl.predict_options(long_prompt, 1))
    # A different long prompt of the same length beside the streams (no cache help).
    long_prompt = maker.prompt(args.long_tokens, "long")
    streams: list[bl.StreamResult] = []
    started = threading.Barrier(args.streams + 1)

    def stream(prompt: str) -> bl.StreamResult:
        started.wait()
        return bl.grpc_stream(stub, bl.predict_options(prompt, args.new_tokens))

    with concurrent.futures.ThreadPoolExecutor(args.streams) as pool:
        futures = [
            pool.submit(stream, maker.prompt(args.prompt_tokens)) for _ in range(args.streams)
        ]
        started.wait()
        time.sleep(args.settle)  # let every stream reach decoding
        beside = bl.grpc_stream(stub, bl.predict_options(long_prompt, 1))
        streams = [f.result() for f in futures]
    t0, t1 = beside.t_start, beside.t_first
    during = [g for s in streams for g in gaps_between(s.marks, t0, t1)]
    before = [g for s in streams for g in gaps_between(s.marks, 0.0, t0)]
    if not during:
        raise RuntimeError(
            "the streams ended before the long prompt's first token: raise --new-tokens"
        )
    return {
        "worst": max(during),
        "p99": bl.percentile(during, 99),
        "median_before": bl.median(before) if before else float("nan"),
        "ttft_beside": beside.ttft,
        "ttft_alone": alone.ttft,
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=400)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--long-tokens", type=int, default=3000)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds before the long prompt")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    args = ap.parse_args(argv)
    print(bl.header("M. long prefill beside running streams", [__file__, *argv]))
    maker = bl.PromptMaker(bl.converted_dir() / "tokenizer.json")
    server = bl.Backend()
    rows = []
    try:
        results: dict[str, list[dict]] = {name: [] for name in args.configs.split(",")}
        for _ in range(args.rounds):
            for name in results:
                results[name].append(run_config(server, maker, args, CONFIGS[name]))
        for name, runs in results.items():
            worst = bl.median(r["worst"] for r in runs)
            p99 = bl.median(r["p99"] for r in runs)
            before = bl.median(r["median_before"] for r in runs)
            beside = bl.median(r["ttft_beside"] for r in runs)
            alone = bl.median(r["ttft_alone"] for r in runs)
            ok = worst <= 1.5 and beside <= 1.5 * alone
            rows.append(
                (
                    name,
                    f"{before * 1000:.0f} ms",
                    f"{worst:.2f} s",
                    f"{p99:.2f} s",
                    f"{beside:.1f} s",
                    f"{alone:.1f} s",
                    f"{beside / alone:.2f}x",
                    bl.verdict(ok),
                )
            )
    finally:
        server.stop()
    headers = (
        "config",
        "gap before",
        "worst gap",
        "p99 gap",
        "TTFT beside",
        "TTFT alone",
        "ratio",
        "target",
    )
    print(bl.table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
