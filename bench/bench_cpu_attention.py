"""V. Attention on the CPU: MLX's kernel vs loading.cpu_attention, in-process, one run.

1. **One attention call** in the shapes a server runs (median ms of ``--repeats``, the two
   alternated): a prefill chunk of one row over cached context (the tiny test llama's
   heads, 2 query / 1 KV of 32; the embedded SmolLM2's, 9 / 3 of 64), and a decode step
   of 16 rows of 3,000-7,000 tokens left-padded to the longest (a batch's bool mask).
2. **The embedded model** (SmolLM2-135M, dense float32 on the fast BLAS, as the server
   loads it), loaded twice (``cpu_attention`` on / off): the prefill of ``--prompts``
   tokens from an empty KV cache in 512-token chunks, then ``--new-tokens`` greedy decode
   steps at that context; the two alternate per prompt length.

The host's load is printed; compare the two columns of one run.

    python bench/bench_cpu_attention.py            # ~2 minutes
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from loading import cpu_fast_path

if __name__ == "__main__":
    cpu_fast_path.ensure_preloaded()  # MLX's matmuls on the fast BLAS, as the server runs

import benchlib as bl


def _time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def calls(repeats: int) -> list[list[object]]:
    """Part 1: (shape, MLX ms, ours ms, ratio) rows."""
    import mlx.core as mx
    from mlx_lm.models.base import create_causal_mask

    from loading import cpu_attention

    rows: list[list[object]] = []
    cases = []
    for heads, kv, dim, label in ((2, 1, 32, "tiny llama"), (9, 3, 64, "SmolLM2")):
        for context in (3000, 5000, 7000):
            cases.append(
                (f"{label}: 1 row, 450 new over {context}", 1, heads, kv, dim, 450, context)
            )
    cases.append(("tiny llama: decode, 16 rows of 3k-7k", 16, 2, 1, 32, 1, 7000))
    for name, B, H, Hk, D, L, context in cases:
        S = context + L
        q = mx.random.normal((B, H, L, D))
        k, v = mx.random.normal((B, Hk, S, D)), mx.random.normal((B, Hk, S, D))
        if B > 1:  # a batch's rows, left-padded to the longest
            pad = mx.array([(7000 - 3000) * (B - 1 - i) // (B - 1) for i in range(B)])
            mask = create_causal_mask(L, context, left_padding=pad)
        else:
            mask = "causal"
        mx.eval(q, k, v, *([mask] if isinstance(mask, mx.array) else []))

        def theirs(q=q, k=k, v=v, mask=mask):
            mx.eval(mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask))

        def ours(q=q, k=k, v=v, mask=mask):
            cpu_attention.attention(q, k, v, 0.125, mask)

        theirs(), ours()
        a = b = 0.0
        for _ in range(2):  # alternated
            a, b = _time(theirs, repeats), _time(ours, repeats)
        rows.append([name, f"{a:.2f}", f"{b:.2f}", f"{a / b:.1f}x"])
    return rows


def embedded(prompts: list[int], new_tokens: int) -> list[list[object]]:
    """Part 2: (prompt tokens, prefill s off / on, decode ms a token off / on) rows."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    import backend_pb2 as pb
    from loading import loaded_model
    from params import load_params

    def load(on: bool):
        option = f"cpu_attention:{'true' if on else 'false'}"
        lp = load_params(pb.ModelOptions(Model="embedded", Options=[option]))
        return loaded_model.load(lp).model

    models = {"off": load(False), "on": load(True)}
    ids = [(i * 7919) % 40000 + 100 for i in range(max(prompts))]
    rows: list[list[object]] = []
    for n in prompts:
        out: dict[str, tuple[float, float]] = {}
        for name, model in models.items():
            cache = make_prompt_cache(model)
            t0 = time.perf_counter()
            for i in range(0, n, 512):
                model(mx.array([ids[i : min(n, i + 512)]]), cache=cache)
                mx.eval([c.state for c in cache])
            prefill = time.perf_counter() - t0
            y = mx.array([ids[n - 1]])
            t0 = time.perf_counter()
            for _ in range(new_tokens):
                y = mx.argmax(model(y[None], cache=cache)[:, -1], axis=-1)
                mx.eval(y)
            out[name] = (prefill, (time.perf_counter() - t0) * 1000 / new_tokens)
        (p0, d0), (p1, d1) = out["off"], out["on"]
        rows.append([n, f"{p0:.2f}", f"{p1:.2f}", f"{p0 / p1:.2f}x", f"{d0:.1f}", f"{d1:.1f}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--prompts", default="512,2048", help="embedded-model prompt lengths")
    ap.add_argument("--new-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    print(bl.header("Attention on the CPU (loading.cpu_attention)", sys.argv))
    print("One attention call, median ms:\n")
    print(bl.table(["shape", "MLX", "cpu_attention", "speed-up"], calls(args.repeats)))
    print("\nThe embedded model, prefill from an empty cache then greedy decode:\n")
    rows = embedded([int(x) for x in args.prompts.split(",")], args.new_tokens)
    heads = ["prompt tokens", "prefill s off", "on", "speed-up", "decode ms/token off", "on"]
    print(bl.table(heads, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
