"""Prompt-cache tiers beside ``prompt_cache.py`` (the in-memory prefix KV cache):

- ``prompt_disk`` + ``prompt_disk_format``: the disk tier (checksummed files, LRU by bytes).
- ``prompt_tiers``: memory and disk as one cache for the scheduler; ``PromptTiers``, the
  interface both the memory tier alone and the two tiers answer.
"""
