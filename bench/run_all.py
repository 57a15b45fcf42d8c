"""Run every benchmark in ``bench/`` one after another and print their result tables.

Each benchmark measures its sides side by side in one run and prints ratios; none
asserts a timing, so this exits non-zero only when a benchmark fails to run. ``make
bench`` runs it with no arguments (full sizes: A-E took 25-30 minutes on 2 busy cores);
``--quick`` shrinks token counts and rounds (roughly half that). The llama.cpp comparison runs
only when a llama-cpp-python interpreter is found (``--llamacpp-python``, default
``/tmp/llamacpp-venv/bin/python``); see ``llamacpp_bench.py``.

    python bench/run_all.py --quick
    python bench/run_all.py --only A,C --out /tmp/bench.md
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (script, full-size arguments, quick arguments)
BENCHMARKS = {
    "A": ("bench_overhead.py", [], ["--new-tokens", "64", "--rounds", "3"]),
    "B": ("bench_concurrency.py", [], ["--new-tokens", "32"]),
    "C": ("bench_prefix_cache.py", [], ["--rounds", "2"]),
    "D": ("bench_health.py", [], ["--new-tokens", "32", "--idle-probes", "100"]),
    "E": (
        "bench_cpu_fast_path.py",
        [],
        ["--rounds", "1", "--load-rounds", "1", "--batch-new-tokens", "16"],
    ),
}
LLAMACPP = ("llamacpp_bench.py", [], ["--rounds", "2", "--new-tokens", "32"])
# Distributed mode (tensor parallel over loopback), when that benchmark is present.
DISTRIBUTED = ("bench_distributed.py", [], [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller token counts and rounds")
    ap.add_argument("--only", default="", help="comma-separated subset of A,B,C,D,E,F,L")
    ap.add_argument("--out", default="", help="also write everything printed to this file")
    ap.add_argument(
        "--llamacpp-python",
        default="/tmp/llamacpp-venv/bin/python",
        help="python of a llama-cpp-python venv (L and the llama.cpp column of E)",
    )
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per benchmark")
    args = ap.parse_args(argv)

    plan = dict(BENCHMARKS)
    have_llama = Path(args.llamacpp_python).is_file()
    plan["L"] = LLAMACPP
    if (HERE / DISTRIBUTED[0]).is_file():
        plan["F"] = DISTRIBUTED
    wanted = [x.strip().upper() for x in args.only.split(",") if x.strip()] or list(plan)
    unknown = [w for w in wanted if w not in plan]
    if unknown:
        ap.error(f"unknown benchmarks {unknown}; choose from {sorted(plan)}")

    out = open(args.out, "w", encoding="utf-8") if args.out else None  # noqa: SIM115
    failed = []
    try:
        for name in wanted:
            script, full, quick = plan[name]
            extra = list(quick if args.quick else full)
            if name in ("E", "L") and have_llama:
                extra += ["--llamacpp-python", args.llamacpp_python]
            cmd = [sys.executable, str(HERE / script), *extra]
            start = time.monotonic()
            proc = subprocess.Popen(
                cmd,
                cwd=HERE.parent,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                if out:
                    out.write(line)
            try:
                rc = proc.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
            tail = f"\n({name}: {script} exited {rc} after {time.monotonic() - start:.0f} s)\n\n"
            sys.stdout.write(tail)
            if out:
                out.write(tail)
                out.flush()
            if rc != 0:
                failed.append(name)
    finally:
        if out:
            out.close()
    if failed:
        print(f"benchmarks that failed to run: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
