"""LocalAI's worker protocol: rank 0 joins its group at LoadModel; workers follow it.

LocalAI forms a group without a launcher (``local-ai worker mlx-distributed``): each
worker is started alone with ``--worker --hostfile FILE --rank N [--backend ring|jaccl]
[--coordinator IP:PORT]`` and runs ``run_worker``; rank 0 is the backend LocalAI starts
like any other, wrapped in ``JoinOnLoad``, which joins the group at the LoadModel that
asks for one and from then on loads every model on every rank.

Whether a LoadModel asks for a group is ``decide``'s answer, from, in this order: the
model's load options (``hostfile:PATH``, or ``distributed_backend:`` with the hostfile
from below), our own command line (``--hostfile``, which ``local-ai worker
mlx-distributed --rank 0`` passes), and LocalAI's ``MLX_DISTRIBUTED_HOSTFILE`` only when
this backend is installed as LocalAI's ``mlx-distributed`` (its folder's name, which is
LocalAI's name for it). The variable alone does not: ``local-ai run --p2p`` exports it
into its own environment, so every backend it spawns inherits it, an ``mlx`` model too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distributed.coordinator import DEFAULT_TIMEOUT, Coordinator
from distributed.follower import follow
from distributed.group import (
    BACKEND_ENV,
    COORDINATOR_ENV,
    HOSTFILE_ENV,
    JOIN_TIMEOUT,
    JOIN_TIMEOUT_ENV,
    GroupSpec,
    Joiner,
    JoinTimeout,
    group_spec,
)
from engine.core import Engine
from engine.jobs import Job
from engine.metrics import Recorder
from engine.model_calls import ModelMetadata
from engine.scheduler import RequestMetrics
from engine.status import StatusSnapshot
from errors import BackendError, ModelLoadError
from loading.loaded_model import LoadedModel
from params import LoadParams
from tasks.embedding import EmbeddingOutput
from tasks.rerank import RerankOutput
from tasks.scoring import CandidateResult

logger = logging.getLogger("localai.mlx.distributed")

MLX_DISTRIBUTED = "mlx-distributed"  # LocalAI's backend name (core/cli/worker, index.yaml)
P2P_HOSTFILE = "localai_mlx_hostfile.json"  # what `local-ai run --p2p` writes (core/cli/run.go)


# ---------------------------------------------------------------------- does a load join?
@dataclass(frozen=True)
class StartSettings:
    """What this process was started with that may name a group for LoadModel.

    ``hostfile``/``backend``: ``--hostfile``/``--backend``; ``coordinator``:
    ``--coordinator`` or ``$MLX_JACCL_COORDINATOR``; ``env_hostfile``/``env_backend``:
    LocalAI's ``$MLX_DISTRIBUTED_HOSTFILE``/``$MLX_DISTRIBUTED_BACKEND``;
    ``installed_as``: the backend's folder name (see ``installed_as``).
    """

    hostfile: str = ""
    backend: str = ""
    coordinator: str = ""
    env_hostfile: str = ""
    env_backend: str = ""
    installed_as: str = ""

    @property
    def as_mlx_distributed(self) -> bool:
        """Installed as LocalAI's mlx-distributed (e.g. ``cpu-mlx-distributed``)."""
        return MLX_DISTRIBUTED in self.installed_as.lower()

    @classmethod
    def from_environment(
        cls,
        hostfile: str | None = None,
        backend: str | None = None,
        coordinator: str | None = None,
        installed: str = "",
    ) -> StartSettings:
        """Flags (None: not given) over LocalAI's environment variables."""
        env = os.environ
        return cls(
            hostfile=hostfile or "",
            backend=backend or "",
            coordinator=coordinator if coordinator is not None else env.get(COORDINATOR_ENV, ""),
            env_hostfile=env.get(HOSTFILE_ENV, ""),
            env_backend=env.get(BACKEND_ENV, ""),
            installed_as=installed,
        )


@dataclass(frozen=True)
class JoinDecision:
    """Whether a LoadModel joins a group: ``hostfile`` ("" = one process), ``backend``,
    ``coordinator``, and ``source``, which setting decided (logged)."""

    hostfile: str
    backend: str
    coordinator: str
    source: str


def decide(params: LoadParams, start: StartSettings) -> JoinDecision:
    """Whether the load of ``params`` joins a group, and which setting says so."""
    backend = params.distributed_backend or start.backend or start.env_backend or "ring"
    mlx_dist = f"installed as LocalAI's {MLX_DISTRIBUTED} backend ({start.installed_as})"
    if params.hostfile:
        hostfile, source = params.hostfile, "load option hostfile"
    elif params.distributed_backend and (start.hostfile or start.env_hostfile):
        hostfile = start.hostfile or start.env_hostfile
        where = "--hostfile" if start.hostfile else f"${HOSTFILE_ENV}"
        source = f"load option distributed_backend, hostfile from {where}"
    elif params.distributed_backend:
        hostfile = ""
        source = (
            f"load option distributed_backend:{params.distributed_backend} names no group: "
            f"no option hostfile, --hostfile or ${HOSTFILE_ENV}; serving as one process"
        )
    elif start.hostfile:
        hostfile, source = start.hostfile, "--hostfile on the command line"
    elif start.env_hostfile and start.as_mlx_distributed:
        hostfile, source = start.env_hostfile, f"${HOSTFILE_ENV}, {mlx_dist}"
    elif start.env_hostfile:
        hostfile = ""
        source = (
            f"${HOSTFILE_ENV}={start.env_hostfile} is ignored: this backend is not installed "
            f"as {MLX_DISTRIBUTED} and neither the load options nor the command line ask "
            "for a group (`local-ai run --p2p` exports the variable to every backend it "
            "starts); use option hostfile:PATH to join one"
        )
    else:
        hostfile, source = "", "no hostfile in the load options or on the command line"
    return JoinDecision(hostfile, backend, start.coordinator, source)


def installed_as(root: Path, pwd: str | None = None) -> str:
    """The name LocalAI knows this backend by: the name of its folder ``root``, or of
    ``pwd`` (``$PWD``, from which libbackend.sh reads ``BACKEND_NAME``) when that is
    the same folder under another name (a link). LocalAI starts ``run.sh`` in it."""
    names = [root.name]
    if pwd:
        try:
            if os.path.samefile(pwd, root):
                names.insert(0, Path(pwd).name)
        except OSError:
            pass
    return next((n for n in names if MLX_DISTRIBUTED in n.lower()), names[-1])


def rank_zero_worker_message(hostfile: str) -> str:
    """Why ``--worker --rank 0`` is refused, and what to run instead."""
    example = hostfile or "hosts.json"
    return (
        "rank 0 serves gRPC and is not a worker: start it without --worker (LocalAI "
        "starts it like any backend; it joins at LoadModel with option hostfile:PATH). "
        "`--worker --rank 0` is what `local-ai worker p2p-mlx` runs: LocalAI's P2P mode "
        "starts every worker as rank 0 and gives rank 0 a hostfile of P2P tunnel "
        "addresses, which cannot form an MLX group. On each worker machine run "
        f"`local-ai worker mlx-distributed --hostfile {example} --rank N` (N = 1, 2, ...; "
        f"or `run.sh --worker --hostfile {example} --rank N`) and load the model with "
        f"option hostfile:{example} (see docs/LOCALAI.md)"
    )


# ---------------------------------------------------------------------- rank 0
class JoinOnLoad:
    """Rank 0 of LocalAI's worker protocol: owns an ``Engine`` and joins its group at
    the LoadModel that asks for one (``decide``).

    What the servicer is given: ``load`` is this class's, every other call of the
    servicer's (``submit``, ``serving``, ``status``, ...) is forwarded to the engine. The first
    load whose decision names a hostfile joins that group as rank 0 once, waiting up to
    ``join_timeout`` seconds for the workers, attaches a ``Coordinator`` (step timeout
    ``timeout`` seconds) and loads on every rank; every later load stays in that group.
    Without one it is a plain single-process engine. ``load`` raises ModelLoadError for
    a bad or different hostfile and for workers that did not connect in time (a later
    LoadModel keeps waiting for them).
    """

    def __init__(
        self,
        start: StartSettings | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        join_timeout: float = JOIN_TIMEOUT,
        engine: Engine | None = None,
    ) -> None:
        self.engine = engine if engine is not None else Engine()
        self.start_settings = start if start is not None else StartSettings.from_environment()
        self.step_timeout = timeout
        self.join_timeout = join_timeout
        self.joiner = Joiner()
        self.coordinator: Coordinator | None = None
        self._join_lock: asyncio.Lock | None = None  # made on the event loop
        self._logged: set[str] = set()

    # -- the engine's API, as the servicer (`edge.servicer.ServedEngine`) and the server
    # (`edge.startup.HostedEngine`) call it: the engine's own, but for `load`.
    @property
    def metrics(self) -> Recorder:
        return self.engine.metrics

    @property
    def loaded(self) -> LoadedModel | None:
        return self.engine.loaded

    @property
    def alive(self) -> bool:
        return self.engine.alive

    @property
    def fatal(self) -> str | None:
        return self.engine.fatal

    @property
    def last_metrics(self) -> RequestMetrics:
        return self.engine.last_metrics

    async def free(self) -> None:
        await self.engine.free()

    def serving(self, identity: str = "") -> LoadedModel:
        return self.engine.serving(identity)

    async def submit(self, message: Any, loaded: LoadedModel) -> Job:
        return await self.engine.submit(message, loaded)

    async def embed(self, text: str, token_ids: list[int], identity: str = "") -> EmbeddingOutput:
        return await self.engine.embed(text, token_ids, identity)

    async def score(
        self,
        prompt: str,
        candidates: list[str],
        include_token_logprobs: bool,
        identity: str = "",
        stable_prefix_len: int = 0,
    ) -> list[CandidateResult]:
        return await self.engine.score(
            prompt, candidates, include_token_logprobs, identity, stable_prefix_len
        )

    async def rerank(
        self, query: str, documents: list[str], top_n: int, identity: str = ""
    ) -> RerankOutput:
        return await self.engine.rerank(query, documents, top_n, identity)

    async def tokenize(self, text: str, identity: str = "") -> list[int]:
        return await self.engine.tokenize(text, identity)

    async def detokenize(self, ids: list[int]) -> str:
        return await self.engine.detokenize(ids)

    async def metadata(self) -> ModelMetadata:
        return await self.engine.metadata()

    def status(self) -> StatusSnapshot:
        return self.engine.status()

    def info(self) -> dict[str, Any]:
        return self.engine.info()

    def start(self) -> None:
        self.engine.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.engine.stop(timeout)

    def fail_from_outside(self, error: BackendError) -> None:
        self.engine.fail_from_outside(error)

    async def load(self, params: LoadParams) -> None:
        decision = decide(params, self.start_settings)
        self._log_once(decision)
        if decision.hostfile:
            spec = self._spec(decision)
            if self.coordinator is None:
                if self._join_lock is None:
                    self._join_lock = asyncio.Lock()
                async with self._join_lock:
                    if self.coordinator is None:
                        await self._join(spec)
        if self.coordinator is not None:
            # Rank 0 decides the split; the workers apply the params it sends them.
            mode = params.distributed_mode or self.coordinator.mode
            params = dataclasses.replace(params, distributed_mode=mode)
        await self.engine.load(params)

    def _log_once(self, decision: JoinDecision) -> None:
        if decision.source in self._logged or (self.coordinator and decision.hostfile):
            return
        self._logged.add(decision.source)
        if decision.hostfile:
            logger.info(
                "LoadModel asks for the group of %s (%s)", decision.hostfile, decision.source
            )
        elif decision.source.startswith(("load option", "$")):
            logger.warning("not joining a distributed group: %s", decision.source)

    def _spec(self, decision: JoinDecision) -> GroupSpec:
        try:
            spec = group_spec(decision.hostfile, decision.backend, 0, decision.coordinator)
        except ValueError as exc:
            raise ModelLoadError(f"{exc} (from {decision.source})") from None
        joined = self.joiner.spec
        if joined is not None and joined != spec:
            raise ModelLoadError(
                f"this backend already serves {joined.describe()} as rank 0; a process "
                f"stays in one group: restart the backend to use {spec.describe()}"
            )
        return spec

    async def _join(self, spec: GroupSpec) -> None:
        logger.info(
            "joining %s as rank 0; waiting up to %gs for the workers",
            spec.describe(),
            self.join_timeout,
        )
        loop = asyncio.get_running_loop()
        p2p = ""
        if os.path.basename(spec.hostfile) == P2P_HOSTFILE:
            p2p = (
                f" ({spec.hostfile} is the hostfile `local-ai run --p2p` writes from P2P "
                "tunnels, which cannot form an MLX group: see docs/LOCALAI.md)"
            )
        try:
            group = await loop.run_in_executor(None, self.joiner.join, spec, self.join_timeout)
        except JoinTimeout as exc:
            workers = ", ".join(str(r) for r in range(1, spec.size))
            raise ModelLoadError(
                f"{exc}: start ranks {workers} first (`local-ai worker mlx-distributed "
                f"--hostfile {spec.hostfile} --rank N`, or `run.sh --worker --hostfile "
                f"{spec.hostfile} --rank N`); the next LoadModel keeps waiting for them{p2p}"
            ) from None
        except (RuntimeError, ValueError, OSError) as exc:
            raise ModelLoadError(f"cannot join {spec.describe()}: {exc}{p2p}") from None
        coordinator = Coordinator(group, "tensor", self.step_timeout)
        # Before the first sync: the watchdog needs the engine. Off the event loop: it
        # opens the lifelines, a collective and a wait for every rank's connection.
        await loop.run_in_executor(None, coordinator.attach, self.engine)
        await self.engine.attach_group(coordinator)
        self.coordinator = coordinator
        logger.info("rank 0 of %d: joined %s", coordinator.size, spec.describe())


# ---------------------------------------------------------------------- workers
def run_worker(spec: GroupSpec, timeout: float, join_timeout: float) -> int:
    """A worker of LocalAI's protocol: join as ``spec.rank`` (waiting up to
    ``join_timeout`` seconds for rank 0 and the others), then follow rank 0 across every
    LoadModel and Free until it stops. Returns the exit code: 0 when rank 0 stopped the
    group, 1 when joining failed or the group broke."""
    logger.info(
        "rank %d: joining %s; waiting up to %gs for rank 0 (it joins at its first "
        "LoadModel with option hostfile:%s)",
        spec.rank,
        spec.describe(),
        join_timeout,
        spec.hostfile,
    )
    try:
        group = Joiner().join(spec, join_timeout)
    except JoinTimeout as exc:
        logger.error(
            "%s; giving up. Load a model on rank 0 with option hostfile:%s (or start it "
            "with --hostfile), or allow longer with --join-timeout / %s",
            exc,
            spec.hostfile,
            JOIN_TIMEOUT_ENV,
        )
        return 1
    except (RuntimeError, OSError) as exc:
        logger.error("rank %d cannot join %s: %s", spec.rank, spec.describe(), exc)
        return 1
    return follow(Coordinator(group, "tensor", timeout))
