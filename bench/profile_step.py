"""Where a decode step's time goes, by operation kind (diagnostic).

Loads the embedded SmolLM2-135M dense float32 on MKL (``prepare_for_cpu(model, True)``,
as the server does with ``cpu_dequantize:true``), fills a KV cache with a prompt of
``--context`` tokens for ``--batch`` sequences, then times in one process, side by side:

* ``DecodeBatch.next()`` per step (what the server's engine calls; greedy sampler)
* a bare forward ``model(tokens, cache)`` + ``mx.eval`` on a plain KV cache of the same
  length (trimmed back after each step, so the length stays put), and the Python time
  to build its graph (no evaluation)
* each operation kind alone, in the model's shapes and per-step counts, evaluated once
  per step: the matmuls of every linear layer + the tied output head ("matmul floor",
  with the model's own weights), attention over the cache (``mx.fast`` SDPA), RMS norms,
  rotary embedding, SwiGLU, residual adds, the head-layout transposes/reshapes, KV cache
  writes, the token embedding, and the sampling work (log-softmax + argmax)

Each figure is the median of ``--repeats`` timed runs after warm-up; rounds of all
measurements alternate so host load hits them alike. With ``--compare`` the same
tables are printed for the model after ``cpu_fuse.transform`` (fused Q/K/V and gate/up
projections, compiled norms and rotary) too; its per-kind rows still time the original
kinds (``mx.fast`` norms and rotary), only the matmul floor uses its fused weights.

    python bench/profile_step.py                      # batch 1 and 8, ~2 minutes
    python bench/profile_step.py --batch 1 --repeats 40 --compare
    python bench/profile_step.py --ab 4               # batch steps, plain vs fused, A/B
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import benchlib as bl


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


class Step:
    """The per-kind graphs of one decode step of ``model`` at batch ``b``, context ``ctx``."""

    def __init__(self, model, tokenizer, b: int, ctx: int):
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        self.mx, self.model, self.b, self.ctx = mx, model, b, ctx
        inner = model.model
        self.layers = inner.layers
        args = model.args
        self.hidden = args.hidden_size
        self.n_heads = args.num_attention_heads
        self.n_kv = args.num_key_value_heads
        self.head_dim = args.head_dim or args.hidden_size // args.num_attention_heads
        self.inter = args.intermediate_size
        self.vocab = args.vocab_size
        ids = tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 40)[:ctx]
        prompt = mx.array([ids] * b)
        self.cache = make_prompt_cache(model)
        mx.eval(model(prompt, cache=self.cache))
        mx.eval([c.state for c in self.cache])
        self.tokens = mx.array([[ids[-1]]] * b)
        # Operands of the per-kind graphs, made once.
        r = mx.random
        self.x = r.normal((b, 1, self.hidden))
        self.q = r.normal((b, self.n_heads, 1, self.head_dim))
        self.k1 = r.normal((b, self.n_kv, 1, self.head_dim))
        kv_buf = (b, self.n_kv, ((ctx + 256) // 256) * 256, self.head_dim)
        self.kbuf, self.vbuf = r.normal(kv_buf), r.normal(kv_buf)
        self.g = r.normal((b, 1, self.inter))
        self.u = r.normal((b, 1, self.inter))
        self.logits = r.normal((b, self.vocab))
        mx.eval(self.x, self.q, self.k1, self.kbuf, self.vbuf, self.g, self.u, self.logits)
        self.rms_w = inner.norm.weight
        self.scale = self.head_dim**-0.5

    # --- whole step ---------------------------------------------------------------
    def forward(self) -> None:
        mx = self.mx
        logits = self.model(self.tokens, cache=self.cache)
        mx.eval(logits[:, -1, :].argmax(axis=-1))
        for c in self.cache:
            c.trim(1)

    def build_only(self) -> None:
        """Python time of building the forward graph (not evaluated; cache restored)."""
        states = [(c.keys, c.values, c.offset) for c in self.cache]
        self.model(self.tokens, cache=self.cache)
        for c, (k, v, o) in zip(self.cache, states, strict=True):
            c.keys, c.values, c.offset = k, v, o

    # --- operation kinds ------------------------------------------------------------
    def linears(self) -> list:
        """Every nn.Linear of the step, in order, with its input width."""
        out = []
        for layer in self.layers:
            for mod in (layer.self_attn, layer.mlp):
                for _name, child in mod.children().items():
                    child = getattr(child, "fused", child)  # cpu_fuse: the group's matmul
                    if hasattr(child, "weight") and child.weight.ndim == 2:
                        out.append(child)
        return out

    def matmul_floor(self) -> None:
        mx = self.mx
        outs = []
        for lin in self._linears:
            x = mx.zeros((self.b, 1, lin.weight.shape[1]))
            outs.append(lin(x))
        outs.append(self.model.model.embed_tokens.as_linear(self.x))
        mx.eval(outs)

    def prepare(self) -> None:
        self._linears = self.linears()
        self.n_linear = len(self._linears) + 1

    def sdpa(self) -> None:
        mx = self.mx
        k = self.kbuf[..., : self.ctx, :]
        v = self.vbuf[..., : self.ctx, :]
        outs = [
            mx.fast.scaled_dot_product_attention(self.q, k, v, scale=self.scale, mask=None)
            for _ in self.layers
        ]
        mx.eval(outs)

    def norms(self) -> None:
        mx = self.mx
        n = 2 * len(self.layers) + 1
        mx.eval([mx.fast.rms_norm(self.x, self.rms_w, 1e-5) for _ in range(n)])

    def rotary(self) -> None:
        mx = self.mx
        rope = self.layers[0].self_attn.rope
        outs = []
        for _ in self.layers:
            outs.append(rope(self.q, offset=self.ctx))
            outs.append(rope(self.k1, offset=self.ctx))
        mx.eval(outs)

    def activations(self) -> None:
        from mlx_lm.models.activations import swiglu

        self.mx.eval([swiglu(self.g, self.u) for _ in self.layers])

    def residuals(self) -> None:
        self.mx.eval([self.x + self.x for _ in range(2 * len(self.layers))])

    def layout(self) -> None:
        """The reshape/transpose of q, k, v into heads and of the output back."""
        b, h, kv, d = self.b, self.n_heads, self.n_kv, self.head_dim
        outs = []
        for _ in self.layers:
            q = self.x.reshape(b, 1, h, d).transpose(0, 2, 1, 3)
            k = self.x[..., : kv * d].reshape(b, 1, kv, d).transpose(0, 2, 1, 3)
            outs += [q + 0, k + 0, self.q.transpose(0, 2, 1, 3).reshape(b, 1, -1)]
        self.mx.eval(outs)

    def cache_writes(self) -> None:
        from mlx_lm.models.cache import KVCache

        mx = self.mx
        outs = []
        for _ in self.layers:
            c = KVCache()
            c.keys, c.values, c.offset = self.kbuf, self.vbuf, self.ctx
            outs += list(c.update_and_fetch(self.k1, self.k1))
        mx.eval(outs)

    def norms_compiled(self) -> None:
        from loading import cpu_fuse

        norm, _ = cpu_fuse._compiled_classes()
        if not hasattr(self, "_cnorm"):
            self._cnorm = norm(self.model.model.norm)
        n = 2 * len(self.layers) + 1
        self.mx.eval([self._cnorm(self.x) for _ in range(n)])

    def rotary_compiled(self) -> None:
        from loading import cpu_fuse

        _, rope = cpu_fuse._compiled_classes()
        if not hasattr(self, "_crope"):
            self._crope = rope(self.layers[0].self_attn.rope)
        outs = []
        for _ in self.layers:
            outs.append(self._crope(self.q, offset=self.ctx))
            outs.append(self._crope(self.k1, offset=self.ctx))
        self.mx.eval(outs)

    def embedding(self) -> None:
        self.mx.eval(self.model.model.embed_tokens(self.tokens))

    def sampling(self) -> None:
        mx = self.mx
        logprobs = self.logits - mx.logsumexp(self.logits, axis=-1, keepdims=True)
        mx.eval(mx.argmax(logprobs, axis=-1), list(logprobs))


KINDS = (
    ("matmuls (linear layers + lm_head): the floor", "matmul_floor"),
    ("attention over the cache (sdpa)", "sdpa"),
    ("RMS norms", "norms"),
    ("rotary", "rotary"),
    ("activations (SwiGLU)", "activations"),
    ("residual adds", "residuals"),
    ("head layout (transpose/reshape)", "layout"),
    ("cache writes", "cache_writes"),
    ("embedding lookup", "embedding"),
    ("sampling (log-softmax + argmax)", "sampling"),
)

# Not part of the plain step (not summed): what cpu_fuse.compile_elementwise puts instead.
ALTERNATIVES = (
    ("RMS norms, compiled (cpu_fuse)", "norms_compiled"),
    ("rotary, compiled (cpu_fuse)", "rotary_compiled"),
)


def batch_generator_step(model, tokenizer, b: int, ctx: int, steps: int) -> list[float]:
    """Milliseconds per `DecodeBatch.next()` call (the server's batch step) once all ``b``
    sequences decode."""
    import mlx.core as mx

    from batch.decode import DecodeBatch

    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 40)[:ctx]
    batch = DecodeBatch(model, max_rows=b)
    for _ in range(b):
        batch.insert([ids], max_tokens=10_000)
    while len(batch.next()[1]) < b:  # prefill until every sequence decodes
        pass
    for _ in range(3):
        batch.next()
    times = []
    for _ in range(steps):
        times.append(_timed(batch.next))
    batch.close()
    mx.clear_cache()
    return times


def profile(model, tokenizer, b: int, ctx: int, repeats: int, label: str) -> dict[str, float]:
    step = Step(model, tokenizer, b, ctx)
    step.prepare()
    names = ["forward", "build_only", *(m for _, m in KINDS + ALTERNATIVES)]
    samples: dict[str, list[float]] = {n: [] for n in names}
    for n in names:  # warm-up (compiles, allocations)
        getattr(step, n)()
        getattr(step, n)()
    for _ in range(repeats):
        for n in names:
            samples[n].append(_timed(getattr(step, n)))
    med = {n: statistics.median(v) for n, v in samples.items()}
    med["batchgen"] = statistics.median(batch_generator_step(model, tokenizer, b, ctx, repeats))
    rows = [
        ("DecodeBatch.next() per step", med["batchgen"], med["batchgen"] / med["matmul_floor"]),
        ("bare forward + argmax", med["forward"], med["forward"] / med["matmul_floor"]),
        ("  of it: Python graph build (no eval)", med["build_only"], float("nan")),
    ]
    parts = 0.0
    for title, m in KINDS:
        parts += med[m]
        rows.append((f"  {title}", med[m], med[m] / med["forward"]))
    rows.append(("  sum of the kinds above", parts, parts / med["forward"]))
    rows.append(
        ("  rest (dispatch, graph, Python)", med["forward"] - parts, 1 - parts / med["forward"])
    )
    for title, m in ALTERNATIVES:
        rows.append((f"instead: {title}", med[m], med[m] / med["forward"]))
    print(f"### {label}: batch {b}, context {ctx}, {step.n_linear} matmuls, median of {repeats}\n")
    print(bl.table(["part of a decode step", "ms", "x floor / share of forward"], rows))
    print(f"\nload average {os.getloadavg()[0]:.2f}\n")
    return med


def ab(plain, transformed, tokenizer, b: int, ctx: int, rounds: int, steps: int) -> None:
    """DecodeBatch.next() ms per step, plain vs transformed, alternating order each round."""
    res: dict[str, list[float]] = {"plain": [], "transform": []}
    for r in range(rounds):
        order = [("plain", plain), ("transform", transformed)]
        for name, m in order[::-1] if r % 2 else order:
            res[name].append(statistics.median(batch_generator_step(m, tokenizer, b, ctx, steps)))
    ratios = [t / p for t, p in zip(res["transform"], res["plain"], strict=True)]
    rows = [(i + 1, p, t, q) for i, (p, t, q) in enumerate(zip(*res.values(), ratios, strict=True))]
    print(f"### DecodeBatch.next(), batch {b}: plain vs cpu_fuse.transform, {steps} steps\n")
    print(bl.table(["round", "plain ms", "transform ms", "transform / plain"], rows))
    print(f"\nmedian ratio {statistics.median(ratios):.2f}, load {os.getloadavg()[0]:.2f}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="1,8", help="batch sizes, comma-separated")
    ap.add_argument("--context", type=int, default=128, help="tokens already in the cache")
    ap.add_argument("--repeats", type=int, default=25, help="timed runs per measurement")
    ap.add_argument("--compare", action="store_true", help="also profile the fused model")
    ap.add_argument(
        "--ab", type=int, default=0, help="instead: N rounds of DecodeBatch plain vs fused"
    )
    args = ap.parse_args(argv)
    env = bl.fast_env()
    if env.get("LD_PRELOAD", "") != os.environ.get("LD_PRELOAD", ""):
        # The BLAS must be preloaded before the process starts: run again with it.
        return subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env).returncode
    from loading import cpu_fast_path, model_loader

    print(bl.header("A decode step by operation kind (diagnostic)", sys.argv))
    model, tokenizer = model_loader.load_model(str(model_loader.embedded_model_path()))
    cpu_fast_path.prepare_for_cpu(model, True)
    variants = [("dense float32", model)]
    if args.compare or args.ab:
        from loading import cpu_fuse

        fused, _ = model_loader.load_model(str(model_loader.embedded_model_path()))
        cpu_fast_path.prepare_for_cpu(fused, True)
        cpu_fuse.transform(fused)
        variants.append(("dense float32, cpu_fuse.transform", fused))
    for b in [int(x) for x in args.batch.split(",")]:
        if args.ab:
            ab(model, variants[1][1], tokenizer, b, args.context, args.ab, 12)
            continue
        for label, m in variants:
            profile(m, tokenizer, b, args.context, args.repeats, label)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
