"""Distributed mode: one model over a group of processes (``mlx.launch`` or LocalAI's
worker protocol), driven by rank 0 through the engine's group hooks."""
