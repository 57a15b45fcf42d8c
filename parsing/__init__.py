"""Helpers of the parsing layer (``params.py`` at the root is its entry): bounded reading
of JSON fields (``jsonfield``), the table of load options and the one on/off reader
(``options``), images (``images``), output constraints (``constraint``), durations
(``durations``), the confined prompt-cache directory (``paths``), token-id sequences
(``tokens``: ``common_prefix``). Nothing here imports MLX.
"""
