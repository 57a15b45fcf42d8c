"""A request's prompt before the engine: no MLX, no engine state, any thread may run it.

- ``render``: a parsed ``PromptSpec`` -> the rendered chat template and its token ids.
- ``fit``: whether a request fits the loaded model (context, memory budget, images,
  identity) and its ``Tokens`` cap, each decided once.
"""
