"""Models named by Hugging Face id: downloaded over real HTTP from a local hub stand-in.

``tests/hubserver.py`` serves the embedded SmolLM2, converted to an MLX directory, as
``test-org/smollm2-mlx`` (and the GGUF itself as ``test-org/smollm2-gguf``) on 127.0.0.1
(the ``hub_server`` fixture); HF_ENDPOINT points at it and HF_HOME is a fresh temp
directory in every test. LoadModel of a hub id in a backend process:
tests/process/test_hub.py.
"""

from __future__ import annotations

import errno
import hashlib
import os
import socket
from pathlib import Path

import pytest
from helpers import greedy_ids
from hubserver import GATED, GGUF_REPO, REPO, TOKEN, HubServer

from loading import hub, model_loader
from loading.model_loader import ModelLoadError, load_model, resolve_model

PROMPT = "The capital of France is"


@pytest.fixture
def server(hub: HubServer) -> HubServer:
    """Here ``server`` is the hub stand-in (``hub``: clean request log, HF_ENDPOINT on it,
    HF_HOME in tmp), not the session's backend process."""
    return hub


@pytest.fixture(scope="module")
def reference(mlx_dir: Path) -> list[int]:
    """Greedy tokens of the source MLX directory itself."""
    model, tokenizer = load_model(str(mlx_dir))
    return _greedy(model, tokenizer)


def _greedy(model, tokenizer, n: int = 12) -> list[int]:
    return greedy_ids(model, tokenizer.encode(PROMPT), n)[1]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _blobs(tmp_path: Path) -> list[Path]:
    root = tmp_path / "hf-home" / "hub"
    return sorted(p for p in root.glob("models--*/blobs/*") if p.is_file())


def _assert_served_files(snapshot: Path, server: HubServer, repo: str = REPO) -> None:
    """``snapshot`` holds exactly the repo's files, byte for byte (sha256)."""
    files = server.repos[repo].files
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(files)
    for name, served in files.items():
        assert _sha256(snapshot / name) == served.sha256, name


def test_first_load_downloads_second_uses_cache(
    server: HubServer,
    mlx_dir: Path,
    reference: list[int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(hub, "PROGRESS_INTERVAL_S", 0.0)
    caplog.set_level("INFO", logger="localai.mlx.loading.hub")
    model, tokenizer = load_model(REPO)
    fetched = sorted(r.path.rsplit("/", 1)[1] for r in server.file_gets())
    assert fetched == sorted(p.name for p in mlx_dir.iterdir())  # each file once
    resolved = resolve_model(REPO)
    assert resolved.kind == "hf_cache" and resolved.name == REPO
    assert resolved.path.parent.parent == tmp_path / "hf-home" / "hub" / (
        "models--test-org--smollm2-mlx"
    )
    _assert_served_files(resolved.path, server)
    assert _greedy(model, tokenizer) == reference

    total_mb = sum(p.stat().st_size for p in mlx_dir.iterdir()) / 1e6
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith(f"downloading {REPO} from {server.url}") for line in lines)
    progress = [line for line in lines if line.startswith(f"downloading {REPO}: ")]
    assert progress, lines  # logged while the download ran
    n = len(fetched)
    assert f"downloaded {REPO}: {n}/{n} files, {total_mb:.1f}/{total_mb:.1f} MB" in "\n".join(lines)

    server.requests.clear()
    again = resolve_model(REPO)  # what every later LoadModel does first
    assert again == resolved
    assert server.requests == []  # the cache answers: no API call, no file GET


def test_unknown_repo_is_a_clear_error(server: HubServer) -> None:
    with pytest.raises(ModelLoadError) as err:
        resolve_model("test-org/no-such-model")
    message = str(err.value)
    assert f"Hugging Face repo 'test-org/no-such-model' not found on {server.url}" in message
    assert "set HF_TOKEN" in message and "Traceback" not in message
    assert [r.path for r in server.requests] == ["/api/models/test-org/no-such-model/revision/main"]


def test_gated_repo_asks_for_hf_token(
    server: HubServer, mlx_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ModelLoadError, match=r"repo 'test-org/gated' is gated .*set HF_TOKEN"):
        resolve_model(GATED)
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(ModelLoadError, match=r"the token set \(HF_TOKEN\) has no access"):
        resolve_model(GATED)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    resolved = resolve_model(GATED)
    _assert_served_files(resolved.path, server)
    assert all(r.authorization == f"Bearer {TOKEN}" for r in server.file_gets())


def test_dropped_connection_is_resumed(server: HubServer, tmp_path: Path) -> None:
    cut = 10 << 20
    server.drop_once("model.safetensors", cut)
    resolve_model(REPO)
    gets = [r for r in server.file_gets() if r.path.endswith("/model.safetensors")]
    assert [r.range for r in gets] == [None, f"bytes={cut}-"]  # resumed, not restarted
    _assert_served_files(resolve_model(REPO).path, server)
    assert not [p for p in _blobs(tmp_path) if p.name.endswith(".incomplete")]


def test_failed_download_is_never_loadable_and_retry_fetches_the_rest(
    server: HubServer, mlx_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.fail_once("model.safetensors", 500)
    with pytest.raises(ModelLoadError, match="answered HTTP 500 while downloading"):
        resolve_model(REPO)
    assert not [p for p in _blobs(tmp_path) if p.name.endswith(".incomplete")]
    have = {p.name for p in _blobs(tmp_path)}
    # What is on disk is not a model: offline, it is "not cached" (the file list says so).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE is set"):
        resolve_model(REPO)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    server.requests.clear()
    resolved = resolve_model(REPO)
    _assert_served_files(resolved.path, server)
    refetched = {r.path.rsplit("/", 1)[1] for r in server.file_gets()}
    assert "model.safetensors" in refetched
    # Exactly the files whose blob the failed attempt had not completed are fetched again.
    names = [p.name for p in mlx_dir.iterdir()]
    assert refetched == {n for n in names if (resolved.path / n).resolve().name not in have}


def test_offline_with_nothing_cached(server: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as err:
        resolve_model(REPO)
    message = str(err.value)
    assert "not in the local Hugging Face cache" in message
    assert "HF_HUB_OFFLINE is set" in message and "unset HF_HUB_OFFLINE" in message
    assert server.requests == []


def test_unreachable_hub(server: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(
        ModelLoadError, match=rf"cannot reach the Hugging Face hub at http://127\.0\.0\.1:{port}"
    ):
        resolve_model(REPO)


def test_disk_full_is_named(
    server: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import file_download

    def no_space(src: Path, dst: Path) -> None:  # the rename of a finished file fails
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(file_download, "_chmod_and_move", no_space)
    with pytest.raises(ModelLoadError) as err:
        resolve_model(REPO)
    message = str(err.value)
    assert message.startswith(f"disk full while downloading '{REPO}' into {tmp_path}")
    assert "set HF_HUB_CACHE" in message  # issue 25: under LocalAI HF_HOME does not decide
    assert hub.cached(hub.HubId(REPO)) is None


def test_gguf_by_id(server: HubServer, tmp_path: Path) -> None:
    gguf = model_loader.embedded_model_path()
    named = resolve_model(f"{GGUF_REPO}/{gguf.name}")
    assert named.kind == "gguf" and named.path.name == gguf.name
    assert _sha256(named.path) == _sha256(gguf)
    gets = len(server.file_gets())
    assert gets == 1
    # The bare repo id: no config.json, one GGUF in the repo -> that file (already cached).
    bare = resolve_model(GGUF_REPO)
    assert (bare.kind, bare.path) == ("gguf", named.path)
    assert len(server.file_gets()) == gets
