"""What one decode step costs per row at long contexts (issue 38, diagnostic).

The host-cost proxy of ``bench_agents.py`` (the tiny random-weight llama of
``tests/tiny_models.py``, float32 on the fast BLAS with ``cpu_fuse`` as the server loads
it), ``--rows`` rows each holding a ``--context``-token KV (one prefill, copied per row),
then greedy decode steps timed three ways in one process, rounds alternated:

* **floor**: the bare model forward on mlx-lm's batched KV cache + argmax, evaluated each
  step (no pipelining, no processors);
* **mlx-lm**: ``BatchGenerator.next()`` (mlx_lm/generate.py), every row with mlx-lm's own
  logit-bias processor for the EOS bias bench_agents sends (``benchlib.EOS_BIAS``);
* **ours**: ``batch.decode.DecodeBatch.next()``, every row with the request's processors
  as the server builds them for bench_agents' options (``Temperature`` 0, ``LogitBias``
  the EOS bias: `decoding.sampling.LogitBias`), and ``ours lean``: the same without the
  bias (the argmax-only path).

Per step ms (median of ``--steps`` steps after warm-up, best of ``--repeats`` rounds) and
per row. Host load changes these numbers: compare columns of one run only.

    eval "$(.venv/bin/python -m loading.cpu_fast_path --exports)"
    flock /tmp/heavy.lock .venv/bin/python bench/profile_rows.py --rows 1,4,16
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import benchlib as bl

sys.path.insert(0, str(bl.ROOT / "tests"))
import tiny_models


def _load(root: Path):
    from mlx_lm import load

    from loading import cpu_fast_path, cpu_fuse

    model, tokenizer = load(str(tiny_models.build("llama", root)))
    mode = cpu_fast_path.prepare_for_cpu(model, True, None)
    if cpu_fuse.applies(mode, True):
        cpu_fuse.transform(model)
    return model, tokenizer


def _prefilled(model, context: int):
    """One KV cache holding ``context`` tokens, and those tokens."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    tokens = [(i * 7919) % 40000 + 100 for i in range(context)]
    cache = make_prompt_cache(model)
    for i in range(0, context, 512):
        model(mx.array([tokens[i : i + 512]]), cache=cache)
        mx.eval([c.state for c in cache])
    return cache, tokens


def _median_step(step, steps: int) -> float:
    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def floor(model, cache, tokens, rows: int, steps: int) -> float:
    import mlx.core as mx

    batch = [c.merge([copy.deepcopy(c) for _ in range(rows)]) for c in cache]
    y = mx.array([tokens[-1]] * rows)

    def step():
        nonlocal y
        logits = model(y[:, None], cache=batch)[:, -1, :]
        y = mx.argmax(logits, axis=-1)
        mx.eval(y)

    return _median_step(step, steps)


def mlx_lm_batch(model, cache, tokens, rows: int, steps: int) -> float:
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_logits_processors

    gen = BatchGenerator(model, completion_batch_size=rows, prefill_batch_size=rows)
    procs = [make_logits_processors(logit_bias=dict(bl.EOS_BIAS)) for _ in range(rows)]
    gen.insert(
        [[tokens[-1]] for _ in range(rows)],
        max_tokens=[10**6] * rows,
        caches=[copy.deepcopy(cache) for _ in range(rows)],
        all_tokens=[tokens[:-1] for _ in range(rows)],
        logits_processors=procs,
    )
    try:
        while not gen.next():  # through the one-token prefill
            pass
        return _median_step(gen.next, steps)
    finally:
        gen.close()


def ours(model, cache, tokens, rows: int, steps: int, bias: bool) -> float:
    from batch.decode import DecodeBatch
    from decoding.sampling import LogitBias

    batch = DecodeBatch(model, max_rows=rows)
    for _ in range(rows):
        batch.insert(
            [[tokens[-1]]],
            max_tokens=10**6,
            cache=copy.deepcopy(cache),
            tokens=tokens[:-1],
            processors=[LogitBias(dict(bl.EOS_BIAS))] if bias else (),
        )
    try:
        while not batch.next()[1]:
            pass
        return _median_step(batch.next, steps)
    finally:
        batch.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model, _ = _load(Path(tmp))
        cache, tokens = _prefilled(model, args.context)
        ways = {
            "floor": lambda n: floor(model, cache, tokens, n, args.steps),
            "mlx-lm": lambda n: mlx_lm_batch(model, cache, tokens, n, args.steps),
            "ours": lambda n: ours(model, cache, tokens, n, args.steps, True),
            "ours lean": lambda n: ours(model, cache, tokens, n, args.steps, False),
        }
        print(
            f"context {args.context} tokens, median of {args.steps} steps, best of "
            f"{args.repeats} rounds; ms per step (ms per row)"
        )
        print("| rows | " + " | ".join(ways) + " |")
        print("|---|" + "---|" * len(ways))
        for n in [int(x) for x in args.rows.split(",")]:
            best = {k: min(f(n) for _ in range(args.repeats)) for k, f in ways.items()}
            cells = " | ".join(f"{v:.2f} ({v / n:.2f})" for v in best.values())
            print(f"| {n} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
