"""Image prompts on the engine thread: the vision tower, once per image; the prompt's
embeddings; the language model prefilled from them; then the same batch as text.

`VisionRunner` is one more kind of running sequence behind the scheduler's interface
(`engine.sequences`). Step by step, beside the running batch, the oldest image prompt
runs one of its images through the vision tower (only the images whose tokens the prompt
cache's hit does not hold; each image alone, its features kept by the image's digest in
`VisionParts.features`, bounded by entries and bytes), then builds the embeddings of the
tokens still to prefill (mlx-vlm's ``get_input_embeddings``, the features merged in); a
failure there fails that request only. Then each step prefills one chunk of it (the
batch's prefill budget, `engine.step_budget`, sizes it) into mlx-lm caches through the
model's `LMView`, stopping at the prompt's checkpoints
(`engine.checkpoints`: snapshots for caches that cannot be trimmed, stored under the
prompt's key ids); when all but the last prompt token are in, the sequence joins the
batch (`BatchRunner.adopt`) with its own sampler, logits processors and stops, and from
then on decodes like any text row (the job's uid becomes the batch's). Qwen2-VL is
prefilled at ``position_ids - rope_deltas``, so it decodes at its plain cache offset in
the shared batch: every relative position, and so the output, is mlx-vlm's.

All MLX here runs on the engine thread (mlx-lm's generation stream).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, cast

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache

from engine.checkpoints import Checkpoints
from engine.runner import Batch, Handover
from engine.sequence import Sequence
from engine.sequences import Token
from engine.vision_prompt import VisionPrompt
from errors import BackendError, InvalidArgument
from loading.loaded_model import LoadedModel
from prompt_cache import CacheLookup

logger = logging.getLogger("localai.mlx." + __name__)


def cache_tokens(job: Sequence, tokens: Any) -> list[int] | None:
    """The tokens ``job``'s KV is stored under in the prompt cache: as they are for text;
    for an image prompt its key ids (`VisionPrompt.key_tokens`; None: store nothing)."""
    vision = job.vision
    return [int(t) for t in tokens] if vision is None else vision.key_tokens(tokens)


# --------------------------------------------------------------------------- features
def _embed_dtype(parts: Any) -> Any:
    dtype = getattr(parts, "_embed_dtype", None)
    if dtype is None:
        lm = parts.model.language_model
        dtype = lm.model.embed_tokens(mx.array([[0]])).dtype
        parts._embed_dtype = dtype
    return dtype


def _tower(parts: Any, vision: Any, i: int) -> mx.array:
    """Image ``i``'s features through the vision tower alone (the family's own call, as
    its ``get_input_embeddings`` makes it)."""
    model = parts.model
    pixels = mx.array(vision.pixels[i])
    if parts.family.tower == "qwen":
        grid = mx.array(vision.image_extra[i]["image_grid_thw"])
        dtype = model.vision_tower.patch_embed.proj.weight.dtype
        out = model.vision_tower(pixels.astype(dtype), grid, output_hidden_states=False)
        return cast(mx.array, out)
    if parts.family.tower == "gemma3":
        hidden, _, _ = model.vision_tower(
            pixels.transpose(0, 2, 3, 1).astype(_embed_dtype(parts)), output_hidden_states=True
        )
        return cast(mx.array, model.multi_modal_projector(hidden))
    raise TypeError(f"no per-image vision tower for {parts.model_type}")


def image_features(parts: Any, vision: Any, i: int) -> tuple[mx.array, bool]:
    """Image ``i``'s vision features, and whether the tower ran for them: from the
    feature cache, else the tower (then kept while the bounds allow, least recently used
    evicted first)."""
    digest = vision.digests[i]
    cache = parts.features
    hit = cache.get(digest)
    if hit is not None:
        cache.move_to_end(digest)
        parts.feature_hits += 1
        return hit, False
    parts.feature_misses += 1
    out = _tower(parts, vision, i)
    mx.eval(out)
    if parts.cache_entries > 0 and out.nbytes <= parts.cache_bytes:
        cache[digest] = out
        parts.features_nbytes += out.nbytes
        while len(cache) > parts.cache_entries or parts.features_nbytes > parts.cache_bytes:
            _, old = cache.popitem(last=False)
            parts.features_nbytes -= old.nbytes
    return out, True


def _placeholder(parts: Any, vision: Any, i: int) -> mx.array:
    """Zeros in image ``i``'s feature shape: for an image whose tokens are all cached
    (its features are merged at positions outside the slice that is prefilled)."""
    start, end = vision.spans[i]
    hidden = parts.model.language_model.model.embed_tokens(mx.array([[0]])).shape[-1]
    shape = (end - start, hidden) if parts.family.tower == "qwen" else (1, end - start, hidden)
    return mx.zeros(shape, dtype=_embed_dtype(parts))


def embeddings(
    parts: Any, vision: Any, start: int, stop: int, features: dict[int, mx.array]
) -> tuple[mx.array, Any]:
    """Input embeddings of prompt positions [start, stop) (1, n, hidden), and their mRoPE
    positions (3, 1, n) shifted by the prompt's delta (None without mRoPE).

    ``features``: the vision features of the images with tokens in [start, stop), for a
    family with a per-image tower (`image_features`); others run their tower here, on all
    of the prompt's images, when any has tokens in the range."""
    model = parts.model
    ids = mx.array([list(vision.input_ids)])
    kwargs = {k: mx.array(v) for k, v in vision.extra.items()}
    mask = mx.array(vision.attention_mask) if vision.attention_mask is not None else None
    if vision.pixels is not None:
        feats = [
            features[i] if i in features else _placeholder(parts, vision, i)
            for i in range(len(vision.spans))
        ]
        kwargs["cached_image_features"] = mx.concatenate(feats, axis=0)
    elif not vision.images_in(start, stop) and not parts.mrope:
        emb = model.language_model.model.embed_tokens(ids[:, start:stop])
        mx.eval(emb)
        return emb, None
    pixel_values = None if vision.pixel_values is None else mx.array(vision.pixel_values)
    out = model.get_input_embeddings(ids, pixel_values, mask=mask, **kwargs)
    emb = out.inputs_embeds[:, start:stop]
    positions = None
    if parts.mrope:
        delta = out.rope_deltas
        delta = int(delta.reshape(-1)[0].item()) if delta is not None else 0
        if parts.family.rope_delta and vision.cacheable and delta != vision.rope_delta:
            # The cache keys carry the predicted delta: never run with another one (a
            # prompt that is not cacheable, e.g. one with videos, has no delta in its keys).
            raise BackendError(
                f"mRoPE delta {delta} differs from the {vision.rope_delta} computed from the "
                "image grids; the request was not run"
            )
        positions = (out.position_ids - delta)[..., start:stop]
    emb = mx.contiguous(emb)
    mx.eval(emb, *([positions] if positions is not None else []))
    return emb, positions


# --------------------------------------------------------------------------- the runner
@dataclass
class _Prefill:
    job: Sequence
    vision: VisionPrompt  # the job's image prompt
    ids: list[int]  # the model's token ids (the processor's)
    kv: list
    done: int  # prompt tokens the cache holds
    stop: int  # prefill up to here: all but the last prompt token
    sampler: Any
    processors: list
    snapshots: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # images still to run the tower on
    features: dict[int, Any] = field(default_factory=dict)  # this prompt's, by image
    first: int = 0  # the prompt position of emb[:, 0]
    emb: Any = None
    positions: Any = None


class VisionRunner:
    """Image prompts, prefilled from embeddings, then handed to the batch (module doc).

    Same interface as the other runners (`engine.sequences`); uids are negative, far
    below the solo runner's. The oldest prompt advances one unit of work per step: one
    image through the vision tower, or one prefill chunk (the first after building its
    embeddings), so running streams decode a token between any two. A sequence handed to
    the batch leaves this runner: its job's uid and runner become the batch's, in the
    scheduler's active set too."""

    drafts = False

    def __init__(self, loaded: LoadedModel, batch: Batch, ckpt: Checkpoints) -> None:
        self.loaded = loaded
        self.parts = loaded.vision
        self.batch = batch
        self.checkpoints = ckpt
        self.seqs: dict[int, _Prefill] = {}
        self._last_uid = -(1 << 40)

    def proposed(self, job: Sequence) -> int:
        return 0

    @property
    def rows(self) -> int:
        return len(self.seqs)

    @property
    def nbytes(self) -> int:
        """KV, embedding and feature bytes of the prompts being prefilled."""
        total = 0
        for seq in self.seqs.values():
            total += sum(getattr(c, "nbytes", 0) for c in seq.kv)
            total += seq.emb.nbytes if seq.emb is not None else 0
            total += sum(f.nbytes for f in seq.features.values())
        return total

    def reset(self) -> None:
        self.seqs.clear()

    close = reset

    def start(
        self,
        job: Sequence,
        ids: list[int],
        lookup: CacheLookup,
        sampler: Any,
        processors: list,
        diverges: int,
    ) -> int:
        vision = job.vision
        if vision is None:
            raise BackendError("a text prompt reached the image prompts' runner")
        p = self.loaded.params
        if p.max_kv_size is not None and job.params.keep:
            raise InvalidArgument("PredictOptions.NKeep cannot be combined with images")
        kv, done = lookup.kv, lookup.cached_tokens
        if kv is not None and vision.inside_image(done):
            # Never resume inside an image's tokens (the key ids make this unlikely).
            kv, done = None, 0
            job.uncached()
        if kv is None:
            kv = self.batch.row_cache(job.params) or make_prompt_cache(
                self.loaded.model, p.max_kv_size
            )
        stop = len(ids) - 1
        snapshots: list[int] = []
        if job.params.cache_write and vision.cacheable and self.checkpoints.takes(kv):
            # Also right after each image: a new question about the same image (placed
            # first, as most families do) resumes there.
            ends = {end for _, end in vision.spans if done < end < len(ids)}
            cuts = self.checkpoints.positions(job, len(ids), diverges) | ends
            snapshots = sorted(q for q in cuts if not vision.inside_image(q))
        # Images the prompt cache does not hold: through the tower (per-image families).
        pending = vision.images_in(done, stop) if vision.pixels is not None else []
        self._last_uid -= 1
        self.seqs[self._last_uid] = _Prefill(
            job,
            vision,
            list(vision.input_ids),
            kv,
            done,
            stop,
            sampler,
            processors,
            snapshots,
            pending,
        )
        return self._last_uid

    def _chunk(self) -> int:
        budget = getattr(self.batch, "budget", None)
        if budget is not None:
            try:
                return max(1, int(budget.chunk(1, bool(self.batch.rows))))
            except Exception:  # a budget of another shape: the plain chunk
                pass
        return max(1, self.loaded.params.prefill_step_size)

    def _vision_work(self, seq: _Prefill) -> bool:
        """One image through the tower (True: that was this step's work), else the
        embeddings once every image's features are there."""
        parts, vision = self.parts, seq.vision
        while seq.pending:
            i = seq.pending.pop(0)
            seq.features[i], ran = image_features(parts, vision, i)
            if ran and seq.pending:
                return True
        if seq.emb is None and seq.done < seq.stop:
            seq.emb, seq.positions = embeddings(parts, vision, seq.done, seq.stop, seq.features)
            seq.first, seq.features = seq.done, {}
        return False

    def step(self, jobs: dict[int, Sequence]) -> list[Token]:
        """One unit of work of the oldest image prompt (class doc); a prompt whose
        prefill is done joins the batch (re-keyed in ``jobs``, the scheduler's active
        set). Produces no token itself: the batch steps the newcomer in the same
        iteration. A failure in the vision part ends that request alone."""
        if not self.seqs:
            return []
        uid = next(iter(self.seqs))
        seq = self.seqs[uid]
        job = jobs.get(uid)
        if job is None:  # ended meanwhile without being released
            del self.seqs[uid]
            return []
        try:
            with mx.stream(generation_stream):
                if self._vision_work(seq):
                    return []
        except Exception as exc:  # this request's images only: the others go on
            del self.seqs[uid]
            if not isinstance(exc, BackendError):
                logger.exception("vision tower failed for request %s", job.params.correlation_id)
                exc = BackendError(
                    "the vision tower failed on this request's images: "
                    f"{type(exc).__name__}: {str(exc)[:300]}"
                )
            return [Token(uid, None, error=exc)]
        if seq.done < seq.stop:
            end = min(seq.done + self._chunk(), seq.stop)
            end = min([end, *(q for q in seq.snapshots if q > seq.done)])
            a, b = seq.done - seq.first, end - seq.first
            with mx.stream(generation_stream):
                self.loaded.model(
                    mx.array([seq.ids[seq.done : end]]),
                    cache=seq.kv,
                    input_embeddings=seq.emb[:, a:b],
                    position_ids=None if seq.positions is None else seq.positions[..., a:b],
                )
                mx.eval([c.state for c in seq.kv])
            seq.done = end
            if end in seq.snapshots:
                self.checkpoints.store(job, list(seq.vision.key_ids[:end]), seq.kv)
            if seq.done < seq.stop:
                return []
        del self.seqs[uid]
        new = self.batch.adopt(
            job, seq.kv, seq.ids[: seq.stop], seq.ids[seq.stop], seq.sampler, seq.processors
        )
        jobs[new] = jobs.pop(uid)
        job.running(self.batch, new)
        return []

    def mirror_step(self) -> dict[int, Handover]:
        return {}  # vision models are served text-only in distributed mode

    def release(self, job: Sequence) -> Handover | None:
        """A prompt left while prefilling: (kv, the tokens it holds) for the prompt cache
        (`cache_tokens` refuses a prefix that ends inside an image)."""
        seq = self.seqs.pop(job.uid, None) if job.uid is not None else None
        if seq is None or seq.done == 0:
            return None
        return seq.kv, seq.ids[: seq.done]

    def drop(self, job: Sequence) -> None:
        if job.uid is not None:
            self.seqs.pop(job.uid, None)
