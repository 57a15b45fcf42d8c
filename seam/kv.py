"""mlx-lm's single-sequence KV caches: the one read their public API lacks."""

from __future__ import annotations

from typing import Any

PRIVATE = (
    (
        "mlx_lm.models.cache",
        "RotatingKVCache",
        "_idx",
        "the rotating buffer's write position; no public accessor (`offset` counts every "
        "token seen, and `state`/`meta_state` differ between mlx-lm versions)",
    ),
)


def rotating_write_position(layer: Any) -> int:
    """Where a ``RotatingKVCache`` writes next: equal to ``offset`` until it wraps around."""
    return int(layer._idx)
