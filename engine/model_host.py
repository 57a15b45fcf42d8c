"""The engine thread's model slot: the loaded model and the scheduler running its requests.

`ModelHost` loads (the current model, when both fit, serves on while the new one is
built; the build runs here, on the engine thread, so running streams pause for it: the
file checks, download and tokenizer happen before, on a worker thread, in
`loaded_model.validate`), installs, serves and unloads models. What runs on the loaded
model (tokenize, metadata: `model_calls`; Score, Rerank, Embedding: `tasks/`) the engine
calls itself, on ``require()``. Engine thread only; other threads may read `loaded` and
`scheduler` (plain references).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from batch.release import release_cache
from caches import prompt_tiers
from caches.prompt_tiers import PromptTiers
from engine import memory, warmup
from engine.metrics import NULL, Recorder
from engine.scheduler import NO_GROUP, GroupHooks, RequestMetrics, Scheduler
from errors import BackendError, FailedPrecondition, ModelLoadError, Unavailable
from loading import loaded_model
from loading.loaded_model import LoadedModel
from params import LoadParams

logger = logging.getLogger("localai.mlx." + __name__)

# UNAVAILABLE, gRPC's retryable code: the request was fine, the server changed under it.
_REPLACED = "the model is being replaced by LoadModel; retry the request"


class ModelHost:
    """Holds at most one `LoadedModel` and the `Scheduler` running its requests.

    ``on_metrics`` receives each finished request's metrics; ``group`` is the
    distributed group's hooks (the engine sets it when the backend joins one);
    ``on_idle`` is called when the last running request ends, before its final event;
    ``metrics``: the Prometheus recorder the scheduler reports to.
    """

    def __init__(
        self,
        on_metrics: Callable[[RequestMetrics], None],
        group: GroupHooks = NO_GROUP,
        on_idle: Callable[[], None] = lambda: None,
        metrics: Recorder = NULL,
    ) -> None:
        self.loaded: LoadedModel | None = None
        self.scheduler: Scheduler | None = None
        self.group = group
        self.metrics = metrics
        self._profiles: dict[tuple, memory.MemoryProfile] = {}  # measured once per model
        self._on_metrics = on_metrics
        self._on_idle = on_idle

    # -- lifecycle
    def load(self, params: LoadParams, file_bytes: int = 0) -> None:
        """Load and serve the model ``params`` names; ``file_bytes``: its weight files' size
        (`loaded_model.validate`). Raises ModelLoadError saying whether the previous
        model was released."""
        if params.unknown_options:
            logger.warning(
                "options this backend does not know, ignored: %s",
                ", ".join(params.unknown_options),
            )
        current = self.loaded
        if current is not None and current.params == params:
            # LocalAI reloads a model it already has (e.g. after a config reload): nobody
            # running or waiting is interrupted.
            logger.info("%s is already loaded with these options; serving on", current.name)
            return
        budget = params.memory_budget
        if current is not None and budget and budget < file_bytes:
            # Refused before anything is released: the weights alone outgrow it.
            raise ModelLoadError(
                f"memory_budget {budget / memory.MIB:.0f} MiB is smaller than the weights "
                f"({file_bytes / memory.MIB:.0f} MiB on disk): raise memory_budget (or 0 to "
                f"turn it off); {current.name} serves on"
            )
        keep = current is not None and loaded_model.fits_beside(current, file_bytes)
        if current is not None and not keep:
            logger.warning(
                "releasing %s before loading the next model: both do not fit", current.name
            )
            self.unload(Unavailable(_REPLACED))
        try:
            # With room for both, the current model serves until the new one has loaded.
            new = loaded_model.load(params)
        except Exception as exc:
            reason = str(exc) if isinstance(exc, ModelLoadError) else f"{type(exc).__name__}: {exc}"
            if current is not None and not keep:
                reason += f" (the previous model, {current.name}, was released to make room)"
            raise ModelLoadError(reason) from None
        current = None  # no reference of ours may keep the previous weights alive
        # Disk tier of the prompt cache (prompt_tiers): single process only.
        fingerprint = prompt_tiers.fingerprint_of(new) if self.group.single_process else None
        self.serve(new, fingerprint=fingerprint)
        # Single process only: a group's ranks would have to run the same warm-up steps.
        if params.warmup and self.group.single_process:
            try:
                logger.info("warm-up: %.2f s", warmup.warm_up(new))
            except Exception as exc:  # a speed-up must never fail the load
                logger.warning("warm-up failed (%r); serving without it", exc)
        mx.reset_peak_memory()  # Status's mlx_peak: since this model loaded, not its loading

    def install_built(self, model: Any, tokenizer: Any, params: LoadParams) -> None:
        """Serve an already-built model and tokenizer (tests, embedding applications)."""
        self.unload(Unavailable(_REPLACED))
        self.serve(LoadedModel.build(model, tokenizer, params))

    def serve(
        self, loaded: LoadedModel, cache: PromptTiers | None = None, fingerprint: str | None = None
    ) -> None:
        """Serve ``loaded``; ``cache``: a prompt cache of one's own, else memory + disk
        tiers (``fingerprint`` None: memory only). A memory budget too small for ``loaded``
        fails before the model served now is released."""
        budget = self._memory_budget(loaded)
        self.unload(Unavailable(_REPLACED))
        if budget.budget:
            memory.apply_limits(budget.budget)
        else:
            memory.reset_limits()
        if cache is None:  # after unload: the previous model's disk tiers are closed
            cache = prompt_tiers.for_model(
                loaded, fingerprint, budget.enabled and self.group.single_process
            )
        self.scheduler = Scheduler(
            loaded, cache, self.group, self._on_metrics, self._on_idle, self.metrics, budget
        )
        self.loaded = loaded
        logger.info(
            "loaded %s: %.1f MB weights, context %s tokens, max_batch_size %d",
            loaded.name,
            loaded.weights_bytes / 1e6,
            loaded.context_len,
            loaded.params.max_batch_size,
        )

    def _memory_budget(self, loaded: LoadedModel) -> memory.MemoryBudget:
        """The memory budget of ``loaded`` (option memory_budget, else the platform
        default), its profile measured (once per model and weight mode); `serve` sets MLX's
        own limits from it. Raises ModelLoadError when the budget cannot hold the weights and one
        prefill chunk."""
        p = loaded.params
        budget = memory.default_budget() if p.memory_budget is None else p.memory_budget
        if not budget:
            return memory.MemoryBudget.off(loaded)
        key = (loaded.name, loaded.cpu_mode, p.max_kv_size)
        prof = self._profiles.get(key)
        if prof is None:
            try:
                prof = self._profiles[key] = memory.profile(loaded.model, p.prefill_step_size)
            except Exception as exc:  # a model whose cache cannot be measured: no budget
                logger.warning("memory budget off: cannot measure the model's KV (%r)", exc)
                return memory.MemoryBudget.off(loaded)
        mem = memory.MemoryBudget(
            budget, loaded.weights_bytes, prof, p.prefill_step_size, memory.cache_limit(budget)
        )
        logger.info(
            "memory budget %.0f MiB: weights %.0f MiB, MLX buffer cache up to %.0f MiB, "
            "KV %.1f KiB/token (+%.1f KiB fixed), prefill %.1f KiB/token",
            budget / memory.MIB,
            loaded.weights_bytes / memory.MIB,
            mem.cache_limit / memory.MIB,
            prof.kv_per_token / 1024,
            prof.fixed / 1024,
            prof.prefill_per_token / 1024,
        )
        return mem

    def unload(self, error: BackendError) -> None:
        """Fail every job with ``error``, drop the model and caches, release MLX memory."""
        if self.scheduler is not None:
            self.scheduler.fail_all(error)
            self.scheduler.close()
            self.scheduler.cache.close()  # flush the disk tier's writes
        had_model = self.loaded is not None
        self.scheduler = None
        self.loaded = None
        if had_model:
            gc.collect()
            release_cache()

    def free(self) -> None:
        self.unload(FailedPrecondition("the model was freed"))

    def scheduler_for(self, loaded: LoadedModel) -> Scheduler | None:
        """The scheduler running ``loaded``; None once it was replaced or freed (any
        thread: both are plain references)."""
        sched = self.scheduler
        return sched if sched is not None and sched.loaded is loaded else None

    def require(self) -> LoadedModel:
        """The loaded model; FailedPrecondition before LoadModel."""
        if self.loaded is None:
            raise FailedPrecondition("no model loaded: call LoadModel first")
        return self.loaded
