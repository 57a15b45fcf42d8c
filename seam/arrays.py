"""Host reads of small MLX arrays, typed (``mx.array.tolist`` is typed as any nesting)."""

from __future__ import annotations

from typing import Any, cast

import mlx.core as mx

#: mlx-lm private members used here: none.
PRIVATE: tuple = ()


def ints(a: mx.array) -> list[int]:
    """A 1-d integer array's values."""
    return cast(list[int], a.tolist())


def nested(a: mx.array) -> list[Any]:
    """A 2-d (or deeper) array's values, as nested lists."""
    return cast(list[Any], a.tolist())


def floats(a: mx.array) -> list[float]:
    """A 1-d floating array's values."""
    return cast(list[float], a.tolist())


def scalar(a: mx.array) -> int:
    """A one-element integer array's value."""
    return int(cast(int, a.item()))


def real(a: mx.array) -> float:
    """A one-element floating array's value."""
    return float(cast(float, a.item()))


def flat_arrays(tree: Any) -> list[tuple[str, mx.array]]:
    """``mlx.utils.tree_flatten`` of a tree whose leaves are arrays (a model's parameters,
    gradients, an optimizer's state): mlx types the leaves as Any and the result as a list
    or a dict (the dict only when a ``destination`` dict is passed, never here)."""
    from mlx.utils import tree_flatten

    return cast(list[tuple[str, mx.array]], tree_flatten(tree))
