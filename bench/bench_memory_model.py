"""O2. The memory model against MLX's real peak: a budget from one request's measured peak.

As issue 32 measured it from outside: one backend (``run.sh``, the embedded model); a
LoadModel without a binding budget, one request of ``--prompt-tokens`` + ``--new-tokens``
alone, its MLX peak read from Status (``mlx_peak``, since the load); then a LoadModel with
``memory_budget`` = that peak + ``--margin-mib`` and ``--streams`` such requests (new
prompts, so no prompt-cache hits) sent at once. Reported: the single-request peak, the
budget, the most requests Status showed running at once, MLX's peak against the budget,
and (``--verify``) whether every output equals the same prompt's solo output (each solo run
after a fresh LoadModel). Target (issue 32): peak <= budget + 10%.

    python bench/bench_memory_model.py                 # ~4 minutes on 2 cores
    python bench/bench_memory_model.py --verify        # + 8 solo runs
"""

from __future__ import annotations

import argparse
import sys

import benchlib as bl

MIB = 1024 * 1024


def run(server: bl.Backend, prompts: list[str], new_tokens: int) -> tuple[list[str], int, float]:
    """(texts, most running at once, seconds) of ``prompts`` sent at once."""
    requests = [bl.predict_options(p, new_tokens) for p in prompts]
    results, most, elapsed = bl.streams_at_once(server.stub, requests)
    return [r.text for r in results], most, elapsed


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=1061)
    ap.add_argument("--new-tokens", type=int, default=150)
    ap.add_argument("--margin-mib", type=int, default=200)
    ap.add_argument("--verify", action="store_true", help="compare with each prompt's solo text")
    ap.add_argument("--options", default="", help="extra load options, comma-separated")
    args = ap.parse_args(argv)
    print(bl.header("O2. the memory model: a budget from one request's measured peak", sys.argv))
    maker = bl.PromptMaker(bl.converted_dir() / "tokenizer.json")
    solo_prompt = maker.prompt(args.prompt_tokens)
    prompts = [maker.prompt(args.prompt_tokens) for _ in range(args.streams)]
    extra = [o for o in args.options.split(",") if o]
    server = bl.Backend()
    try:
        server.load(bl.embedded_gguf(), [f"memory_budget:{64 * 1024**3}", *extra])
        run(server, [solo_prompt], args.new_tokens)
        s = bl.memory_breakdown(server.stub)
        single = s["mlx_peak"]
        solo: list[str] = []
        if args.verify:
            for p in prompts:  # a fresh load each: no prompt-cache hit, peak reset
                server.load(bl.embedded_gguf(), [f"memory_budget:{64 * 1024**3}", *extra])
                solo += run(server, [p], args.new_tokens)[0]
        budget = single + args.margin_mib * MIB
        server.load(bl.embedded_gguf(), [f"memory_budget:{budget}", *extra])
        s = bl.memory_breakdown(server.stub)
        texts, most, elapsed = run(server, prompts, args.new_tokens)
        peak = bl.memory_breakdown(server.stub)["mlx_peak"]
    finally:
        server.stop()
    same = f"{sum(a == b for a, b in zip(texts, solo, strict=True))}/{len(texts)}" if solo else "-"
    headers = (
        "streams x tokens",
        "single peak",
        "budget",
        "prefill KiB/token",
        "most running",
        "MLX peak",
        "over budget",
        "seconds",
        "peak <= budget+10%",
        "= solo",
    )
    row = (
        f"{args.streams} x {args.prompt_tokens}+{args.new_tokens}",
        f"{single / MIB:.0f} MiB",
        f"{budget / MIB:.0f} MiB",
        f"{s.get('memory_prefill_per_token', 0) / 1024:.0f}",
        most,
        f"{peak / MIB:.0f} MiB",
        f"{(peak / budget - 1) * 100:+.1f}%",
        f"{elapsed:.0f}",
        bl.verdict(peak <= budget * 1.1),
        same,
    )
    print(bl.table(headers, [row]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
