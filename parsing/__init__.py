"""Helpers of the parsing layer (``params.py`` at the root is its entry). Nothing here
imports MLX.

- ``fields``: the tables of every request and load field (read, refused, ignored) and of
  the Metadata keys; docs/FIELDS.md is generated from them.
- ``options``: the table of load options, their reading, and the one on/off reader.
- ``jsonfield``: bounded reading of JSON fields; ``bounds``: the bounds checked on cheap
  figures (lengths, counts) before any expensive work.
- ``constraint``: a request's output constraint (Grammar, JSON schema) and its bounds.
- ``tool_choice``: ``ToolChoice`` as LocalAI sends it.
- ``images`` and ``videos``: a request's media (base64, bounds, hashes, sampled frames).
- ``volatile_spans``: the text removed from every prompt before it is tokenized.
- ``durations``: durations as LocalAI's settings write them; ``paths``: the confined
  prompt-cache directory.
- ``tokens``: token-id sequences (``common_prefix``).
"""
