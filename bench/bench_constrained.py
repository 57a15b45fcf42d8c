"""Constrained vs free decoding at 8 streams (issue 31): what a grammar costs per token.

Our backend (``run.sh``, ``max_batch_size:8``, ``tool_parser:hermes``) serves, one model
at a time,

* **tiny**: the tiny random-weight llama of `tests/tiny_models.py` (2 layers, hidden 64,
  SmolLM2's 49,152-token vocabulary): per-step host work dominates, so the grammar's
  share shows most;
* **embedded**: the embedded SmolLM2 GGUF (``cpu_dequantize:true``), a real model.

Scenarios, each with 8 concurrent greedy streams on unique prompts, EOS biased away
(every stream runs to ``--new-tokens``):

* ``free``: no constraint;
* ``json_schema``: ``Metadata`` json_schema, an object holding an array of at least 500
  short strings (the output stays inside the grammar to the end);
* ``tool_lazy``: ``tool_grammar:on`` with two tools, ToolChoice auto: the tool-call grammar
  sleeps until ``<tool_call>`` (these models never write it): the cost of a lazy tool
  grammar that never engages (its trigger gate decodes each token; no mask);
* ``tool_required``: ToolChoice names ``take_notes`` (a call required): the call is
  constrained from the first token (its arguments an array of at least 500 short strings).
  The token limit cuts the call, which ends the request RESOURCE_EXHAUSTED (a cut call is
  refused); the call streams no token counts, so only its end-to-end figure is defined.

Reported: end-to-end tok/s (all tokens over the wall time from the first request to the
last token) and decode-window tok/s (tokens all streams received while every one was
decoding, over that window), medians over ``--rounds``; the ratio of each constrained
scenario to ``free`` of the same model and round.

    flock /tmp/heavy.lock .venv/bin/python bench/bench_constrained.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import benchlib as bl
import grpc
from bench_concurrency import run_level

sys.path.insert(0, str(bl.ROOT / "tests"))
import tiny_models

MODELS = ("tiny", "embedded")
SCENARIOS = ("free", "json_schema", "tool_lazy", "tool_required")
STREAMS = 8
LONG = {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 500}
SCHEMA = {"type": "object", "properties": {"notes": LONG}, "required": ["notes"]}
TOOLS = json.dumps(
    [
        {"type": "function", "function": {"name": "take_notes", "parameters": SCHEMA}},
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        },
    ]
)


def fields(scenario: str) -> dict:
    """The PredictOptions fields of ``scenario`` (besides the prompt and sampling)."""
    if scenario == "json_schema":
        return {"Metadata": {"json_schema": json.dumps(SCHEMA)}}
    if scenario == "tool_lazy":
        return {"Tools": TOOLS, "Metadata": {"tool_grammar": "on"}}
    if scenario == "tool_required":
        choice = {"type": "function", "function": {"name": "take_notes"}}
        return {"Tools": TOOLS, "ToolChoice": json.dumps(choice)}
    return {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    scenarios = [s for s in args.scenarios.split(",") if s]

    print(bl.header(f"Constrained vs free decoding, {STREAMS} streams (issue 31)", sys.argv))
    root = Path(tempfile.mkdtemp(prefix="bench-constrained-"))
    pm = bl.PromptMaker(tiny_models.tokenizer_dir() / "tokenizer.json")
    per: dict[tuple[str, str], list[tuple[float, float]]] = {}
    samples: dict[tuple[str, str], str] = {}
    rows = []
    for model in models:
        path = tiny_models.build("llama", root) if model == "tiny" else bl.embedded_gguf()
        options = ["max_batch_size:8", "tool_parser:hermes"]
        if model == "embedded":
            options.append("cpu_dequantize:true")
        server = bl.Backend(f"ours-{model}")
        try:
            server.load(path, options)

            def stream(prompt: str, sc: str, stub=server.stub, model=model) -> bl.StreamResult:
                req = bl.predict_options(prompt, args.new_tokens, **fields(sc))
                # The required call never closes (at least 500 items): the token limit
                # cuts it, which ends the request RESOURCE_EXHAUSTED once all the tokens
                # are made; a call's tokens stream no counts, so its end is its last token
                # and the decode window is undefined ("nan") for this scenario.
                ends = (grpc.StatusCode.RESOURCE_EXHAUSTED,) if sc == "tool_required" else ()
                result = bl.grpc_stream(stub, req, ends=ends)
                if result.error:
                    result.tokens, result.t_last = args.new_tokens, time.perf_counter()
                samples.setdefault((model, sc), result.text)
                return result

            for sc in scenarios:  # warm-up: compiles each grammar once
                stream(pm.prompt(args.prompt_tokens, "warm"), sc)
            for rnd in range(args.rounds):
                # Scenarios take turns within a round, on fresh prompts of the same length.
                for sc in scenarios:
                    prompts = [
                        pm.prompt(args.prompt_tokens, f"{model}{rnd}-{sc}-") for _ in range(STREAMS)
                    ]
                    e2e, window, _, ttft, tokens = run_level(
                        lambda p, sc=sc: stream(p, sc), prompts
                    )
                    per.setdefault((model, sc), []).append((window, e2e))
                    rows.append((rnd + 1, model, sc, tokens, window, e2e, ttft * 1000))
        finally:
            server.stop()
    print(
        bl.table(
            ["round", "model", "scenario", "tokens", "decode-window tok/s", "end-to-end tok/s",
             "TTFT ms"],
            rows,
        )
    )  # fmt: skip

    def med(model: str, sc: str, k: int) -> float:
        return bl.median(v[k] for v in per[(model, sc)])

    print(f"\nMedian tok/s at {STREAMS} streams, decode-window [end-to-end]; ratio to free:\n")
    summary = []
    for sc in scenarios:
        cells: list[object] = [sc]
        for model in models:
            cells.append(f"{med(model, sc, 0):.0f} [{med(model, sc, 1):.0f}]")
            if "free" in scenarios:
                cells.append(
                    f"{med(model, sc, 0) / med(model, 'free', 0):.2f}x "
                    f"[{med(model, sc, 1) / med(model, 'free', 1):.2f}x]"
                )
        summary.append(cells)
    head = ["scenario"]
    for model in models:
        head += [model, f"{model} / free"] if "free" in scenarios else [model]
    print(bl.table(head, summary))
    print("\nThe first stream's text (60 characters) per model and scenario:\n")
    for (model, sc), text in samples.items():
        print(f"- {model} {sc}: `{text[:60]!r}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
