"""A scripted fake model, served by ``inprocess.InProcessServer`` around the real engine.

The fake model replays fixed token ids through mlx-lm's ``BatchGenerator``: the next token
depends only on the position (the KV cache offset), so prompt caching and batching keep
working. Everything else (engine thread, output pipeline, servicer, gRPC on a real port)
is the production code.
"""

from __future__ import annotations

import time

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache


class ScriptedModel(nn.Module):
    """Emits ``script[i]`` as the i-th generated token after a prompt of ``prompt_len`` tokens.

    Logits are (B, L, vocab_size) with one large entry; past the script it emits ``eos``.
    """

    def __init__(self, vocab_size: int, eos: int, step_seconds: float = 0.0) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.eos = eos
        # A real forward pass takes milliseconds with the GIL released; a free-running fake
        # would starve the event loop's thread of the GIL instead.
        self.step_seconds = step_seconds
        self.set_script(0, [])

    def set_script(self, prompt_len: int, tokens: list[int]) -> None:
        self.prompt_len = prompt_len
        self.tokens = mx.array([*tokens, self.eos])

    def make_cache(self) -> list:
        return [KVCache()]

    def __call__(self, inputs: mx.array, cache=None, **kwargs) -> mx.array:
        if self.step_seconds:
            time.sleep(self.step_seconds)  # deliberate: the cost of a forward pass
        batch, length = inputs.shape
        layer = cache[0]
        dummy = mx.zeros((batch, 1, length, 1))
        layer.update_and_fetch(dummy, dummy)
        offset = layer.offset
        offset = mx.array([offset] * batch) if isinstance(offset, int) else offset
        # The logits of the last input predict the token at position `offset`.
        index = mx.clip(offset - self.prompt_len, 0, self.tokens.size - 1)
        token = self.tokens[index]
        hot = (mx.arange(self.vocab_size)[None, :] == token[:, None]).astype(mx.float32) * 50.0
        return mx.broadcast_to(hot[:, None, :], (batch, length, self.vocab_size))
