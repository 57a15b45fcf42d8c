"""The real servicer over real gRPC on 127.0.0.1:<free port>, inside the test process.

``InProcessServer()`` serves a real ``Engine`` (started here) that gets its models by
LoadModel; with ``model`` and ``tokenizer`` (e.g. ``scripted.ScriptedModel``) those are
installed as the served model first; with ``engine=`` a fake engine is served, to test
the servicer alone. The event loop runs in a thread of its own (``loop``).
"""

from __future__ import annotations

import asyncio
import threading

import grpc

import backend_pb2
import backend_pb2_grpc
import params
from edge.servicer import BackendServicer


class InProcessServer:
    """The real servicer around ``engine`` (default: a real, started ``Engine``)."""

    def __init__(
        self, model=None, tokenizer=None, options: list[str] | None = None, *, engine=None
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._owns_engine = engine is None
        if engine is None:
            from engine.core import Engine

            engine = Engine()
            engine.start()
        self.engine = engine
        install = None
        if model is not None:
            load = params.load_params(backend_pb2.ModelOptions(Model="scripted", Options=options))
            install = (model, tokenizer, load)
        port = asyncio.run_coroutine_threadsafe(self._start(install), self.loop).result(60)
        self.address = f"127.0.0.1:{port}"  # for a channel with options of its own
        self.channel = grpc.insecure_channel(self.address)
        self.stub = backend_pb2_grpc.BackendStub(self.channel)

    async def _start(self, install) -> int:
        self.server = grpc.aio.server()
        backend_pb2_grpc.add_BackendServicer_to_server(BackendServicer(self.engine), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        if install is not None:
            await self.engine.install(*install)
        return port

    def stop(self) -> None:
        self.channel.close()
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(30)
        if self._owns_engine:
            self.engine.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
