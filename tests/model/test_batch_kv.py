"""Quantized KV (kv_bits) and rotating KV with keep (NKeep) inside the continuous batch
(`batch.decode.DecodeBatch` with `seam.quantized_kv`'s and `seam.rotating_kv`'s batch
layers, `batch.rows`) give the same greedy tokens as mlx-lm's solo ``generate_step``.

Models: the embedded SmolLM2-135M (``smol``: 30 layers, 3 KV heads of 64, GQA) and the
tiny random-weight llama of tests/tiny_models.py (2 layers, 1 KV head of 32, so group
size 32). Solo references: ``generate_step`` with a ``QuantizedKVCache(group, bits)``
prompt cache (quantized from the first token, as the batch is) and with
``RotatingKVCache(max_size, keep)``; prompts plus generation are longer than max_size, so
rows rotate. Batches: the prompt beside two others of different lengths, rows leaving at
different steps (``filter``), rows joining a running batch (``extend``), a ragged prefill
spread over several model calls, several keep values in one batch, and rows taken out
mid-generation (``extract``), stored in the prompt cache, trimmed, written through the
disk tier's format and merged back. What the batch's keep rows attend to, without a
model: tests/fast/test_rotating_kv.py.
"""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
import tiny_models
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import (
    BatchKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    make_prompt_cache,
)
from mlx_lm.utils import _get_classes

from batch.decode import DecodeBatch
from batch.rows import merge_layer, row_cache
from caches import prompt_disk_format as fmt
from loading import model_loader
from prompt_cache import PromptCache
from seam.quantized_kv import BatchQuantizedKVCache
from seam.rotating_kv import BatchKeepRotatingKVCache

MAX, KEEP = 48, 4  # tiny llama's rotating cache
GROUP = 32  # tiny llama's head dim


def _ids(n: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(100, 40000) for _ in range(n)]


TINY_PROMPTS = [_ids(30, 1), _ids(61, 2), _ids(45, 3)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tiny_models.build("llama", tmp_path_factory.mktemp("tiny_models"))
    model, _ = model_loader.load_model(str(path))
    return model


def solo(model, prompt, n, kv, step=2048) -> list[int]:
    """mlx-lm's own greedy decoding of ``n`` tokens with the prompt cache ``kv``."""
    steps = generate_step(
        mx.array(prompt), model, max_tokens=n, prompt_cache=kv, prefill_step_size=step
    )
    return [int(t) for t, _ in steps]


class Batch:
    """A DecodeBatch with greedy rows; ``out[uid]``: the tokens each row yielded."""

    def __init__(self, model, step: int = 2048) -> None:
        self.gen = DecodeBatch(model, prefill_step_size=step, own_layers=True)
        self.out: dict[int, list[int]] = {}
        self.kv_widths: list[int] = []  # tail + sink columns of layer 0 while decoding

    def add(self, prompt, n, kv, tokens=None) -> int:
        uid = self.gen.insert([prompt], max_tokens=n, cache=kv, tokens=tokens or [])
        self.out[uid] = []
        return uid

    def step(self) -> bool:
        """One generator step; False when nothing is left to do (a step may return
        nothing while rows run: the one that reads first tokens already returned)."""
        prompts, responses = self.gen.next()
        for r in responses:
            self.out[r.uid].append(r.token)
        layers = self.gen._cache  # the decoding rows' batch layers
        if layers and isinstance(layers[0], BatchKeepRotatingKVCache):
            self.kv_widths.append(layers[0].keys.shape[2])
        return bool(prompts or responses or len(self.gen))

    def run(self) -> dict[int, list[int]]:
        while self.step():
            pass
        self.gen.close()
        return self.out


def batch_vs_solo(model, prompts, lengths, row, reference, step=2048) -> tuple[list, list]:
    """(solo tokens, batch tokens) per prompt: row(i) is prompt i's empty batch row,
    reference(i) its solo prompt cache; prompt i decodes lengths[i] tokens."""
    refs = [
        solo(model, p, n, reference(i), step)
        for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
    ]
    b = Batch(model, step)
    uids = [b.add(p, n, row(i)) for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))]
    out = b.run()
    return refs, [out[u] for u in uids]


# --------------------------------------------------------------------------- quantized
@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_batch_equals_solo_tiny(tiny, bits):
    n = len(tiny.layers)
    lengths = [40, 25, 40]  # the second row leaves first: filter keeps the others exact
    refs, got = batch_vs_solo(
        tiny,
        TINY_PROMPTS,
        lengths,
        lambda i: row_cache(tiny, kv_bits=bits, kv_group_size=GROUP),
        lambda i: [QuantizedKVCache(GROUP, bits) for _ in range(n)],
    )
    assert got == refs
    if bits == 4:  # the quantization is real: unquantized decoding differs
        plain = [
            solo(tiny, p, k, make_prompt_cache(tiny))
            for p, k in zip(TINY_PROMPTS, lengths, strict=True)
        ]
        assert plain != refs


def test_quantized_batch_equals_solo_smollm2(smol):
    model, tok = smol
    n = len(model.layers)
    prompts = [
        tok.encode("The capital of France is Paris, and the capital of Germany is"),
        tok.encode("Write a short poem about the sea and the wind over the grey harbour."),
        tok.encode("Once upon a time, in a land far away, there lived a"),
    ]
    refs, got = batch_vs_solo(
        model,
        prompts,
        [6, 4, 6],
        lambda i: row_cache(model, kv_bits=4),
        lambda i: [QuantizedKVCache(64, 4) for _ in range(n)],
    )
    assert got == refs


# --------------------------------------------------------------------------- rotating + keep
@pytest.mark.parametrize("step", [2048, 16])  # 16: prefill chunks rotate the cache too
def test_keep_batch_equals_solo_tiny(tiny, step):
    n = len(tiny.layers)
    lengths = [40, 25, 40]
    refs, got = batch_vs_solo(
        tiny,
        TINY_PROMPTS,
        lengths,
        lambda i: row_cache(tiny, max_kv_size=MAX, keep=KEEP),
        lambda i: [RotatingKVCache(MAX, KEEP) for _ in range(n)],
        step,
    )
    assert got == refs
    if step == 16:
        return
    # Keep changes the tokens: solo decoding that keeps nothing, or everything, differs.
    none_kept = [
        solo(tiny, p, k, [RotatingKVCache(MAX, 0) for _ in range(n)], step)
        for p, k in zip(TINY_PROMPTS, lengths, strict=True)
    ]
    unbounded = [
        solo(tiny, p, k, make_prompt_cache(tiny), step)
        for p, k in zip(TINY_PROMPTS, lengths, strict=True)
    ]
    assert none_kept != refs and unbounded != refs


def test_keep_batch_equals_solo_smollm2(smol):
    model, tok = smol
    n = len(model.layers)
    prompts = [
        tok.encode("The capital of France is Paris, and the capital of Germany is Berlin. The"),
        tok.encode("Write a short poem about the sea and the wind over the grey harbour."),
        tok.encode("Once upon a time, in a land far away, there lived a king who"),
    ]
    assert all(len(p) + 4 > 16 for p in prompts)  # every row rotates
    refs, got = batch_vs_solo(
        model,
        prompts,
        [6, 4, 6],
        lambda i: row_cache(model, max_kv_size=16, keep=4),
        lambda i: [RotatingKVCache(16, 4) for _ in range(n)],
    )
    assert got == refs


@pytest.mark.parametrize("kind", ["quantized", "keep"])
def test_ragged_prefill_over_several_model_calls(tiny, kind):
    """The batch's prompt chunk (16) is smaller than what the generator cuts once raised
    (64, as the engine's step budget does): right-padded rows span several model calls
    before finalize."""
    n = len(tiny.layers)
    if kind == "quantized":
        row = lambda: row_cache(tiny, kv_bits=4, kv_group_size=GROUP)  # noqa: E731
        ref_kv = lambda: [QuantizedKVCache(GROUP, 4) for _ in range(n)]  # noqa: E731
    else:
        row = lambda: row_cache(tiny, max_kv_size=MAX, keep=KEEP)  # noqa: E731
        ref_kv = lambda: [RotatingKVCache(MAX, KEEP) for _ in range(n)]  # noqa: E731
    prompts = [_ids(70, 4), _ids(23, 5), _ids(101, 6)]
    refs = [solo(tiny, p, 30, ref_kv(), 16) for p in prompts]
    b = Batch(tiny, step=16)
    uids = [b.add(p, 30, row()) for p in prompts]
    b.step()
    b.gen.prefill_step_size = 64
    out = b.run()
    assert [out[u] for u in uids] == refs


def test_keep_rows_joining_with_their_own_keep(tiny):
    """Keep 4, 0 and 7 in one batch; the second and third rows join a decoding batch."""
    n = len(tiny.layers)
    keeps = [4, 0, 7]
    prompts = [TINY_PROMPTS[1], TINY_PROMPTS[0], TINY_PROMPTS[2]]
    refs = [
        solo(tiny, p, 40, [RotatingKVCache(MAX, k) for _ in range(n)])
        for p, k in zip(prompts, keeps, strict=True)
    ]
    b = Batch(tiny)
    uids = [b.add(prompts[0], 40, row_cache(tiny, max_kv_size=MAX, keep=keeps[0]))]
    for _ in range(5):
        b.step()
    uids.append(b.add(prompts[1], 40, [RotatingKVCache(MAX, 0) for _ in range(n)]))
    for _ in range(25):
        b.step()
    uids.append(b.add(prompts[2], 40, row_cache(tiny, max_kv_size=MAX, keep=keeps[2])))
    out = b.run()
    assert [out[u] for u in uids] == refs
    # Bounded: sink (7) + max_size - min(keep) (48) columns per layer while decoding.
    assert max(b.kv_widths) <= 7 + MAX


# --------------------------------------------------------------------------- round trip
def _through_disk(kv: list, tokens: list[int]) -> list:
    """``kv`` written and read back in the disk tier's format (prompt_disk's calls)."""
    fingerprint = "test:batch_kv"
    layers = [fmt.compact(c) for c in kv]
    payload, _ = fmt.serialise(layers, fingerprint, tokens, fmt.FORMAT_VERSION)
    name = fmt.file_name(fmt.entry_key(fingerprint, tuple(tokens)), payload)
    return fmt.parse_entry(bytes(payload), name, fingerprint, tuple(tokens), fmt.FORMAT_VERSION)


@pytest.mark.parametrize("kind", ["quantized", "keep"])
def test_extract_store_trim_disk_merge_continues_identically(tiny, kind):
    """Mid-generation, two rows leave the batch (extract); each goes through the prompt
    cache (the long one as a shorter-prefix hit, the short one trimmed by two tokens)
    and the disk tier's format, then joins the still running batch again and goes on
    exactly as solo decoding; the third row never leaves and is not disturbed."""
    n = len(tiny.layers)
    if kind == "quantized":
        cls = QuantizedKVCache
        row = lambda: row_cache(tiny, kv_bits=4, kv_group_size=GROUP)  # noqa: E731
        ref_kv = lambda: [QuantizedKVCache(GROUP, 4) for _ in range(n)]  # noqa: E731
    else:
        cls = RotatingKVCache
        row = lambda: row_cache(tiny, max_kv_size=MAX, keep=KEEP)  # noqa: E731
        ref_kv = lambda: [RotatingKVCache(MAX, KEEP) for _ in range(n)]  # noqa: E731
    prompts = [TINY_PROMPTS[1], _ids(23, 7), TINY_PROMPTS[2]]  # 61 + 12 > 48 > 23 + 12
    N, k = 40, 12
    refs = [solo(tiny, p, N, ref_kv()) for p in prompts]
    b = Batch(tiny)
    uids = [b.add(p, N, row()) for p in prompts]
    while len(b.out[uids[0]]) < k:
        b.step()
    assert len(b.out[uids[1]]) == k
    taken = b.gen.remove(uids[:2], return_prompt_caches=True)
    cache = PromptCache(max_entries=4)
    resumed = []
    for i, uid in enumerate(uids[:2]):
        kv, tokens = taken[uid]
        assert tokens == prompts[i] + refs[i][:k]
        assert all(type(c) is cls and c.offset == len(tokens) for c in kv)
        cache.insert("m", tokens, kv)
        if i == 0:  # a shorter-prefix hit: the stored row as it is
            hit = cache.fetch("m", [*tokens, refs[i][k]])
            assert (hit.kind, hit.cached_tokens) == ("shorter", len(tokens))
            expected = refs[i][k + 1 :]
        else:  # trimmed by two tokens in the prompt cache
            hit = cache.fetch("m", tokens[:-2])
            assert (hit.kind, hit.cached_tokens) == ("trimmed", len(tokens) - 3)
            expected = refs[i][k - 2 :]
        if kind == "keep":  # the long row has rotated: only a shorter-prefix hit serves it
            assert hit.kv[0].is_trimmable() == (i == 1)
        held = tokens[: hit.cached_tokens]
        kv = _through_disk(hit.kv, held)
        assert all(type(c) is cls and c.offset == len(held) for c in kv)
        resumed.append((b.add(hit.rest, len(expected), kv, held), expected))
    out = b.run()
    assert out[uids[2]] == refs[2]
    for uid, expected in resumed:
        assert out[uid] == expected


def test_rows_made_outside_the_batch_merge(tiny):
    """A prompt prefilled by the model alone into mlx-lm's own QuantizedKVCache or
    RotatingKVCache(keep) continues in a batch (beside a row of the same kind) exactly
    as generate_step decodes it."""
    n = len(tiny.layers)
    prompt = TINY_PROMPTS[1]
    for make, companion in [
        (
            lambda: [QuantizedKVCache(GROUP, 8) for _ in range(n)],
            lambda: row_cache(tiny, kv_bits=8, kv_group_size=GROUP),
        ),
        (
            lambda: [RotatingKVCache(MAX, KEEP) for _ in range(n)],
            lambda: row_cache(tiny, max_kv_size=MAX, keep=KEEP),
        ),
    ]:
        ref = solo(tiny, prompt, 20, make())
        kv = make()
        tiny(mx.array([prompt[:-1]]), cache=kv)  # generate_step's prefill, one chunk
        b = Batch(tiny)
        b.add(TINY_PROMPTS[0], 20, companion())
        uid = b.add(prompt[-1:], 20, kv, prompt[:-1])
        assert b.run()[uid] == ref


# --------------------------------------------------------------------------- bytes, API
def test_nbytes_of_quantized_rows_and_batches(tiny):
    n = len(tiny.layers)
    prompts = TINY_PROMPTS
    rows = {}
    for bits in (None, 4, 8):
        per_prompt = []
        for p in prompts:
            kv = (
                [KVCache() for _ in range(n)]
                if bits is None
                else [QuantizedKVCache(GROUP, bits) for _ in range(n)]
            )
            tiny(mx.array([p]), cache=kv)
            per_prompt.append(kv)
        rows[bits] = per_prompt
    merged = {
        bits: sum(
            merge_layer([kv[j][layer] for j in range(3)], own=True).nbytes for layer in range(n)
        )
        for bits, kv in rows.items()
    }
    assert isinstance(merge_layer([r[0] for r in rows[4]], own=True), BatchQuantizedKVCache)
    assert isinstance(merge_layer([r[0] for r in rows[None]], own=True), BatchKVCache)
    # Per token, head and K or V, float32: 32 dims * 4 B = 128 B unquantized; 32 * bits / 8
    # B of codes plus one group's float32 scale and bias (8 B) quantized.
    cells = n * 2 * 3 * 1 * max(len(p) for p in prompts)  # layers, K/V, rows, heads, width
    assert merged == {None: cells * 128, 4: cells * (16 + 8), 8: cells * (32 + 8)}
    assert merged[4] < merged[8] < merged[None]
    # An empty row counts 0 bytes (the batch sums its waiting rows).
    gen = DecodeBatch(tiny, own_layers=True)
    gen.insert([prompts[0]], max_tokens=2, cache=row_cache(tiny, kv_bits=4, kv_group_size=GROUP))
    assert gen.nbytes == 0
    gen.next()  # prefilled: now it counts
    assert gen.nbytes > 0
    gen.close()


def _model_of(family: str):
    config = tiny_models.CONFIGS[family]
    model_cls, args_cls = _get_classes(config)
    return model_cls(args_cls.from_dict(config))


def test_row_cache_choices_and_refusals(tiny):
    n = len(tiny.layers)
    plain = row_cache(tiny)
    assert [type(c) for c in plain] == [type(c) for c in make_prompt_cache(tiny)]
    assert [type(c) for c in row_cache(tiny, max_kv_size=MAX)] == [KVCache] * n
    q = row_cache(tiny, kv_bits=4, kv_group_size=GROUP)
    assert [(type(c), c.bits, c.group_size) for c in q] == [(QuantizedKVCache, 4, GROUP)] * n
    r = row_cache(tiny, max_kv_size=MAX, keep=KEEP)
    assert [(type(c), c.max_size, c.keep) for c in r] == [(RotatingKVCache, MAX, KEEP)] * n
    assert isinstance(merge_layer([q[0], q[0]], own=True), BatchQuantizedKVCache)
    assert isinstance(merge_layer([r[0], r[0]], own=True), BatchKeepRotatingKVCache)
    for kwargs, words in [
        ({"kv_bits": 7}, "kv_bits must be one of"),
        ({"kv_bits": 4, "kv_group_size": 16}, "kv_group_size must be one of"),
        ({"kv_bits": 4, "max_kv_size": MAX}, "no quantized rotating"),
        ({"max_kv_size": MAX, "keep": MAX}, "must be smaller than max_kv_size"),
        ({"max_kv_size": MAX, "keep": -1}, "keep must be >= 0"),
    ]:
        with pytest.raises(ValueError, match=words):
            row_cache(tiny, **kwargs)
    for family, layer in [
        ("gemma3_text", "RotatingKVCache"),
        ("gpt_oss", "RotatingKVCache"),
        ("mamba2", "ArraysCache"),
        ("lfm2", "ArraysCache"),
    ]:
        other = _model_of(family)
        for kwargs in ({"kv_bits": 4}, {"max_kv_size": MAX, "keep": KEEP}):
            with pytest.raises(ValueError, match=layer):
                row_cache(other, **kwargs)
        assert row_cache(other)  # plain rows: what the batch makes itself


def test_disk_entry_of_a_quantized_row_holds_only_its_tokens(tiny):
    """compact() cuts a quantized row's step-padded buffer to its tokens."""
    kv = [QuantizedKVCache(GROUP, 4) for _ in range(len(tiny.layers))]
    tiny(mx.array([TINY_PROMPTS[0]]), cache=kv)
    assert kv[0].keys[0].shape[2] == 256  # mlx-lm's growth step
    small = fmt.compact(kv[0])
    assert small.keys[0].shape[2] == small.offset == len(TINY_PROMPTS[0])
    back = _through_disk(kv, TINY_PROMPTS[0])
    assert type(back[0]) is QuantizedKVCache and back[0].keys[0].shape[2] == 30
