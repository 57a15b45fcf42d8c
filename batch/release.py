"""Giving MLX's cached buffers back: the one place that calls ``mx.clear_cache``.

MLX keeps freed buffers for reuse; clearing that cache while work is still in flight
(a decode step queued with ``async_eval``) is the pattern behind the Metal kernel panics
oMLX reports (its issues #300 and #435; it now synchronizes first and never clears in the
step a sequence completes). Here every clear waits for the stream's queued work first;
the batch defers its periodic clear past a step in which a sequence finished
(`batch.decode.DecodeBatch`).

mlx-lm's own generators (`generate_step`, used by the solo runner for the few requests
the batch cannot hold) still clear every 256 tokens with the next step queued: their
code, not called through here.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

#: mlx-lm private members used here: none.
PRIVATE: tuple = ()


def release_cache(stream: Any = None) -> None:
    """Wait for the work queued on ``stream`` (an ``mx.Stream``, or mlx-lm's thread-local
    ``generation_stream``; None: every stream), then free MLX's cached buffers."""
    if stream is None:
        mx.synchronize()
    else:
        mx.synchronize(stream)
    mx.clear_cache()
