"""Decoding: turning logits into tokens and tokens into the deltas a client sees.

- ``sampling``: per-request samplers and logits processors (bias, penalties, grammar).
- ``grammar``: llguidance constraints (GBNF, JSON schema) compiled for the tokenizer;
  ``grammar_gate``: when a constraint starts (after the reasoning, at a trigger word);
  ``tool_grammar``: a request's tool calls held to its declared tools.
- ``reasoning_budget``: forcing the end of a think block after N tokens.
- ``ngram_spec``: n-gram (prompt lookup) drafts, their gate, and a solo speculative step.
- ``finish``: how a sequence ends: ``FinishReason`` and the one decision a token makes.
- ``output``: the output pipeline: UTF-8, stop sequences, reasoning/content/tool deltas, logprobs.
- ``tool_calls``: streaming tool-call parsing; ``parsers``: which mlx-lm parser a model uses.
- ``arrays``: small MLX arrays' values, typed.
"""
