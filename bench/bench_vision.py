"""Image requests: TTFT with and without the vision-feature cache, and 4 concurrent image
requests vs one at a time (issue 23).

Our backend (``run.sh``) serves a small random-weight Qwen2-VL built at run time
(tests/vision_models.py) with a vision tower large enough to cost something (``--depth``
layers of width ``--width``; a 448x448 image is 1,024 patches, 256 image tokens), loaded
by LoadModel twice: with the vision-feature cache (the default) and without it
(``vision_cache_entries:0``). Greedy, images as base64 PNGs.

1. **Feature cache.** Per round, one request ``Question <n>: ... <image>`` with the image
   *after* a question that changes every round, so the prompt cache cannot serve the
   image's tokens and only the feature cache can skip the vision tower. ``cold``: a new
   image every round (the tower always runs); ``same image``: the image of round 0 again.
   Client TTFT and the server's prompt time, medians over rounds, with and without the
   feature cache.
2. **Concurrency.** 4 requests with 4 different images, ``--tokens`` tokens each: all at
   once (they prefill one after another and decode together in one batch) vs one at a
   time; wall time and aggregate tokens/s.

    python bench/bench_vision.py                 # ~2 minutes on 2 busy CPU cores
    python bench/bench_vision.py --rounds 5 --depth 12
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import benchlib as bl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import vision_models

import backend_pb2

SIZE = (448, 448)


def request(prompt: str, image: bytes, tokens: int) -> backend_pb2.PredictOptions:
    return backend_pb2.PredictOptions(
        Prompt=prompt,
        Images=[base64.b64encode(image).decode()],
        Tokens=tokens,
        Temperature=0.0,
        IgnoreEOS=True,
    )


def feature_cache(server, rounds: int, tokens: int) -> dict[str, tuple[float, float]]:
    """{case: (median client TTFT ms, median server prompt ms)} for cold / same image."""
    base = vision_models.png(SIZE, seed=1)
    out = {}
    for case in ("cold", "same image"):
        ttft, prompt_ms = [], []
        for i in range(rounds + 1):  # round 0 warms up (and caches the base image)
            image = vision_models.png(SIZE, seed=100 + i) if case == "cold" and i else base
            question = f"Question {case} {i}: what do you see here? <__media__>"
            r = bl.grpc_stream(server.stub, request(question, image, tokens))
            if i:
                ttft.append(r.ttft * 1000)
                prompt_ms.append(r.server_prompt_ms)
        out[case] = (bl.median(ttft), bl.median(prompt_ms))
    return out


def concurrency(server, n: int, tokens: int, tag: str) -> dict[str, float]:
    """``n`` image requests one at a time, then all at once: wall seconds of each, and
    for all at once when the last first token came (the towers and prefills are done)."""
    images = [vision_models.png(SIZE, seed=500 + i) for i in range(n)]

    def reqs(round_tag: str) -> list:
        return [
            request(f"{round_tag} image {i}: describe <__media__>", img, tokens)
            for i, img in enumerate(images)
        ]

    t = time.perf_counter()
    for req in reqs(f"{tag} sequential"):
        bl.grpc_stream(server.stub, req)
    sequential = time.perf_counter() - t
    server.load_again()  # an empty feature cache and prompt cache for the second side
    results: list = []

    def run(req) -> None:
        results.append(bl.grpc_stream(server.stub, req))

    threads = [threading.Thread(target=run, args=(req,)) for req in reqs(f"{tag} concurrent")]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join(600)
    together = time.perf_counter() - t
    last_first = max(r.t_first for r in results) - t
    return {
        "sequential": sequential,
        "together": together,
        "ratio": sequential / together,
        "last_first": last_first,
    }


class Served:
    def __init__(self, server, model: Path, options: list[str]) -> None:
        self.server, self.model, self.options = server, model, options
        self.stub = server.stub
        self.load_again()

    def load_again(self) -> None:
        self.server.stub.Free(backend_pb2.HealthMessage())
        self.server.load(self.model, self.options)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # mlx-vlm's fallbacks must not download
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds per case")
    ap.add_argument("--tokens", type=int, default=16, help="tokens generated per request")
    ap.add_argument("--depth", type=int, default=8, help="vision tower layers")
    ap.add_argument("--width", type=int, default=256, help="vision tower width")
    ap.add_argument("--concurrent", type=int, default=4, help="image requests at once")
    args = ap.parse_args(argv)

    print(bl.header("Vision: feature cache and concurrent image requests", sys.argv))
    server = bl.Backend()
    try:
        with tempfile.TemporaryDirectory(prefix="vision-bench-") as root:
            model = vision_models.build(
                "qwen2_vl",
                Path(root) / "qwen2_vl",
                vision={"depth": args.depth, "embed_dim": args.width, "num_heads": 4},
                preprocessor={"max_pixels": SIZE[0] * SIZE[1]},
            )
            rows = []
            for label, options in (("on", []), ("off", ["vision_cache_entries:0"])):
                served = Served(server, model, options)
                result = feature_cache(served, args.rounds, args.tokens)
                for case, (ttft, prompt_ms) in result.items():
                    rows.append((label, case, ttft, prompt_ms))
                print(rows[-2:], flush=True)
            print(
                bl.table(["feature cache", "image", "TTFT ms (median)", "server prompt ms"], rows)
            )
            on = {case: ttft for label, case, ttft, _ in rows if label == "on"}
            print(f"\nsame image vs cold, cache on: {on['cold'] / on['same image']:.2f}x faster")
            served = Served(server, model, [])
            c = concurrency(served, args.concurrent, args.tokens, "c")
            n = args.concurrent
            print(
                bl.table(
                    [
                        "requests",
                        "one at a time s",
                        "all at once s",
                        "speed-up",
                        "all at once: last first token s",
                        "agg tok/s",
                    ],
                    [
                        (
                            n,
                            c["sequential"],
                            c["together"],
                            c["ratio"],
                            c["last_first"],
                            n * args.tokens / c["together"],
                        )
                    ],
                )
            )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
