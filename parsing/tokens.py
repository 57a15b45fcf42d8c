"""Token-id sequence helpers shared by every layer that compares prompts (the prompt
cache, in-flight prefix sharing, prompt rendering, scoring, the reasoning budget).
Pure Python: no MLX, nothing of ours."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["common_prefix"]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length (tokens) of the longest common prefix of the token sequences ``a`` and ``b``
    (lists or tuples; compared as tuples when their types differ)."""
    if type(a) is not type(b):
        a, b = tuple(a), tuple(b)
    m = min(len(a), len(b))
    if m == 0 or a[0] != b[0]:
        return 0
    if a[:m] == b[:m]:
        return m
    # Binary search on slice equality: O(m log m) in C instead of a Python loop.
    lo, hi = 1, m  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
