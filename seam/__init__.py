"""The one seam to mlx-lm and mlx-vlm: every use of their private members lives in this
package (see tests/fast/test_seam_contract.py), and it imports nothing of ours.

- ``contract``: the supported versions and every private member the backend needs (each
  module's ``PRIVATE`` lists its own, with a reason); checked at start-up.
- ``tokenizer``: what mlx-lm's ``TokenizerWrapper`` and streaming detokenizers lack.
- ``kv``: the one read of mlx-lm's single-sequence KV caches their public API lacks.
- ``holes``: per-row reject for mlx-lm's ``BatchKVCache`` (a speculative step's rejected
  drafts).
- ``quantized_kv``: ``BatchQuantizedKVCache``, the batch form of mlx-lm's
  ``QuantizedKVCache``.
- ``rotating_kv`` and ``keep_layout``: ``BatchKeepRotatingKVCache``, mlx-lm's rotating
  cache with keep (NKeep), batched, and its storage and attention.
- ``vision``: mlx-vlm's processors (the one module global of theirs that we replace).
- ``arrays``: host reads of small MLX arrays, typed.
"""
