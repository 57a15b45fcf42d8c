"""N-gram (prompt lookup) speculation: decode tok/s with vs without, one run, in-process.

Loads the embedded SmolLM2-135M GGUF as the engine does (``prepare_for_cpu``, under the
MKL preload ``run.sh`` applies: the script re-executes itself with it when missing),
then decodes greedily with mlx-lm's ``generate_step`` (plain) and with
``ngram_spec.ngram_generate_step`` on two prompts, alternating plain and n-gram runs:

* **planets**: four lines listing the planets, then the start of a fifth (the
  continuation repeats earlier text); target n-gram/plain >= 1.8x;
* **no_repeat**: a chat prompt whose answer does not quote the prompt; target >= 0.95x.

Decode tok/s = (new tokens - 1) / seconds from the first token to the last (prefill
excluded). Each run's tokens are also checked equal between the two (greedy identity).
Generation does not stop at EOS (``generate_step`` never does), so every run makes
exactly ``--new-tokens`` tokens.

    python bench/bench_ngram.py                              # ~2 minutes on 2 cores
    python bench/bench_ngram.py --num-draft-tokens 3,8 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from loading import cpu_fast_path  # noqa: E402  (standard library only until a function needs MLX)

LINE = "Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus, Neptune\n"
PLANETS = LINE * 4 + "Mercury, Venus,"
NO_REPEAT = "Explain in a few paragraphs how a refrigerator keeps food cold."
TARGETS = {"planets": 1.8, "no_repeat": 0.95}


def _decode_tps(steps) -> tuple[float, list[int]]:
    tokens: list[int] = []
    start = 0.0
    for item in steps:
        tokens.append(int(item[0]))
        if len(tokens) == 1:
            start = time.perf_counter()
    elapsed = time.perf_counter() - start
    return (len(tokens) - 1) / elapsed if elapsed > 0 else 0.0, tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1, help="plain/n-gram pairs per prompt")
    ap.add_argument("--num-draft-tokens", default="3,8", help="comma-separated values to measure")
    ap.add_argument("--ngram-size", type=int, default=3, help="longest n-gram matched")
    args = ap.parse_args(argv)

    wanted = cpu_fast_path.preload_env(os.environ)
    if wanted.get("LD_PRELOAD", "") != os.environ.get("LD_PRELOAD", ""):
        os.execve(sys.executable, [sys.executable, *sys.argv], wanted)

    import mlx.core as mx
    from mlx_lm.generate import generate_step

    from decoding.ngram_spec import NgramStats, ngram_generate_step
    from loading import model_loader

    command = "python bench/bench_ngram.py " + " ".join(sys.argv[1:])
    model, tok = model_loader.load_model(str(model_loader.embedded_model_path()))
    mode = cpu_fast_path.prepare_for_cpu(model, None)
    messages = [{"role": "user", "content": NO_REPEAT}]
    prompts = {
        "planets": tok.encode(PLANETS),
        "no_repeat": tok.apply_chat_template(messages, add_generation_prompt=True),
    }
    drafts = [int(x) for x in args.num_draft_tokens.split(",")]
    n = args.new_tokens
    # Warm-up: first-call costs (kernels, allocations) land in neither measurement.
    list(generate_step(mx.array(prompts["planets"]), model, max_tokens=8))
    list(ngram_generate_step(mx.array(prompts["planets"]), model, max_tokens=8))

    print(f"# n-gram speculation, embedded SmolLM2-135M ({mode}), {n} new tokens")
    print(f"command: {command}")
    print(
        "| prompt | num_draft_tokens | plain tok/s | n-gram tok/s | ratio | target "
        "| accepted/drafted | verify steps | same tokens |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    ok = True
    for name, ids in prompts.items():
        for k in drafts:
            plain, spec, same = [], [], True
            stats = NgramStats()
            for _ in range(args.rounds):
                tps_a, a = _decode_tps(generate_step(mx.array(ids), model, max_tokens=n))
                stats = NgramStats()
                steps = ngram_generate_step(
                    mx.array(ids),
                    model,
                    max_tokens=n,
                    num_draft_tokens=k,
                    ngram_max=args.ngram_size,
                    stats=stats,
                )
                tps_b, b = _decode_tps(steps)
                plain.append(tps_a)
                spec.append(tps_b)
                same = same and a == b
            ratio = statistics.median(spec) / statistics.median(plain)
            target = TARGETS[name]
            ok = ok and ratio >= target and same
            print(
                f"| {name} | {k} | {statistics.median(plain):.1f} | "
                f"{statistics.median(spec):.1f} | {ratio:.2f}x | >= {target}x "
                f"{'met' if ratio >= target else 'MISSED'} | "
                f"{stats.accepted}/{stats.drafted} | {stats.verify_steps} | {same} |",
                flush=True,
            )
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
