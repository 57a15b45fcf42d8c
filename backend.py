#!/usr/bin/env python3
"""LocalAI MLX backend: the gRPC servicer and ``serve()``.

Each RPC is a short adapter: protobuf in, a call on the ``Engine`` (which owns the model
and the MLX thread), protobuf out. Predict and PredictStream share one path
(``_generate``); Predict joins the same events that PredictStream sends. Errors from the
engine carry the name of their gRPC status code (``errors.py``).
"""

from __future__ import annotations

if __name__ == "__main__":  # before anything loads MLX: restart with the fast BLAS preloaded
    import cpu_fast_path

    cpu_fast_path.ensure_preloaded()

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

import backend_pb2
import backend_pb2_grpc
import model_loader
import ops
import params
from engine import Engine, Event
from errors import BackendError

if TYPE_CHECKING:  # distributed imports MLX; backend.py only names its type
    from distributed import Coordinator

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
        return backend_pb2.Result(success=True, message="MLX model loaded successfully")

    async def Free(self, request, context):
        await self.engine.free()
        await self._set_health()
        return backend_pb2.Result(success=True, message="Model freed")

    async def Predict(self, request, context):
        acc = Accumulator()
        # aclosing: a caller that leaves cancels the job now, not when the GC runs.
        async with contextlib.aclosing(self._generate(request, context)) as events:
            async for event in events:
                acc.add(event)
        return acc.final_reply()

    async def PredictStream(self, request, context):
        acc = Accumulator()
        async with contextlib.aclosing(self._generate(request, context)) as events:
            async for event in events:
                acc.add(event)
                if event.delta or event.final:
                    yield acc.stream_reply(event)

    async def _generate(self, request, context) -> AsyncIterator[Event]:
        """Submit one request and yield its events; cancels the job if the caller leaves."""
        try:
            self.engine.check_identity(request.ModelIdentity)  # first, as LocalAI does
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
        # LocalAI sends the text in Embeddings (Prompt as a fallback), or token ids.
        e = await self._engine_call(
            context,
            self.engine.embed,
            request.Embeddings or request.Prompt,
            list(request.EmbeddingTokens),
            request.ModelIdentity,
        )
        layout = (
            backend_pb2.EMBEDDING_LAYOUT_PER_TOKEN
            if e.per_token
            else backend_pb2.EMBEDDING_LAYOUT_FINAL
        )
        return backend_pb2.EmbeddingResult(
            embeddings=e.vector,
            dim=e.dim,
            tokens=e.rows,
            prompt_tokens=e.prompt_tokens,
            layout=layout,
        )

    async def Score(self, request, context):
        results = await self._engine_call(
            context,
            self.engine.score,
            request.prompt,
            list(request.candidates),
            request.include_token_logprobs,
            request.ModelIdentity,
        )
        return backend_pb2.ScoreResponse(
            candidates=[
                backend_pb2.CandidateScore(
                    log_prob=r.log_prob,
                    length_normalized_log_prob=r.length_normalized_log_prob,
                    num_tokens=r.num_tokens,
                    tokens=[backend_pb2.TokenLogProb(token=t, log_prob=lp) for t, lp in r.tokens],
                )
                for r in results
            ]
        )

    async def TokenizeString(self, request, context):
        tokens = await self._engine_call(
            context, self.engine.tokenize, request.Prompt, request.ModelIdentity
        )
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


HEALTH_REFRESH_SECONDS = 1.0  # how often health re-checks that the engine thread lives


async def serve(
    address: str,
    model: str | None = None,
    grace: float = 5.0,
    parent_watch: ops.ParentWatcher | None = None,
    coordinator: Coordinator | None = None,
) -> bool:
    """Serve on ``address`` until SIGTERM/SIGINT; optionally preload ``model``.

    ``coordinator``: distributed mode, this process being rank 0 of the group (see
    ``distributed.py``); the model is then loaded and run on every rank.

    ``grace`` is in seconds. On a signal (or when ``parent_watch`` finds the parent gone,
    which sends SIGTERM): health turns NOT_SERVING, new calls are refused, in-flight
    calls get ``grace`` seconds to finish, the rest are cancelled (their engine jobs
    with them), MLX memory is freed, and this returns True; False when a thread (the
    engine, stuck in a long call) still runs after the stop. Raises SystemExit when
    ``address`` cannot be bound.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        if not stop.is_set():
            logger.info("%s received", sig.name)
        stop.set()

    # Before anything slow, so an early SIGTERM still takes the graceful path.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)

    engine = Engine()
    if coordinator is not None:
        coordinator.attach(engine)  # distributed rank 0: every step is shared with the group
    known = set(threading.enumerate())
    engine.start()
    engine_threads = [t for t in threading.enumerate() if t not in known]
    # PYTHON_GRPC_MAX_WORKERS sizes the original's thread pool; grpc.aio needs none.
    server = grpc.aio.server(
        interceptors=ops.server_interceptors(),
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
        engine.stop()
        raise SystemExit(f"cannot listen on {address}")
    await servicer._set_health()
    await server.start()
    logger.info("serving on %s (pid %d)", address.rsplit(":", 1)[0] + f":{port}", os.getpid())
    if parent_watch is not None:
        parent_watch.start()

    async def preload() -> None:
        result = await servicer.LoadModel(backend_pb2.ModelOptions(Model=model), None)
        if not result.success:
            logger.error("%s", result.message)
        else:
            logger.info("preloaded %s", model)

    async def refresh_health() -> None:
        # LoadModel and Free set health themselves; this catches a dead engine thread.
        while True:
            await asyncio.sleep(HEALTH_REFRESH_SECONDS)
            await servicer._set_health()

    # A long preload (a GGUF conversion) must not delay a SIGTERM that comes meanwhile.
    tasks = [asyncio.create_task(refresh_health())]
    if model:
        tasks.append(asyncio.create_task(preload()))

    await stop.wait()
    logger.info("stopping: %gs grace for in-flight requests", grace)
    if parent_watch is not None:
        parent_watch.stop()
    await health_servicer.enter_graceful_shutdown()
    # Refuses new calls at once and returns as soon as in-flight calls are done; after
    # `grace` it cancels the rest: their clients get UNAVAILABLE, and each abandoned
    # handler's `finally: job.cancel()` runs when its generator is closed.
    await server.stop(grace)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    # Ends every job still left (CANCELLED), frees the model and MLX memory, ends the
    # engine thread.
    await loop.run_in_executor(None, engine.stop)
    # Let the engine's OS thread finish its native cleanup before Python finalizes.
    await ops.os_threads_gone([t.native_id for t in engine_threads if not t.is_alive()], 5.0)
    stuck = [t.name for t in engine_threads if t.is_alive()]
    if stuck:
        logger.warning("still running after stop: %s", ", ".join(stuck))
    logger.info("stopped")
    return not stuck


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, set up logging on stderr, serve until a signal; exits 0 after a
    graceful stop, 2 on bad arguments."""
    parent_pid = os.getppid()  # first thing: the parent could die while we start
    parser = argparse.ArgumentParser(description="LocalAI MLX backend (gRPC)")
    parser.add_argument("--addr", default="localhost:50051", help="HOST:PORT to listen on")
    parser.add_argument(
        "--model",
        default=None,
        help="model to preload: a GGUF file, an MLX model directory, a cached HF repo id, "
        "or 'embedded' for the bundled SmolLM2-135M-Instruct",
    )
    parser.add_argument(
        "--grace",
        type=ops.parse_duration,
        default=5.0,
        help='shutdown grace period for in-flight requests: seconds, or "500ms", "1m"',
    )
    parser.add_argument(
        "--log-level",
        default=None,
        help=f"debug, info, warning, error, or LocalAI's trace, warn (default: "
        f"${ops.LOG_LEVEL_ENV}, else info)",
    )
    parser.add_argument(
        "--distributed",
        choices=("tensor", "pipeline"),
        default=None,
        help="serve one model across the processes of an MLX group started by mlx.launch: "
        "tensor parallel (the model's shard()) or pipeline (model.pipeline()); rank 0 "
        "serves gRPC on --addr, the other ranks follow it",
    )
    parser.add_argument(
        "--distributed-timeout",
        type=ops.parse_duration,
        default=60.0,
        help="distributed mode: how long one step may take before rank 0 declares a rank "
        'hung and fails requests with UNAVAILABLE: seconds, or "500ms", "2m" (default 60)',
    )
    parser.add_argument(
        "--distributed-backend",
        default="any",
        help="distributed mode: MLX backend to join (any, ring, mpi, nccl, jaccl; default "
        "any: the one the launcher set up)",
    )
    args, _unknown = parser.parse_known_args(argv)
    bad_env_level = ""
    try:
        level = ops.log_level(args.log_level or os.environ.get(ops.LOG_LEVEL_ENV) or "info")
    except ValueError as exc:
        if args.log_level:
            parser.error(str(exc))
        level, bad_env_level = logging.INFO, str(exc)  # an inherited typo must not stop us
    logging.basicConfig(
        stream=sys.stderr,
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("grpc", "asyncio"):  # their DEBUG lines come once per call
        logging.getLogger(noisy).setLevel(max(level, logging.INFO))
    if bad_env_level:
        logger.warning("%s: %s; using info", ops.LOG_LEVEL_ENV, bad_env_level)
    interval = ops.parent_watch_interval()
    watcher = None if interval is None else ops.ParentWatcher(interval, initial_ppid=parent_pid)
    coordinator = _join_group(args) if args.distributed else None
    model = args.model
    if model == "embedded":
        model = str(model_loader.embedded_model_path())
    if not asyncio.run(serve(args.addr, model, args.grace, watcher, coordinator)):
        # Finalizing Python under a thread inside native code can abort the process;
        # everything that matters is already stopped and freed.
        logging.shutdown()
        os._exit(0)


def _join_group(args: argparse.Namespace) -> Coordinator | None:
    """``--distributed``: join the MLX group; ranks other than 0 follow rank 0 and exit
    here (0 when rank 0 stopped them, 1 when the group broke). Returns rank 0's
    coordinator, or None for a group of one process."""
    import distributed  # imports MLX, which backend.py otherwise leaves to the engine

    try:
        group = distributed.init_group(args.distributed_backend)
        coordinator = distributed.Coordinator(group, args.distributed, args.distributed_timeout)
    except (RuntimeError, ValueError) as exc:
        logger.error("%s", exc)
        raise SystemExit(2) from None
    if coordinator.size == 1:
        logger.warning("--distributed in a group of one process: serving alone")
        return None
    fmt = f"%(asctime)s rank{coordinator.rank} %(levelname)s %(name)s: %(message)s"
    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter(fmt))
    if coordinator.leader:
        return coordinator
    code = distributed.follow(coordinator)
    logging.shutdown()
    os._exit(code)  # MLX's threads may still sit in native code: skip finalization


if __name__ == "__main__":
    main()
