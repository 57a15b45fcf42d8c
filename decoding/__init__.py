"""Decoding: turning logits into tokens and tokens into the deltas a client sees.

- ``sampling``: per-request samplers and logits processors (bias, penalties, grammar).
- ``grammar``: llguidance constraints (GBNF, JSON schema) compiled for the tokenizer;
  ``grammar_gate``: when a constraint starts (after the reasoning, at a trigger word);
  ``tool_grammar``: a request's tool calls held to its declared tools.
- ``reasoning_budget``: forcing the end of a think block after N tokens.
- ``ngram_spec``: n-gram (prompt lookup) drafts, their gate, and a solo speculative step.
- ``finish``: how a sequence ends: ``FinishReason`` and the one decision a token makes.
- ``output``: the output pipeline: UTF-8, stop sequences, reasoning/content/tool deltas, logprobs.
- ``text_router``: the output pipeline's state machine, splitting text at markers and stops.
- ``tool_calls``: the ``ToolCall`` value, parsing one tool-call block, streaming its
  arguments; ``tool_formats``: one object per tool-call format (vLLM parser names);
  ``call_formats``: one tool-call grammar per format; ``tool_schema``: calls and schemas
  checked against the declared JSON schemas; ``parsers``: LocalAI's parser hints (vLLM
  tool/reasoning parser names -> tool formats and markers).
- ``reasoning_formats``: one object per vLLM reasoning-parser name.
- ``arrays``: small MLX arrays' values, typed.
"""
