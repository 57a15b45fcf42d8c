"""The gRPC servicer of LocalAI's ``backend.Backend`` service.

Each RPC is a short adapter: protobuf in, a call on the engine (``ServedEngine``: which
owns the model and the MLX thread; a Predict request is parsed, compiled, rendered and
tokenized in its one prepare step, ``engine.prepare``), protobuf out (``replies``).
Predict and PredictStream share one path (``_generate``); Predict joins the same events
that PredictStream sends. Domain errors map to gRPC status codes in one place
(``_abort``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, Protocol, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2

import backend_pb2
import backend_pb2_grpc
import params
from edge.replies import Accumulator
from engine.jobs import Event
from engine.metrics import Recorder
from engine.model_calls import ModelMetadata
from engine.scheduler import RequestMetrics
from engine.status import StatusSnapshot
from errors import BackendError, as_backend_error
from loading.loaded_model import LoadedModel
from params import LoadParams
from tasks.embedding import EmbeddingOutput
from tasks.rerank import RerankOutput
from tasks.scoring import CandidateResult
from training import checkpoints as training_checkpoints
from training import spec as training_spec
from training.jobs import JobManager, parse

logger = logging.getLogger("localai.mlx." + __name__)
_T = TypeVar("_T")

HEALTH_SERVICE = "backend.Backend"
LOAD_SUCCESS_MESSAGE = "MLX model loaded successfully"  # LocalAI's own test compares it


class JobHandle(Protocol):
    """A submitted request, as the servicer reads it (`engine.jobs.Job`)."""

    def events(self) -> AsyncIterator[Event]:
        """Its events, the last one final."""
        ...

    def cancel(self) -> None:
        """End it now (the caller left); idempotent."""
        ...


class ServedEngine(Protocol):
    """Exactly what the servicer calls on its engine: `engine.core.Engine`, or
    `distributed.worker.JoinOnLoad` in front of one (which joins a group at LoadModel).
    Errors are `errors.BackendError`s, mapped to gRPC codes in `_abort`."""

    @property
    def metrics(self) -> Recorder: ...
    @property
    def loaded(self) -> LoadedModel | None: ...
    @property
    def alive(self) -> bool: ...
    @property
    def last_metrics(self) -> RequestMetrics: ...
    async def load(self, params: LoadParams) -> None: ...
    async def free(self) -> None: ...
    def serving(self, identity: str = "") -> LoadedModel: ...
    async def submit(self, message: Any, loaded: LoadedModel) -> JobHandle: ...
    async def embed(
        self, text: str, token_ids: list[int], identity: str = ""
    ) -> EmbeddingOutput: ...
    async def score(
        self,
        prompt: str,
        candidates: list[str],
        include_token_logprobs: bool,
        identity: str = "",
        stable_prefix_len: int = 0,
    ) -> list[CandidateResult]: ...
    async def rerank(
        self, query: str, documents: list[str], top_n: int, identity: str = ""
    ) -> RerankOutput: ...
    async def tokenize(self, text: str, identity: str = "") -> list[int]: ...
    async def detokenize(self, ids: list[int]) -> str: ...
    async def metadata(self) -> ModelMetadata: ...
    def status(self) -> StatusSnapshot: ...
    def info(self) -> dict[str, Any]: ...


class HostedEngine(ServedEngine, Protocol):
    """What the server (`edge.startup.serve`) also calls: start, stop, and the watchdog's
    reason to stop and way to end every request."""

    @property
    def fatal(self) -> str | None: ...
    def start(self) -> None: ...
    def stop(self, timeout: float = 5.0) -> None: ...
    def fail_from_outside(self, error: BackendError) -> None: ...


def _update(message: Any, job_id: str, update: dict[str, Any]) -> Any:
    """A job's progress line (training.worker) as LocalAI's progress message."""
    names = {f.name for f in message.DESCRIPTOR.fields}
    return message(job_id=job_id, **{k: v for k, v in update.items() if k in names})


class BackendServicer(backend_pb2_grpc.BackendServicer):
    """The LocalAI ``backend.Backend`` service over one engine."""

    def __init__(
        self,
        engine: ServedEngine,
        health_servicer: health.aio.HealthServicer | None = None,
        jobs: JobManager | None = None,
    ) -> None:
        self.engine = engine
        self.health = health_servicer
        self.jobs = jobs or JobManager()  # fine-tune/export/quantize children (training/)

    async def _abort(self, context: grpc.aio.ServicerContext, exc: Exception) -> NoReturn:
        """End the call with the gRPC status of ``exc``: the one mapping of domain errors to
        gRPC codes (``errors.as_backend_error`` names the domain error); counted by code."""
        error = as_backend_error(exc)
        code = getattr(grpc.StatusCode, error.status, grpc.StatusCode.INTERNAL)
        self.engine.metrics.request_failed(code.name)
        await context.abort(code, str(error))
        raise AssertionError("grpc's context.abort raises")  # not reached

    async def refresh_health(self) -> None:
        """Set grpc.health.v1's status: SERVING while a model is loaded and the engine lives."""
        if self.health is not None:
            status = (
                health_pb2.HealthCheckResponse.SERVING
                if self.engine.loaded is not None and self.engine.alive
                else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            await self.health.set(HEALTH_SERVICE, status)
            await self.health.set("", status)

    async def Health(
        self, request: backend_pb2.HealthMessage, context: grpc.aio.ServicerContext
    ) -> backend_pb2.Reply:
        return backend_pb2.Reply(message=b"OK")

    async def LoadModel(
        self, request: backend_pb2.ModelOptions, context: grpc.aio.ServicerContext
    ) -> backend_pb2.Result:
        if training_spec.names_this_backend(request.Model, request.ModelFile):
            # LocalAI starts a job's process with the backend's name as the model
            # (core/services/finetune/service.go): nothing to load, jobs bring their own.
            return backend_pb2.Result(success=True, message=training_spec.JOB_PROCESS_MESSAGE)
        try:
            await self.engine.load(params.load_params(request))
        except (ValueError, BackendError) as exc:
            message = f"failed to load model: {exc}"
        except Exception as exc:  # an unexpected loader failure must still answer
            logger.exception("LoadModel failed")
            message = f"failed to load model: {type(exc).__name__}: {exc}"
        else:
            message = ""
        await self.refresh_health()
        if message:
            logger.error("%s", message)
            return backend_pb2.Result(success=False, message=message)
        return backend_pb2.Result(success=True, message=LOAD_SUCCESS_MESSAGE)

    async def Free(
        self, request: backend_pb2.HealthMessage, context: grpc.aio.ServicerContext
    ) -> backend_pb2.Result:
        await self.engine.free()
        await self.refresh_health()
        return backend_pb2.Result(success=True, message="Model freed")

    async def Predict(
        self, request: backend_pb2.PredictOptions, context: grpc.aio.ServicerContext
    ) -> backend_pb2.Reply:
        acc = Accumulator()
        # aclosing: a caller that leaves cancels the job now, not when the GC runs.
        async with contextlib.aclosing(self._generate(request, context)) as events:
            async for event in events:
                acc.add(event)
        return acc.final_reply()

    async def PredictStream(
        self, request: backend_pb2.PredictOptions, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[backend_pb2.Reply]:
        acc = Accumulator()
        async with contextlib.aclosing(self._generate(request, context)) as events:
            async for event in events:
                acc.add(event)
                if event.delta or event.final:
                    yield acc.stream_reply(event)

    async def _generate(
        self, request: backend_pb2.PredictOptions, context: grpc.aio.ServicerContext
    ) -> AsyncGenerator[Event, None]:
        """Submit and yield one request's events; cancels the job if the caller leaves."""
        try:
            # Which model serves this request, read once; its identity is checked first,
            # as LocalAI's own backends do.
            loaded = self.engine.serving(request.ModelIdentity)
            # One hop off the event loop: parse, compile, render, tokenize; then queued.
            job = await self.engine.submit(request, loaded)
        except Exception as exc:
            await self._abort(context, exc)
            return
        try:
            async for event in job.events():
                if event.error is not None:
                    await self._abort(context, event.error)
                yield event
        finally:
            job.cancel()  # no-op when finished; frees the batch slot when the client is gone

    async def Embedding(
        self, request: backend_pb2.PredictOptions, context: grpc.aio.ServicerContext
    ) -> backend_pb2.EmbeddingResult:
        # LocalAI sends the text in Embeddings (Prompt as a fallback), or token ids.
        e = await self._call(
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

    async def Score(
        self, request: backend_pb2.ScoreRequest, context: grpc.aio.ServicerContext
    ) -> backend_pb2.ScoreResponse:
        results = await self._call(
            context,
            self.engine.score,
            request.prompt,
            list(request.candidates),
            request.include_token_logprobs,
            request.ModelIdentity,
            request.stable_prefix_len,
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

    async def Rerank(
        self, request: backend_pb2.RerankRequest, context: grpc.aio.ServicerContext
    ) -> backend_pb2.RerankResult:
        out = await self._call(
            context,
            self.engine.rerank,
            request.query,
            list(request.documents),
            request.top_n,
            request.ModelIdentity,
        )
        return backend_pb2.RerankResult(
            usage=backend_pb2.Usage(
                total_tokens=out.prompt_tokens, prompt_tokens=out.prompt_tokens
            ),
            results=[
                backend_pb2.DocumentResult(
                    index=r.index, text=r.text, relevance_score=r.relevance_score
                )
                for r in out.results
            ],
        )

    async def TokenizeString(
        self, request: backend_pb2.PredictOptions, context: grpc.aio.ServicerContext
    ) -> backend_pb2.TokenizationResponse:
        tokens = await self._call(
            context, self.engine.tokenize, request.Prompt, request.ModelIdentity
        )
        return backend_pb2.TokenizationResponse(length=len(tokens), tokens=tokens)

    async def Detokenize(
        self, request: backend_pb2.DetokenizeRequest, context: grpc.aio.ServicerContext
    ) -> backend_pb2.DetokenizeResponse:
        text = await self._call(context, self.engine.detokenize, list(request.tokens))
        return backend_pb2.DetokenizeResponse(content=text)

    async def Status(
        self, request: backend_pb2.HealthMessage, context: grpc.aio.ServicerContext
    ) -> backend_pb2.StatusResponse:
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

    async def ModelMetadata(
        self, request: backend_pb2.ModelOptions, context: grpc.aio.ServicerContext
    ) -> backend_pb2.ModelMetadataResponse:
        m = await self._call(context, self.engine.metadata)
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
            media_marker=m.media_marker,
        )

    async def GetMetrics(
        self, request: backend_pb2.MetricsRequest, context: grpc.aio.ServicerContext
    ) -> backend_pb2.MetricsResponse:
        m = self.engine.last_metrics
        info = self.engine.info()
        counters = self.engine.metrics.snapshot()  # {} when metrics are off
        if counters:
            info["metrics"] = counters
        return backend_pb2.MetricsResponse(
            slot_id=0,
            # No llama.cpp slot prompt here: the field carries engine facts as JSON instead.
            prompt_json_for_slot=json.dumps(info),
            tokens_per_second=m.tokens_per_second,
            tokens_generated=m.tokens_generated,
            prompt_tokens_processed=m.prompt_tokens_processed,
        )

    async def _call(
        self,
        context: grpc.aio.ServicerContext,
        fn: Callable[..., Awaitable[_T]],
        *args: Any,
    ) -> _T:
        try:
            return await fn(*args)
        except Exception as exc:
            await self._abort(context, exc)

    # ------------------------------------------------------------------ training jobs
    async def StartFineTune(
        self, request: backend_pb2.FineTuneRequest, context: grpc.aio.ServicerContext
    ) -> backend_pb2.FineTuneJobResult:
        try:
            spec = parse(training_spec.finetune_spec, request)
            job = await self.jobs.start("finetune", spec.job_id, spec.to_json())
        except Exception as exc:
            await self._abort(context, exc)
        return backend_pb2.FineTuneJobResult(
            job_id=job.id, success=True, message="Fine-tuning job started"
        )

    async def FineTuneProgress(
        self, request: backend_pb2.FineTuneProgressRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[backend_pb2.FineTuneProgressUpdate]:
        try:
            async for update in self.jobs.follow(request.job_id, "finetune"):
                yield _update(backend_pb2.FineTuneProgressUpdate, request.job_id, update)
        except Exception as exc:
            await self._abort(context, exc)

    async def StopFineTune(
        self, request: backend_pb2.FineTuneStopRequest, context: grpc.aio.ServicerContext
    ) -> backend_pb2.Result:
        # LocalAI stops a job by stopping its process (the child saves on SIGTERM); a
        # client may call this instead: the job saves a checkpoint when asked and ends.
        final = await self._call(
            context, self.jobs.stop, request.job_id, "finetune", request.save_checkpoint
        )
        return backend_pb2.Result(success=True, message=final.get("message", "stopped"))

    async def ListCheckpoints(
        self, request: backend_pb2.ListCheckpointsRequest, context: grpc.aio.ServicerContext
    ) -> backend_pb2.ListCheckpointsResponse:
        found = await asyncio.to_thread(training_checkpoints.list_checkpoints, request.output_dir)
        return backend_pb2.ListCheckpointsResponse(
            checkpoints=[backend_pb2.CheckpointInfo(**c) for c in found]
        )

    async def ExportModel(
        self, request: backend_pb2.ExportModelRequest, context: grpc.aio.ServicerContext
    ) -> backend_pb2.Result:
        try:
            spec = parse(training_spec.export_spec, request)
            final = await self.jobs.run("export", f"export-{id(request)}", spec.to_json())
        except Exception as exc:
            await self._abort(context, exc)
        return backend_pb2.Result(success=True, message=final.get("message", ""))

    async def StartQuantization(
        self, request: backend_pb2.QuantizationRequest, context: grpc.aio.ServicerContext
    ) -> backend_pb2.QuantizationJobResult:
        try:
            spec = parse(training_spec.quantize_spec, request)
            job = await self.jobs.start("quantize", spec.job_id, spec.to_json())
        except Exception as exc:
            await self._abort(context, exc)
        return backend_pb2.QuantizationJobResult(
            job_id=job.id,
            success=True,
            message=f"Quantization job started: {spec.recipe.describe()}",
        )

    async def QuantizationProgress(
        self, request: backend_pb2.QuantizationProgressRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[backend_pb2.QuantizationProgressUpdate]:
        try:
            async for update in self.jobs.follow(request.job_id, "quantize"):
                yield _update(backend_pb2.QuantizationProgressUpdate, request.job_id, update)
        except Exception as exc:
            await self._abort(context, exc)

    async def StopQuantization(
        self, request: backend_pb2.QuantizationStopRequest, context: grpc.aio.ServicerContext
    ) -> backend_pb2.Result:
        final = await self._call(context, self.jobs.stop, request.job_id, "quantize", False)
        return backend_pb2.Result(success=True, message=final.get("message", "stopped"))
