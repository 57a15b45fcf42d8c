"""C. Time to first token with a cached ~1,000-token prefix vs cold.

Our backend (``run.sh``, ``cpu_dequantize:true``, default prompt cache). Each round
builds a fresh unique prefix of ``--prefix-tokens`` tokens, then sends, greedy and one
after another:

1. **cold**: prefix + suffix A (nothing of it is cached: the prefix is new);
2. **cached**: the same prefix + a different short suffix B. The cache holds the KV of
   request 1 (prefix + A + its output); the engine reuses the common prefix (trimming
   the entry) and prefills only suffix B.

Reported per round: client-side TTFT of both, the server's own prompt-processing time
(``timing_prompt_processing``), and the speed-up cold / cached; medians over rounds.

Target: cached TTFT >= 5x faster than cold.

    python bench/bench_prefix_cache.py                  # ~1 minute
    python bench/bench_prefix_cache.py --rounds 5 --prefix-tokens 2000
"""

from __future__ import annotations

import argparse
import sys

import benchlib as bl


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix-tokens", type=int, default=1000, help="shared prefix, tokens")
    ap.add_argument("--suffix-tokens", type=int, default=12, help="differing suffix, tokens")
    ap.add_argument("--new-tokens", type=int, default=8, help="tokens generated per request")
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds")
    args = ap.parse_args(argv)

    print(bl.header("C. Prefix cache: TTFT cached vs cold", sys.argv))
    pm = bl.PromptMaker(bl.converted_dir() / "tokenizer.json")
    server = bl.Backend()
    try:
        server.load(bl.embedded_gguf(), ["cpu_dequantize:true"])

        def ttft(prompt: str) -> bl.StreamResult:
            return bl.grpc_stream(server.stub, bl.predict_options(prompt, args.new_tokens))

        ttft(pm.prompt(64, "warm"))
        rows, speedups = [], []
        for i in range(args.rounds):
            prefix = pm.prompt(args.prefix_tokens, f"C{i}-")
            cold = ttft(prefix + " Question A: " + pm.words(args.suffix_tokens))
            warm = ttft(prefix + " Question B: " + pm.words(args.suffix_tokens))
            speedups.append(cold.ttft / warm.ttft)
            rows.append(
                (
                    i + 1,
                    pm.count(prefix),
                    cold.ttft * 1000,
                    warm.ttft * 1000,
                    cold.server_prompt_ms,
                    warm.server_prompt_ms,
                    cold.ttft / warm.ttft,
                )
            )
        print(
            bl.table(
                [
                    "round",
                    "prefix tok",
                    "cold TTFT ms",
                    "cached TTFT ms",
                    "cold server prompt ms",
                    "cached server prompt ms",
                    "speed-up",
                ],
                rows,
            )
        )
        best = bl.median(speedups)
        print(f"\ntarget cached >= 5x faster: median {best:.1f}x -> {bl.verdict(best >= 5)}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
