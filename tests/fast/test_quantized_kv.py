"""`seam.quantized_kv` quantizes the same float keys and values to the same codes on every
path: however a prompt is chunked, whatever rows share the batch (ragged prefill rolled
left, merge, extend, filter), and when its prefix comes from the prompt cache (extract,
trim, merge, continue). What can still differ, and why (docs/DECODING.md, "Quantized KV and batch
invariance"): the float K/V themselves, in their last bits, because the model's matmuls
round differently for different batch and chunk shapes; one such bit moves a value across
a rounding boundary, and its code by a whole quantization step.

Synthetic keys and values (no model): shaped as the embedded SmolLM2's (3 KV heads of 64).
"""

from __future__ import annotations

import itertools

import mlx.core as mx
import pytest
from mlx_lm.models.cache import QuantizedKVCache

from seam.quantized_kv import BatchQuantizedKVCache

HEADS, DIM, GROUP = 3, 64, 64


def _kv(tokens: int, seed: int) -> tuple[mx.array, mx.array]:
    key = mx.random.key(seed)
    k1, k2 = mx.random.split(key)
    shape = (1, HEADS, tokens, DIM)
    return mx.random.normal(shape, key=k1), mx.random.normal(shape, key=k2)


def _codes(c: QuantizedKVCache) -> list[mx.array]:
    """A row's stored triples (codes, scales, biases of keys, then values), its tokens only."""
    return [x[..., : c.offset, :] for x in (*c.keys, *c.values)]


def _same(a: QuantizedKVCache, b: QuantizedKVCache) -> bool:
    assert a.offset == b.offset
    return all(mx.array_equal(x, y).item() for x, y in zip(_codes(a), _codes(b), strict=True))


def _alone(k: mx.array, v: mx.array, bits: int) -> QuantizedKVCache:
    """mlx-lm's own QuantizedKVCache fed the whole row at once."""
    c = QuantizedKVCache(group_size=GROUP, bits=bits)
    c.update_and_fetch(k, v)
    return c


@pytest.mark.parametrize("bits", [4, 8])
def test_codes_do_not_depend_on_chunking(bits):
    k, v = _kv(40, 1)
    cuts = (0, 1, 8, 21, 22, 40)  # chunks of 1, 7, 13, 1, 18 tokens
    batch = BatchQuantizedKVCache(bits, GROUP, [0])
    for a, b in itertools.pairwise(cuts):
        batch.update_and_fetch(k[:, :, a:b], v[:, :, a:b])
    assert _same(batch.extract(0), _alone(k, v, bits))


@pytest.mark.parametrize("bits", [4, 8])
def test_codes_do_not_depend_on_the_rows_beside(bits):
    """A ragged prefill (right-padded, rolled left by ``finalize``) beside two other rows,
    then a row leaving (``filter``) and one joining (``extend``)."""
    lengths = [12, 40, 25]
    rows = [_kv(n, seed) for seed, n in enumerate(lengths)]
    longest = max(lengths)
    batch = BatchQuantizedKVCache.merge([QuantizedKVCache(GROUP, bits) for _ in lengths])
    batch.prepare(lengths=lengths, right_padding=[longest - n for n in lengths])
    garbage = mx.full((1, HEADS, 1, DIM), 7.0)  # what padding tokens' projections write

    def padded(x: mx.array) -> mx.array:
        pad = longest - x.shape[2]
        return mx.concatenate([x, mx.repeat(garbage, pad, axis=2)], axis=2) if pad else x

    batch.update_and_fetch(
        mx.concatenate([padded(k) for k, _ in rows]), mx.concatenate([padded(v) for _, v in rows])
    )
    batch.finalize()
    for i, (k, v) in enumerate(rows):
        assert _same(batch.extract(i), _alone(k, v, bits)), i
    batch.filter([0, 2])
    joining = BatchQuantizedKVCache.merge([_alone(*_kv(9, 7), bits)])
    batch.extend(joining)
    assert _same(batch.extract(0), _alone(*rows[0], bits))
    assert _same(batch.extract(1), _alone(*rows[2], bits))
    assert _same(batch.extract(2), _alone(*_kv(9, 7), bits))


@pytest.mark.parametrize("bits", [4, 8])
def test_a_prefix_from_the_prompt_cache_equals_the_cold_run(bits):
    """A row taken out (``extract``), trimmed as an exact prompt-cache hit is, merged back
    beside another row and continued holds the codes of a row that never left."""
    k, v = _kv(40, 3)
    cold = _alone(k, v, bits)
    first = BatchQuantizedKVCache(bits, GROUP, [0])
    first.update_and_fetch(k[:, :, :35], v[:, :, :35])
    entry = first.extract(0)
    entry.trim(5)  # the prompt cache keeps 30 of its tokens
    batch = BatchQuantizedKVCache.merge([entry, _alone(*_kv(50, 4), bits)])
    tail = mx.concatenate([k[:, :, 30:], mx.zeros((1, HEADS, 10, DIM))])
    tail_v = mx.concatenate([v[:, :, 30:], mx.zeros((1, HEADS, 10, DIM))])
    batch.update_and_fetch(tail, tail_v)
    assert _same(batch.extract(0), cold)


def test_one_last_bit_of_a_float_moves_a_code_by_a_whole_step():
    """Why float rounding noise of 1e-6 becomes a KV difference of 1/255 of a group's range
    at 8 bits: a value on a rounding boundary goes either way."""
    values = mx.arange(DIM, dtype=mx.float32) * (255 / (DIM - 1))  # range 255: step 1.0
    below, above = values.tolist(), values.tolist()
    below[1], above[1] = 10.5 - 1e-5, 10.5 + 1e-5
    q = [mx.quantize(mx.array([x]), group_size=GROUP, bits=8) for x in (below, above)]
    out = [mx.dequantize(*t, group_size=GROUP, bits=8) for t in q]
    assert abs(above[1] - below[1]) < 1e-4
    assert (out[1][0, 1] - out[0][0, 1]).item() == pytest.approx(1.0, abs=1e-3)
