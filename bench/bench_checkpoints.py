"""Prefix reuse per cache family: TTFT of the second agent request vs cold (issue 14).

Our backend (``run.sh``) serves tiny random-weight models of each cache family
(tests/tiny_models.py: llama; gemma3_text and gpt_oss with a 32-token sliding window;
qwen3_5, lfm2 and mamba2 with recurrent state), loaded by LoadModel. Per family and
round, greedy, one after another:

1. **cold**: a fresh ~``--system-tokens`` system message (with tool descriptions) +
   user question A (nothing cached);
2. **second**: the same system message + a different question B. Families whose cache
   cannot be trimmed reuse the snapshot taken at the end of the system message in (1).

Reported: client TTFT of both, the server's own prompt time of both
(``timing_prompt_processing``: admission to first token), the speed-up cold / second,
tokens prefilled again by (2) (GetMetrics prompt_tokens_processed) out of its prompt,
and the bytes one checkpoint costs (GetMetrics JSON prompt_cache.checkpoint_bytes /
checkpoints after the cold request: its snapshots at the system boundary and at len - 1).
Medians over rounds.

Targets: second >= 5x faster than cold, and prefilled again <= 10% of the prompt.

    python bench/bench_checkpoints.py                     # a few minutes on 2 CPU cores
    python bench/bench_checkpoints.py --families mamba2 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import benchlib as bl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import tiny_models

import backend_pb2

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')}: looks up store data",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
    for name in ("find_item", "check_price", "list_aisles", "order_stock")
]


def chat(system: str, user: str, max_tokens: int) -> backend_pb2.PredictOptions:
    req = backend_pb2.PredictOptions(
        UseTokenizerTemplate=True, Tokens=max_tokens, Temperature=0.0, Tools=json.dumps(TOOLS)
    )
    req.Messages.add(role="system", content=system)
    req.Messages.add(role="user", content=user)
    return req


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system-tokens", type=int, default=2000, help="system message, tokens")
    ap.add_argument("--new-tokens", type=int, default=4, help="tokens generated per request")
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds per family")
    ap.add_argument("--families", default=",".join(tiny_models.CONFIGS), help="comma list")
    args = ap.parse_args(argv)

    print(bl.header("Checkpoints: second agent request TTFT vs cold, per family", sys.argv))
    pm = bl.PromptMaker(bl.converted_dir() / "tokenizer.json")
    tools_text = "Tools: " + json.dumps(TOOLS) + "\n"
    server = bl.Backend()
    rows, ok = [], True
    try:
        with tempfile.TemporaryDirectory(prefix="tiny-models-") as root:
            for family in args.families.split(","):
                server.load(tiny_models.build(family, Path(root)))
                metrics = server.stub.GetMetrics
                speedups, again, sizes, colds, seconds, prompt_ms = [], [], [], [], [], []
                for i in range(args.rounds + 1):  # round 0 warms up
                    system = tools_text + pm.prompt(args.system_tokens, f"{family}{i}-")
                    cold = bl.grpc_stream(
                        server.stub, chat(system, "Where is the glue?", args.new_tokens)
                    )
                    m = metrics(backend_pb2.MetricsRequest())
                    prompt = m.prompt_tokens_processed  # cold: the whole prompt
                    info = json.loads(m.prompt_json_for_slot)["prompt_cache"]
                    second = bl.grpc_stream(
                        server.stub, chat(system, "Price of 4 mm screws?", args.new_tokens)
                    )
                    m = metrics(backend_pb2.MetricsRequest())
                    if i == 0:
                        continue
                    speedups.append(cold.ttft / second.ttft)
                    colds.append(cold.ttft * 1000)
                    seconds.append(second.ttft * 1000)
                    prompt_ms.append((cold.server_prompt_ms, second.server_prompt_ms))
                    again.append((m.prompt_tokens_processed, prompt))
                    if info["checkpoints"]:
                        sizes.append(info["checkpoint_bytes"] / info["checkpoints"])
                speed = bl.median(speedups)
                processed, prompt = sorted(again)[len(again) // 2]
                share = processed / prompt
                ok = ok and speed >= 5 and share <= 0.10
                rows.append(
                    (
                        family,
                        prompt,
                        bl.median(colds),
                        bl.median(seconds),
                        "{:.0f} / {:.0f}".format(*sorted(prompt_ms)[len(prompt_ms) // 2]),
                        speed,
                        f"{processed} ({share:.1%})",
                        f"{bl.median(sizes) / 1e6:.2f}" if sizes else "-",
                    )
                )
                print(rows[-1], flush=True)
        print(
            bl.table(
                [
                    "family",
                    "prompt tok",
                    "cold TTFT ms",
                    "second TTFT ms",
                    "server prompt ms cold / second",
                    "speed-up (median)",
                    "prefilled again",
                    "MB per checkpoint",
                ],
                rows,
            )
        )
        print(f"\ntargets >= 5x and <= 10% prefilled again, every family: {bl.verdict(ok)}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
