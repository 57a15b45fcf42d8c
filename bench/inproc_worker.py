"""In-process mlx-lm worker for the benchmarks: the model without any service around it.

Started by the benchmark drivers (``benchlib.inproc_worker``) with the MKL preload that
``run.sh`` applies, it reads one JSON command per line on stdin and answers one JSON line
on stdout. Commands (``op``):

* ``load`` {``mode``: cpu_dequantize value}: load the embedded GGUF with our loader
  (``model_loader.load_model``, as the server does), then
  ``cpu_fast_path.prepare_for_cpu(model, mode)``; answers the seconds of each step.
* ``generate`` {``prompt`` text or ``ids``, ``max_tokens``}: one mlx-lm
  ``stream_generate`` call, greedy, EOS ids biased by -100 (as every side of every
  benchmark), timed per yielded token: TTFT, decode tok/s after the first token, and
  mlx-lm's own ``prompt_tps`` / ``generation_tps``.
* ``batch`` {``prompts``: list of id lists, ``max_tokens``}: mlx-lm ``BatchGenerator``
  with all prompts inserted at once; aggregate decode tok/s over the steps after every
  sequence has its first token, and end-to-end tok/s.

Never run it by hand except to debug: ``echo '{"op": "load", "mode": "true"}' |
python bench/inproc_worker.py``. It stops when stdin closes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EOS_BIAS = {2: -100.0, 0: -100.0}  # the same bias as benchlib.EOS_BIAS


class Worker:
    def __init__(self) -> None:
        self.model = None
        self.tokenizer = None

    def load(self, mode: str = "true") -> dict:
        from loading import cpu_fast_path, model_loader

        t0 = time.perf_counter()
        model, tokenizer = model_loader.load_model(str(model_loader.embedded_model_path()))
        t1 = time.perf_counter()
        got = cpu_fast_path.prepare_for_cpu(model, mode)
        t2 = time.perf_counter()
        self.model, self.tokenizer = model, tokenizer
        report = cpu_fast_path.check_blas()
        return {
            "mode": got,
            "load_s": t1 - t0,
            "prepare_s": t2 - t1,
            "blas": report.library,
            "gflops": report.gflops,
        }

    def _processors(self):
        from mlx_lm.sample_utils import make_logits_processors

        return make_logits_processors(logit_bias=dict(EOS_BIAS))

    def generate(self, max_tokens: int, prompt: str | None = None, ids=None) -> dict:
        import mlx.core as mx
        from mlx_lm.generate import stream_generate

        source = prompt if prompt is not None else mx.array(ids)
        times, counts, last = [], [], None
        cpu0 = _cpu()
        t0 = time.perf_counter()
        for resp in stream_generate(
            self.model,
            self.tokenizer,
            source,
            max_tokens=max_tokens,
            logits_processors=self._processors(),
        ):
            times.append(time.perf_counter())
            counts.append(resp.generation_tokens)
            last = resp
        span = times[-1] - times[0]
        return {
            "ttft": times[0] - t0,
            "decode_tps": (counts[-1] - counts[0]) / span if span > 0 else 0.0,
            "tokens": counts[-1],
            "prompt_tokens": last.prompt_tokens,
            "prompt_tps": last.prompt_tps,
            "generation_tps": last.generation_tps,
            "total_s": times[-1] - t0,
            "cpu_s": _cpu() - cpu0,
        }

    def batch(self, prompts: list[list[int]], max_tokens: int) -> dict:
        from mlx_lm.generate import BatchGenerator

        n = len(prompts)
        gen = BatchGenerator(
            self.model,
            stop_tokens=[[2], [0]],
            completion_batch_size=n,
            prefill_batch_size=n,
            prefill_step_size=512,
        )
        try:
            cpu0 = _cpu()
            t0 = time.perf_counter()
            gen.insert(
                prompts,
                max_tokens=[max_tokens] * n,
                logits_processors=[self._processors() for _ in prompts],
            )
            seen: dict[int, int] = {}
            done: set[int] = set()
            t_all_first, k_all_first = None, 0
            # Bounded: each step yields at least one token per live sequence after prefill.
            for _ in range(n * (max_tokens + 64) + 1000):
                _, responses = gen.next()
                now = time.perf_counter()
                for r in responses:
                    seen[r.uid] = seen.get(r.uid, 0) + 1
                    if r.finish_reason is not None:
                        done.add(r.uid)
                if t_all_first is None and len(seen) == n:
                    t_all_first, k_all_first = now, sum(seen.values())
                if len(done) == n:
                    break
            t_end = time.perf_counter()
        finally:
            gen.close()
        total = sum(seen.values())
        span = t_end - t_all_first if t_all_first else 0.0
        return {
            "streams": n,
            "tokens": total,
            "decode_tps": (total - k_all_first) / span if span > 0 else 0.0,
            "e2e_tps": total / (t_end - t0),
            "prefill_s": (t_all_first or t_end) - t0,
            "total_s": t_end - t0,
            "cpu_s": _cpu() - cpu0,
        }


def _cpu() -> float:
    """User + system CPU seconds of this process, all threads."""
    t = os.times()
    return t.user + t.system


def serve(worker: object) -> None:
    """Answer JSON-line commands ({"op": method, ...kwargs}) from stdin until "quit" or EOF.

    Shared by this worker and bench/llamacpp_bench.py's (stdlib only, so it also runs
    in the llama.cpp throwaway venv).
    """
    out = sys.stdout
    sys.stdout = sys.stderr  # anything a library prints must not corrupt the protocol
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            if op == "quit":
                break
            answer = getattr(worker, op)(**cmd)
        except Exception as exc:  # answered, so the driver can report and stop
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


def main() -> None:
    serve(Worker())


if __name__ == "__main__":
    main()
