"""The engine thread's model slot: the loaded model, its scheduler, and what runs on them.

`ModelHost` loads (keeping the current model serving while the new one loads when both
fit), installs, serves and unloads models, and runs the operations on the loaded model
(tokenize, metadata, Score, Embedding: `model_calls.py`). Engine thread only; other
threads may read `loaded` and `scheduler` (plain references).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from caches import prompt_tiers
from engine import model_calls
from engine.scheduler import NO_GROUP, GroupHooks, RequestMetrics, Scheduler
from errors import BackendError, FailedPrecondition, ModelLoadError
from loading import loaded_model
from loading.loaded_model import LoadedModel
from params import LoadParams
from prompt_cache import PromptCache

logger = logging.getLogger("localai.mlx." + __name__)

_REPLACED = "the model is being replaced; retry the request"


class ModelHost:
    """Holds at most one `LoadedModel` and the `Scheduler` running its requests.

    ``on_metrics`` receives each finished request's metrics; ``group`` is the
    distributed group's hooks (the engine sets it when the backend joins one);
    ``on_idle`` is called when the last running request ends, before its final event.
    """

    def __init__(
        self,
        on_metrics: Callable[[RequestMetrics], None],
        group: GroupHooks = NO_GROUP,
        on_idle: Callable[[], None] = lambda: None,
    ) -> None:
        self.loaded: LoadedModel | None = None
        self.scheduler: Scheduler | None = None
        self.group = group
        self._on_metrics = on_metrics
        self._on_idle = on_idle

    # -- lifecycle
    def load(self, params: LoadParams, file_bytes: int = 0) -> None:
        """Load and serve the model ``params`` names; ``file_bytes``: its weight files' size
        (`loaded_model.validate`). Raises ModelLoadError saying whether the previous
        model was released."""
        current = self.loaded
        keep = current is not None and loaded_model.fits_beside(current, file_bytes)
        if current is not None and not keep:
            logger.warning(
                "releasing %s before loading the next model: both do not fit", current.name
            )
            self.unload(FailedPrecondition(_REPLACED))
        try:
            # With room for both, the current model serves until the new one has loaded.
            new = loaded_model.load(params)
        except Exception as exc:
            reason = str(exc) if isinstance(exc, ModelLoadError) else f"{type(exc).__name__}: {exc}"
            if current is not None and not keep:
                reason += f" (the previous model, {current.name}, was released to make room)"
            raise ModelLoadError(reason) from None
        # Disk tier of the prompt cache (prompt_tiers): single process only.
        fingerprint = prompt_tiers.fingerprint_of(new) if self.group is NO_GROUP else None
        self.serve(new, fingerprint=fingerprint)

    def install_built(self, model: Any, tokenizer: Any, params: LoadParams) -> None:
        """Serve an already-built model and tokenizer (tests, embedding applications)."""
        self.unload(FailedPrecondition(_REPLACED))
        self.serve(LoadedModel.build(model, tokenizer, params))

    def serve(
        self, loaded: LoadedModel, cache: PromptCache | None = None, fingerprint: str | None = None
    ) -> None:
        """Serve ``loaded``; ``cache``: a prompt cache of one's own, else memory + disk
        tiers (``fingerprint`` None: memory only)."""
        self.unload(FailedPrecondition(_REPLACED))
        if cache is None:  # after unload: the previous model's disk tiers are closed
            cache = prompt_tiers.for_model(loaded, fingerprint)
        self.scheduler = Scheduler(loaded, cache, self.group, self._on_metrics, self._on_idle)
        self.loaded = loaded
        logger.info(
            "loaded %s: %.1f MB weights, context %s tokens, max_batch_size %d",
            loaded.name,
            loaded.weights_bytes / 1e6,
            loaded.context_len,
            loaded.params.max_batch_size,
        )

    def unload(self, error: BackendError) -> None:
        """Fail every job with ``error``, drop the model and caches, release MLX memory."""
        if self.scheduler is not None:
            self.scheduler.fail_all(error)
            self.scheduler.close()
            prompt_tiers.close(self.scheduler.cache)  # flush the disk tier's writes
        had_model = self.loaded is not None
        self.scheduler = None
        self.loaded = None
        if had_model:
            gc.collect()
            mx.clear_cache()

    def free(self) -> None:
        self.unload(FailedPrecondition("the model was freed"))

    # -- operations on the loaded model
    def require(self) -> LoadedModel:
        """The loaded model; FailedPrecondition before LoadModel."""
        if self.loaded is None:
            raise FailedPrecondition("no model loaded: call LoadModel first")
        return self.loaded

    def tokenize(self, text: str) -> list[int]:
        return model_calls.tokenize(self.require(), text)

    def detokenize(self, ids: list[int]) -> str:
        return model_calls.detokenize(self.require(), ids)

    def metadata(self) -> model_calls.ModelMetadata:
        return model_calls.metadata(self.require())

    def score(
        self,
        prompt: str,
        candidates: list[str],
        include: bool,
        stable_prefix_len: int = 0,
        should_stop: Callable[[], bool] | None = None,
    ) -> list:
        loaded = self.require()
        cache = self.scheduler.cache if self.scheduler is not None else None
        return model_calls.score(
            loaded, cache, prompt, candidates, include, should_stop, stable_prefix_len
        )

    def embed(self, text: str, token_ids: list[int], should_stop: Callable[[], bool] | None = None):
        return model_calls.embed(self.require(), text, token_ids, should_stop)
