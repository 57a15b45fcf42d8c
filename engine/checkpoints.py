"""Prefill checkpoints: snapshots of a prompt's KV at chosen positions, for models whose
cache cannot be trimmed back to a shared prefix.

A model with sliding-window layers past their window, or with recurrent/SSM state, can
only reuse a stored entry that is a strict prefix of the new prompt. For those, a
newcomer's prefill is snapshot at its checkpoint positions (the chat boundary before the
last user message, the prompt minus one token, where it diverges from a stored prompt,
every `prompt_checkpoint_interval` tokens) and each snapshot is stored in the prompt cache
under exactly the tokens it holds. Batched sequences are snapshot where mlx-lm's batch
prefill stops at a segment end (`Checkpoints.store_extracted`); solo sequences prefill to
each checkpoint before their generator starts (`Checkpoints.prefill`).

Whether a sequence takes checkpoints is decided here only (`Checkpoints.takes`): never in
distributed mode (every rank must run identical prefill chunks, and the followers do not
know the leader's cache contents), never with a draft model's layers or a KV quantized
while prefilling (the snapshot would differ from what a cold run computes).
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from caches.prompt_tiers import PromptTiers
from engine.sequence import Sequence
from loading.loaded_model import LoadedModel
from prompt_cache import needs_checkpoints

logger = logging.getLogger("localai.mlx." + __name__)

# A new prompt sharing at least this many leading tokens with a stored entry gets a
# snapshot where it diverges (a third prompt with that start reuses it); shorter shared
# starts are not worth a snapshot's memory.
MIN_DIVERGENCE_CHECKPOINT = 32


def split(ids: list[int], start: int, cuts: frozenset[int]) -> list[list[int]]:
    """``ids[start:]`` cut at the positions ``cuts`` (absolute; those in (start, len))."""
    bounds = [start, *sorted(c for c in cuts if start < c < len(ids)), len(ids)]
    return [ids[a:b] for a, b in itertools.pairwise(bounds)]


class Checkpoints:
    """The checkpoint policy and snapshots of one loaded model's scheduler.

    ``single_process``: False in a distributed group (no checkpoints there). ``batched``:
    whether batched sequences take checkpoints (their cache, as the batch makes it, cannot
    be trimmed). ``wants_boundaries``: whether jobs should come with their chat boundary
    (`Engine.submit`): for batched checkpoints, and for a rotating cache with NKeep, which
    solo runs make for any model.
    """

    def __init__(self, loaded: LoadedModel, cache: PromptTiers, single_process: bool) -> None:
        self.loaded = loaded
        self.cache = cache
        self.single_process = single_process
        p = loaded.params
        kv = make_prompt_cache(loaded.model, p.max_kv_size)
        self.batched = self.takes(kv, draft=loaded.draft)
        self.wants_boundaries = self.batched or (single_process and p.max_kv_size is not None)

    def takes(self, kv: list, *, draft: Any = None, kv_bits: int | None = None) -> bool:
        """Whether a sequence with cache layers ``kv`` (plus a draft model's, or quantized
        to ``kv_bits`` while prefilling) takes prefill checkpoints: the one decision."""
        return self.single_process and draft is None and kv_bits is None and needs_checkpoints(kv)

    def positions(self, job: Sequence, n: int, diverges: int = 0) -> frozenset[int]:
        """Token positions where ``job``'s prefill (of an ``n``-token prompt) is snapshot:
        the job's own (the chat boundary), ``n - 1`` (an exact repeat then prefills one
        token), every ``prompt_checkpoint_interval`` tokens, and ``diverges`` (where it
        leaves a stored prompt) when at least MIN_DIVERGENCE_CHECKPOINT. Only positions
        after the cache hit and before the last token are kept."""
        positions = {*job.checkpoints, n - 1}
        interval = self.loaded.params.prompt_checkpoint_interval
        if interval > 0:
            positions.update(range(interval, n - 1, interval))
        if diverges >= MIN_DIVERGENCE_CHECKPOINT:
            positions.add(diverges)
        return frozenset(p for p in positions if job.cached_tokens < p < n)

    def prefill(self, job: Sequence, ids: list[int], kv: list, done: int, diverges: int) -> int:
        """A solo sequence's prefill up to its last checkpoint, in chunks of at most
        prefill_step_size tokens stopping at each checkpoint, where ``kv`` (holding
        ``ids[:done]``) is snapshot into the prompt cache. Returns the tokens ``kv``
        then holds. Runs at once, as the solo generator's own prefill would."""
        step = self.loaded.params.prefill_step_size
        for pos in sorted(self.positions(job, len(ids), diverges)):
            while done < pos:
                end = min(pos, done + step)
                self.loaded.model(mx.array([ids[done:end]], dtype=mx.uint32), cache=kv)
                mx.eval([c.state for c in kv])
                done = end
            self.store(job, ids[:pos], kv)
        return done

    def store_extracted(self, extracted: dict[int, tuple], jobs: dict[int, Sequence]) -> None:
        """Store the prefill state of batch sequences, each just stopped at a segment
        boundary (``extracted``: uid -> (kv, tokens), from mlx-lm's ``extract_cache``),
        when that boundary is one of its job's checkpoints."""
        for uid, (kv, tokens) in extracted.items():
            job = jobs.get(uid)
            tokens = list(tokens)  # the batch keeps appending to its own list
            if job is not None and len(tokens) in job.snapshots:
                self.store(job, tokens, kv)

    def store(self, job: Sequence, tokens: list[int], kv: list) -> None:
        """Insert one snapshot; one that is not exact is dropped with a warning."""
        try:
            self.cache.insert(
                self.loaded.cache_key,
                tokens,
                kv,
                job.params.prompt_cache_dir,
                checkpoint=True,
            )
        except ValueError as exc:  # never serve a snapshot that is not exact
            logger.warning("prefill snapshot of request %s dropped: %s", job.uid, exc)
