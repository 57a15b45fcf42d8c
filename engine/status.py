"""What Status, GetMetrics and the Prometheus gauges report about an engine.

Each function takes ``EngineFacts``, the values it reads, which the engine takes from any
thread without waiting for the engine thread (``Engine.facts``: plain attributes, counts
taken under its count lock, the MLX memory reading the engine thread last took); this
module never imports the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import mlx.core as mx

from caches import prompt_tiers
from params import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_QUEUE

if TYPE_CHECKING:
    from engine.metrics import Recorder
    from engine.scheduler import GroupHooks, Scheduler
    from loading.loaded_model import LoadedModel


@dataclass(frozen=True)
class EngineFacts:
    """What this module reads of an engine, taken at one moment (``Engine.facts``)."""

    scheduler: Scheduler | None
    loaded: LoadedModel | None
    group: GroupHooks
    alive: bool  # the engine thread runs and was not stopped
    running: int  # requests in the batch or solo (taken under the engine's count lock)
    waiting: int  # requests queued: in the scheduler and not yet seen by the engine thread
    mlx_memory: Mapping[str, int]  # the engine thread's last reading (``mlx_memory``)
    draft_tokens_accepted: int  # of the last finished request


@dataclass(frozen=True)
class StatusSnapshot:
    """What Status reports: state name, request counts, memory in bytes."""

    state: str  # UNINITIALIZED | BUSY | READY | ERROR
    running: int
    waiting: int
    memory: dict[str, int] = field(default_factory=dict)


def snapshot(engine: EngineFacts) -> StatusSnapshot:
    """What Status reports of ``engine``.

    MLX memory figures come from the engine thread's last reading (taken after every
    operation and, while busy, every ``MEMORY_SNAPSHOT_INTERVAL`` seconds).
    """
    sched = engine.scheduler
    running, waiting = engine.running, engine.waiting
    if engine.group.failed:
        state = "ERROR"
    elif engine.loaded is None:
        state = "UNINITIALIZED"
    elif not engine.alive:
        state = "ERROR"
    else:
        state = "BUSY" if running or waiting else "READY"
    loaded = engine.loaded
    memory = {
        "weights": loaded.weights_bytes if loaded is not None else 0,
        "kv_active": sched.kv_bytes if sched is not None else 0,
        "prompt_cache": sched.cache.nbytes if sched is not None else 0,
        **prompt_tiers.disk_memory(sched.cache if sched is not None else None),
        # the part of prompt_cache held by prefill snapshots (checkpoints)
        "prompt_cache_checkpoints": sched.cache.checkpoint_nbytes if sched is not None else 0,
        # vision models: the vision-tower outputs kept by image (engine.vision)
        **({"vision_cache": loaded.vision.features_nbytes} if loaded and loaded.vision else {}),
        # memory_budget, memory_reserved (KV of running sequences), memory_free
        **(sched.memory.status() if sched is not None else {}),
        # preemptions, preemption_resumes, preemption_bytes_to/from_cache (since load)
        **(sched.preemption.status() if sched is not None else {}),
        **engine.mlx_memory,
        **engine.group.memory(),  # distributed: group_size, weights_rank_<i>
    }
    return StatusSnapshot(state, running, waiting, memory)


def info(engine: EngineFacts) -> dict:
    """Engine facts for operators (GetMetrics): model, CPU weight mode, BLAS, batch, cache."""
    snap = snapshot(engine)
    sched = engine.scheduler
    stats = sched.cache.stats() if sched is not None else None
    loaded = engine.loaded
    p = loaded.params if loaded is not None else None
    return {
        "model": loaded.name if loaded is not None else "",
        "state": snap.state,
        "requests_running": snap.running,
        "requests_waiting": snap.waiting,
        "max_batch_size": p.max_batch_size if p else DEFAULT_MAX_BATCH_SIZE,
        "max_queue": p.max_queue if p else DEFAULT_MAX_QUEUE,
        "cpu_mode": loaded.cpu_mode if loaded is not None else "",
        "kv_bits": p.kv_bits if p else None,
        "draft_model": bool(loaded is not None and loaded.draft is not None),
        "speculative": (p.speculative or ("draft" if p.draft_model else "")) if p else "",
        "last_request_draft_tokens_accepted": engine.draft_tokens_accepted,
        "blas": loaded.blas if loaded is not None else None,
        "vision_cache": loaded.vision.cache_info() if loaded and loaded.vision else None,
        "prompt_cache": (
            dict(dataclasses.asdict(stats), disk=prompt_tiers.disk_info(sched.cache))
            if sched is not None and stats is not None
            else None
        ),
        "distributed": engine.group.info(),
    }


def push_gauges(engine: EngineFacts, metrics: Recorder) -> None:
    """Status's figures to the Prometheus gauges of ``metrics`` (the endpoint never asks
    the engine)."""
    snap = snapshot(engine)
    mem = snap.memory
    metrics.set_load(snap.running, snap.waiting)
    metrics.set_memory(
        weights=mem["weights"],
        kv=mem["kv_active"],
        prompt_cache=mem["prompt_cache"],
        prompt_cache_disk=mem.get("prompt_cache_disk", 0),
        mlx_active=mem["mlx_active"],
        mlx_peak=mem["mlx_peak"],
        mlx_cache=mem["mlx_cache"],
        budget=mem.get("memory_budget", 0),
        reserved=mem.get("memory_reserved", 0),
    )
    sched = engine.scheduler
    if sched is not None:
        metrics.cache_totals("memory", evictions=sched.cache.stats().evictions)
        disk = prompt_tiers.disk_info(sched.cache)
        evicted = sum(d.get("evictions", 0) for d in disk.values())
        metrics.cache_totals("disk", evictions=evicted)


def mlx_memory() -> dict[str, int]:
    return {
        "mlx_active": mx.get_active_memory(),
        "mlx_peak": mx.get_peak_memory(),
        "mlx_cache": mx.get_cache_memory(),
    }
