"""P. Speculation inside the batch: 4 concurrent streams, n-gram speculation vs plain.

Two backends side by side (``run.sh``-equivalent processes, MKL preloaded), both on the
embedded SmolLM2 with ``cpu_dequantize:true``: **plain** and **ngram** (the same plus
``speculative:ngram``, its default 8 draft tokens). Each round sends the same
``--streams`` prompts at once to one, then the other (the order alternates per round),
for two prompt kinds:

* **repetitive**: each stream a different list repeated four times, then the start of
  the next repetition (the continuation repeats earlier text);
* **ordinary**: each stream a different question whose answer does not quote it.

Greedy, EOS biased away (every stream makes ``--new-tokens`` tokens; the bias is a
logits processor, as many real requests carry). Reported: decode-window tok/s (tokens
all streams received while every one was decoding, over that window), end-to-end
tok/s, and whether each stream's text is identical between the two servers. Medians
over ``--rounds``.

Targets (issue 22): repetitive ngram/plain >= 1.5x, ordinary >= 0.9x, same text.

    python bench/bench_spec_batch.py                  # ~4 minutes on 2 cores
    python bench/bench_spec_batch.py --rounds 3 --new-tokens 128
"""

from __future__ import annotations

import argparse
import sys

import benchlib as bl
from bench_concurrency import run_level

REPETITIVE = [
    "Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus, Neptune\n",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday\n",
    "red, orange, yellow, green, blue, indigo, violet, white, black\n",
    "January, February, March, April, May, June, July, August\n",
]
ORDINARY = [
    "Explain in a few paragraphs how a refrigerator keeps food cold.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Describe the water cycle to a ten-year-old, step by step.",
    "What are the main differences between a violin and a cello? Answer in prose.",
]
TARGETS = {"repetitive": 1.5, "ordinary": 0.9}


def prompts(kind: str, n: int) -> list[str]:
    if kind == "repetitive":
        return [(line * 4) + line.split(",")[0] + "," for line in REPETITIVE[:n]]
    return [f"Question: {q}\nAnswer:" for q in ORDINARY[:n]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=4, help="concurrent streams (at most 4)")
    ap.add_argument("--new-tokens", type=int, default=96, help="tokens generated per stream")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    n = min(args.streams, 4)

    print(bl.header("P. Speculation inside the batch", sys.argv))
    gguf = bl.embedded_gguf()
    servers = {"plain": bl.Backend("plain"), "ngram": bl.Backend("ngram")}
    try:
        servers["plain"].load(gguf, ["cpu_dequantize:true"])
        servers["ngram"].load(gguf, ["cpu_dequantize:true", "speculative:ngram"])
        for srv in servers.values():
            print(f"{srv.name}: pid {srv.proc.pid}, BLAS mapped: {bl.blas_mapped(srv.proc.pid)}")
            bl.grpc_stream(srv.stub, bl.predict_options("Warm up: one, two, three,", 8))
        rows, per, same = [], {}, {}
        for rnd in range(args.rounds):
            for kind in ("repetitive", "ordinary"):
                texts = {}
                order = ("plain", "ngram") if rnd % 2 == 0 else ("ngram", "plain")
                for name in order:
                    stub = servers[name].stub
                    results = []

                    def stream(p: str, stub=stub, results=results) -> bl.StreamResult:
                        r = bl.grpc_stream(stub, bl.predict_options(p, args.new_tokens))
                        results.append((p, r.text))
                        return r

                    e2e, window, _, ttft, tokens = run_level(stream, prompts(kind, n))
                    texts[name] = dict(results)
                    per.setdefault((kind, name), []).append((window, e2e))
                    rows.append((rnd + 1, kind, name, tokens, e2e, window, ttft * 1000))
                same.setdefault(kind, []).append(texts["plain"] == texts["ngram"])
        print(
            bl.table(
                [
                    "round",
                    "prompts",
                    "server",
                    "tokens",
                    "end-to-end tok/s",
                    "decode-window tok/s",
                    "TTFT ms",
                ],
                rows,
            )
        )
        print("\nMedians (ratios in the same run):\n")
        summary = []
        for kind in ("repetitive", "ordinary"):
            w = {s: bl.median(v[0] for v in per[(kind, s)]) for s in servers}
            e = {s: bl.median(v[1] for v in per[(kind, s)]) for s in servers}
            ratio = w["ngram"] / w["plain"]
            summary.append(
                (
                    kind,
                    w["plain"],
                    w["ngram"],
                    ratio,
                    e["ngram"] / e["plain"],
                    f">= {TARGETS[kind]}x {bl.verdict(ratio >= TARGETS[kind])}",
                    "yes" if all(same[kind]) else "NO",
                )
            )
        print(
            bl.table(
                [
                    "prompts",
                    "plain decode-window tok/s",
                    "ngram decode-window tok/s",
                    "ratio",
                    "end-to-end ratio",
                    "target",
                    "same text",
                ],
                summary,
            )
        )
        for srv in servers.values():
            bl.grpc_stream(srv.stub, bl.predict_options("x", 1))
    finally:
        for srv in servers.values():
            srv.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
