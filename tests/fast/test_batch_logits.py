"""Batch-wide logits processors without a model (`batch.logits.split`) and the penalties
against mlx-lm's own `make_*_penalty` (mlx_lm/sample_utils.py). Whole batches against the
same processors row by row: tests/model/test_batch_processors.py."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.sample_utils import (
    make_frequency_penalty,
    make_presence_penalty,
    make_repetition_penalty,
)

from batch.logits import split
from decoding.sampling import LogitBias, Penalty


def _unknown(tokens: mx.array, logits: mx.array) -> mx.array:
    """A plain callable: the per-row path (it reads the history)."""
    return logits - 0.01 * (tokens.reshape(-1)[-1:] % 7).astype(logits.dtype)


def test_split_keeps_the_order_batch_wide_or_per_row():
    bias, rep = LogitBias({1: 1.0}), Penalty("repetition", 1.1, 4)
    pres, freq = Penalty("presence", 0.5, 4), Penalty("frequency", 0.5, 4)
    assert split([bias, bias, rep, pres, freq]) == ((bias, bias, rep, pres, freq), ())
    assert split([rep, bias]) == ((rep,), (bias,))
    assert split([rep, rep]) == ((rep,), (rep,))
    assert split([_unknown, bias]) == ((), (_unknown, bias))


@pytest.mark.parametrize("kind", ["repetition", "presence", "frequency"])
def test_penalty_is_mlx_lms(kind):
    make = {
        "repetition": make_repetition_penalty,
        "presence": make_presence_penalty,
        "frequency": make_frequency_penalty,
    }[kind]
    tokens = mx.array([4, 9, 4, 4, 17, 9, 3])
    logits = mx.array(np.random.default_rng(1).normal(size=(1, 32)).astype(np.float32))
    want = make(1.4, 5)(tokens, mx.array(logits))
    assert np.array_equal(np.array(Penalty(kind, 1.4, 5)(tokens[None], logits)), np.array(want))
