"""G. Disk tier of the prompt cache: write cost, and TTFT after a restart vs cold.

In-process, on the embedded SmolLM2-135M (CPU dense mode when a fast BLAS is
preloaded, as the engine does). Each round takes a fresh ``--prompt-tokens`` prompt:

1. **cold**: empty KV cache, prefill the prompt and sample the first token (TTFT);
2. **put**: ``DiskCache.put`` of the resulting KV on the caller's thread (engine-thread
   cost: materialise + serialise into memory), then the writer thread's cost (hash,
   write, fsync, rename); both reported per 1,000 tokens;
3. **restart**: close the cache, open a new ``DiskCache`` on the directory (start-up
   scan), ``lookup`` the same prompt (read, checksum, load), trim to all but the last
   prompt token and sample the first token: TTFT after a restart. The first tokens of
   cold and warm must agree.

Then, once: the decode rate of a running sequence alone vs while the writer thread
writes an entry of the same size (target: <= 5% slower).

Target: TTFT after a restart >= 5x faster than cold. Run as the tests are:

    eval "$(python -m loading.cpu_fast_path --exports)"; python bench/bench_disk_cache.py
    python bench/bench_disk_cache.py --rounds 3 --prompt-tokens 2000
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import benchlib as bl
import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from caches.prompt_disk import DiskCache
from loading import cpu_fast_path, model_loader

FP = "bench000bench000:" + "0" * 32


def first_token(model, prompt: list[int], kv) -> tuple[int, float]:
    """(first sampled token, seconds) for ``prompt`` fed onto ``kv``."""
    start = time.perf_counter()
    steps = generate_step(
        mx.array(prompt, dtype=mx.uint32), model, prompt_cache=kv, sampler=lambda x: x.argmax(-1)
    )
    token, _ = next(steps)
    return int(token), time.perf_counter() - start


def decode_rate(model, kv, token: int, n: int) -> float:
    """Tokens per second decoding ``n`` greedy tokens after ``token`` onto ``kv``."""
    steps = generate_step(
        mx.array([token], dtype=mx.uint32), model, prompt_cache=kv, sampler=lambda x: x.argmax(-1)
    )
    next(steps)
    start = time.perf_counter()
    for _ in range(n):
        next(steps)
    return n / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=2000, help="prompt length, tokens")
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds")
    ap.add_argument("--decode-tokens", type=int, default=64, help="tokens per decode sample")
    args = ap.parse_args(argv)

    print(bl.header("G. Disk prompt cache: write cost, TTFT after restart vs cold", sys.argv))
    model, tok = model_loader.load_model(str(model_loader.embedded_model_path()))
    mode = cpu_fast_path.prepare_for_cpu(model, None)
    print(f"model: embedded SmolLM2-135M, CPU weight mode {mode}\n")
    rng = random.Random(7)
    words = bl._WORDS

    def make_prompt(tag: str) -> list[int]:
        text = tag + " " + " ".join(rng.choice(words) for _ in range(args.prompt_tokens))
        ids = tok.encode(text, add_special_tokens=False)[: args.prompt_tokens]
        assert len(ids) == args.prompt_tokens, "not enough words for the prompt length"
        return ids

    first_token(model, make_prompt("warm-up")[:256], make_prompt_cache(model))
    rows, speedups, engine_ms, writer_ms = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-disk-") as tmp:
        for i in range(args.rounds):
            ids = make_prompt(f"round {i}")
            directory = Path(tmp) / f"r{i}"
            kv = make_prompt_cache(model)
            cold_tok, cold_s = first_token(model, ids, kv)
            held = [*ids, cold_tok]  # generate_step has fed the first token already
            mx.eval([c.state for c in kv])
            disk = DiskCache(directory, 8 << 30, FP)
            start = time.perf_counter()
            assert disk.put(held[: kv[0].offset], kv)
            put_s = time.perf_counter() - start
            assert disk.flush(300)
            st = disk.stats()
            disk.close()
            assert st.writes == 1 and st.write_errors == 0, st
            start = time.perf_counter()
            restarted = DiskCache(directory, 8 << 30, FP)
            scan_s = time.perf_counter() - start
            start = time.perf_counter()
            hit = restarted.lookup(ids)
            assert hit is not None and hit.cached_len == len(ids) - 1
            for c in hit.kv:
                c.trim(len(hit.tokens) - hit.cached_len)
            warm_tok, _ = first_token(model, ids[hit.cached_len :], hit.kv)
            warm_s = time.perf_counter() - start
            load_s = restarted.stats().load_ms / 1000
            restarted.close()
            assert warm_tok == cold_tok, (warm_tok, cold_tok)
            last_held, last_kv = held[: kv[0].offset], kv
            k = len(ids) / 1000
            engine_ms.append(put_s * 1000 / k)
            writer_ms.append(st.write_ms / k)
            speedups.append(cold_s / warm_s)
            rows.append(
                (
                    i + 1,
                    len(ids),
                    st.nbytes / 2**20,
                    cold_s * 1000,
                    put_s * 1000,
                    st.write_ms,
                    scan_s * 1000,
                    load_s * 1000,
                    warm_s * 1000,
                    cold_s / warm_s,
                )
            )
        print(
            bl.table(
                [
                    "round",
                    "prompt tokens",
                    "file MiB",
                    "cold TTFT ms",
                    "put (engine) ms",
                    "write (writer) ms",
                    "restart scan ms",
                    "load ms",
                    "TTFT after restart ms",
                    "speed-up",
                ],
                rows,
            )
        )

        # Decode rate of a running sequence, alone and while the writer writes.
        ids = make_prompt("decode")
        kv = make_prompt_cache(model)
        tok0, _ = first_token(model, ids[:256], kv)
        alone = decode_rate(model, kv, tok0, args.decode_tokens)
        disk = DiskCache(Path(tmp) / "decode", 8 << 30, FP)
        kv2 = make_prompt_cache(model)
        tok1, _ = first_token(model, ids[:256], kv2)
        assert disk.put(last_held, last_kv)  # the last round's entry, written again
        during = decode_rate(model, kv2, tok1, args.decode_tokens)
        still_writing = disk._queue.unfinished_tasks > 0
        disk.flush(300)
        disk.close()

    print()
    print(
        f"write cost per 1,000 tokens: engine thread {bl.median(engine_ms):.1f} ms "
        f"(materialise + serialise), writer thread {bl.median(writer_ms):.1f} ms "
        "(hash + write + fsync + rename)"
    )
    ratio = during / alone
    print(
        f"decode rate of another sequence: alone {alone:.1f} tok/s, while writing "
        f"{during:.1f} tok/s ({ratio:.2f}x; the write "
        f"{'outlasted' if still_writing else 'ended within'} the sample)  "
        f"target >= 0.95x: {bl.verdict(ratio >= 0.95)}"
    )
    med = bl.median(speedups)
    print(
        f"median TTFT speed-up after restart vs cold: {med:.1f}x  "
        f"target >= 5x: {bl.verdict(med >= 5)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
