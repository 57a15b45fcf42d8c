#!/usr/bin/env python3
"""Command-line client: stream a chat or prompt completion from a running backend.

Examples::

    python -m clients.cli --chat "What is the capital of France?"
    python -m clients.cli --prompt "Once upon a time" --temperature 0.8 --seed 7 --max-tokens 64
    python -m clients.cli --load /path/to/model.gguf --chat "Hi"

Content streams to stdout as it arrives; reasoning (if any) goes to stderr; usage and
timings are printed to stderr at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import grpc

import backend_pb2
import backend_pb2_grpc


def build_request(args: argparse.Namespace) -> backend_pb2.PredictOptions:
    req = backend_pb2.PredictOptions(
        Tokens=args.max_tokens,
        Temperature=args.temperature,
        TopP=args.top_p,
        TopK=args.top_k,
        MinP=args.min_p,
        Penalty=args.repetition_penalty,
        Seed=args.seed,
        StopPrompts=args.stop,
        Logprobs=1 if args.top_logprobs is not None else 0,
        TopLogprobs=args.top_logprobs or 0,
    )
    if args.chat is not None:
        req.UseTokenizerTemplate = True
        if args.system:
            req.Messages.add(role="system", content=args.system)
        req.Messages.add(role="user", content=args.chat)
        if args.thinking is not None:
            req.Metadata["enable_thinking"] = args.thinking
    else:
        req.Prompt = args.prompt
    return req


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--addr", default="localhost:50051")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--chat", help="a user message, rendered with the model's chat template")
    src.add_argument("--prompt", help="a raw prompt, sent as is")
    p.add_argument("--system", default="", help="system message (with --chat)")
    p.add_argument("--load", help="call LoadModel with this model first")
    p.add_argument(
        "--max-tokens", type=int, default=128, help="max new tokens (0 = server default)"
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=0.0, help="0 = disabled")
    p.add_argument("--top-k", type=int, default=0, help="0 = disabled")
    p.add_argument("--min-p", type=float, default=0.0, help="0 = disabled")
    p.add_argument("--repetition-penalty", type=float, default=0.0, help="0 = disabled")
    p.add_argument("--seed", type=int, default=0, help="> 0 for reproducible sampling")
    p.add_argument("--stop", action="append", default=[], help="stop sequence (repeatable)")
    p.add_argument(
        "--top-logprobs", type=int, default=None, help="print logprobs with N alternatives"
    )
    p.add_argument("--thinking", choices=["true", "false"], default=None, help="enable_thinking")
    p.add_argument("--no-stream", action="store_true", help="use Predict instead of PredictStream")
    args = p.parse_args(argv)

    metadata = []
    token = os.environ.get("LOCALAI_GRPC_AUTH_TOKEN")
    if token:
        metadata.append(("authorization", f"Bearer {token}"))
    with grpc.insecure_channel(args.addr) as channel:
        stub = backend_pb2_grpc.BackendStub(channel)
        try:
            if args.load:
                res = stub.LoadModel(backend_pb2.ModelOptions(Model=args.load), metadata=metadata)
                if not res.success:
                    print(res.message, file=sys.stderr)
                    return 1
            req = build_request(args)
            if args.no_stream:
                replies = [stub.Predict(req, metadata=metadata)]
            else:
                replies = stub.PredictStream(req, metadata=metadata)
            last = None
            for reply in replies:
                for d in reply.chat_deltas:
                    if d.reasoning_content:
                        print(d.reasoning_content, end="", file=sys.stderr, flush=True)
                    for call in d.tool_calls:
                        print(
                            f"\n[tool call {call.index}] {call.name}({call.arguments})", flush=True
                        )
                print(reply.message.decode("utf-8", "replace"), end="", flush=True)
                last = reply
        except grpc.RpcError as err:
            print(f"\nerror: {err.code().name}: {err.details()}", file=sys.stderr)
            return 1
    print()
    if last is not None:
        print(
            f"[{last.prompt_tokens} prompt tokens, {last.tokens} generated; "
            f"prompt {last.timing_prompt_processing:.0f} ms, "
            f"generation {last.timing_token_generation:.0f} ms]",
            file=sys.stderr,
        )
        if last.logprobs:
            print(json.dumps(json.loads(last.logprobs), indent=1), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
