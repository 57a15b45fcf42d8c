"""GGUF -> MLX conversion of the embedded SmolLM2 against the pinned reference.

The embedded GGUF is converted once per module (into the default cache dir, so re-runs are
fast; set LOCALAI_MLX_CACHE_DIR to move it) and checked for token ids, next-token top-5 and
a 40-token greedy continuation against tests/data/smollm2-reference.json (``REFERENCE``):
every case on the converted model as the engine serves it (the tier's ``smol``: dense
float32 weights dequantized from the converted ones under the suite's fast BLAS, quantized
on Metal), and one case on the converted model as loaded, through MLX's quantized kernels
(on the CPU they take ~0.15 s a token: 10-15 s a case).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest
from helpers import REFERENCE, greedy_ids

from loading import gguf_convert, model_loader


# ----------------------------------------------------------------------------- real model
@pytest.fixture(scope="module")
def smollm2() -> tuple:
    """The embedded SmolLM2 GGUF, converted (cached) and loaded once for this module."""
    return model_loader.load_model(str(model_loader.embedded_model_path()))


def _check_case(model, tokenizer, case: dict) -> None:
    ids = tokenizer.encode(case["prompt"], add_special_tokens=False)
    assert ids == case["prompt_ids"]
    top5, greedy = greedy_ids(model, ids, len(case["greedy_40"]))
    assert top5 == case["next_token_top5"]
    assert greedy == case["greedy_40"]


@pytest.mark.parametrize("case", REFERENCE["cases"], ids=lambda c: c["name"])
def test_reference_outputs(smol: tuple, case: dict) -> None:
    """The converted model as the engine prepares it (tests/model/conftest.py ``smol``)."""
    _check_case(*smol, case)


def test_reference_output_through_the_quantized_kernels(smollm2: tuple) -> None:
    """The converted model as loaded: quantized, every projection through MLX's quantized
    matmul (the plain case)."""
    _check_case(*smollm2, next(c for c in REFERENCE["cases"] if c["name"] == "plain"))


def test_converted_tokenizer_metadata(smollm2: tuple) -> None:
    _, tokenizer = smollm2
    assert tokenizer.eos_token_ids == {2, 0}
    assert tokenizer.encode("Hi", add_special_tokens=True) == tokenizer.encode(
        "Hi", add_special_tokens=False
    )  # this tokenizer adds no BOS
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer.encode("a <|im_end|> b", add_special_tokens=False)
    assert 2 in ids and tokenizer.decode(ids, skip_special_tokens=True) == "a  b"


def test_untied_output_layer_loads_and_is_used(tmp_path: Path, smollm2: tuple) -> None:
    """A GGUF with its own ``output`` tensor: converted untied, lm_head is that tensor."""
    from mlx_lm.utils import load

    tensors, metadata = gguf_convert.read_gguf(model_loader.embedded_model_path())
    for part in ("weight", "scales", "biases"):
        tensors[f"output.{part}"] = tensors[f"token_embd.{part}"]
    gguf_convert.write_mlx_dir(tensors, metadata, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    assert config["quantization"]["lm_head"] == {"group_size": 32, "bits": 8}

    untied, _ = load(str(tmp_path))
    assert "lm_head" in dict(untied.named_modules())
    tied, _ = smollm2
    prompt = mx.array([REFERENCE["cases"][0]["prompt_ids"][:6]])
    assert mx.array_equal(untied(prompt), tied(prompt)).item()  # same weights, other path
