"""``quantization_type`` names -> what ``mlx_lm.convert`` does with them (no MLX here).

MLX's own names: ``q2`` .. ``q8`` (affine, group 64: ``mlx_lm.convert -q --q-bits N``),
``mixed_2_6`` / ``mixed_3_4`` / ``mixed_3_6`` / ``mixed_4_6`` (mlx_lm/convert.py's
``QUANT_RECIPES``: more bits for v_proj, down_proj and lm_head in some layers), the
microscaling modes ``mxfp4`` / ``nvfp4`` / ``mxfp8``, and the dtypes ``bf16`` / ``f16`` /
``f32`` (converted, not quantized). LocalAI's quantization page sends llama.cpp names
(default ``q4_k_m``); those with an MLX counterpart are translated (``q4_k_m`` -> mixed_4_6,
whose predicate mlx-lm documents as following llama.cpp's Q4_K_M choices; ``q8_0`` -> 8 bits
in groups of 32, as Q8_0's blocks), the rest refused naming the MLX ones. DWQ and AWQ
(mlx_lm/quant/dwq.py, awq.py) need a calibration dataset from the Hugging Face hub and, for
DWQ, a second (teacher) model: refused here with how to run them.
"""

from __future__ import annotations

from dataclasses import dataclass

MIXED = ("mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6")
MODES = {"mxfp4": 4, "nvfp4": 4, "mxfp8": 8}
DTYPES = {"bf16": "bfloat16", "f16": "float16", "fp16": "float16", "f32": "float32"}
# llama.cpp type -> (MLX name it becomes, group size)
LLAMA_CPP = {
    "q4_k_m": ("mixed_4_6", 64),
    "q4_k_s": ("q4", 64),
    "q4_k": ("q4", 64),
    "q4_0": ("q4", 32),
    "q4_1": ("q4", 32),
    "q5_k_m": ("q5", 64),
    "q5_k_s": ("q5", 64),
    "q5_k": ("q5", 64),
    "q5_0": ("q5", 32),
    "q5_1": ("q5", 32),
    "q6_k": ("q6", 64),
    "q8_0": ("q8", 32),
    "q3_k_m": ("mixed_3_6", 64),
    "q3_k_l": ("mixed_3_6", 64),
    "q3_k_s": ("q3", 64),
    "q2_k": ("mixed_2_6", 64),
}
MLX_NAMES = (
    "q2, q3, q4, q5, q6, q8, " + ", ".join(MIXED) + ", " + ", ".join(MODES) + ", bf16, f16, f32"
)


@dataclass(frozen=True)
class Recipe:
    """What ``mlx_lm.convert.convert`` gets: quantize with bits/group_size/mode and an
    optional mixed predicate, or only a dtype."""

    quantize: bool
    bits: int = 0
    group_size: int = 0
    mode: str = "affine"
    predicate: str = ""  # one of MIXED, or ""
    dtype: str = ""  # float16 / bfloat16 / float32 when not quantizing
    translated_from: str = ""  # the llama.cpp name this stands for

    def describe(self) -> str:
        if not self.quantize:
            return f"{self.dtype} (not quantized)"
        what = self.predicate or (f"{self.bits}-bit {self.mode}" if self.mode else "")
        return f"{what}, group size {self.group_size}" + (
            f" (for {self.translated_from})" if self.translated_from else ""
        )


def recipe(name: str, group_size: int | None = None, bits: int | None = None) -> Recipe:
    """The recipe of ``name``; ValueError naming the MLX names for an unknown one."""
    key = name.strip().lower()
    source = ""
    default_group = 64
    if key in LLAMA_CPP:
        source = key
        key, default_group = LLAMA_CPP[key]
    if key in ("dwq", "awq", "gptq") or key.startswith(("dwq", "awq")):
        raise ValueError(
            f"quantization_type {name!r}: mlx-lm's {key.upper()} needs a calibration dataset "
            "from the Hugging Face hub (and DWQ a teacher model), which this backend does not "
            f"fetch; run `mlx_lm.{key[:3]}` yourself, or use one of {MLX_NAMES}"
        )
    group = group_size or default_group
    if key in DTYPES:
        return Recipe(quantize=False, dtype=DTYPES[key], translated_from=source)
    if key in MIXED:
        if bits:
            raise ValueError(f"extra_options.bits does not apply to the mixed recipe {key}")
        return Recipe(
            quantize=True, bits=4, group_size=group, predicate=key, translated_from=source
        )
    if key in MODES:
        # mlx_lm.utils.quantize_model's defaults per mode (mxfp4/mxfp8 32, nvfp4 16)
        mode_group = {"mxfp4": 32, "nvfp4": 16, "mxfp8": 32}[key]
        return Recipe(quantize=True, bits=MODES[key], group_size=group_size or mode_group, mode=key)
    if len(key) == 2 and key[0] == "q" and key[1] in "234568":
        n = bits or int(key[1])
        if n not in (2, 3, 4, 5, 6, 8):
            raise ValueError(f"extra_options.bits {n}: MLX quantizes to 2, 3, 4, 5, 6 or 8 bits")
        if group not in (32, 64, 128):
            raise ValueError(f"extra_options.group_size {group}: MLX takes 32, 64 or 128")
        return Recipe(quantize=True, bits=n, group_size=group, translated_from=source)
    raise ValueError(
        f"quantization_type {name!r} has no MLX counterpart: use one of {MLX_NAMES} "
        f"(llama.cpp names translated: {', '.join(LLAMA_CPP)})"
    )
