"""Batch-wide logits processors (issue 30): decode throughput with processors on the rows.

The proxy for hosts where per-step host work dominates (small and medium models on Apple
GPUs): a tiny random-weight llama (`tests/tiny_models.py` "llama": 2 layers, hidden 64,
the embedded SmolLM2 tokenizer's 49,152-token vocabulary), served by

* **ours**: this checkout's backend through ``run.sh`` (``max_batch_size:32``; ``--options ''``:
  the default options, issue 38's 32 streams starting together);
* **main**: the same backend from another checkout (``--main-root``, e.g. a ``git archive``
  of main's HEAD with backend_pb2*.py and the .venv link copied in), the code before;
* **mlx_lm.server**: ``python -m mlx_lm.server`` from the installed mlx-lm (its default
  ``--decode-concurrency`` 32), over HTTP ``/v1/completions``.

Scenarios, each at 1, 8 and 32 concurrent greedy streams (unique prompts, no prefix help):

* ``none``: no processor;
* ``eos_bias``: every row carries the EOS logit bias (-100);
* ``penalties``: repetition penalty 1.1 and presence penalty 0.5 (window 20) on every row;
* ``grammar_half``: a JSON grammar (``response_format`` json_object) on every other row,
  none on the others. mlx_lm.server has no grammar: its figure is its unconstrained
  (``none``) run, marked so.

Reported: end-to-end tok/s (all tokens over the wall time from the first request to the
last token) and the decode-window tok/s (tokens all streams received while every one of
them was decoding, over that window; one stream: its decode rate; "nan" where the streams
barely overlap), medians over ``--rounds``; the systems take turns per level, on the same
prompts.

Targets (issue 30): at 32 streams ours >= 2x mlx_lm.server with the EOS bias, >= 1.5x
with the grammar on half the rows; at 1 stream ours no slower than main.

    flock /tmp/heavy.lock .venv/bin/python bench/bench_processors.py \\
        --main-root /tmp/mainhead --rounds 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import benchlib as bl
from bench_concurrency import run_level

sys.path.insert(0, str(bl.ROOT / "tests"))
import tiny_models

from clients import server_process

SYSTEMS = ("ours", "main", "mlx_lm.server")
SCENARIOS = ("none", "eos_bias", "penalties", "grammar_half")
JSON_FORMAT = json.dumps({"type": "json_object"})


def _fields(scenario: str, row: int) -> dict:
    """Our PredictOptions fields for stream ``row`` of ``scenario``."""
    if scenario == "eos_bias":
        return {"LogitBias": json.dumps({str(k): v for k, v in bl.EOS_BIAS.items()})}
    if scenario == "penalties":
        return {"Penalty": 1.1, "PresencePenalty": 0.5}
    if scenario == "grammar_half" and row % 2 == 0:
        return {"Metadata": {"response_format": JSON_FORMAT}}
    return {}


def _body(scenario: str) -> dict:
    """mlx_lm.server's request fields for ``scenario`` (no grammar there)."""
    if scenario == "eos_bias":
        return {"logit_bias": {str(k): v for k, v in bl.EOS_BIAS.items()}}
    if scenario == "penalties":
        return {"repetition_penalty": 1.1, "presence_penalty": 0.5}
    return {}


def grpc_stream(stub, prompt: str, max_tokens: int, fields: dict) -> bl.StreamResult:
    req = bl.backend_pb2.PredictOptions(Prompt=prompt, Tokens=max_tokens, Temperature=0.0, **fields)
    return bl.grpc_stream(stub, req)


def backend_at(root: Path, name: str) -> bl.Backend:
    """Our backend started from the checkout at ``root`` (its own run.sh and code)."""
    saved = server_process.ROOT
    server_process.ROOT = root
    try:
        return bl.Backend(name)
    finally:
        server_process.ROOT = saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="1,8,32")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--main-root", type=Path, help="checkout of the code before (for 'main')")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--options",
        default="max_batch_size:32",
        help="load options of ours and main, comma-separated ('' = the defaults: issue 38)",
    )
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.streams.split(",")]
    scenarios = [s for s in args.scenarios.split(",") if s]
    systems = [s for s in args.systems.split(",") if s]
    if "main" in systems and args.main_root is None:
        ap.error("system 'main' needs --main-root")

    print(bl.header("Batch-wide logits processors (issue 30)", sys.argv))
    root = Path(tempfile.mkdtemp(prefix="bench-processors-"))
    model = tiny_models.build("llama", root)
    pm = bl.PromptMaker(tiny_models.tokenizer_dir() / "tokenizer.json")
    procs: list = []
    fns: dict[str, Callable[[str, int, str], bl.StreamResult]] = {}
    try:
        for name in systems:
            if name == "mlx_lm.server":
                mlx = bl.MlxLmServer(model)
                procs.append(mlx)
                fns[name] = lambda p, row, sc, port=mlx.port: bl.http_stream(
                    port, p, args.new_tokens, fields=_body("none" if sc == "grammar_half" else sc)
                )
                continue
            server = backend_at(args.main_root, name) if name == "main" else bl.Backend(name)
            procs.append(server)
            server.load(model, [o for o in args.options.split(",") if o])
            fns[name] = lambda p, row, sc, stub=server.stub: grpc_stream(
                stub, p, args.new_tokens, _fields(sc, row)
            )
        for name in systems:
            for sc in scenarios:  # warm-up (compiles the grammar once)
                fns[name](pm.prompt(args.prompt_tokens, "warm"), 0, sc)

        per: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
        rows = []
        turn = 0
        for rnd in range(args.rounds):
            for sc in scenarios:
                for n in levels:
                    order = systems[turn % len(systems) :] + systems[: turn % len(systems)]
                    turn += 1
                    # The same prompts for every system (each its own server: no sharing).
                    prompts = [pm.prompt(args.prompt_tokens, f"P{rnd}-{sc}-{n}-") for _ in range(n)]
                    for name in order:
                        fn = fns[name]
                        e2e, window, _, ttft, tokens = run_level(
                            lambda p, fn=fn, sc=sc, at=prompts.index: fn(p, at(p), sc), prompts
                        )
                        per.setdefault((name, sc, n), []).append((window, e2e))
                        rows.append((rnd + 1, sc, n, name, tokens, window, e2e, ttft * 1000))
        print(
            bl.table(
                [
                    "round",
                    "scenario",
                    "streams",
                    "system",
                    "tokens",
                    "decode-window tok/s",
                    "end-to-end tok/s",
                    "TTFT ms",
                ],
                rows,
            )
        )

        def med(name: str, sc: str, n: int, k: int = 0) -> float:
            return bl.median(v[k] for v in per.get((name, sc, n), []))

        print("\nMedian decode-window tok/s (end-to-end in brackets); ratios in the same run:\n")
        head = ["scenario", "streams", *systems]
        others = [s for s in systems if s != "ours"]
        head += [f"ours / {s}" for s in others]
        summary = []
        for sc in scenarios:
            for n in levels:
                cells: list[object] = [sc, n]
                for s in systems:
                    mark = (
                        " (unconstrained)" if s == "mlx_lm.server" and sc == "grammar_half" else ""
                    )
                    cells.append(f"{med(s, sc, n):.0f} [{med(s, sc, n, 1):.0f}]{mark}")
                if "ours" in systems:
                    cells += [f"{med('ours', sc, n) / med(s, sc, n):.2f}x" for s in others]
                summary.append(cells)
        print(bl.table(head, summary))
        top = max(levels)
        # Verdicts on end-to-end tok/s: the decode window is undefined ("nan") where the
        # streams barely overlap (grammar rows that close their JSON early; mlx_lm.server
        # admitting 8 prompts at a time).
        if "ours" in systems and "mlx_lm.server" in systems:
            for sc, goal in (("eos_bias", 2.0), ("grammar_half", 1.5)):
                if sc in scenarios:
                    rel = med("ours", sc, top, 1) / med("mlx_lm.server", sc, top, 1)
                    print(
                        f"target {sc} ours@{top} >= {goal}x mlx_lm.server (end-to-end): "
                        f"{rel:.2f}x -> {bl.verdict(rel >= goal)}"
                    )
        if "ours" in systems and "main" in systems and 1 in levels:
            for sc in scenarios:
                rel = med("ours", sc, 1, 1) / med("main", sc, 1, 1)
                print(f"{sc}: ours@1 / main@1 (end-to-end): {rel:.2f}x")
    finally:
        for proc in procs:
            proc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
