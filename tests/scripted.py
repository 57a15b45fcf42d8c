"""A scripted fake model and an in-process gRPC server around the real engine.

The fake model replays fixed token ids through mlx-lm's ``BatchGenerator``: the next token
depends only on the position (the KV cache offset), so prompt caching and batching keep
working. Everything else (engine thread, output pipeline, servicer, gRPC on a real port)
is the production code.
"""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

import backend_pb2
import backend_pb2_grpc
import params
from edge.servicer import BackendServicer
from engine.core import Engine


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
            time.sleep(self.step_seconds)
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


class InProcessServer:
    """The real servicer and engine on 127.0.0.1:<free port>, serving ``model``/``tokenizer``."""

    def __init__(self, model, tokenizer, options: list[str] | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.engine = Engine()
        self.engine.start()
        load = params.load_params(backend_pb2.ModelOptions(Model="scripted", Options=options))
        port = asyncio.run_coroutine_threadsafe(
            self._start(model, tokenizer, load), self.loop
        ).result(60)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = backend_pb2_grpc.BackendStub(self.channel)

    async def _start(self, model, tokenizer, load) -> int:
        self.server = grpc.aio.server()
        backend_pb2_grpc.add_BackendServicer_to_server(BackendServicer(self.engine), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        await self.engine.install(model, tokenizer, load)
        return port

    def stop(self) -> None:
        self.channel.close()
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(30)
        self.engine.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
