"""Dense CPU path: fuse the Q/K/V and the gate/up projections into single matmuls.

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
"""

from __future__ import annotations

import logging
from typing import Any

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

    def __init__(self, linear: Any, consumers: int):
        self.linear, self.x, self.y, self.consumers = linear, None, None, consumers


def _slice_module_class():
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

        def __call__(self, x):
            s = self._shared
            if s.x is not x:
                s.x, s.y = x, s.linear(x)
            y = s.y[..., self._start : self._stop]
            if self._last:  # the group's last projection: drop the references
                s.x = s.y = None
            return y

    return FusedSlice


_FusedSlice = None


def _fuse_group(parent: Any, names: tuple[str, ...]) -> bool:
    """Replace ``parent.<names>`` by slices of one fused Linear; False when not fusable."""
    global _FusedSlice
    import mlx.core as mx
    import mlx.nn as nn

    layers = [getattr(parent, n, None) for n in names]
    if any(type(lin) is not nn.Linear for lin in layers):
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


def fuse_projections(model: Any) -> int:
    """Fuse Q/K/V and gate/up projections of every decoder layer of ``model`` in place.

    ``model``: an mlx-lm model (``model.model_type`` / ``model.args.model_type`` and
    ``model.layers``). Returns the number of groups fused; 0 (model untouched) when the
    architecture is not in ``FUSABLE_TYPES`` or its layers are not plain ``nn.Linear``
    (quantized, LoRA, sharded). Run on the MLX thread, after weights are final (after
    dequantizing and merging adapters). Never raises for an unsupported model.
    """
    model_type = getattr(model, "model_type", None) or getattr(
        getattr(model, "args", None), "model_type", None
    )
    if model_type not in FUSABLE_TYPES:
        logger.info("projection fusion skipped: model type %r not in the checked list", model_type)
        return 0
    layers = getattr(model, "layers", None)
    if layers is None:
        layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers:
        return 0
    fused = 0
    for layer in layers:
        for parent_name, names in _GROUPS:
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
