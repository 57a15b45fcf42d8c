"""The batch's rotating KV with keep (NKeep: `seam.rotating_kv.BatchKeepRotatingKVCache`)
against solo ``RotatingKVCache(max_size, keep)``s, without a model: keys carry token ids,
so what each query attends to can be compared directly. The same against mlx-lm's solo
``generate_step`` on real models: tests/model/test_batch_kv.py."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from mlx_lm.models.cache import RotatingKVCache

from seam.rotating_kv import BatchKeepRotatingKVCache


def _solo_sees(c: RotatingKVCache, ids: mx.array) -> list[list[float]]:
    """Per query of the update ``ids`` (1, 1, N, 1): the ids the solo cache attends to."""
    n = ids.shape[2]
    mask = c.make_mask(n)
    keys, _ = c.update_and_fetch(ids, ids)
    col = keys[0, 0, :, 0].tolist()
    if mask is None:
        return [sorted(col)] * n
    if isinstance(mask, str):  # "causal", aligned to the end
        return [sorted(col[: len(col) - n + i + 1]) for i in range(n)]
    rows = mask.tolist()
    return [sorted(x for x, seen in zip(col, rows[i], strict=True) if seen) for i in range(n)]


@pytest.mark.parametrize("seed", range(30))
def test_keep_batch_attends_to_what_solo_caches_attend_to(seed):
    """No model: keys carry token ids; for random decode steps and ragged chunks (some
    spread over several calls), rows leaving, joining, all taken out and merged back,
    and trims, every real query of every row sees the same ids through the batch's
    keys and mask as through its own solo ``RotatingKVCache(max_size, keep)``, at the
    same RoPE offset."""
    rnd = random.Random(seed)
    M = rnd.choice([3, 5, 8, 13])
    keeps = [rnd.randrange(M) for _ in range(3)]
    solos = [RotatingKVCache(M, k) for k in keeps]
    batch = BatchKeepRotatingKVCache.merge([RotatingKVCache(M, k) for k in keeps])
    held = [0] * 3  # tokens fed per row
    names = [0, 1, 2]  # id namespace per row
    for _ in range(30):
        B = len(solos)
        if rnd.random() < 0.45:
            lengths, calls = [1] * B, [1]
        else:
            lengths = [rnd.randint(1, 2 * M + 2) for _ in range(B)]
            S = max(lengths)
            cuts = sorted(rnd.sample(range(1, S), min(rnd.randint(0, 2), S - 1)))
            calls = [b - a for a, b in zip([0, *cuts], [*cuts, S], strict=True)]
        S = max(lengths)
        if min(lengths) < S:
            batch.prepare(lengths=lengths, right_padding=[S - n for n in lengths])
        done = 0
        for n in calls:
            real = [max(0, min(length - done, n)) for length in lengths]
            ids = mx.array(
                [
                    [names[b] * 10**5 + held[b] + i for i in range(real[b])] + [-1] * (n - real[b])
                    for b in range(B)
                ],
                dtype=mx.float32,
            )[:, None, :, None]
            offsets = batch.offset.tolist()
            mask = batch.make_mask(n)[:, 0].tolist()
            keys = batch.update_and_fetch(ids, ids)[0][:, 0, :, 0].tolist()
            for b in range(B):
                if real[b]:
                    assert offsets[b] == solos[b].offset
                    want = _solo_sees(solos[b], ids[b : b + 1, :, : real[b]])
                    got = [
                        sorted(x for x, seen in zip(keys[b], mask[b][i], strict=True) if seen)
                        for i in range(real[b])
                    ]
                    assert got == want
                    held[b] += real[b]
            done += n
        batch.finalize()
        event = rnd.random()
        if event < 0.15:  # every row out (extract) and merged back
            batch = BatchKeepRotatingKVCache.merge([batch.extract(b) for b in range(B)])
        elif event < 0.25 and B > 1:  # a row leaves
            gone = rnd.randrange(B)
            rest = [i for i in range(B) if i != gone]
            batch.filter(rest)
            solos, held, names = ([x[i] for i in rest] for x in (solos, held, names))
        elif event < 0.35:  # a row joins
            k = rnd.randrange(M)
            batch.extend(BatchKeepRotatingKVCache.merge([RotatingKVCache(M, k)]))
            solos.append(RotatingKVCache(M, k))
            held.append(0)
            names.append(max(names) + 1)
        elif event < 0.4 and batch.is_trimmable() and min(held) > 2:
            assert batch.trim(2) == 2
            for c in solos:
                c.trim(2)
            held = [h - 2 for h in held]
