"""The project's continuous batch: our own decode step over mlx-lm's public model and cache API.

- ``decode``: ``DecodeBatch``, the rows decoded together, one step per engine iteration.
- ``logits``: the rows' logits processors applied batch-wide in a few array operations.
- ``speculation``: per-row drafts checked in one verify pass (``SpeculativeBatch``).
- ``rows``: which batch cache class a row's layers merge into (quantized, keep-rotating).
- ``release``: the one place that gives MLX's cached buffers back (``release_cache``).

The private members of mlx-lm / mlx-vlm it needs are reached through ``seam/``.
"""
