"""D. Latency of the Health RPC while the backend decodes 8 streams at full load.

Our backend (``run.sh``, ``cpu_dequantize:true``). A separate prober process (this
script with ``--probe``, so its timings share no interpreter or GIL with the threads
reading the streams) calls ``backend.Backend/Health`` every ``--interval`` seconds and
records each call's round-trip latency:

1. **idle**: ``--idle-probes`` calls with nothing running;
2. **loaded**: from just before ``--streams`` concurrent PredictStream requests
   (unique ``--prompt-tokens`` prompts, ``--new-tokens`` each, greedy) are sent until
   the last one ends: this covers their prefill and their decode.

Reported: count, p50, p99 and max latency of each phase.

Target: p99 < 50 ms under load.

    python bench/bench_health.py                  # ~1-2 minutes
    python bench/bench_health.py --new-tokens 256 --interval 0.005
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import select
import sys
import time

import benchlib as bl


def probe(address: str, interval: float, max_seconds: float) -> None:
    """Prober process: Health every ``interval`` s until stdin says stop (or time runs out).

    Prints one JSON line: the list of latencies in seconds.
    """
    import grpc

    import backend_pb2
    import backend_pb2_grpc

    channel = grpc.insecure_channel(address)
    stub = backend_pb2_grpc.BackendStub(channel)
    stub.Health(backend_pb2.HealthMessage(), timeout=30)  # connect first
    print("ready", flush=True)
    latencies: list[float] = []
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        stub.Health(backend_pb2.HealthMessage(), timeout=30)
        latencies.append(time.perf_counter() - t0)
        ready, _, _ = select.select([sys.stdin], [], [], interval)
        if ready:
            break
    channel.close()
    print(json.dumps(latencies), flush=True)


def run_probe(address: str, args, during) -> list[float]:
    """Start a prober, run ``during()`` (or ``--idle-probes`` intervals), return latencies."""
    worker = bl.Worker(
        [
            bl.python_exe(),
            __file__,
            "--probe",
            address,
            "--interval",
            str(args.interval),
            "--max-seconds",
            str(args.max_seconds),
        ],
        bl.fast_env(),
        "health-probe",
    )
    try:
        ready, _, _ = select.select([worker.proc.stdout], [], [], 60)
        if not ready or worker.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"prober did not start:\n{worker.logs()}")
        during()
        worker.proc.stdin.write("stop\n")
        worker.proc.stdin.flush()
        ready, _, _ = select.select([worker.proc.stdout], [], [], 60)
        line = worker.proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"prober gave no result:\n{worker.logs()}")
        return json.loads(line)
    finally:
        worker.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=8, help="concurrent streams under load")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="prompt length, tokens")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens generated per stream")
    ap.add_argument("--interval", type=float, default=0.01, help="seconds between probes")
    ap.add_argument("--idle-probes", type=int, default=200, help="probes while idle")
    ap.add_argument("--max-seconds", type=float, default=600.0, help="prober's own time limit")
    ap.add_argument("--probe", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        probe(args.probe, args.interval, args.max_seconds)
        return 0

    print(bl.header("D. Health latency under full load", sys.argv))
    pm = bl.PromptMaker(bl.converted_dir() / "tokenizer.json")
    server = bl.Backend()
    try:
        server.load(bl.embedded_gguf(), ["cpu_dequantize:true"])
        bl.grpc_stream(server.stub, bl.predict_options(pm.prompt(32, "warm"), 4))

        idle = run_probe(server.address, args, lambda: time.sleep(args.idle_probes * args.interval))

        tokens = []

        def load() -> None:
            prompts = [pm.prompt(args.prompt_tokens, "D-") for _ in range(args.streams)]
            with concurrent.futures.ThreadPoolExecutor(args.streams) as pool:
                results = pool.map(
                    lambda p: bl.grpc_stream(server.stub, bl.predict_options(p, args.new_tokens)),
                    prompts,
                )
                tokens.extend(r.tokens for r in results)

        loaded = run_probe(server.address, args, load)
        rows = [
            (
                name,
                len(lat),
                bl.percentile(lat, 50) * 1000,
                bl.percentile(lat, 99) * 1000,
                max(lat) * 1000,
            )
            for name, lat in (("idle", idle), (f"{args.streams} streams", loaded))
        ]
        print(bl.table(["phase", "probes", "p50 ms", "p99 ms", "max ms"], rows))
        p99 = bl.percentile(loaded, 99) * 1000
        print(
            f"\n{sum(tokens)} tokens generated under load; "
            f"target p99 < 50 ms: {p99:.1f} ms -> {bl.verdict(p99 < 50)}"
        )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
