"""How the BLAS's cost grows with the number of sequences decoded together (diagnostic).

A decode step of SmolLM2 on the dense CPU path is a handful of float32 matmuls
``x @ W.T`` with one row of ``x`` per sequence in the batch. This script times those
matmuls in the model's shapes, with random data, for 1 to 32 rows: the tied lm_head
(49,152 x 576, 113 MB), an MLP up projection (1,536 x 576) and its way back
(576 x 1,536). If the BLAS reused each weight it reads for all rows, the time would
barely grow with rows (the step is memory-bound at 1 row); how fast it does grow bounds
the aggregate decode speed-up that batching can give (targets B and E).

It runs with the MKL preload that ``run.sh`` applies (re-executing itself with it when
needed). Each time is the best of ``--repeats`` runs after a warm-up (the run least
disturbed by other load on the host).

    python bench/profile_decode.py                  # ~30 seconds
    python bench/profile_decode.py --rows 1,8,64 --repeats 30
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import benchlib as bl

SHAPES = (
    ("lm_head 49152x576", 49152, 576),
    ("mlp up 1536x576", 1536, 576),
    ("mlp down 576x1536", 576, 1536),
)


def best_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def sweep(rows: list[int], repeats: int) -> None:
    import mlx.core as mx

    from loading import cpu_fast_path

    report = cpu_fast_path.check_blas()
    print(f"BLAS {report.library} ({report.gflops:.0f} GFLOP/s), best of {repeats}\n")
    table = []
    for name, n_out, n_in in SHAPES:
        w = mx.random.normal((n_out, n_in))
        mx.eval(w)
        times = []
        for m in rows:
            x = mx.random.normal((m, n_in))
            mx.eval(x)
            times.append(best_ms(lambda x=x, w=w: mx.eval(x @ w.T), repeats))
        ref = 8 if 8 in rows else max(rows)
        table.append((name, *times, times[rows.index(ref)] / times[0]))
    ref = 8 if 8 in rows else max(rows)
    head = ["x @ W.T, ms", *(f"{m} rows" for m in rows), f"{ref} rows / {rows[0]}"]
    print(bl.table(head, table))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8,12,16,32", help="rows (sequences), comma-separated")
    ap.add_argument("--repeats", type=int, default=15, help="timed runs per measurement")
    args = ap.parse_args(argv)
    env = bl.fast_env()
    if env.get("LD_PRELOAD", "") != os.environ.get("LD_PRELOAD", ""):
        # The BLAS must be preloaded before the process starts: run again with it.
        return subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env).returncode
    print(bl.header("Matmul cost by rows decoded together (diagnostic)", sys.argv))
    sweep([int(x) for x in args.rows.split(",")], args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
