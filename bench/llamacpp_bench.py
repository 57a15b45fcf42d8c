"""llama.cpp reference: prefill and decode tok/s on the same GGUF, beside dense MLX.

llama.cpp is never a project dependency: ``llama-cpp-python`` lives only in a throwaway
virtual environment outside the repository, and this script runs inside it as a worker
(``--worker``) started with that venv's python. Build it once, for example:

    python3 -m venv /tmp/llamacpp-venv
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \\
      -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \\
      -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_BLAS=OFF" \\
      nice -n 19 /tmp/llamacpp-venv/bin/pip install llama-cpp-python==0.3.36  # 20+ min

(``-DGGML_NATIVE=ON`` builds AMX kernels that crash on this VM unless the model is loaded
with ``use_extra_bufts=False``: pass ``--no-extra-bufts`` for such a build. The build
above, with AMX off, needs nothing: its extra buffer types are the repacked CPU kernels.)

Measured, side by side in one run, on the same prompt token ids (llama.cpp's tokenizer
gives the same ids as ours for this model; the ids are passed directly anyway):

* **llama.cpp**: the embedded GGUF as is (Q4_1), ``--threads`` threads, the prompt fed in
  one ``eval`` (prefill), then greedy decoding one token per ``eval`` with the EOS ids
  masked;
* **MLX dense**: ``inproc_worker.py`` (MKL preloaded, ``prepare_for_cpu(model, "true")``),
  mlx-lm ``stream_generate`` on the same ids.

The sides alternate each round; medians over ``--rounds``. Reported: prefill tok/s,
decode tok/s and the ratio MLX dense / llama.cpp (target for prefill: >= 0.7).

    python bench/llamacpp_bench.py --llamacpp-python /tmp/llamacpp-venv/bin/python

Without that interpreter (or without ``llama_cpp`` in it) the script prints why it is
skipped and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

DEFAULT_PYTHON = "/tmp/llamacpp-venv/bin/python"
EOS_IDS = (2, 0)  # benchlib.EOS_IDS: masked on every side


# --------------------------------------------------------------------------- worker side
# Runs under the llama.cpp venv's python: standard library, numpy and llama_cpp only.


class LlamaWorker:
    def __init__(self) -> None:
        self.llm = None

    def load(self, gguf: str, threads: int, extra_bufts: bool = True, n_ctx: int = 4096) -> dict:
        import llama_cpp
        import llama_cpp.llama_cpp as lib

        if not extra_bufts:
            # A -DGGML_NATIVE=ON build crashes in its AMX kernels on this VM unless the
            # model is loaded without extra buffer types (BENCHMARKS.md, section L).
            # Llama() has no parameter for it: patch the defaults it starts from.
            default = lib.llama_model_default_params

            def no_extra_bufts():
                params = default()
                params.use_extra_bufts = False
                return params

            lib.llama_model_default_params = no_extra_bufts
        t0 = time.perf_counter()
        self.llm = llama_cpp.Llama(
            model_path=gguf,
            n_ctx=n_ctx,
            n_batch=512,
            n_ubatch=512,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
        return {"load_s": time.perf_counter() - t0, "version": llama_cpp.__version__}

    def generate(self, ids: list[int], max_tokens: int) -> dict:
        import numpy as np

        llm = self.llm
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        tokens = []
        for _ in range(max_tokens):
            logits = np.array(llm.scores[llm.n_tokens - 1], copy=True)
            logits[list(EOS_IDS)] = -np.inf
            tok = int(np.argmax(logits))
            tokens.append(tok)
            if len(tokens) == max_tokens:
                break
            llm.eval([tok])
        t2 = time.perf_counter()
        # Decode rate as the others report it: tokens after the first / time after it.
        return {
            "prompt_tokens": len(ids),
            "prefill_s": t1 - t0,
            "prompt_tps": len(ids) / (t1 - t0),
            "decode_tps": (len(tokens) - 1) / (t2 - t1) if len(tokens) > 1 else 0.0,
            "tokens": len(tokens),
            "first_ids": tokens[:16],
        }


def worker_main() -> None:
    from inproc_worker import serve  # bench/ is sys.path[0]: this file runs as a script

    serve(LlamaWorker())


# --------------------------------------------------------------------------- driver side


def available(python: str) -> str | None:
    """None when ``python`` can import llama_cpp; else the reason it cannot."""
    import subprocess

    if not python or not Path(python).is_file():
        return f"no llama.cpp interpreter at {python!r} (build it as this script's docstring says)"
    probe = subprocess.run(
        [python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        return f"{python} cannot import llama_cpp: {probe.stderr.strip().splitlines()[-1:]}"
    return None


def start_worker(python: str, threads: int, extra_bufts: bool = True):
    """A ``benchlib.Worker`` running this file under the llama.cpp venv, model loaded."""
    import benchlib as bl

    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONPATH")}
    worker = bl.Worker([python, str(Path(__file__).resolve()), "--worker"], env, "llama.cpp")
    info = worker.call(
        op="load", gguf=str(bl.embedded_gguf()), threads=threads, extra_bufts=extra_bufts
    )
    return worker, info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llamacpp-python", default=DEFAULT_PYTHON, help="python of the venv")
    ap.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 2,
        help="llama.cpp threads (on a busy 2-core host 1 thread can beat 2: its threads spin)",
    )
    ap.add_argument("--prompt-tokens", type=int, default=128, help="prompt length, tokens")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens decoded per round")
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds")
    ap.add_argument(
        "--no-extra-bufts",
        action="store_true",
        help="load with use_extra_bufts=False (needed by -DGGML_NATIVE=ON builds here)",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main()
        return 0

    import benchlib as bl

    print(bl.header("llama.cpp vs MLX dense (same GGUF, same prompt ids)", sys.argv))
    reason = available(args.llamacpp_python)
    if reason:
        print(f"SKIPPED: {reason}")
        return 0
    pm = bl.PromptMaker(bl.converted_dir() / "tokenizer.json")
    llama = mlx = None
    try:
        llama, info = start_worker(args.llamacpp_python, args.threads, not args.no_extra_bufts)
        mlx = bl.inproc_worker("mlx-dense")
        mlx.call(op="load", mode="true")
        print(f"llama-cpp-python {info['version']}, {args.threads} threads\n")
        # Two warm-ups each: llama.cpp's first full-size request after load ran ~10x slow.
        for _ in range(2):
            warm = pm.encode(pm.prompt(args.prompt_tokens, "warm"))
            llama.call(op="generate", ids=warm, max_tokens=8)
            mlx.call(op="generate", ids=warm, max_tokens=8)
        rows, res = [], {"llama.cpp": [], "MLX dense": []}
        for i in range(args.rounds):
            ids = pm.encode(pm.prompt(args.prompt_tokens, f"L{i}-"))
            sides = [("llama.cpp", llama), ("MLX dense", mlx)]
            for name, w in sides if i % 2 == 0 else sides[::-1]:
                r = w.call(op="generate", ids=ids, max_tokens=args.new_tokens)
                res[name].append((r["prompt_tps"], r["decode_tps"]))
                rows.append((i + 1, name, len(ids), r["prompt_tps"], r["decode_tps"]))
        print(bl.table(["round", "side", "prompt tok", "prefill tok/s", "decode tok/s"], rows))
        pre = {k: bl.median(p for p, _ in v) for k, v in res.items()}
        dec = {k: bl.median(d for _, d in v) for k, v in res.items()}
        ratio = pre["MLX dense"] / pre["llama.cpp"]
        print()
        print(
            bl.table(
                ["metric", "llama.cpp", "MLX dense", "MLX / llama.cpp"],
                [
                    ("prefill tok/s", pre["llama.cpp"], pre["MLX dense"], ratio),
                    (
                        "decode tok/s",
                        dec["llama.cpp"],
                        dec["MLX dense"],
                        dec["MLX dense"] / dec["llama.cpp"],
                    ),
                ],
            )
        )
        print(
            f"\ntarget MLX dense prefill >= 0.7x llama.cpp: {ratio:.2f}x "
            f"-> {bl.verdict(ratio >= 0.7)}"
        )
    finally:
        for w in (llama, mlx):
            if w is not None:
                w.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
