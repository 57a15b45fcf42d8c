"""B. Aggregate decode throughput at 1, 2, 4, 8 concurrent streams: ours vs mlx_lm.server.

Three servers run side by side, all on the same dense float32 weights of the embedded
SmolLM2 with MKL preloaded:

* **ours**: our backend via ``run.sh``, ``cpu_dequantize:true`` (continuous batching,
  default ``max_batch_size`` 8);
* **mlx_lm.server**: ``python -m mlx_lm.server`` from the installed mlx-lm on a free
  127.0.0.1 port, started with the same MKL preload, serving a dense float32 MLX
  directory saved once from our own prepared model (``benchlib.dense_model_dir``), driven
  over HTTP ``/v1/completions`` with ``stream``, ``max_tokens`` and temperature 0;
* **one-at-a-time**: our backend with ``max_batch_size:1``: requests queue and run one
  after another, as the original LocalAI MLX backend served them (one lock around
  ``generate``).

For each concurrency level the three systems run in turn (the order rotates per level
and round). Each stream gets its own unique prompt of ``--prompt-tokens`` tokens (no
prefix-cache help anywhere), greedy, EOS biased away so every stream generates exactly
``--new-tokens`` tokens. Reported per system and level:

* **decode-window tok/s**: the tokens all streams received while every one of them was
  decoding (from the last stream's first token to the first stream's last token), over
  that window: the aggregate decode rate the targets speak of. For one stream, its decode
  rate; "-" when the streams never overlap (one-at-a-time);
* **end-to-end tok/s**: all generated tokens / wall time from the first request sent to
  the last token received (prefill included: what clients see);
* the median per-stream decode tok/s after its first token, and the median TTFT.

Medians over ``--rounds``.

Targets: ours at 8 streams >= 3x ours at 1 stream; ours >= mlx_lm.server at 8 streams.

    python bench/bench_concurrency.py --new-tokens 32      # quick: ~4 minutes
    python bench/bench_concurrency.py                       # 128 new tokens: ~10 minutes
    python bench/bench_concurrency.py --rounds 3 --systems ours,mlx_lm.server
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import time
from collections.abc import Callable

import benchlib as bl

SYSTEMS = ("ours", "mlx_lm.server", "one-at-a-time")


def decode_window_tps(results: list[bl.StreamResult]) -> float:
    """Aggregate decode tok/s while every stream is decoding; NaN if they never overlap.

    The window runs from the last stream's first token to the first stream's last
    token; the tokens all streams received inside it, over its length.
    """
    t_a = max(r.t_first for r in results)
    t_b = min(r.t_last for r in results)
    if t_b - t_a < 0.5:  # too short to time (or the streams ran one after another)
        return float("nan")
    tokens = sum(r.count_at(t_b) - r.count_at(t_a) for r in results)
    return tokens / (t_b - t_a)


def run_level(
    stream_fn: Callable[[str], bl.StreamResult], prompts: list[str]
) -> tuple[float, float, float, float, int]:
    """Run one stream per prompt at once.

    Returns (end-to-end tok/s, decode-window tok/s, per-stream decode tok/s, TTFT s,
    tokens); medians over the streams for the per-stream figures.
    """
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(stream_fn, prompts))
    t_end = max(r.t_last for r in results)
    tokens = sum(r.tokens for r in results)
    window = decode_window_tps(results) if len(results) > 1 else results[0].decode_tps
    return (
        tokens / (t_end - t0),
        window,
        bl.median(r.decode_tps for r in results),
        bl.median(r.ttft for r in results),
        tokens,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="1,2,4,8", help="concurrency levels, comma-separated")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="prompt length, tokens")
    ap.add_argument("--new-tokens", type=int, default=128, help="tokens generated per stream")
    ap.add_argument("--rounds", type=int, default=1, help="rounds over all levels")
    ap.add_argument(
        "--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {SYSTEMS}"
    )
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.streams.split(",")]
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        ap.error(f"unknown systems {sorted(unknown)}")

    print(bl.header("B. Aggregate decode throughput vs concurrency", sys.argv))
    gguf = bl.embedded_gguf()
    pm = bl.PromptMaker(bl.converted_dir() / "tokenizer.json")
    procs: list = []
    try:
        fns: dict[str, Callable[[str], bl.StreamResult]] = {}
        if "ours" in systems:
            ours = bl.Backend("ours")
            procs.append(ours)
            ours.load(gguf, ["cpu_dequantize:true"])
            fns["ours"] = lambda p, s=ours.stub: bl.grpc_stream(
                s, bl.predict_options(p, args.new_tokens)
            )
        if "one-at-a-time" in systems:
            seq = bl.Backend("one-at-a-time")
            procs.append(seq)
            seq.load(gguf, ["cpu_dequantize:true", "max_batch_size:1"])
            fns["one-at-a-time"] = lambda p, s=seq.stub: bl.grpc_stream(
                s, bl.predict_options(p, args.new_tokens)
            )
        if "mlx_lm.server" in systems:
            dense = bl.dense_model_dir()
            mlx = bl.MlxLmServer(dense)
            procs.append(mlx)
            fns["mlx_lm.server"] = lambda p, port=mlx.port: bl.http_stream(port, p, args.new_tokens)
            print(f"mlx_lm.server on 127.0.0.1:{mlx.port} serving {dense}")
        for proc in procs:
            print(f"{proc.name}: pid {proc.proc.pid}, BLAS mapped: {bl.blas_mapped(proc.proc.pid)}")
        print()
        for name in systems:  # one warm-up request each
            fns[name](pm.prompt(args.prompt_tokens, "warm"))

        per: dict[tuple[str, int], list[tuple[float, ...]]] = {}
        rows = []
        turn = 0
        for rnd in range(args.rounds):
            for n in levels:
                order = systems[turn % len(systems) :] + systems[: turn % len(systems)]
                turn += 1
                for name in order:
                    prompts = [pm.prompt(args.prompt_tokens, f"B{rnd}-{n}-") for _ in range(n)]
                    e2e, window, dec, ttft, tokens = run_level(fns[name], prompts)
                    per.setdefault((name, n), []).append((e2e, window))
                    rows.append((rnd + 1, n, name, tokens, e2e, window, dec, ttft * 1000))
        print(
            bl.table(
                [
                    "round",
                    "streams",
                    "system",
                    "tokens",
                    "end-to-end tok/s",
                    "decode-window tok/s",
                    "per-stream decode tok/s",
                    "TTFT ms",
                ],
                rows,
            )
        )

        def med(name: str, n: int, k: int) -> float:
            return bl.median(v[k] for v in per.get((name, n), []))

        top = max(levels)
        for k, title in ((1, "decode-window"), (0, "end-to-end")):
            print(f"\nMedian {title} tok/s (ratios in the same run):\n")
            head = ["streams", *systems]
            if "ours" in systems:
                head += ["ours / ours@1"]
                head += [f"ours / {s}" for s in systems if s != "ours"]
            summary = []
            for n in levels:
                row: list[object] = [n, *(med(s, n, k) for s in systems)]
                if "ours" in systems:
                    row.append(med("ours", n, k) / med("ours", levels[0], k))
                    row += [med("ours", n, k) / med(s, n, k) for s in systems if s != "ours"]
                summary.append(row)
            print(bl.table(head, summary))
            if "ours" in systems and 1 in levels:
                scale = med("ours", top, k) / med("ours", 1, k)
                print(
                    f"\ntarget ({title}) ours@{top} >= 3x ours@1: {scale:.2f}x "
                    f"-> {bl.verdict(scale >= 3)}"
                )
            if "ours" in systems and "mlx_lm.server" in systems:
                rel = med("ours", top, k) / med("mlx_lm.server", top, k)
                print(
                    f"target ({title}) ours >= mlx_lm.server at {top}: {rel:.2f}x "
                    f"-> {bl.verdict(rel >= 1)}"
                )
    finally:
        for proc in procs:
            proc.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
