"""N. The first request after LoadModel in a fresh container, with and without warm-up.

MLX compiles kernels on first use and caches them under ``$TMPDIR/mlx/<version>/cpu``
(Metal and CUDA compile on first use too), so in a fresh container the first request
paid for them. Each configuration starts a backend (``run.sh``) with an empty
``TMPDIR`` of its own, loads the embedded model and sends two requests of the same size
(different prompts, greedy): the first request's TTFT and total time against the
second's. Configurations: ``warm-up`` (the default) and ``no warm-up`` (``warmup:false``),
side by side in one run. Target (issue 24): first request <= 3x a later one.

    python bench/bench_warmup.py                 # ~3 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time

import benchlib as bl

CONFIGS = {"warm-up": [], "no warm-up": ["warmup:false"]}


def run_config(maker: bl.PromptMaker, args, options: list[str]) -> dict:
    tmp = tempfile.mkdtemp(prefix="bench-warmup-")
    server = bl.Backend(env={"TMPDIR": tmp})
    try:
        load_s = server.load(bl.embedded_gguf(), options)
        runs = []
        for _ in range(2):
            start = time.perf_counter()
            res = bl.grpc_stream(
                server.stub, bl.predict_options(maker.prompt(args.prompt_tokens), args.new_tokens)
            )
            runs.append((res.ttft, time.perf_counter() - start))
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"load": load_s, "first": runs[0], "later": runs[1]}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args(argv)
    print(bl.header("N. first request after LoadModel in a fresh TMPDIR", [__file__, *argv]))
    maker = bl.PromptMaker(bl.converted_dir() / "tokenizer.json")
    rows = []
    results: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for _ in range(args.rounds):
        for name, options in CONFIGS.items():
            results[name].append(run_config(maker, args, options))
    for name, runs in results.items():
        load = bl.median(r["load"] for r in runs)
        first_ttft = bl.median(r["first"][0] for r in runs)
        later_ttft = bl.median(r["later"][0] for r in runs)
        first_total = bl.median(r["first"][1] for r in runs)
        later_total = bl.median(r["later"][1] for r in runs)
        ratio = first_total / later_total
        rows.append(
            (
                name,
                f"{load:.1f} s",
                f"{first_ttft:.2f} s",
                f"{later_ttft:.2f} s",
                f"{first_total:.2f} s",
                f"{later_total:.2f} s",
                f"{ratio:.1f}x",
                bl.verdict(ratio <= 3.0),
            )
        )
    headers = (
        "config",
        "LoadModel",
        "TTFT 1st",
        "TTFT 2nd",
        "total 1st",
        "total 2nd",
        "1st/2nd",
        "target",
    )
    print(bl.table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
