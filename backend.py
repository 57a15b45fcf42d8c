#!/usr/bin/env python3
"""LocalAI MLX backend: the gRPC servicer and ``serve()``.

Each RPC is a short adapter: protobuf in, a call on the ``Engine`` (which owns the model
and the MLX thread), protobuf out. Predict and PredictStream share one path
(``_generate``); Predict joins the same events that PredictStream sends. Errors from the
engine carry the name of their gRPC status code (``errors.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

import backend_pb2
import backend_pb2_grpc
import model_loader
import params
from engine import Engine, Event
from errors import BackendError

logger = logging.getLogger("localai.mlx")

MAX_MESSAGE_BYTES = 50 * 1024 * 1024  # as the original backend: 50 MB each way
HEALTH_SERVICE = "backend.Backend"


class BackendServicer(backend_pb2_grpc.BackendServicer):
    """The LocalAI ``backend.Backend`` service over one ``Engine``."""

    def __init__(self, engine: Engine, health_servicer: health.aio.HealthServicer | None = None):
        self.engine = engine
        self.health = health_servicer

    async def _set_health(self) -> None:
        if self.health is not None:
            status = (
                health_pb2.HealthCheckResponse.SERVING
                if self.engine.loaded and self.engine.alive
                else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            await self.health.set(HEALTH_SERVICE, status)
            await self.health.set("", status)

    async def Health(self, request, context):
        return backend_pb2.Reply(message=b"OK")

    async def LoadModel(self, request, context):
        try:
            load = params.load_params(request)
            await self.engine.load(load)
        except (ValueError, model_loader.ModelLoadError, BackendError) as exc:
            logger.error("LoadModel failed: %s", exc)
            await self._set_health()
            return backend_pb2.Result(success=False, message=f"failed to load model: {exc}")
        except Exception as exc:  # an unexpected loader failure must still answer
            logger.exception("LoadModel failed")
            await self._set_health()
            return backend_pb2.Result(success=False, message=f"failed to load model: {exc!r}")
        await self._set_health()
        return backend_pb2.Result(success=True, message="Model loaded successfully")

    async def Free(self, request, context):
        await self.engine.free()
        await self._set_health()
        return backend_pb2.Result(success=True, message="Model freed")

    async def Predict(self, request, context):
        acc = Accumulator()
        async for event in self._generate(request, context):
            acc.add(event)
        return acc.final_reply()

    async def PredictStream(self, request, context):
        acc = Accumulator()
        async for event in self._generate(request, context):
            acc.add(event)
            if event.delta or event.final:
                yield acc.stream_reply(event)

    async def _generate(self, request, context) -> AsyncIterator[Event]:
        """Submit one request and yield its events; cancels the job if the caller leaves."""
        try:
            gen = params.generation_params(request, self.engine.load_params)
            job = self.engine.submit(request, gen)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except BackendError as exc:
            await context.abort(getattr(grpc.StatusCode, exc.status), str(exc))
        try:
            async for event in job.events():
                if event.error is not None:
                    await context.abort(
                        getattr(grpc.StatusCode, event.error.status), str(event.error)
                    )
                yield event
        finally:
            job.cancel()  # no-op when finished; frees the batch slot when the client is gone

    async def Embedding(self, request, context):
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "Embedding is not implemented by the MLX backend yet; use an embeddings backend",
        )

    async def TokenizeString(self, request, context):
        tokens = await self._engine_call(context, self.engine.tokenize, request.Prompt)
        return backend_pb2.TokenizationResponse(length=len(tokens), tokens=tokens)

    async def Detokenize(self, request, context):
        text = await self._engine_call(context, self.engine.detokenize, list(request.tokens))
        return backend_pb2.DetokenizeResponse(content=text)

    async def Status(self, request, context):
        snap = self.engine.status()
        state = getattr(backend_pb2.StatusResponse, snap.state)
        # Request counts ride in the breakdown map (the proto has no other place for them).
        breakdown = {
            **snap.memory,
            "requests_running": snap.running,
            "requests_waiting": snap.waiting,
        }
        memory = backend_pb2.MemoryUsageData(
            total=snap.memory.get("mlx_active", 0), breakdown=breakdown
        )
        return backend_pb2.StatusResponse(state=state, memory=memory)

    async def ModelMetadata(self, request, context):
        m = await self._engine_call(context, self.engine.metadata)
        return backend_pb2.ModelMetadataResponse(
            supports_thinking=m.supports_thinking,
            rendered_template=m.rendered_template,
            tool_format=backend_pb2.ToolFormatMarkers(
                format_type=m.tool_format,
                section_start=m.tool_call_start,
                section_end=m.tool_call_end,
                reasoning_start=m.think_start,
                reasoning_end=m.think_end,
            ),
        )

    async def GetMetrics(self, request, context):
        m = self.engine.last_metrics
        return backend_pb2.MetricsResponse(
            slot_id=0,
            # No llama.cpp slot prompt here: the field carries engine facts as JSON instead.
            prompt_json_for_slot=json.dumps(self.engine.info()),
            tokens_per_second=m.tokens_per_second,
            tokens_generated=m.tokens_generated,
            prompt_tokens_processed=m.prompt_tokens_processed,
        )

    async def _engine_call(self, context, fn, *args):
        try:
            return await fn(*args)
        except BackendError as exc:
            await context.abort(getattr(grpc.StatusCode, exc.status), str(exc))


class Accumulator:
    """Joins a request's events; builds Predict's reply and each streamed reply.

    Usage and timings ride on every streamed reply (LocalAI overwrites usage per chunk);
    the final streamed reply also carries the whole logprobs list (LocalAI keeps the last).
    """

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: list = []
        self.logprobs: list[dict] = []
        self.last: Event | None = None

    def add(self, event: Event) -> None:
        d = event.delta
        self.content.append(d.content)
        self.reasoning.append(d.reasoning)
        self.tool_calls.extend(d.tool_calls)
        self.logprobs.extend(d.logprobs)
        self.last = event

    def _usage(self, event: Event) -> dict:
        return dict(
            tokens=event.tokens,
            prompt_tokens=event.prompt_tokens,
            timing_prompt_processing=event.prompt_ms,
            timing_token_generation=event.generation_ms,
        )

    def stream_reply(self, event: Event) -> backend_pb2.Reply:
        d = event.delta
        entries = self.logprobs if event.final else list(d.logprobs)
        return backend_pb2.Reply(
            message=d.content.encode("utf-8"),
            chat_deltas=[_chat_delta(d.content, d.reasoning, d.tool_calls)] if d else [],
            logprobs=_logprobs_json(entries),
            **self._usage(event),
        )

    def final_reply(self) -> backend_pb2.Reply:
        content, reasoning = "".join(self.content), "".join(self.reasoning)
        return backend_pb2.Reply(
            message=content.encode("utf-8"),
            chat_deltas=[_chat_delta(content, reasoning, self.tool_calls)],
            logprobs=_logprobs_json(self.logprobs),
            **(self._usage(self.last) if self.last else {}),
        )


def _chat_delta(content: str, reasoning: str, tool_calls) -> backend_pb2.ChatDelta:
    return backend_pb2.ChatDelta(
        content=content,
        reasoning_content=reasoning,
        tool_calls=[
            backend_pb2.ToolCallDelta(index=t.index, id=t.id, name=t.name, arguments=t.arguments)
            for t in tool_calls
        ],
    )


def _logprobs_json(entries: list[dict]) -> bytes:
    return json.dumps({"content": entries}).encode("utf-8") if entries else b""


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires ``authorization: Bearer <token>`` on every call (constant-time compare).

    The standard ``grpc.health.v1.Health`` service stays open so that load balancers and
    probes that cannot send credentials still see liveness; it reveals nothing else.
    """

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation, details):
        if details.method.startswith("/grpc.health.v1.Health/"):
            return await continuation(details)
        supplied = dict(details.invocation_metadata or ()).get("authorization", "")
        if isinstance(supplied, str):
            supplied = supplied.encode("utf-8")
        if hmac.compare_digest(supplied, self._expected):
            return await continuation(details)
        return _deny(await continuation(details))


def _deny(handler):
    async def unary(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    async def stream(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        yield  # pragma: no cover  (makes this an async generator)

    if handler is None:
        return None
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            stream, handler.request_deserializer, handler.response_serializer
        )
    return grpc.unary_unary_rpc_method_handler(
        unary, handler.request_deserializer, handler.response_serializer
    )


async def serve(address: str, model: str | None = None, grace: float = 5.0) -> None:
    """Serve on ``address`` until SIGTERM/SIGINT; optionally preload ``model``.

    On a signal: stop accepting calls, let in-flight calls finish for ``grace`` seconds,
    cancel the rest, free MLX memory, return.
    """
    engine = Engine()
    engine.start()
    interceptors = []
    token = os.environ.get("LOCALAI_GRPC_AUTH_TOKEN", "")
    if token:
        interceptors.append(AuthInterceptor(token))
    # PYTHON_GRPC_MAX_WORKERS sizes the original's thread pool; grpc.aio needs none.
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ],
    )
    health_servicer = health.aio.HealthServicer()
    servicer = BackendServicer(engine, health_servicer)
    backend_pb2_grpc.add_BackendServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (
        backend_pb2.DESCRIPTOR.services_by_name["Backend"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    )
    reflection.enable_server_reflection(names, server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise SystemExit(f"cannot listen on {address}")
    await servicer._set_health()
    await server.start()
    logger.info("serving on %s (pid %d)", address.rsplit(":", 1)[0] + f":{port}", os.getpid())

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    if model:
        result = await servicer.LoadModel(backend_pb2.ModelOptions(Model=model), None)
        if not result.success:
            logger.error("%s", result.message)
        else:
            logger.info("preloaded %s", model)

    await stop.wait()
    logger.info("stopping: %.1fs grace for in-flight requests", grace)
    await health_servicer.enter_graceful_shutdown()
    await server.stop(grace)
    await loop.run_in_executor(None, engine.stop)
    logger.info("stopped")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="LocalAI MLX backend (gRPC)")
    parser.add_argument("--addr", default="localhost:50051", help="HOST:PORT to listen on")
    parser.add_argument(
        "--model",
        default=None,
        help="model to preload: a GGUF file, an MLX model directory, a cached HF repo id, "
        "or 'embedded' for the bundled SmolLM2-135M-Instruct",
    )
    parser.add_argument("--grace", type=float, default=5.0, help="shutdown grace period, seconds")
    parser.add_argument(
        "--log-level", default=os.environ.get("LOCALAI_LOG_LEVEL", "INFO"), help="logging level"
    )
    args, _unknown = parser.parse_known_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    model = args.model
    if model == "embedded":
        model = str(model_loader.embedded_model_path())
    asyncio.run(serve(args.addr, model, args.grace))


if __name__ == "__main__":
    main()
