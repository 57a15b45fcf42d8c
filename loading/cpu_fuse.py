"""Dense CPU path: fewer operations per decode step (fused projections, compiled norms/rope).

A decode step on MLX's CPU backend pays a fixed cost per operation; the 7 projections of
every layer are 7 small BLAS calls. ``fuse_projections`` concatenates the weights of
projections that read the same input (``q_proj``/``k_proj``/``v_proj`` of the attention,
``gate_proj``/``up_proj`` of the MLP) into one ``nn.Linear`` at load time and puts small
slice modules in place of the originals: the first call with an input computes the fused
matmul once, each projection returns its column block of it. mlx-lm's own ``__call__``
methods run unchanged, so this is a transformation of the loaded model objects, not a
fork of mlx-lm's files.

Applies only to architectures whose attention and MLP were checked to call these
projections on the same input (``FUSABLE_TYPES``), only to plain float32/float16
``nn.Linear`` layers (quantized, LoRA or sharded layers are left alone), and only on the
CPU (``loaded_model.load`` calls it for ``cpu_mode == "dense"`` when the default device is
the CPU; Metal and CUDA keep mlx-lm's model as loaded). The fused weight replaces the
separate ones: parameter memory stays the same.

``compile_elementwise`` replaces the RMS norms and rotary embeddings by ``mx.compile``d
equivalents (MLX runs ``mx.fast.rms_norm``/``mx.fast.rope`` as composed fallbacks on the
CPU); ``transform`` applies both and is what ``loaded_model.load`` calls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn

logger = logging.getLogger("localai.mlx.cpu_fuse")

#: mlx-lm ``model_type`` values whose Attention calls ``q_proj(x), k_proj(x), v_proj(x)``
#: and whose MLP calls ``gate_proj(x)`` and ``up_proj(x)`` on one input (checked in
#: mlx_lm/models/llama.py, qwen2.py, qwen3.py; "mistral" loads as llama).
FUSABLE_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})

_GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


class _Shared:
    """The fused Linear and its last (input, output) pair; not an nn.Module on purpose,
    so the fused weight is listed once among the model's parameters (by its owner)."""

    __slots__ = ("consumers", "linear", "x", "y")

    def __init__(self, linear: nn.Linear, consumers: int) -> None:
        self.linear, self.consumers = linear, consumers
        self.x: mx.array | None = None  # the last input
        self.y: mx.array | None = None  # its fused output


def _slice_module_class() -> type:
    import mlx.nn as nn

    class FusedSlice(nn.Module):
        """One projection of a fused group: columns ``[start, stop)`` of the fused output.

        Called with ``x`` of shape (..., in_features); returns (..., stop - start), the
        same values the original Linear computed (up to the BLAS's summation order).
        The group's first slice owns the fused Linear (attribute ``fused``).
        """

        def __init__(self, shared: _Shared, start: int, stop: int, owner: bool):
            super().__init__()
            if owner:
                self.fused = shared.linear
            self._shared, self._start, self._stop = shared, start, stop
            self._last = stop == shared.linear.weight.shape[0]

        def __call__(self, x: mx.array) -> mx.array:
            s = self._shared
            fused = s.y
            if s.x is not x or fused is None:
                fused = s.linear(x)
                s.x, s.y = x, fused
            y = fused[..., self._start : self._stop]
            if self._last:  # the group's last projection: drop the references
                s.x = s.y = None
            return y

    return FusedSlice


_FusedSlice: type | None = None


def _fuse_group(parent: nn.Module, names: tuple[str, ...]) -> bool:
    """Replace ``parent.<names>`` by slices of one fused Linear; False when not fusable."""
    global _FusedSlice
    import mlx.core as mx
    import mlx.nn as nn

    found = [getattr(parent, n, None) for n in names]
    layers = [lin for lin in found if type(lin) is nn.Linear]
    if len(layers) != len(found):
        return False
    widths = {lin.weight.shape[1] for lin in layers}
    dtypes = {lin.weight.dtype for lin in layers}
    biased = {"bias" in lin for lin in layers}
    if len(widths) != 1 or len(dtypes) != 1 or len(biased) != 1:
        return False
    fused = nn.Linear(widths.pop(), sum(lin.weight.shape[0] for lin in layers), bias=biased.pop())
    fused.weight = mx.concatenate([lin.weight for lin in layers], axis=0)
    if "bias" in fused:
        fused.bias = mx.concatenate([lin.bias for lin in layers], axis=0)
    mx.eval(fused.parameters())
    if _FusedSlice is None:
        _FusedSlice = _slice_module_class()
    shared = _Shared(fused, len(layers))
    start = 0
    for i, (name, lin) in enumerate(zip(names, layers, strict=True)):
        stop = start + lin.weight.shape[0]
        setattr(parent, name, _FusedSlice(shared, start, stop, owner=i == 0))
        start = stop
    return True


def fuse_projections(model: nn.Module, mlp: bool = False) -> int:
    """Fuse the Q/K/V (and with ``mlp``, the gate/up) projections of every decoder layer.

    In place. ``mlp`` is off by default: on MKL a fused 2*intermediate x hidden gate/up
    matmul is no faster at 1 row and 4-17% slower at 8 rows than the two separate ones
    (small-M path), while fused Q/K/V is faster at both (BENCHMARKS.md, G).

    ``model``: an mlx-lm model (``model.model_type`` / ``model.args.model_type`` and
    ``model.layers``). Returns the number of groups fused; 0 (model untouched) when the
    architecture is not in ``FUSABLE_TYPES`` or its layers are not plain ``nn.Linear``
    (quantized, LoRA, sharded). Run on the MLX thread, after weights are final (after
    dequantizing and merging adapters). Never raises for an unsupported model.
    """
    model_type = _model_type(model)
    if model_type not in FUSABLE_TYPES:
        logger.info("projection fusion skipped: model type %r not in the checked list", model_type)
        return 0
    layers = getattr(model, "layers", None)
    if layers is None:
        layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers:
        return 0
    fused = 0
    groups = _GROUPS if mlp else _GROUPS[:1]
    for layer in layers:
        for parent_name, names in groups:
            parent = getattr(layer, parent_name, None)
            if parent is not None and _fuse_group(parent, names):
                fused += 1
    logger.info("fused %d projection groups (%s, dense CPU)", fused, model_type)
    return fused


def applies(cpu_mode: str, enabled: bool) -> bool:
    """Whether ``loaded_model.load`` should fuse: dense weights, option on, default device CPU."""
    if not enabled or cpu_mode != "dense":
        return False
    import mlx.core as mx

    return mx.default_device().type == mx.DeviceType.cpu


# --- compiled RMS norm and rotary embedding -------------------------------------------
# On the CPU, mx.fast.rms_norm and mx.fast.rope run as their composed fallbacks (~8 and
# ~12 separate ops per call); the same math under mx.compile runs as a few fused kernels.
# Shapes are fixed per batch size while decoding, so nothing recompiles step to step
# (offsets go in as arrays, not Python numbers, for the same reason).

_compiled: dict[tuple, Callable[..., mx.array]] = {}


def _rms_fn(eps: float) -> Callable[..., mx.array]:
    import mlx.core as mx

    key = ("rms", eps)
    if key not in _compiled:

        def rms(x: mx.array, w: mx.array) -> mx.array:
            return mx.fast.rms_norm(x, w, eps)

        _compiled[key] = mx.compile(rms)
    return _compiled[key]


def _rope_fn(traditional: bool, scale: float) -> Callable[..., mx.array]:
    import mlx.core as mx

    key = ("rope", traditional, scale)
    if key in _compiled:
        return _compiled[key]

    def rope(x: mx.array, offset: mx.array, inv_freqs: mx.array) -> mx.array:
        # x: (B, N, T, D) with D == 2 * inv_freqs.size; offset: () or (B,) int32.
        b, n, t, d = x.shape
        if offset.ndim == 1:
            offset = offset.reshape(-1, 1, 1)
        positions = (mx.arange(t, dtype=mx.float32) + offset) * scale
        theta = positions[..., None] * inv_freqs
        cos, sin = mx.cos(theta).astype(x.dtype), mx.sin(theta).astype(x.dtype)
        if traditional:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            out = mx.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
            return out.reshape(b, n, t, d)
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return mx.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)

    _compiled[key] = mx.compile(rope)
    return _compiled[key]


def _compiled_classes() -> tuple[type, type]:
    import mlx.core as mx
    import mlx.nn as nn

    class CompiledRMSNorm(nn.Module):
        """nn.RMSNorm's computation (same ``weight`` parameter) as one compiled call.

        ``x``: (..., dims) -> same shape and dtype."""

        def __init__(self, norm: nn.RMSNorm) -> None:
            super().__init__()
            self.weight = norm.weight
            self.eps = norm.eps
            self._fn = _rms_fn(norm.eps)

        def __call__(self, x: mx.array) -> mx.array:
            return self._fn(x, self.weight)

    class CompiledRoPE(nn.Module):
        """nn.RoPE (full head width, base frequencies) as one compiled call.

        ``x``: (B, N, T, D) or (B, T, D); ``offset``: int or an int array of shape (B,)
        (BatchKVCache). Falls back to ``mx.fast.rope`` for other ranks."""

        def __init__(self, rope: nn.RoPE) -> None:
            super().__init__()
            self.dims, self.traditional = rope.dims, rope.traditional
            self.base, self.scale = rope.base, rope.scale
            half = rope.dims // 2
            # The inverse frequencies exactly as MLX's own rope fallback computes them.
            log_step = mx.log(mx.array(rope.base, mx.float32)) / half
            self._inv = mx.exp(mx.arange(0.0, -half, -1.0, dtype=mx.float32) * log_step)
            mx.eval(self._inv)
            self._fn = _rope_fn(rope.traditional, float(rope.scale))

        def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
            if x.ndim != 4 or x.shape[-1] != self.dims:
                return mx.fast.rope(
                    x,
                    self.dims,
                    traditional=self.traditional,
                    base=self.base,
                    scale=self.scale,
                    offset=offset,
                )
            if not isinstance(offset, mx.array):
                offset = mx.array(offset, dtype=mx.int32)
            return self._fn(x, offset, self._inv)

    return CompiledRMSNorm, CompiledRoPE


def compile_elementwise(model: nn.Module) -> int:
    """Replace ``model``'s nn.RMSNorm and full-width base nn.RoPE modules by compiled ones.

    Same parameters (a norm keeps its ``weight``), same math; for families in
    ``FUSABLE_TYPES`` only. Returns the number of modules replaced (0: untouched).
    Run on the MLX thread, on the CPU path (on Metal/CUDA the fast kernels are faster).
    """
    import mlx.nn as nn
    from mlx.utils import tree_flatten, tree_unflatten

    if _model_type(model) not in FUSABLE_TYPES:
        return 0
    norm_cls, rope_cls = _compiled_classes()
    replaced = []
    # Leaves are modules here (is_leaf); mlx types them as Any.
    leaves = cast(
        list[tuple[str, Any]], tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)
    )
    for name, mod in leaves:
        if type(mod) is nn.RMSNorm:
            replaced.append((name, norm_cls(mod)))
        elif type(mod) is nn.RoPE and mod.dims % 2 == 0:
            replaced.append((name, rope_cls(mod)))
    if replaced:
        model.update_modules(tree_unflatten(replaced))
    return len(replaced)


def _model_type(model: nn.Module) -> Any:
    return getattr(model, "model_type", None) or getattr(
        getattr(model, "args", None), "model_type", None
    )


def transform(model: nn.Module) -> dict[str, int]:
    """The dense-CPU transformation: ``fuse_projections`` (Q/K/V) then ``compile_elementwise``.

    Returns {"projections": groups fused, "compiled": modules replaced}."""
    return {"projections": fuse_projections(model), "compiled": compile_elementwise(model)}
