"""What one decode step costs per row at long contexts (issue 38, diagnostic).

The host-cost proxy of ``bench_agents.py`` (the tiny random-weight llama of
``tests/tiny_models.py``, float32 on the fast BLAS with ``cpu_fuse`` as the server loads
it), ``--rows`` rows each holding a ``--context``-token KV (one prefill, copied per row and
cut to its length: "3000-7000" spreads the rows' contexts as bench_agents' prompts are;
a batch's KV is left-padded to its longest row), then greedy decode steps timed three
ways in one process:

* **floor**: the bare model forward on mlx-lm's batched KV cache + argmax, evaluated each
  step (no pipelining, no processors); **floor, no head**: the layers alone (attention
  over the KV and the small matmuls; what is left is the output head + argmax);
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
    flock /tmp/heavy.lock .venv/bin/python bench/profile_rows.py --rows 16 --context 3000-7000
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


def _load(root: Path, attention: bool = True):
    from mlx_lm import load

    from loading import cpu_attention, cpu_fast_path, cpu_fuse

    model, tokenizer = load(str(tiny_models.build("llama", root)))
    mode = cpu_fast_path.prepare_for_cpu(model, True, None)
    if cpu_fuse.applies(mode, True):
        cpu_fuse.transform(model)
    if cpu_attention.applies(attention):
        cpu_attention.install(model)
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


def _copies(cache, tokens, lengths: list[int]) -> list[tuple[list, list[int]]]:
    """Per row: its own copy of ``cache`` cut to ``lengths[i]`` tokens, and those tokens."""
    out = []
    for n in lengths:
        layers = copy.deepcopy(cache)
        for c in layers:
            c.trim(c.offset - n)
        out.append((layers, tokens[:n]))
    return out


def _lengths(context: str, rows: int) -> list[int]:
    """``context`` "N": every row N tokens; "A-B": spread evenly from A to B."""
    lo, _, hi = context.partition("-")
    a, b = int(lo), int(hi or lo)
    return [a + (b - a) * i // max(rows - 1, 1) for i in range(rows)]


def floor(model, cache, tokens, lengths: list[int], steps: int, head: bool = True) -> float:
    """The bare forward + argmax; ``head`` False: the layers alone (no output head, no
    argmax: the same input token each step)."""
    import mlx.core as mx

    rows = _copies(cache, tokens, lengths)
    batch = [c.merge([r[0][i] for r in rows]) for i, c in enumerate(cache)]
    y = mx.array([t[-1] for _, t in rows])

    def step():
        nonlocal y
        if not head:
            mx.eval(model.model(y[:, None], cache=batch))
            return
        logits = model(y[:, None], cache=batch)[:, -1, :]
        y = mx.argmax(logits, axis=-1)
        mx.eval(y)

    return _median_step(step, steps)


def mlx_lm_batch(model, cache, tokens, lengths: list[int], steps: int) -> float:
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_logits_processors

    rows = _copies(cache, tokens, [n - 1 for n in lengths])
    n = len(rows)
    gen = BatchGenerator(model, completion_batch_size=n, prefill_batch_size=n)
    procs = [make_logits_processors(logit_bias=dict(bl.EOS_BIAS)) for _ in range(n)]
    gen.insert(
        [[tokens[len(t)]] for _, t in rows],
        max_tokens=[10**6] * n,
        caches=[c for c, _ in rows],
        all_tokens=[t for _, t in rows],
        logits_processors=procs,
    )
    try:
        while not gen.next():  # through the one-token prefill
            pass
        return _median_step(gen.next, steps)
    finally:
        gen.close()


def ours(model, cache, tokens, lengths: list[int], steps: int, bias: bool) -> float:
    from batch.decode import DecodeBatch
    from decoding.sampling import LogitBias

    batch = DecodeBatch(model, max_rows=len(lengths))
    for layers, held in _copies(cache, tokens, [n - 1 for n in lengths]):
        batch.insert(
            [[tokens[len(held)]]],
            max_tokens=10**6,
            cache=layers,
            tokens=held,
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
    ap.add_argument("--context", default="4096", help='tokens per row: "N", or "A-B" spread')
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--cpu-attention", choices=("on", "off"), default="on", help="loading.cpu_attention"
    )
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model, _ = _load(Path(tmp), args.cpu_attention == "on")
        longest = max(_lengths(args.context, 2))
        cache, tokens = _prefilled(model, longest)
        ways = {
            "floor": lambda n: floor(model, cache, tokens, n, args.steps),
            "floor, no head": lambda n: floor(model, cache, tokens, n, args.steps, False),
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
            lengths = _lengths(args.context, n)
            best = {k: min(f(lengths) for _ in range(args.repeats)) for k, f in ways.items()}
            cells = " | ".join(f"{v:.2f} ({v / n:.2f})" for v in best.values())
            print(f"| {n} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
