"""Process start-up: arguments, the grpc.aio server, interceptors, health and reflection,
signals and graceful stop, distributed roles.

``main()`` is what ``backend.py`` runs (LocalAI starts ``backend.py --addr HOST:PORT``);
``serve()`` runs one server until SIGTERM/SIGINT. Holds no request logic: the servicer
(``edge/servicer.py``) and the engine do that.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

import backend_pb2
import backend_pb2_grpc
from edge import interceptors, lifecycle
from edge.servicer import BackendServicer, HostedEngine
from engine import metrics as metrics_mod
from engine import request_log
from engine.core import Engine
from errors import Unavailable
from loading import model_loader
from parsing.durations import parse_duration
from seam import contract as seam_contract

if TYPE_CHECKING:  # a single process never imports distributed; only its types are named here
    from distributed.coordinator import Coordinator
    from distributed.worker import JoinOnLoad, StartSettings

logger = logging.getLogger("localai.mlx." + __name__)

MAX_MESSAGE_BYTES = 50 * 1024 * 1024  # as the original backend: 50 MB each way


HEALTH_REFRESH_SECONDS = 1.0  # how often health re-checks that the engine thread lives


async def serve(
    address: str,
    model: str | None = None,
    grace: float = 5.0,
    parent_watch: lifecycle.ParentWatcher | None = None,
    coordinator: Coordinator | None = None,
    engine: HostedEngine | None = None,
    metrics: metrics_mod.Recorder = metrics_mod.NULL,
) -> tuple[int, bool]:
    """Serve on ``address`` until SIGTERM/SIGINT; optionally preload ``model``.

    ``coordinator``: distributed mode, this process being rank 0 of the group (see
    ``distributed/``); the model is then loaded and run on every rank. ``engine``: the
    engine to serve (or ``distributed.worker.JoinOnLoad``, which owns one), built here
    when None, reporting to ``metrics`` (the Prometheus endpoint, already started; it
    is stopped here at the end).

    ``grace`` is in seconds. On a signal (or when ``parent_watch`` finds the parent gone,
    which sends SIGTERM): health turns NOT_SERVING, new calls are refused, in-flight
    calls get ``grace`` seconds to finish, the rest are cancelled (their engine jobs
    with them), MLX memory is freed. When the engine can never serve again (a broken
    distributed group, an engine thread that died: ``Engine.fatal``), in-flight and
    queued requests end UNAVAILABLE at once and the server stops the same way, so that
    LocalAI's next Health check finds the process gone and starts a new one (its loader
    recreates a backend only when Health fails and the process has exited).

    Returns (exit status, clean): 0 after a signal, 1 after a fatal engine state; clean
    is False when a thread (the engine, stuck in a long call) still runs after the
    stop. Raises SystemExit when ``address`` cannot be bound.
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

    if engine is None:
        own = Engine(metrics=metrics) if coordinator is None else Engine(coordinator, metrics)
        if coordinator is not None:
            coordinator.attach(own)  # distributed rank 0: every step is shared with the group
        engine = own
    known = set(threading.enumerate())
    engine.start()
    engine_threads = [t for t in threading.enumerate() if t not in known]
    # PYTHON_GRPC_MAX_WORKERS sizes the original's thread pool; grpc.aio needs none.
    server = grpc.aio.server(
        interceptors=interceptors.server_interceptors(),
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
    await servicer.refresh_health()
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

    exit_status = 0

    async def refresh_health() -> None:
        # LoadModel and Free set health themselves; this catches a dead engine thread
        # or a broken group, and ends the process so that it can be started again.
        nonlocal exit_status
        while True:
            await asyncio.sleep(HEALTH_REFRESH_SECONDS)
            await servicer.refresh_health()
            reason = engine.fatal
            if reason is not None and not stop.is_set():
                logger.error(
                    "%s: ending in-flight requests and exiting with status 1, so that "
                    "LocalAI (or any supervisor) starts the backend again",
                    reason,
                )
                engine.fail_from_outside(Unavailable(f"{reason}; the backend restarts: retry"))
                exit_status = 1
                stop.set()

    # A long preload (a GGUF conversion) must not delay a SIGTERM that comes meanwhile.
    tasks = [asyncio.create_task(refresh_health())]
    if model:
        tasks.append(asyncio.create_task(preload()))

    await stop.wait()
    logger.info("stopping: %gs grace for in-flight requests", grace)
    if parent_watch is not None:
        parent_watch.stop()
    await health_servicer.enter_graceful_shutdown()
    await servicer.jobs.shutdown(grace)  # a running fine-tune saves its checkpoint
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
    gone = [t.native_id for t in engine_threads if not t.is_alive() and t.native_id is not None]
    await lifecycle.os_threads_gone(gone, 5.0)
    stuck = [t.name for t in engine_threads if t.is_alive()]
    if stuck:
        logger.warning("still running after stop: %s", ", ".join(stuck))
    metrics.stop()
    logger.info("stopped")
    return exit_status, not stuck


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
        type=parse_duration,
        default=5.0,
        help='shutdown grace period for in-flight requests: seconds, or "500ms", "1m"',
    )
    parser.add_argument(
        "--log-level",
        default=None,
        help=f"debug, info, warning, error, or LocalAI's trace, warn (default: "
        f"${lifecycle.LOG_LEVEL_ENV}, else info)",
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
        type=parse_duration,
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
    metrics_mod.add_argument(parser)
    _add_worker_arguments(parser)
    args, _unknown = parser.parse_known_args(argv)
    bad_env_level = ""
    try:
        level = lifecycle.log_level(
            args.log_level or os.environ.get(lifecycle.LOG_LEVEL_ENV) or "info"
        )
    except ValueError as exc:
        if args.log_level:
            parser.error(str(exc))
        level, bad_env_level = logging.INFO, str(exc)  # an inherited typo must not stop us
    stderr = logging.StreamHandler(sys.stderr)
    stderr.addFilter(request_log.RepeatFilter())  # a warning per request: bounded
    logging.basicConfig(
        handlers=[stderr],
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("grpc", "asyncio"):  # their DEBUG lines come once per call
        logging.getLogger(noisy).setLevel(max(level, logging.INFO))
    if bad_env_level:
        logger.warning("%s: %s; using info", lifecycle.LOG_LEVEL_ENV, bad_env_level)
    seam_contract.check_at_startup()  # versions warn; a missing private member exits 2
    interval = lifecycle.parent_watch_interval()
    watcher = (
        None if interval is None else lifecycle.ParentWatcher(interval, initial_ppid=parent_pid)
    )
    if args.worker:
        _run_worker(args)  # never returns
    coordinator = _join_group(args) if args.distributed else None
    # After the worker and follower exits: every rank on a host inherits the same address.
    try:
        metrics = metrics_mod.from_settings(args.metrics_addr)
    except ValueError as exc:
        parser.error(str(exc))
    except OSError as exc:
        logger.error("%s", exc)
        raise SystemExit(2) from None
    engine = None if args.distributed else _join_on_load(args, metrics)
    model = args.model
    if model == model_loader.EMBEDDED:  # preloaded (and identified) by its path
        model = str(model_loader.embedded_model_path())
    status, clean = asyncio.run(
        serve(args.addr, model, args.grace, watcher, coordinator, engine, metrics)
    )
    if not clean or status:
        # Finalizing Python under a thread inside native code can abort the process;
        # everything that matters is already stopped and freed.
        logging.shutdown()
        os._exit(status)


def _join_group(args: argparse.Namespace) -> Coordinator | None:
    """``--distributed``: join the MLX group; ranks other than 0 follow rank 0 and exit
    here (0 when rank 0 stopped them, 1 when the group broke). Returns rank 0's
    coordinator, or None for a group of one process."""
    # Only here: a single process never imports the distributed package.
    from distributed import coordinator as coordinators
    from distributed import follower, group

    try:
        mlx_group = group.init_group(args.distributed_backend)
        coordinator = coordinators.Coordinator(
            mlx_group, args.distributed, args.distributed_timeout
        )
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
    code = follower.follow(coordinator)
    logging.shutdown()
    os._exit(code)  # MLX's threads may still sit in native code: skip finalization


# ---------------------------------------------------------------------- LocalAI's worker protocol
def _add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags ``local-ai worker mlx-distributed`` passes (core/cli/worker), with
    LocalAI's environment variables as fallbacks, plus our join timeout."""
    group = parser.add_argument_group(
        "LocalAI worker protocol",
        "workers: run.sh --worker --hostfile FILE --rank N [--backend ring|jaccl] "
        "[--coordinator IP:PORT]; rank 0 is started like any backend and joins at "
        "LoadModel (option hostfile:FILE), or takes --hostfile/--backend here; "
        "$MLX_DISTRIBUTED_HOSTFILE alone makes rank 0 join only when this backend is "
        "installed as mlx-distributed",
    )
    group.add_argument(
        "--worker",
        action="store_true",
        help="follow rank 0 of the hostfile's group instead of serving gRPC",
    )
    group.add_argument(
        "--hostfile",
        default=None,
        help="ring: JSON array of 'ip:port', entry i = rank i's listen address; JACCL: "
        "matrix of RDMA device names (workers' default: $MLX_DISTRIBUTED_HOSTFILE)",
    )
    group.add_argument(
        "--rank", default=None, help="this process's rank in the hostfile (default: $MLX_RANK)"
    )
    group.add_argument(
        "--backend",
        default=None,
        help="ring or jaccl (default: $MLX_DISTRIBUTED_BACKEND, else ring)",
    )
    group.add_argument(
        "--coordinator",
        default=None,
        help="JACCL: rank 0's ip:port for RDMA setup (default: $MLX_JACCL_COORDINATOR)",
    )
    group.add_argument(
        "--join-timeout",
        type=parse_duration,
        default=None,
        help='how long a rank waits for the others to connect: seconds, or "10m" '
        "(default: $LOCALAI_MLX_JOIN_TIMEOUT, else 600)",
    )


def _start_settings(args: argparse.Namespace) -> tuple[StartSettings, float]:
    """(what rank 0's LoadModel may join: flags over LocalAI's env, join timeout)."""
    from distributed import group, worker

    root = Path(__file__).resolve().parent.parent  # the backend's folder (run.sh, backend.py)
    settings = worker.StartSettings.from_environment(
        args.hostfile,
        args.backend,
        args.coordinator,
        worker.installed_as(root, os.environ.get("PWD")),
    )
    timeout = args.join_timeout
    if timeout is None:
        timeout = group.join_timeout_default()
    return settings, timeout


def _run_worker(args: argparse.Namespace) -> None:
    """``--worker``: join the hostfile's group as rank ``--rank`` and follow rank 0;
    exits 2 on bad arguments (``--rank 0`` included: what ``local-ai worker p2p-mlx``
    runs), 1 when the group could not form or broke, 0 when rank 0 stopped it."""
    # Only here: a single process never imports the distributed package.
    from distributed import group, worker

    try:
        if args.distributed:
            raise ValueError(
                "--worker is LocalAI's worker protocol; --distributed is for groups "
                "started by mlx.launch: use one of them"
            )
        env = group.env_defaults()  # a worker takes LocalAI's environment as it is
        hostfile = args.hostfile if args.hostfile is not None else env["hostfile"]
        backend = args.backend if args.backend is not None else env["backend"]
        coordinator = args.coordinator if args.coordinator is not None else env["coordinator"]
        join_timeout = args.join_timeout
        if join_timeout is None:
            join_timeout = group.join_timeout_default()
        rank_text = args.rank if args.rank is not None else os.environ.get(group.RANK_ENV)
        if rank_text is None or not str(rank_text).strip().isdigit():
            raise ValueError(f"--worker needs --rank N (N >= 1, or $MLX_RANK), got {rank_text!r}")
        rank = int(rank_text)
        if rank == 0:
            raise ValueError(worker.rank_zero_worker_message(hostfile))
        spec = group.group_spec(hostfile, backend, rank, coordinator)
    except ValueError as exc:
        logger.error("%s", exc)
        logging.shutdown()
        os._exit(2)
    fmt = f"%(asctime)s rank{spec.rank} %(levelname)s %(name)s: %(message)s"
    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter(fmt))
    code = worker.run_worker(spec, args.distributed_timeout, join_timeout)
    logging.shutdown()
    os._exit(code)  # a join attempt or MLX's threads may still sit in native code


def _join_on_load(args: argparse.Namespace, metrics: metrics_mod.Recorder) -> JoinOnLoad:
    """Rank 0 of LocalAI's worker protocol (or a plain single process): the engine
    behind a ``JoinOnLoad``, which joins a group at the LoadModel that asks for one
    (load options, --hostfile, or $MLX_DISTRIBUTED_HOSTFILE when installed as
    mlx-distributed: ``distributed.worker.decide``). Exits 2 on bad arguments."""
    from distributed import group, worker

    try:
        settings, join_timeout = _start_settings(args)
        if args.rank is not None and str(args.rank).strip() != "0":
            raise ValueError(
                f"--rank {args.rank} without --worker: ranks other than 0 are workers "
                "(add --worker); rank 0 serves gRPC"
            )
        if settings.hostfile:  # started with a hostfile: check it now, not at LoadModel
            group.group_spec(
                settings.hostfile,
                settings.backend or settings.env_backend,
                0,
                settings.coordinator,
            )
    except ValueError as exc:
        logger.error("%s", exc)
        raise SystemExit(2) from None
    if settings.hostfile:
        logger.info("rank 0: joins the group of --hostfile %s at LoadModel", settings.hostfile)
    elif settings.as_mlx_distributed:
        logger.info(
            "installed as %s: a LoadModel joins the group of its option hostfile, else of $%s",
            settings.installed_as,
            group.HOSTFILE_ENV,
        )
    return worker.JoinOnLoad(
        settings, args.distributed_timeout, join_timeout, Engine(metrics=metrics)
    )
