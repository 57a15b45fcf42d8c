"""The loaded model: one frozen record of everything a load decided, and the loader.

`LoadedModel` holds the model, tokenizer and draft model with the facts the scheduler and
the servicer need (context length, KV settings, limits, weight bytes, CPU weight mode,
identity). `load` builds it, in a single process and on every rank of a distributed
group alike: there the group's split step (`distributed/sharding.py`) replaces the CPU
preparation, the only difference. Runs on the engine thread (it calls MLX).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

from decoding import grammar, parsers
from errors import ModelLoadError
from loading import cpu_attention, cpu_fast_path, cpu_fuse, model_loader, vision
from params import LoadParams
from seam.arrays import flat_arrays

if TYPE_CHECKING:
    import mlx.nn as nn
    from mlx_lm.tokenizer_utils import TokenizerWrapper

logger = logging.getLogger("localai.mlx." + __name__)

_serials = itertools.count(1)


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to serve. Treat every field as read-only.

    ``context_len`` in tokens (None = unknown); ``weights_bytes`` in bytes;
    ``max_token_chars``: characters of the longest vocabulary entry (bounds how many
    characters a prompt of ``context_len`` tokens can have); ``cpu_mode`` "dense",
    "quantized" or "" off the CPU; ``blas``: which BLAS the CPU matmuls use (None off
    the CPU); ``serial``: unique per load, so work prepared for one model is never run
    on the next; ``cache_key``: the prompt cache's model key.
    """

    model: nn.Module
    tokenizer: TokenizerWrapper
    params: LoadParams
    draft: nn.Module | None
    context_len: int | None
    weights_bytes: int
    max_token_chars: int
    cpu_mode: str
    blas: dict | None
    serial: int

    @property
    def name(self) -> str:
        return self.params.model or self.params.model_file

    @property
    def identity(self) -> str:
        """What LocalAI records as the model's identity: ModelOptions.Model alone."""
        return self.params.model

    @property
    def vision(self) -> Any:
        """The vision part (`loading.vision.VisionParts`) of a vision-language model served
        with images; None for a text model (or one loaded text-only)."""
        return getattr(self.model, "vision", None)

    @property
    def cache_key(self) -> str:
        return f"{self.name}:{self.serial}" + ("+draft" if self.draft is not None else "")

    @classmethod
    def build(
        cls,
        model: nn.Module,
        tokenizer: TokenizerWrapper,
        params: LoadParams,
        *,
        draft: nn.Module | None = None,
        cpu_mode: str = "",
    ) -> LoadedModel:
        """Derive the record's facts from a prepared model (weights, context, BLAS); apply
        LocalAI's parser hints (options tool_parser / reasoning_parser) to the tokenizer."""
        if params.tool_parser or params.reasoning_parser:
            tokenizer = parsers.apply_parser_overrides(
                tokenizer, params.tool_parser, params.reasoning_parser
            )
        blas = None
        if mx.default_device().type == mx.DeviceType.cpu:
            report = cpu_fast_path.blas_report()
            blas = {"library": report.library, "gflops": report.gflops, "fast": report.fast}
        return cls(
            model=model,
            tokenizer=tokenizer,
            params=params,
            draft=draft,
            context_len=params.context_size or model_context(model),
            weights_bytes=sum(v.nbytes for _, v in flat_arrays(model.parameters())),
            max_token_chars=max_token_chars(tokenizer),
            cpu_mode=cpu_mode,
            blas=blas,
            serial=next(_serials),
        )


def validate(params: LoadParams) -> int:
    """Check what can be checked before the current model is dropped, off the engine
    thread (no MLX): the model, the draft model and the adapter exist (a Hugging Face id
    is downloaded here), and a model directory's config.json agrees with its weights'
    headers (`model_loader.check_config_against_weights`); the model's tokenizer is
    read here (`model_loader.prefetch_tokenizer`). Returns the bytes of the model's and
    draft's weight files. Raises ModelLoadError naming what is missing or
    wrong."""
    resolved = [model_loader.resolve_model(params.model, params.model_file, params.model_path)]
    if params.draft_model:
        resolved.append(model_loader.resolve_model(params.draft_model, "", params.model_path))
    if params.lora_adapter:
        model_loader.resolve_adapter(params.lora_adapter, params.model_path)
    for r in resolved:
        if r.path.is_dir():
            model_loader.check_config_against_weights(r.path)
    directory = model_loader.loads_from(resolved[0])
    if directory is not None:  # the tokenizer is read here, not on the engine thread
        model_loader.prefetch_tokenizer(
            directory, params.tokenizer_config, params.trust_remote_code
        )
    return sum(_weight_file_bytes(r.path) for r in resolved)


def _weight_file_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.glob("*.safetensors") if f.is_file())


def fits_beside(current: LoadedModel, file_bytes: int) -> bool:
    """Whether a model of ``file_bytes`` on disk can load while ``current`` stays in memory.

    Worst case on the CPU: quantized 4-bit files become float32 weights (8x) there.
    Both within ``cpu_dequantize_budget``'s default (`cpu_fast_path.default_dequantize_budget`:
    half the RAM, or of the cgroup limit).
    """
    factor = 8 if mx.default_device().type == mx.DeviceType.cpu else 1
    budget = cpu_fast_path.default_dequantize_budget()
    return current.weights_bytes + file_bytes * factor <= budget


def load(params: LoadParams, split: Callable[[Any], str] | None = None) -> LoadedModel:
    """Load, prepare (CPU weight mode, LoRA) and describe the model ``params`` names.

    ``split``: distributed mode's split step (``distributed.sharding.ShardStep``). The
    model is then built lazily and handed to it before any weight is read; it keeps this
    rank's part, prepares it for the CPU in the group's weight mode and returns that
    mode, in place of ``prepare_for_cpu``. Raises ModelLoadError naming the cause
    (missing files, unsupported architecture, a draft model with another vocabulary).
    """
    model, tokenizer = model_loader.load_model(
        params.model,
        params.model_file,
        params.model_path,
        trust_remote_code=params.trust_remote_code,
        tokenizer_config=params.tokenizer_config,
        adapter_path=params.lora_adapter,
        lora_scale=params.lora_scale,
        lazy=split is not None,
        vision_options=params.vision,
        vision_off=vision.text_only_reason(params, distributed=split is not None),
    )
    if split is not None:
        cpu_mode = split(model)
    else:
        # On CPU: float32 parameters, and dense weights on the fast BLAS when they fit.
        cpu_mode = cpu_fast_path.prepare_for_cpu(
            model, params.cpu_dequantize, params.cpu_dequantize_budget
        )
    # Dense weights: merge a LoRA adapter in (no per-token cost); quantized: keep it apart.
    model_loader.fuse_adapters(model)
    if cpu_fuse.applies(cpu_mode, params.cpu_fuse):  # fewer ops per decode step
        cpu_fuse.transform(model)
    draft = _load_draft(params, tokenizer) if params.draft_model else None
    attention = cpu_attention.applies(params.cpu_attention)  # MLX's CPU exp: scalar on x86
    for m in (model, draft):
        if m is not None:
            _check_kv_quantization(params, m)
            if attention:
                cpu_attention.install(m)
    loaded = LoadedModel.build(model, tokenizer, params, draft=draft, cpu_mode=cpu_mode)
    # llguidance's view of the vocabulary takes ~2 s to build and needs no MLX: build
    # it off this thread, so the first constrained request does not stall the batch.
    threading.Thread(target=_warm_grammar, args=(tokenizer,), daemon=True).start()
    return loaded


def _check_kv_quantization(params: LoadParams, model: nn.Module) -> None:
    """ModelLoadError when ``kv_bits`` asks to quantize a rotating KV cache (``max_kv_size``,
    or a model's sliding-window layers): mlx-lm has no quantized rotating cache, and each
    request would fail at its first step instead."""
    if params.kv_bits is None:
        return
    if params.max_kv_size is not None:
        raise ModelLoadError(
            "option kv_bits (or CacheTypeKey/CacheTypeValue) cannot be combined with "
            "max_kv_size: mlx-lm has no quantized rotating KV cache; drop one of them"
        )
    if any(isinstance(c, RotatingKVCache) for c in make_prompt_cache(model)):
        raise ModelLoadError(
            "option kv_bits (or CacheTypeKey/CacheTypeValue): this model's sliding-window "
            "layers keep a rotating KV cache, which mlx-lm cannot quantize; load it "
            "without KV quantization"
        )


def _load_draft(params: LoadParams, tokenizer: TokenizerWrapper) -> nn.Module | None:
    """The speculative-decoding draft model; its vocabulary must be the main model's."""
    draft, draft_tok = model_loader.load_model(
        params.draft_model,
        "",
        params.model_path,
        trust_remote_code=params.trust_remote_code,
        tokenizer_config=params.tokenizer_config,
    )
    if draft_tok.get_vocab() != tokenizer.get_vocab():
        raise ModelLoadError(
            f"DraftModel {params.draft_model!r} has a different vocabulary from the main "
            "model; speculative decoding needs the same tokenizer"
        )
    cpu_fast_path.prepare_for_cpu(draft, params.cpu_dequantize, params.cpu_dequantize_budget)
    return draft


def _warm_grammar(tokenizer: TokenizerWrapper) -> None:
    try:
        grammar.warm_up(tokenizer)
    except ValueError as exc:  # a slow tokenizer: constrained requests will say so
        logger.warning("constrained decoding unavailable for this tokenizer: %s", exc)


def model_context(model: nn.Module) -> int | None:
    """The context length the model's config declares, in tokens (None when it has none)."""
    args = getattr(model, "args", None)
    for name in ("max_position_embeddings", "context_length", "max_seq_len"):
        value = getattr(args, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def max_token_chars(tokenizer: TokenizerWrapper) -> int:
    """Characters of the longest vocabulary entry (an upper bound on the text one token
    decodes to, for byte-level BPE and SentencePiece vocabularies); 0 when unknown."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # a tokenizer without a vocabulary view: no cheap bound
        return 0
    return max((len(piece) for piece in vocab), default=0)
