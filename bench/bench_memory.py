"""O. Eight streams with and without a memory budget: throughput and MLX peak memory.

One backend (``run.sh``, the embedded model); for each configuration a LoadModel, then
``--streams`` greedy streams of ``--prompt-tokens`` + ``--new-tokens`` tokens sent at
once. Reported: end-to-end aggregate tok/s, the most requests Status showed running at
once, and MLX's peak memory since the load (Status ``mlx_peak``) against the budget.
Configurations, side by side in one run: ``off`` (``memory_budget:0``) and ``budget``:
the weights, one prompt's prefill working set and ``--rows`` sequences at their longest
(each with the copy of its KV a step may hold, engine/memory.py ``KV_COPIES``) beside
the share of MLX's buffer cache (``budget_for``),
from the KV and prefill figures the server reports (Status ``memory_kv_per_token``,
``memory_prefill_per_token``). Target (issue 21): peak <= budget + 10%.

A third row, ``agents``: the same budget, the same streams declaring ``--tokens`` (2048,
as agents send large max_tokens) while each stops after about ``--new-tokens`` (a stop
string taken from its own output, computed alone first). Admitted on the KV they hold
(engine/preemption.py), they run as many at once as the ``budget`` row, where reserving
each at its longest (prompt + Tokens) would run ``reserved`` of them (issue 32 target:
at least 2x).

    python bench/bench_memory.py            # ~5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import sys

import benchlib as bl

from engine.memory import KV_COPIES, budget_for


def run(
    server: bl.Backend, prompts: list[str], new_tokens: int, stops: list[str] | None = None
) -> tuple[float, int, int, int, float]:
    requests = [
        bl.predict_options(p, new_tokens, StopPrompts=[stops[i]] if stops else [])
        for i, p in enumerate(prompts)
    ]
    results, most, elapsed = bl.streams_at_once(server.stub, requests)
    tokens = sum(r.tokens for r in results)
    return (
        tokens / elapsed,
        most,
        bl.memory_breakdown(server.stub)["mlx_peak"],
        tokens,
        elapsed,
    )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rows", type=float, default=4.0)
    ap.add_argument("--tokens", type=int, default=2048, help="Tokens the agents row declares")
    args = ap.parse_args(argv)
    print(bl.header("O. eight streams with and without a memory budget", [__file__, *argv]))
    maker = bl.PromptMaker(bl.converted_dir() / "tokenizer.json")
    prompts = [maker.prompt(args.prompt_tokens) for _ in range(args.streams)]
    server = bl.Backend()
    rows = []
    try:
        server.load(bl.embedded_gguf(), [f"memory_budget:{64 * 1024**3}"])  # the profile
        s = bl.memory_breakdown(server.stub)
        longest = -(-(args.prompt_tokens + args.new_tokens) // 256) * 256
        seq = s["memory_fixed_per_sequence"] + s["memory_kv_per_token"] * longest
        # Each row's KV and the copy of it a step may hold (engine/memory.py, KV_COPIES).
        kv_and_copy = 1 + KV_COPIES
        need = s["weights"] + s["memory_prefill_per_token"] * args.prompt_tokens
        need += int(args.rows * seq * kv_and_copy)
        # MLX's buffer cache takes its share of the budget beside that (engine/memory.py
        # cache_limit), as the memory-budget tests budget.
        budget = budget_for(need)
        # The agents' stop strings: where each prompt's own output reaches --new-tokens.
        stops = [
            bl.grpc_stream(server.stub, bl.predict_options(p, args.new_tokens)).text[-24:]
            for p in prompts
        ]
        declared = -(-(args.prompt_tokens + args.tokens) // 256) * 256
        at_longest = s["memory_fixed_per_sequence"] + s["memory_kv_per_token"] * declared
        reserved = max(int(args.rows * seq * kv_and_copy) // int(at_longest * kv_and_copy), 1)
        configs = (
            ("off", 0, args.new_tokens, None, "-"),
            ("budget", budget, args.new_tokens, None, "-"),
            ("agents", budget, args.tokens, stops, str(reserved)),
        )
        for name, value, tokens, stop, held in configs:
            server.load(bl.embedded_gguf(), [f"memory_budget:{value}"])
            tps, most, peak, made, secs = run(server, prompts, tokens, stop)
            limit = f"{budget / 2**20:.0f} MiB" if value else "-"
            ok = bl.verdict(peak <= budget * 1.1) if value else "-"
            rows.append(
                (name, limit, made, f"{secs:.1f}", f"{tps:.1f}", most, held,
                 f"{peak / 2**20:.0f} MiB", ok)
            )  # fmt: skip
    finally:
        server.stop()
    headers = (
        "config", "budget", "tokens", "s", "tok/s", "most running", "reserved (longest)",
        "MLX peak",
        "peak <= budget+10%",
    )  # fmt: skip
    print(bl.table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
