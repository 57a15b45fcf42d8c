"""Splitting one model over the ranks of a group, and loading each rank's part.

How a model is split: tensor parallel through the model's own ``shard(group)`` (plus,
for a few architectures, the vocabulary rows of the embedding and output head:
``shard_vocab``), or pipeline through ``model.model.pipeline(group)``; ``check_split``
says why a model cannot be split before any weight is read.

How each rank loads its part (``load``, over the group's ``Collectives``): through the one loader,
``loading.loaded_model.load``, with ``ShardStep`` as its split step, the only
difference from a single process. The loader builds the model lazily; the step checks
the split, keeps this rank's part and prepares it for the CPU in the weight mode rank 0
chose; the loader then applies what it applies to every model (adapter fusing, the
fused CPU weights of ``cpu_fuse``, the parser hints) and describes it. The ranks agree
twice: after the check (a refusal anywhere keeps the current model everywhere, as in a
single process) and at the end (a failure anywhere drops the new model everywhere).
Every rank passes through every collective whatever fails where, so none is left
waiting in one.
"""

from __future__ import annotations

import gc
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers import distributed as dist_layers
from mlx.utils import tree_unflatten

from batch.release import release_cache
from errors import ModelLoadError, Unavailable
from loading import cpu_fast_path, loaded_model
from loading.loaded_model import LoadedModel
from params import LoadParams

if TYPE_CHECKING:
    from distributed.collectives import Collectives

logger = logging.getLogger("localai.mlx.distributed")

MODES = ("tensor", "pipeline")
# Architectures whose code only calls embed_tokens(ids), embed_tokens.as_linear(h) and
# lm_head(h), so their vocabulary can be split too (see shard_vocab).
VOCAB_SPLIT_ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
_CPU_MODES = ("", "dense", "quantized")  # codes of the CPU weight mode rank 0 shares


# ---------------------------------------------------------------------- loading a part
class _RankZeroFailed(Exception):
    """A follower's load ends because rank 0's failed (rank 0 reports its own reason)."""


class ShardStep:
    """The split step of ``loaded_model.load`` on one rank: called with the lazily built
    model, returns its CPU weight mode ("dense" or "quantized") after keeping this
    rank's part in ``mode`` and preparing it as rank 0 chose.

    ``release`` drops the model currently served (once the split is agreed on).
    Raises ModelLoadError: on every rank alike when a rank refused the split.
    """

    def __init__(
        self,
        net: Collectives,
        params: LoadParams,
        mode: str,
        release: Callable[[], None],
    ) -> None:
        self.net = net
        self.params = params
        self.mode = mode
        self.release = release
        self.stage = 0  # collectives passed: 1 the split is agreed on, 2 CPU mode shared

    def __call__(self, model: nn.Module) -> str:
        c = self.net
        error = ""
        try:
            check_split(model, self.mode, c.size)
        except Exception as exc:
            error = describe(exc)
        self.agree_split(error)
        cpu_mode = ""
        try:
            self.release()
            split(model, self.mode, c.group, vocab=self.params.distributed_vocab)
            if c.leader:
                p = self.params
                cpu_mode = _prepare(model, p.cpu_dequantize, p.cpu_dequantize_budget)
        except Exception as exc:
            error = describe(exc)
        cpu_mode = self.share_cpu_mode(cpu_mode if not error else "")
        if error:
            raise ModelLoadError(error)
        if not cpu_mode:
            raise _RankZeroFailed
        if not c.leader:
            # Rank 0 chose dense or quantized weights; every rank must compute the same
            # way (each rank measuring its own BLAS would disagree on a busy machine).
            _prepare(model, cpu_mode == "dense", None)
        return cpu_mode

    def agree_split(self, error: str) -> None:
        """First agreement: every rank could build the model and split it."""
        self.stage = 1
        self.net.agree(error, 0)

    def share_cpu_mode(self, cpu_mode: str) -> str:
        """Rank 0's CPU weight mode on every rank ("" when rank 0 failed)."""
        self.stage = 2
        mine = _CPU_MODES.index(cpu_mode) if self.net.leader else 0
        return _CPU_MODES[self.net.broadcast_int(mine)]

    def finish(self, error: str) -> None:
        """The collectives a rank whose load failed (``error``) has not reached yet."""
        if self.stage == 0:
            self.agree_split(error)  # raises on every rank: nobody replaced its model
        if self.stage == 1:
            self.share_cpu_mode("")


def load(
    net: Collectives, params: LoadParams, mode: str, release: Callable[[], None]
) -> tuple[LoadedModel, list[int]]:
    """Every rank: this rank's part of the model ``params`` names, split in ``mode``
    ("tensor" or "pipeline") and loaded by the one loader with ``ShardStep``; and the
    weight bytes of every rank's part.

    ``release`` drops the current model once every rank could split the new one.
    Raises ``ModelLoadError`` naming the reason (and the ranks, when they differ); a
    refused split leaves the current model serving on every rank.
    """
    step = ShardStep(net, params, mode, release)
    loaded: LoadedModel | None = None
    error = ""
    try:
        if params.draft_model:
            raise ValueError("DraftModel (speculative decoding) is not supported distributed")
        if params.lora_adapter:
            raise ValueError("LoraAdapter is not supported in distributed mode")
        loaded_model.validate(params)
        loaded = loaded_model.load(params, split=step)
    except Unavailable:
        raise  # the group is lost (GroupLost): no agreement can follow
    except _RankZeroFailed:
        pass  # rank 0's error is the one reported
    except ModelLoadError as exc:
        if step.stage == 1:
            raise  # the split was refused: every rank raises here, the old model stays
        error = describe(exc)
    except Exception as exc:
        error = describe(exc)
    step.finish(error)
    if loaded is None:
        gc.collect()
        release_cache()
    weights = loaded.weights_bytes if loaded is not None else 0
    results = net.agree(error, weights)  # on failure every rank drops its part
    # agree raised unless every rank loaded its part (an empty error is a loaded model).
    assert loaded is not None
    return loaded, [w for _, w in results]


def _prepare(model: nn.Module, dequantize: bool | str | None, budget: int | None) -> str:
    """Prepare a split model for the CPU as a single process does; evaluate it.

    Returns the CPU weight mode ("dense" or "quantized"; see cpu_fast_path).
    """
    cpu_mode = cpu_fast_path.prepare_for_cpu(model, dequantize, budget)
    if cpu_mode == "dense":
        # mlx-lm's dequantize_model skips the sharded quantized layers: do those here.
        _dequantize_sharded(model)
    mx.eval(model.parameters())
    return cpu_mode


def describe(exc: BaseException) -> str:
    """An exception as one line for a load failure (the type when the text says little)."""
    text = str(exc)
    return text if text and not isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------- model splitting
def split(model: nn.Module, mode: str, group: mx.distributed.Group, vocab: bool = True) -> None:
    """Keep this rank's part of ``model`` in place: ``mode`` "tensor" (the model's
    ``shard()``, and with ``vocab`` the vocabulary rows where supported) or "pipeline"."""
    if mode == "tensor":
        model.shard(group)
        if vocab:
            shard_vocab(model, group)
    else:
        model.model.pipeline(group)


def check_split(model: nn.Module, mode: str, size: int) -> None:
    """Raise ValueError naming the reason when ``model`` cannot be split over ``size``
    ranks in ``mode`` ("tensor": the model's ``shard()`` with head counts divisible by
    ``size``; "pipeline": ``model.model.pipeline()`` with at least ``size`` layers)."""
    arch = _architecture(model)
    if mode == "tensor":
        if not hasattr(model, "shard"):
            hint = " (it supports --distributed pipeline)" if _can_pipeline(model) else ""
            raise ValueError(
                f"the {arch} architecture has no tensor-parallel split in mlx-lm (no shard()){hint}"
            )
        heads = _head_counts(model)
        if any(count % size for _, count in heads):
            common = math.gcd(*(count for _, count in heads))
            sizes = [d for d in range(2, common + 1) if common % d == 0]
            raise ValueError(
                f"the {arch} model's {' and '.join(f'{v} {k}' for k, v in heads)} cannot "
                f"be split evenly over {size} ranks; group sizes that work: "
                f"{', '.join(map(str, sizes)) or 'none'} (or --distributed pipeline, where "
                "the architecture supports it)"
            )
    elif mode == "pipeline":
        if not _can_pipeline(model):
            raise ValueError(
                f"the {arch} architecture has no pipeline split in mlx-lm (no "
                "model.pipeline()); use --distributed tensor"
            )
        layers = len(model.model.layers)
        if layers < size:
            raise ValueError(f"the {arch} model has {layers} layers, fewer than {size} ranks")
    else:
        raise ValueError(f"distributed mode must be one of {', '.join(MODES)}, got {mode!r}")


def _architecture(model: nn.Module) -> str:
    args = getattr(model, "args", None)
    return getattr(args, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1]


def _can_pipeline(model: nn.Module) -> bool:
    return hasattr(getattr(model, "model", None), "pipeline")


def _head_counts(model: nn.Module) -> list[tuple[str, int]]:
    """(name, count) of the attention and KV head counts in the model's config."""
    args = getattr(model, "args", None)
    names = {
        "attention heads": ("num_attention_heads", "n_heads"),
        "KV heads": ("num_key_value_heads", "n_kv_heads"),
    }
    out = []
    for label, keys in names.items():
        for key in keys:
            value = getattr(args, key, None)
            if isinstance(value, int) and value > 0:
                out.append((label, value))
                break
    return out


class VocabParallelEmbedding(nn.Module):
    """One rank's rows of a token embedding (and of a tied or separate output head).

    Each rank holds ``ceil(vocab / size)`` rows (the last padded with zeros).
    ``__call__`` looks up the ids this rank holds and sums the group's results (every
    id lives on exactly one rank, so the sum is exact); ``as_linear`` (or calling it as
    a head) scores this rank's slice of the vocabulary and gathers the slices.
    """

    def __init__(
        self, inner: nn.Module, vocab: int, group: mx.distributed.Group, head: bool = False
    ) -> None:
        super().__init__()
        self.inner = inner  # an Embedding/QuantizedEmbedding or Linear/QuantizedLinear
        self.vocab = vocab
        self.rows = -(-vocab // group.size())
        self.start = group.rank() * self.rows
        self.group = group
        self.head = head

    def __call__(self, x: mx.array) -> mx.array:
        if self.head:
            return self.as_linear(x)
        local = x - self.start
        inside = (local >= 0) & (local < self.rows)
        h = self.inner(mx.where(inside, local, 0))
        h = mx.where(inside[..., None], h, mx.zeros_like(h))
        return mx.distributed.all_sum(h, group=self.group)

    def as_linear(self, x: mx.array) -> mx.array:
        part = self.inner(x) if self.head else self.inner.as_linear(x)
        # all_gather stacks along the first axis: bring the vocabulary axis there.
        full = mx.distributed.all_gather(mx.moveaxis(part, -1, 0), group=self.group)
        return mx.moveaxis(full, 0, -1)[..., : self.vocab]


def shard_vocab(model: nn.Module, group: mx.distributed.Group) -> bool:
    """Split the token embedding (and an untied output head) of ``model`` by vocabulary
    rows over ``group``, in place; returns False (and leaves the model alone) for
    architectures not in ``VOCAB_SPLIT_ARCHITECTURES`` or of another shape.

    Tensor parallelism (``shard()``) splits the layers but keeps the embedding whole on
    every rank; for small models with large vocabularies that is a large share.
    """
    body = getattr(model, "model", None)
    embed = getattr(body, "embed_tokens", None)
    if _architecture(model) not in VOCAB_SPLIT_ARCHITECTURES or body is None or embed is None:
        return False
    vocab = int(embed.weight.shape[0])
    body.embed_tokens = VocabParallelEmbedding(_rows(embed, vocab, group), vocab, group)
    head = getattr(model, "lm_head", None) if "lm_head" in model else None
    if head is not None:
        model.lm_head = VocabParallelEmbedding(_rows(head, vocab, group), vocab, group, head=True)
    return True


def _rows(module: nn.Module, vocab: int, group: mx.distributed.Group) -> nn.Module:
    """``module`` (embedding or linear, maybe quantized) keeping this rank's vocab rows."""
    rows = -(-vocab // group.size())
    start = group.rank() * rows
    stop = min(start + rows, vocab)

    def take(a: mx.array) -> mx.array:
        part = a[start:stop]
        if stop - start < rows:  # the last rank: pad to the common row count
            pad = mx.zeros((rows - (stop - start), *a.shape[1:]), dtype=a.dtype)
            part = mx.concatenate([part, pad])
        return mx.contiguous(part)

    for key in ("weight", "scales", "biases", "bias"):
        if key in module and isinstance(module[key], mx.array):
            module[key] = take(module[key])
    if hasattr(module, "num_embeddings"):  # QuantizedEmbedding keeps its row count
        module.num_embeddings = rows
    return module


def _dequantize_sharded(model: nn.Module) -> int:
    """Replace sharded quantized linears by dense float32 ones; returns how many."""
    replaced = []
    for name, m in model.named_modules():
        if not isinstance(
            m, (dist_layers.QuantizedAllToShardedLinear, dist_layers.QuantizedShardedToAllLinear)
        ):
            continue
        weight = mx.dequantize(
            m.weight, m.scales, m.biases, m.group_size, m.bits, mode=m.mode
        ).astype(mx.float32)
        out_dims, in_dims = weight.shape  # this rank's shard
        n = m.group.size()
        layer: dist_layers.AllToShardedLinear | dist_layers.ShardedToAllLinear
        if isinstance(m, dist_layers.QuantizedAllToShardedLinear):  # outputs are split
            layer = dist_layers.AllToShardedLinear(in_dims, out_dims * n, "bias" in m, m.group)
        else:  # inputs are split
            layer = dist_layers.ShardedToAllLinear(in_dims * n, out_dims, "bias" in m, m.group)
        layer.weight = weight
        if "bias" in m:
            layer.bias = m.bias.astype(mx.float32)
        replaced.append((name, layer))
    if replaced:
        model.update_modules(tree_unflatten(replaced))
    return len(replaced)
