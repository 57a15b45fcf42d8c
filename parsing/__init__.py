"""Helpers of the parsing layer (``params.py`` at the root is its entry): bounded reading
of JSON fields (``jsonfield``). Nothing here imports MLX.
"""
