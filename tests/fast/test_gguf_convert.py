"""GGUF -> MLX conversion without a model: name mapping, config, tokenizer, cache.

Fake metadata and tiny arrays. The embedded SmolLM2 converted and checked against the
pinned reference: tests/model/test_gguf_convert.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlx.core as mx
import pytest

from loading import gguf_convert
from loading.gguf_convert import (
    build_config,
    build_tokenizer,
    cached_conversion,
    end_of_generation_ids,
    gguf_to_mlx_name,
    quantization_config,
)
from loading.model_loader import ModelLoadError


# ----------------------------------------------------------------------------- pure
@pytest.mark.parametrize(
    ("gguf", "mlx"),
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("token_embd.scales", "model.embed_tokens.scales"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
        ("output.biases", "lm_head.biases"),
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("blk.12.attn_k.scales", "model.layers.12.self_attn.k_proj.scales"),
        ("blk.3.attn_v.biases", "model.layers.3.self_attn.v_proj.biases"),
        ("blk.3.attn_q.bias", "model.layers.3.self_attn.q_proj.bias"),
        ("blk.29.attn_output.weight", "model.layers.29.self_attn.o_proj.weight"),
        ("blk.1.ffn_gate.weight", "model.layers.1.mlp.gate_proj.weight"),
        ("blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"),
        ("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight"),
        ("blk.7.attn_norm.weight", "model.layers.7.input_layernorm.weight"),
        ("blk.7.ffn_norm.weight", "model.layers.7.post_attention_layernorm.weight"),
    ],
)
def test_tensor_names_map_to_mlx_lm_llama(gguf: str, mlx: str) -> None:
    assert gguf_to_mlx_name(gguf) == mlx


@pytest.mark.parametrize("name", ["blk.0.ffn_gate_exps.weight", "mm.0.weight", "output"])
def test_unknown_tensor_names_are_refused_by_name(name: str) -> None:
    with pytest.raises(ModelLoadError, match=name.replace(".", r"\.")):
        gguf_to_mlx_name(name)


def _meta(**overrides: object) -> dict:
    meta = {
        "general.architecture": "llama",
        "llama.context_length": 8192,
        "llama.embedding_length": 64,
        "llama.block_count": 2,
        "llama.feed_forward_length": 128,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "llama.rope.freq_base": 10000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "tokenizer.ggml.tokens": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b"],
        "tokenizer.ggml.token_type": [3, 3, 3, 1, 1],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    meta.update(overrides)
    return meta


def _quantized(rows: int, cols: int, bits: int) -> dict[str, mx.array]:
    """Shapes of an MLX-quantized (rows, cols) matrix, group size 32."""
    return {
        "weight": mx.zeros((rows, cols * bits // 32), dtype=mx.uint32),
        "scales": mx.zeros((rows, cols // 32), dtype=mx.float16),
        "biases": mx.zeros((rows, cols // 32), dtype=mx.float16),
    }


def _weights(tied: bool = True) -> dict[str, mx.array]:
    out = {f"model.embed_tokens.{k}": v for k, v in _quantized(5, 64, 8).items()}
    out |= {f"model.layers.0.self_attn.q_proj.{k}": v for k, v in _quantized(64, 64, 4).items()}
    out |= {f"model.layers.0.mlp.down_proj.{k}": v for k, v in _quantized(64, 128, 4).items()}
    out["model.norm.weight"] = mx.ones((64,))
    if not tied:
        out |= {f"lm_head.{k}": v for k, v in _quantized(5, 64, 6).items()}
    return out


def test_config_from_metadata() -> None:
    config = build_config(_meta(), _weights())
    assert config["model_type"] == "llama"
    assert config["hidden_size"] == 64
    assert config["num_hidden_layers"] == 2
    assert config["intermediate_size"] == 128
    assert config["num_attention_heads"] == 4
    assert config["num_key_value_heads"] == 2
    assert config["head_dim"] == 16
    assert config["vocab_size"] == 5
    assert config["rms_norm_eps"] == 1e-5
    assert config["rope_theta"] == 10000.0
    assert config["max_position_embeddings"] == 8192
    assert config["rope_traditional"] is True
    assert config["eos_token_id"] == [2, 0]
    assert "rope_scaling" not in config


def test_quantization_lists_modules_that_differ_from_the_default() -> None:
    quant = quantization_config(_weights(tied=False))
    assert quant == {
        "group_size": 32,
        "bits": 4,
        "model.embed_tokens": {"group_size": 32, "bits": 8},
        "lm_head": {"group_size": 32, "bits": 6},
    }
    assert quantization_config({"model.norm.weight": mx.ones((4,))}) is None


def test_tied_and_untied_output() -> None:
    assert build_config(_meta(), _weights(tied=True))["tie_word_embeddings"] is True
    assert build_config(_meta(), _weights(tied=False))["tie_word_embeddings"] is False


@pytest.mark.parametrize("arch", ["qwen2", "gemma3", "phi3"])
def test_unsupported_architecture_names_it_and_the_supported_list(arch: str) -> None:
    with pytest.raises(ModelLoadError, match=rf"'{arch}'.*supported: llama"):
        build_config(_meta(**{"general.architecture": arch}), _weights())


def test_mixture_of_experts_llama_is_refused() -> None:
    with pytest.raises(ModelLoadError, match="mixture-of-experts"):
        build_config(_meta(**{"llama.expert_count": 8}), _weights())


def test_rope_scaling_from_metadata_and_rope_freqs() -> None:
    linear = build_config(
        _meta(**{"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}),
        _weights(),
    )
    assert linear["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}

    freqs = gguf_convert._llama3_rope_factors(16, 500000.0, 8192, 8.0, 1.0, 4.0)
    meta = _meta(**{"llama.rope.freq_base": 500000.0, "llama.context_length": 131072})
    llama3 = build_config(meta, _weights(), mx.array(freqs))
    assert llama3["rope_scaling"]["rope_type"] == "llama3"
    assert llama3["rope_scaling"]["factor"] == 8.0
    assert llama3["rope_scaling"]["original_max_position_embeddings"] == 8192

    with pytest.raises(ModelLoadError, match="rope_freqs"):
        build_config(meta, _weights(), mx.array(freqs * 3.0))


def test_end_of_generation_ids_follow_llama_cpp() -> None:
    meta = _meta(**{"tokenizer.ggml.eot_token_id": 2})
    assert end_of_generation_ids(meta) == [2, 0]  # eos first, no duplicates


def test_unsupported_tokenizers_are_named() -> None:
    with pytest.raises(ModelLoadError, match=r"'bert'.*supported: gpt2, llama"):
        build_tokenizer(_meta(**{"tokenizer.ggml.model": "bert"}))
    with pytest.raises(ModelLoadError, match=r"pre-tokenizer 'martian'.*smollm"):
        build_tokenizer(_meta(**{"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "martian"}))


def test_sentencepiece_vocab_matches_sentencepiece(tmp_path: Path) -> None:
    """SPM ("llama") vocabularies: same ids as sentencepiece itself on plain text."""
    spm = pytest.importorskip("sentencepiece")
    import io

    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "café", "日本語"]
    lines = [" ".join(words[(i * 7 + j) % len(words)] for j in range(9)) for i in range(400)]
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=proto,
        vocab_size=300,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name="identity",  # as Llama/Mistral tokenizer models
        remove_extra_whitespaces=False,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    n = sp.get_piece_size()

    def token_type(i: int) -> int:
        if sp.is_unknown(i):
            return 2
        return 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1

    meta = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(n)],
        "tokenizer.ggml.scores": [sp.get_score(i) for i in range(n)],
        "tokenizer.ggml.token_type": [token_type(i) for i in range(n)],
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    tokenizer, config = build_tokenizer(meta)
    assert config["add_bos_token"] is True  # llama.cpp's SPM default
    for text in ["the quick brown fox", "  two  spaces", "café 日本語 zebra ✓", "a\n\tb", "Über"]:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert ids == sp.encode(text), text
        assert tokenizer.decode(ids) == text
    assert tokenizer.encode("hi").ids[0] == 1

    # Saved and reloaded the way mlx-lm loads it: BOS added, SPM streaming detokenizer.
    from mlx_lm.tokenizer_utils import SPMStreamingDetokenizer, load

    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    wrapper = load(tmp_path)
    assert isinstance(wrapper.detokenizer, SPMStreamingDetokenizer)
    assert wrapper.encode("the fox") == [1, *sp.encode("the fox")]


# ----------------------------------------------------------------------------- cache
@pytest.fixture
def fake_convert(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace the real conversion with one that records its calls and writes config.json."""
    calls: list[Path] = []

    def convert(gguf_path: Path, out_dir: Path) -> Path:
        calls.append(out_dir)
        (out_dir / "config.json").write_text("{}")
        return out_dir

    monkeypatch.setattr(gguf_convert, "convert_gguf", convert)
    return calls


def test_conversion_is_cached_by_file_identity(tmp_path: Path, fake_convert: list[Path]) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    cache = tmp_path / "cache"

    first = cached_conversion(gguf, cache)
    assert cached_conversion(gguf, cache) == first
    assert len(fake_convert) == 1
    assert first.parent == cache and first.name.startswith("m-")
    assert [p.name for p in cache.iterdir()] == [first.name]  # temp dir renamed away

    os.utime(gguf, ns=(1, 1))  # same path, new mtime: a new conversion
    second = cached_conversion(gguf, cache)
    assert second != first and len(fake_convert) == 2


def test_default_cache_dir_honours_the_environment(
    tmp_path: Path, fake_convert: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCALAI_MLX_CACHE_DIR", str(tmp_path / "env-cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert cached_conversion(gguf).parent == tmp_path / "env-cache"
    monkeypatch.delenv("LOCALAI_MLX_CACHE_DIR")
    assert gguf_convert.default_cache_dir() == Path.home() / ".cache" / "localai-mlx" / "gguf"


def test_failed_conversion_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(gguf_path: Path, out_dir: Path) -> Path:
        (out_dir / "model.safetensors").write_bytes(b"partial")
        raise ModelLoadError("boom")

    monkeypatch.setattr(gguf_convert, "convert_gguf", broken)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match="boom"):
        cached_conversion(gguf, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_missing_or_invalid_gguf_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"nope\.gguf"):
        cached_conversion(tmp_path / "nope.gguf", tmp_path / "cache")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelLoadError, match=r"bad\.gguf"):
        gguf_convert.convert_gguf(bad, tmp_path / "out")
