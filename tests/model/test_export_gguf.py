"""The ``gguf`` export read back through this backend's GGUF path (loading/gguf_convert.py):
a tiny random llama (tests/tiny_models.py, the embedded SmolLM2 byte-level BPE tokenizer)
written by training/export.py's ``write_gguf`` (mlx_lm/gguf.py plus the corrected
tokenizer metadata) must tokenize and generate as the same model from its MLX directory."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest
import tiny_models
from transformers import AutoTokenizer

from loading import gguf_convert
from training import export

PROMPT = "Hello there, it's 2024!\nWhat do bees make?"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("gguf")
    model = tiny_models.save_scaled(tiny_models.CONFIGS["llama"], root / "base", scale=4.0)
    weights = dict(mx.load(str(model / "model.safetensors")))
    config = json.loads((model / "config.json").read_text())
    target = root / "out-f16.gguf"
    export.write_gguf(model, weights, config, target)
    return model, gguf_convert.cached_conversion(target, root / "cache")


def test_gguf_metadata_is_byte_level_bpe(exported: tuple[Path, Path]) -> None:
    """mlx-lm alone writes model "llama" (SentencePiece) with no merges for this vocabulary."""
    _, meta = gguf_convert.read_gguf(exported[1].parent.parent / "out-f16.gguf")
    assert meta["tokenizer.ggml.model"] == "gpt2"
    # SmolLM2's vocabulary has no multi-digit tokens: llama.cpp's "smollm" and "gpt-2"
    # splits give it the same ids; the probe picks the first of the two in the table.
    assert meta["tokenizer.ggml.pre"] in ("gpt-2", "smollm")
    merges = json.loads((exported[0] / "tokenizer.json").read_text())["model"]["merges"]
    assert meta["tokenizer.ggml.merges"] == [
        m if isinstance(m, str) else " ".join(m) for m in merges
    ]
    assert "tokenizer.ggml.scores" not in meta
    assert meta["tokenizer.ggml.add_bos_token"] is False  # SmolLM2 prepends no BOS
    assert meta["tokenizer.chat_template"].startswith("{% for message in messages %}")


def test_gguf_export_tokenizes_and_generates_as_mlx_dir(exported: tuple[Path, Path]) -> None:
    model, converted = exported
    want = AutoTokenizer.from_pretrained(str(model))
    got = AutoTokenizer.from_pretrained(str(converted))
    assert got.encode(PROMPT) == want.encode(PROMPT)
    text = tiny_models.reference_text(converted, PROMPT, 12)
    assert "Ġ" not in text
    assert text == tiny_models.reference_text(model, PROMPT, 12)
