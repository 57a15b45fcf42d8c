"""E. CPU fast path: quantized-as-loaded vs dense float32 on MKL, in-process, one run.

Two ``inproc_worker.py`` processes, both started with the MKL preload ``run.sh`` applies,
load the embedded SmolLM2 GGUF with our loader and then call
``cpu_fast_path.prepare_for_cpu(model, mode)``:

* **quantized**: ``cpu_dequantize:false``: Q4_1 layers kept (float32 scales), MLX's
  quantized matmul;
* **dense**: ``cpu_dequantize:true``: dequantized to float32, matmuls on MKL.

Measured side by side (the modes alternate at every step):

1. **startup**: ``--load-rounds`` fresh processes per mode; seconds for the load and for
   ``prepare_for_cpu`` (dense: cast, dequantize, evaluate, BLAS check; quantized: cast
   the scales). The dequantization cost is dense prepare - quantized prepare.
2. **single stream**: mlx-lm ``stream_generate`` on the same ``--prompt-tokens`` token
   ids, ``--new-tokens`` tokens, greedy, EOS biased away: prefill tok/s (mlx-lm's
   ``prompt_tps``) and decode tok/s after the first token. Medians over ``--rounds``.
3. **batched decode**: mlx-lm ``BatchGenerator`` with 1, 2, 4, 8 sequences inserted at
   once (``--batch-prompt-tokens`` each, ``--batch-new-tokens`` each): aggregate decode
   tok/s over the steps after every sequence has its first token.
4. **llama.cpp** (only with ``--llamacpp-python``, see ``llamacpp_bench.py``): prefill and
   decode tok/s on the same GGUF and the same ids, alternated with the two modes.

Targets: dense prefill >= 10x quantized; dense prefill >= 0.7x llama.cpp's; dense
aggregate decode at 8 >= 3x at 1; dequantization adds <= 2 s to the load.

    python bench/bench_cpu_fast_path.py                        # ~4-5 minutes
    python bench/bench_cpu_fast_path.py --llamacpp-python /tmp/llamacpp-venv/bin/python
"""

from __future__ import annotations

import argparse
import sys

import benchlib as bl
import llamacpp_bench

MODES = {"quantized": "false", "dense": "true"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=128, help="single-stream prompt")
    ap.add_argument("--new-tokens", type=int, default=32, help="single-stream new tokens")
    ap.add_argument("--rounds", type=int, default=2, help="single-stream rounds")
    ap.add_argument("--load-rounds", type=int, default=2, help="fresh loads per mode")
    ap.add_argument("--streams", default="1,2,4,8", help="batch sizes, comma-separated")
    ap.add_argument("--batch-prompt-tokens", type=int, default=16, help="prompt per sequence")
    ap.add_argument("--batch-new-tokens", type=int, default=32, help="new tokens per sequence")
    ap.add_argument(
        "--llamacpp-python",
        default="",
        help=f"python of a llama-cpp-python venv (e.g. {llamacpp_bench.DEFAULT_PYTHON})",
    )
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.streams.split(",")]

    print(bl.header("E. CPU fast path: quantized vs dense (in-process)", sys.argv))
    pm = bl.PromptMaker(bl.converted_dir() / "tokenizer.json")
    workers: dict[str, bl.Worker] = {}
    try:
        # 1. Startup cost, fresh processes, modes alternating.
        loads: dict[str, list[dict]] = {m: [] for m in MODES}
        for i in range(args.load_rounds):
            for mode in MODES if i % 2 == 0 else list(MODES)[::-1]:
                w = bl.inproc_worker(f"load-{mode}")
                try:
                    loads[mode].append(w.call(op="load", mode=MODES[mode]))
                finally:
                    w.stop()
        rows = [
            (
                mode,
                loads[mode][0]["mode"],
                bl.median(r["load_s"] for r in loads[mode]),
                bl.median(r["prepare_s"] for r in loads[mode]),
                bl.median(r["load_s"] + r["prepare_s"] for r in loads[mode]),
            )
            for mode in MODES
        ]
        print("### Startup (median of fresh processes)\n")
        print(bl.table(["mode", "applied", "load s", "prepare_for_cpu s", "total s"], rows))
        added = rows[1][3] - rows[0][3]
        print(
            f"\ndequantization adds {added:.2f} s to prepare_for_cpu "
            f"(BLAS {loads['dense'][0]['blas']}, {loads['dense'][0]['gflops']:.0f} GFLOP/s) "
            f"-> target <= 2 s {bl.verdict(added <= 2)}\n"
        )

        # 2. Single stream, same ids, modes alternating (llama.cpp too when given).
        for mode, value in MODES.items():
            workers[mode] = bl.inproc_worker(mode)
            workers[mode].call(op="load", mode=value)
        llama_reason = (
            llamacpp_bench.available(args.llamacpp_python)
            if args.llamacpp_python
            else "no --llamacpp-python given"
        )
        if llama_reason is None:
            workers["llama.cpp"], info = llamacpp_bench.start_worker(
                args.llamacpp_python, args.threads
            )
            print(f"llama.cpp: llama-cpp-python {info['version']}, {args.threads} threads\n")
        warm = pm.encode(pm.prompt(16, "warm"))
        for w in workers.values():
            w.call(op="generate", ids=warm, max_tokens=4)

        single: dict[str, list[tuple[float, float]]] = {name: [] for name in workers}
        rows = []
        for i in range(args.rounds):
            ids = pm.encode(pm.prompt(args.prompt_tokens, f"E{i}-"))
            names = list(workers) if i % 2 == 0 else list(workers)[::-1]
            for name in names:
                r = workers[name].call(op="generate", ids=ids, max_tokens=args.new_tokens)
                single[name].append((r["prompt_tps"], r["decode_tps"]))
                rows.append((i + 1, name, len(ids), r["prompt_tps"], r["decode_tps"]))
        print("### Single stream\n")
        print(bl.table(["round", "side", "prompt tok", "prefill tok/s", "decode tok/s"], rows))
        pre = {k: bl.median(p for p, _ in v) for k, v in single.items()}
        dec = {k: bl.median(d for _, d in v) for k, v in single.items()}
        summary = [
            (k, pre[k], dec[k], pre[k] / pre["quantized"], dec[k] / dec["quantized"])
            for k in single
        ]
        print()
        print(
            bl.table(
                [
                    "side",
                    "prefill tok/s",
                    "decode tok/s",
                    "prefill x quantized",
                    "decode x quantized",
                ],
                summary,
            )
        )
        speed = pre["dense"] / pre["quantized"]
        print(f"\ntarget dense prefill >= 10x quantized: {speed:.1f}x -> {bl.verdict(speed >= 10)}")
        if "llama.cpp" in pre:
            rel = pre["dense"] / pre["llama.cpp"]
            print(f"target dense prefill >= 0.7x llama.cpp: {rel:.2f}x -> {bl.verdict(rel >= 0.7)}")
        else:
            print(f"llama.cpp comparison skipped: {llama_reason}")

        # 3. Batched decode, modes alternating per level.
        batch: dict[tuple[str, int], dict] = {}
        rows = []
        for j, n in enumerate(levels):
            prompts = [pm.encode(pm.prompt(args.batch_prompt_tokens, f"EB{n}-")) for _ in range(n)]
            for mode in MODES if j % 2 == 0 else list(MODES)[::-1]:
                r = workers[mode].call(
                    op="batch", prompts=prompts, max_tokens=args.batch_new_tokens
                )
                batch[(mode, n)] = r
                rows.append((n, mode, r["tokens"], r["prefill_s"], r["decode_tps"], r["e2e_tps"]))
        print("\n### Batched decode (BatchGenerator, in-process)\n")
        print(
            bl.table(
                [
                    "streams",
                    "mode",
                    "tokens",
                    "prefill s",
                    "aggregate decode tok/s",
                    "end-to-end tok/s",
                ],
                rows,
            )
        )
        print()
        head = [
            "streams",
            *(f"{m} decode tok/s" for m in MODES),
            "dense x quantized",
            *(f"{m} x own@{levels[0]}" for m in MODES),
        ]
        summary = []
        for n in levels:
            q, d = batch[("quantized", n)]["decode_tps"], batch[("dense", n)]["decode_tps"]
            summary.append(
                (
                    n,
                    q,
                    d,
                    d / q,
                    *(
                        batch[(m, n)]["decode_tps"] / batch[(m, levels[0])]["decode_tps"]
                        for m in MODES
                    ),
                )
            )
        print(bl.table(head, summary))
        top = max(levels)
        scale = batch[("dense", top)]["decode_tps"] / batch[("dense", levels[0])]["decode_tps"]
        print(
            f"\ntarget dense aggregate decode at {top} >= 3x at {levels[0]}: "
            f"{scale:.2f}x -> {bl.verdict(scale >= 3)}"
        )
    finally:
        for w in workers.values():
            w.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
