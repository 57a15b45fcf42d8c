"""Q. Quantized KV inside the batch: 8 concurrent streams, kv_bits 8 and 4 vs float KV.

Three backends side by side, all on the embedded SmolLM2 with ``cpu_dequantize:true``
and MKL preloaded: **float** (no KV quantization), **q8** (``kv_bits:8``) and **q4**
(``kv_bits:4``). Each round sends ``--streams`` unique prompts of ``--prompt-tokens``
tokens at once to each in turn (the order rotates per round), greedy, EOS biased away.
Reported: decode-window tok/s (tokens all streams received while every one was
decoding, over that window), end-to-end tok/s, and the running sequences' KV bytes at
their largest (Status ``memory.breakdown["kv_active"]``, polled every 50 ms) — the batch
holds every stream's KV in one quantized cache since these requests stopped running
one at a time. Medians over ``--rounds``.

    python bench/bench_kv_quant.py                    # ~5 minutes on 2 cores
    python bench/bench_kv_quant.py --rounds 3 --prompt-tokens 512
"""

from __future__ import annotations

import argparse
import sys
import threading

import benchlib as bl
from bench_concurrency import run_level

import backend_pb2

SERVERS = {"float": [], "q8": ["kv_bits:8"], "q4": ["kv_bits:4"]}


class PeakKV:
    """Largest ``kv_active`` a server's Status reports while the block runs."""

    def __init__(self, stub) -> None:
        self.stub, self.peak = stub, 0
        self._stop = threading.Event()

    def __enter__(self) -> PeakKV:
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(0.05):
            status = self.stub.Status(backend_pb2.HealthMessage(), timeout=5)
            self.peak = max(self.peak, status.memory.breakdown["kv_active"])

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)

    print(bl.header("Q. Quantized KV inside the batch", sys.argv))
    gguf = bl.embedded_gguf()
    pm = bl.PromptMaker(bl.converted_dir() / "tokenizer.json")
    servers = {name: bl.Backend(name) for name in SERVERS}
    try:
        for name, srv in servers.items():
            srv.load(gguf, ["cpu_dequantize:true", *SERVERS[name]])
            print(f"{name}: pid {srv.proc.pid}, BLAS mapped: {bl.blas_mapped(srv.proc.pid)}")
            bl.grpc_stream(srv.stub, bl.predict_options(pm.prompt(32, "warm"), 8))
        names = list(servers)
        rows, per = [], {}
        for rnd in range(args.rounds):
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            for name in order:
                stub = servers[name].stub
                prompts = [pm.prompt(args.prompt_tokens, f"Q{rnd}-") for _ in range(args.streams)]
                with PeakKV(stub) as kv:
                    e2e, window, _, ttft, tokens = run_level(
                        lambda p, s=stub: bl.grpc_stream(s, bl.predict_options(p, args.new_tokens)),
                        prompts,
                    )
                per.setdefault(name, []).append((window, e2e, kv.peak))
                rows.append((rnd + 1, name, tokens, e2e, window, ttft * 1000, kv.peak / 2**20))
        print(
            bl.table(
                [
                    "round",
                    "KV",
                    "tokens",
                    "end-to-end tok/s",
                    "decode-window tok/s",
                    "TTFT ms",
                    "peak KV MiB",
                ],
                rows,
            )
        )
        print("\nMedians (ratios to float KV, same run):\n")
        med = {n: [bl.median(v[k] for v in per[n]) for k in range(3)] for n in names}
        summary = [
            (
                n,
                med[n][0],
                med[n][0] / med["float"][0],
                med[n][1] / med["float"][1],
                med[n][2] / 2**20,
                med[n][2] / med["float"][2] if med["float"][2] else float("nan"),
            )
            for n in names
        ]
        print(
            bl.table(
                [
                    "KV",
                    "decode-window tok/s",
                    "decode-window ratio",
                    "end-to-end ratio",
                    "peak KV MiB",
                    "KV bytes ratio",
                ],
                summary,
            )
        )
    finally:
        for srv in servers.values():
            srv.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
