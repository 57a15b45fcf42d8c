"""Python values of small 1-D MLX arrays, typed: mlx's stubs type ``tolist()`` as any nesting
of scalars and ``item()`` as any scalar."""

from __future__ import annotations

from typing import cast

import mlx.core as mx


def ints(a: mx.array) -> list[int]:
    """The values of a 1-D integer array."""
    return cast("list[int]", a.tolist())


def floats(a: mx.array) -> list[float]:
    """The values of a 1-D floating-point array."""
    return cast("list[float]", a.tolist())


def scalar(a: mx.array) -> float:
    """The value of a one-element floating-point array."""
    return float(cast("float", a.item()))
