"""Issue 38 with a real model: rows that wait to join the prefill group (a bound on its
rows, or the step's token budget shared shortest first: batch/decode.py `_pick`) decode
exactly what they decode alone (greedy, mlx-lm's `generate_step`), whether the group
holds one row or all."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
import tiny_models
from mlx_lm.generate import generate_step

from batch.decode import DecodeBatch
from loading import model_loader


@pytest.fixture(scope="module")
def tiny(model_root):
    model, _ = model_loader.load_model(str(tiny_models.build("llama", model_root)))
    return model


def _ids(n: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(100, 40000) for _ in range(n)]


# (step it joins at, prompt, max_tokens): one decodes while the others prefill.
PLAN = [(0, _ids(9, 1), 12), (2, _ids(45, 2), 6), (2, _ids(30, 3), 6), (3, _ids(12, 4), 6)]


@pytest.mark.parametrize(
    ("prefill_rows", "prefill_tokens"), [(1, None), (2, None), (None, None), (None, 8), (None, 24)]
)
def test_rows_waiting_for_the_prefill_group_decode_their_solo_tokens(
    tiny, prefill_rows, prefill_tokens
):
    batch = DecodeBatch(tiny, max_rows=8, prefill_step_size=8)
    batch.prefill_rows, batch.prefill_tokens = prefill_rows, prefill_tokens
    uids: dict[int, int] = {}
    got: dict[int, list[int]] = {}
    for step in range(80):
        for i, (at, prompt, n) in enumerate(PLAN):
            if at == step:
                uids[batch.insert([prompt], max_tokens=n, stops=False)] = i
        _, responses = batch.next()
        for r in responses:
            got.setdefault(uids[r.uid], []).append(r.token)
        if len(got) == len(PLAN) and all(len(got[i]) == PLAN[i][2] for i in got):
            break
    for i, (_, prompt, n) in enumerate(PLAN):
        solo = [int(t) for t, _ in generate_step(mx.array(prompt), tiny, max_tokens=n)]
        assert got[i] == solo, i
