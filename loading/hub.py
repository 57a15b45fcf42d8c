"""Hugging Face Hub downloads for models named by repo id.

Owns: telling a hub id from a path (``parse_hub_id``: ``owner/name``, and the URL forms
LocalAI writes or passes through: ``https://huggingface.co/owner/name[/tree/REV]``,
``hf.co/owner/name``, ``huggingface://owner/name[@REV]``, ``hf://owner/name``), reading the
hub settings in effect now (``settings``: endpoint, cache directory and offline flag read
from ``HF_ENDPOINT``, ``HF_HUB_CACHE`` / ``HUGGINGFACE_HUB_CACHE`` / ``HF_HOME`` /
``XDG_CACHE_HOME``, ``HF_HUB_OFFLINE`` with huggingface_hub's precedence, and passed to
its functions explicitly; plus whether a token is set), looking a repo up in the local
cache without any network (``cached``), and downloading it with ``huggingface_hub``
(``download``) while logging progress (files, bytes, rate). Every failure is a
``model_loader.ModelLoadError`` whose message says the cause and what to change (repo
not found, gated or private, offline with nothing cached, network unreachable, disk
full, ...), never a traceback.

What is fetched for a repo is mlx-lm's own list (``mlx_lm.utils.DEFAULT_ALLOW_PATTERNS``:
config and tokenizer JSON, ``model*.safetensors``, ``*.py``, ``tokenizer.model``,
``*.tiktoken``, ``*.txt``, ``*.jsonl``, ``*.jinja``); a GGUF file is fetched only when the
id names it (``owner/name/file.gguf``), or when a repo without ``config.json`` holds
exactly one. huggingface_hub writes each file to a temporary ``.incomplete`` name and
renames it when its size checks out, and its cache check compares the snapshot with the
cached file list, so an interrupted download is never found "cached" half-written.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from tqdm.std import tqdm as _std_tqdm

from errors import ModelLoadError

logger = logging.getLogger("localai.mlx." + __name__)

# Seconds between two progress lines while a download runs (the last line always shows).
PROGRESS_INTERVAL_S = 2.0

_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
_REPO_RE = re.compile(rf"^{_NAME}/{_NAME}$")
_GGUF_FILE_RE = re.compile(rf"^({_NAME}/{_NAME})/((?:[^/]+/)*[^/]+\.gguf)$", re.IGNORECASE)
# The hub's web hosts: LocalAI's importer writes https://huggingface.co/OWNER/NAME
# (core/gallery/importers/mlx.go, mlx_test.go); hf.co/ is one of its URI prefixes too
# (pkg/downloader/uri.go).
_WEB_HOSTS = ("huggingface.co", "www.huggingface.co", "hf.co")
# LocalAI's scheme prefixes (pkg/downloader/uri.go HuggingFacePrefix, HuggingFacePrefix1):
# with fewer than 3 path pieces LocalAI passes them through unchanged (ResolveURL).
_SCHEMES = ("huggingface://", "hf://")
# For messages: huggingface_hub's order (its constants.py); LocalAI sets the last two.
_CACHE_VARS = "huggingface_hub takes it before HUGGINGFACE_HUB_CACHE and HF_HOME"
_DEFAULT_ENDPOINT = "https://huggingface.co"  # huggingface_hub's, without HF_ENDPOINT


@dataclass(frozen=True)
class HubId:
    """A model named on the hub: ``repo`` (``owner/name``), for a GGUF ``filename``, and
    ``revision`` (a branch, tag or commit; None = the default branch)."""

    repo: str
    filename: str | None = None
    revision: str | None = None

    def __str__(self) -> str:
        name = f"{self.repo}/{self.filename}" if self.filename else self.repo
        return f"{name}@{self.revision}" if self.revision else name


@dataclass(frozen=True)
class HubSettings:
    """The hub settings in effect now: endpoint URL, cache directory, offline flag and
    whether a token is set (``HF_TOKEN``, or a token file from ``hf auth login``)."""

    endpoint: str
    cache_dir: Path
    offline: bool
    has_token: bool


def parse_hub_id(model: str) -> HubId | None:
    """``HubId`` for a hub reference; None for anything else (then it is a path).

    Accepted: ``owner/name`` and ``owner/name/path/file.gguf``; the same behind LocalAI's
    prefixes ``huggingface://``, ``hf://`` and ``hf.co/`` (optionally ``@REV`` after the
    name, LocalAI's revision syntax); web URLs ``http(s)://huggingface.co/owner/name`` (or
    ``hf.co``), with a trailing slash, ``/tree/REV``, or ``/resolve/REV/file.gguf`` /
    ``/blob/REV/file.gguf`` for one GGUF file.
    """
    text = model.strip()
    lowered = text.lower()
    for scheme in _SCHEMES:
        if lowered.startswith(scheme):
            return _parse_path(text[len(scheme) :], at_revision=True)
    if lowered.startswith("hf.co/"):
        return _parse_path(text[len("hf.co/") :], at_revision=True)
    if lowered.startswith(("https://", "http://")):
        return _parse_web_url(text)
    return _parse_path(text, at_revision=False)


def _parse_path(path: str, at_revision: bool) -> HubId | None:
    """``owner/name[@rev]`` or ``owner/name[@rev]/path/file.gguf``."""
    path = path.strip("/") if at_revision else path
    revision = None
    if at_revision:
        head, _, tail = path.partition("/")
        name, sep, rest = tail.partition("/")
        if "@" in name:
            name, _, rev = name.partition("@")
            if not rev:
                return None
            revision = _revision(rev)
        path = f"{head}/{name}" + (f"/{rest}" if sep else "")
    if _REPO_RE.match(path):
        return HubId(path, revision=revision)
    m = _GGUF_FILE_RE.match(path)
    if m and ".." not in m.group(2).split("/"):
        return HubId(m.group(1), m.group(2), revision)
    return None


def _parse_web_url(url: str) -> HubId | None:
    """A hub web page or file URL: ``/owner/name``, ``/owner/name/tree/REV``,
    ``/owner/name/resolve|blob/REV/file.gguf`` on huggingface.co or hf.co."""
    parts = urlsplit(url)
    if (parts.hostname or "").lower() not in _WEB_HOSTS or parts.port is not None:
        return None
    pieces = [unquote(p) for p in parts.path.split("/") if p]
    if len(pieces) < 2 or pieces[0] in ("datasets", "spaces"):
        return None
    repo = "/".join(pieces[:2])
    if not _REPO_RE.match(repo):
        return None
    rest = pieces[2:]
    if not rest:
        return HubId(repo)
    if rest[0] == "tree" and len(rest) >= 2:  # a branch may hold slashes: refs/pr/1
        return HubId(repo, revision=_revision("/".join(rest[1:])))
    if rest[0] in ("resolve", "blob") and len(rest) >= 3:
        filename = "/".join(rest[2:])
        if filename.lower().endswith(".gguf") and ".." not in rest[2:]:
            return HubId(repo, filename, _revision(rest[1]))
    return None


def _revision(rev: str) -> str | None:
    """None for the default branch (huggingface_hub's DEFAULT_REVISION), else ``rev``."""
    return None if rev == "main" else rev


def settings() -> HubSettings:
    """The hub settings in effect now, read from the environment as huggingface_hub does.

    huggingface_hub reads its variables once, at import (``huggingface_hub.constants``),
    and its functions take ``endpoint`` and ``cache_dir``: this module reads the current
    environment with its precedence and passes both explicitly. Endpoint: ``HF_ENDPOINT``
    (default https://huggingface.co). Cache: ``HF_HUB_CACHE``, then
    ``HUGGINGFACE_HUB_CACHE``, then ``HF_HOME``/hub, then ``XDG_CACHE_HOME``/huggingface/hub
    (``~`` and ``$VARS`` expanded). Offline: ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``
    set to 1, ON, YES or TRUE. tests/fast/test_localai_inputs.py checks these against a
    fresh huggingface_hub.

    LocalAI sets ``HF_HOME``, ``TRANSFORMERS_CACHE`` and ``HUGGINGFACE_HUB_CACHE`` to its
    models directory when they are unset (pkg/model/initializers.go, spawnGRPCModel), so
    under LocalAI the cache is ``<models>/models--owner--name`` (``HUGGINGFACE_HUB_CACHE``
    wins over ``HF_HOME``), where huggingface_hub itself would look.
    """
    from huggingface_hub import get_token
    from huggingface_hub.constants import ENV_VARS_TRUE_VALUES

    env = os.environ
    xdg = env.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    home = _expand(env.get("HF_HOME", os.path.join(xdg, "huggingface")))
    cache = env.get("HF_HUB_CACHE", env.get("HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub")))
    offline = env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or ""
    return HubSettings(
        endpoint=env.get("HF_ENDPOINT", _DEFAULT_ENDPOINT).rstrip("/"),
        cache_dir=Path(_expand(cache)),
        offline=offline.upper() in ENV_VARS_TRUE_VALUES,
        has_token=bool(get_token()),
    )


def _expand(path: str) -> str:
    return os.path.expandvars(os.path.expanduser(path))


def _allow_patterns() -> list[str]:
    from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS

    return list(DEFAULT_ALLOW_PATTERNS)


def cached(hub_id: HubId) -> Path | None:
    """The local snapshot directory (or GGUF file) for ``hub_id``, or None; no network.

    A snapshot whose cached file list shows a missing file (an interrupted download)
    counts as not cached.
    """
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    cfg = settings()
    try:
        if hub_id.filename:
            path = hf_hub_download(
                hub_id.repo,
                hub_id.filename,
                revision=hub_id.revision,
                cache_dir=cfg.cache_dir,
                local_files_only=True,
            )
        else:
            path = snapshot_download(
                hub_id.repo,
                revision=hub_id.revision,
                cache_dir=cfg.cache_dir,
                local_files_only=True,
                allow_patterns=_allow_patterns(),
            )
    except (LocalEntryNotFoundError, HFValidationError, OSError, ValueError) as exc:
        logger.debug("%s not in the local Hugging Face cache: %s", hub_id, _first_line(exc))
        return None
    return Path(path)


def download(hub_id: HubId) -> Path:
    """Download ``hub_id`` into the Hugging Face cache; returns the snapshot dir or GGUF file.

    Runs on the calling thread (huggingface_hub fetches up to 8 files in parallel on its
    own threads) and logs progress every ``PROGRESS_INTERVAL_S`` seconds plus a summary.
    A repo without ``config.json`` that holds exactly one ``*.gguf`` also gets that file,
    and the file's path is returned. Raises ``ModelLoadError`` for every failure: repo or
    file not found, gated or private (set ``HF_TOKEN``), ``HF_HUB_OFFLINE`` set, hub
    unreachable, disk full or cache not writable, an interrupted download that did not
    recover.
    """
    from huggingface_hub import hf_hub_download, snapshot_download

    cfg = settings()
    if cfg.offline:
        raise ModelLoadError(
            f"model '{hub_id}' is not in the local cache and HF_HUB_OFFLINE is set "
            f"(cache: {cfg.cache_dir}); unset HF_HUB_OFFLINE to download it, or download it "
            "beforehand (e.g. `hf download owner/name`)."
        )
    progress = _Progress(str(hub_id), single_file=bool(hub_id.filename))
    logger.info("downloading %s from %s into %s", hub_id, cfg.endpoint, cfg.cache_dir)
    common: dict[str, Any] = {
        "cache_dir": cfg.cache_dir,
        "endpoint": cfg.endpoint,
        "revision": hub_id.revision,
        "tqdm_class": progress.bar_class(),
    }
    try:
        if hub_id.filename:
            result = Path(hf_hub_download(hub_id.repo, hub_id.filename, **common))
        else:
            result = Path(
                snapshot_download(hub_id.repo, allow_patterns=_allow_patterns(), **common)
            )
            if not (result / "config.json").is_file():
                ggufs = remote_gguf_files(hub_id.repo, result.name)
                if len(ggufs) == 1:
                    result = Path(hf_hub_download(hub_id.repo, ggufs[0], **common))
    except ModelLoadError:
        raise
    except Exception as exc:  # huggingface_hub / httpx / OSError: translated for the user
        raise _explain(exc, hub_id, cfg) from exc
    progress.finish()
    return result


def remote_gguf_files(repo: str, commit: str) -> list[str]:
    """``*.gguf`` paths in ``repo`` at ``commit``, from the file list cached by a download."""
    try:
        from huggingface_hub import get_cached_repo_tree

        files = get_cached_repo_tree(repo, revision=commit, cache_dir=settings().cache_dir)
    except Exception as exc:  # no cached list (or an older huggingface_hub): nothing to tell
        logger.debug("no cached file list for %s: %s", repo, _first_line(exc))
        return []
    return sorted(f.path for f in files if f.path.lower().endswith(".gguf"))


# --------------------------------------------------------------------------- errors
def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in seen:
        seen.append(link)
        link = link.__cause__ or link.__context__
    return seen


def _explain(exc: Exception, hub_id: HubId, cfg: HubSettings) -> ModelLoadError:
    """One clear ``ModelLoadError`` for a failed download (cause first, then the fix)."""
    try:  # the HTTP client huggingface_hub uses: httpx2 (2.x) or httpx (1.x)
        import httpx2
    except ImportError:
        import httpx as httpx2  # type: ignore[no-redef]
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"on {cfg.endpoint}"
    token = (
        "the token set (HF_TOKEN) has no access to it"
        if cfg.has_token
        else "set HF_TOKEN to a token with read access"
    )
    for err in _chain(exc):
        if isinstance(err, GatedRepoError):
            return ModelLoadError(
                f"Hugging Face repo '{hub_id.repo}' is gated {where}: accept its terms on "
                f"{cfg.endpoint}/{hub_id.repo} while logged in, then {token}"
                + ("; request access with the token's account" if cfg.has_token else "")
                + "."
            )
        if isinstance(err, RevisionNotFoundError):
            return ModelLoadError(
                f"Hugging Face repo '{hub_id.repo}' has no revision "
                f"'{hub_id.revision or 'main'}' {where}; check the branch, tag or commit."
            )
        if isinstance(err, RepositoryNotFoundError):
            return ModelLoadError(
                f"Hugging Face repo '{hub_id.repo}' not found {where}: check the id "
                f"(owner/name, as on the hub page); if the repo is private, {token}."
            )
        if isinstance(err, RemoteEntryNotFoundError):
            return ModelLoadError(
                f"Hugging Face repo '{hub_id.repo}' has no file '{hub_id.filename}' {where}; "
                "check the GGUF file name (case matters)."
            )
        if isinstance(err, OfflineModeIsEnabled):
            return ModelLoadError(
                f"model '{hub_id}' is not in the local cache and HF_HUB_OFFLINE is set "
                f"(cache: {cfg.cache_dir}); unset HF_HUB_OFFLINE to download it."
            )
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return ModelLoadError(
                f"disk full while downloading '{hub_id}' into {cfg.cache_dir} "
                f"({err.strerror}); free space there, or set HF_HUB_CACHE to a disk with room "
                f"for the model ({_CACHE_VARS})."
            )
        if isinstance(err, OSError) and err.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
            return ModelLoadError(
                f"cannot write the Hugging Face cache {cfg.cache_dir} ({err.strerror}); set "
                f"HF_HUB_CACHE to a writable directory ({_CACHE_VARS})."
            )
        if isinstance(err, httpx2.ProxyError):
            return ModelLoadError(
                f"the proxy refused the connection to {cfg.endpoint} while fetching "
                f"'{hub_id}' ({_first_line(err)}); check HTTPS_PROXY / HTTP_PROXY."
            )
        if isinstance(err, (httpx2.ConnectError, httpx2.TimeoutException)):
            return ModelLoadError(
                f"cannot reach the Hugging Face hub at {cfg.endpoint} to download '{hub_id}' "
                f"({type(err).__name__}: {_first_line(err)}); check the network, proxy and "
                "HF_ENDPOINT, or download the model beforehand and set HF_HUB_OFFLINE=1."
            )
        if isinstance(err, httpx2.TransportError):
            return ModelLoadError(
                f"the download of '{hub_id}' from {cfg.endpoint} was interrupted "
                f"({type(err).__name__}: {_first_line(err)}) and did not recover; retry "
                "LoadModel (files already complete are kept)."
            )
        if isinstance(err, HfHubHTTPError) and err.response is not None:
            status = err.response.status_code
            return ModelLoadError(
                f"the hub at {cfg.endpoint} answered HTTP {status} while downloading "
                f"'{hub_id}'; retry later (files already complete are kept)."
            )
    if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
        return ModelLoadError(
            f"the download of '{hub_id}' ended short of the file size the hub announced; "
            "retry LoadModel (files already complete are kept)."
        )
    return ModelLoadError(
        f"cannot download '{hub_id}' from {cfg.endpoint}: {type(exc).__name__}: {_first_line(exc)}."
    )


# --------------------------------------------------------------------------- progress
class _Progress:
    """Combines huggingface_hub's progress bars into log lines: files, bytes, rate.

    huggingface_hub reports progress only through a tqdm class; a tqdm subclass that
    logs instead of drawing is the supported hook (``tqdm_class``).
    """

    def __init__(self, name: str, single_file: bool) -> None:
        self.name = name
        self.single_file = single_file
        self.finished = False
        self.start = time.monotonic()
        self.last_log = self.start
        self.lock = threading.Lock()
        self.bars: list[_std_tqdm] = []

    def bar_class(self) -> type[_std_tqdm]:
        progress = self

        class _LogBar(_std_tqdm):
            monitor_interval = 0  # no tqdm monitor thread

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs.pop("name", None)
                kwargs["file"] = io.StringIO()
                kwargs["disable"] = False
                kwargs["mininterval"] = 0.05
                super().__init__(*args, **kwargs)
                with progress.lock:
                    progress.bars.append(self)

            def display(self, msg: str | None = None, pos: int | None = None) -> None:
                progress.maybe_log()

        return _LogBar

    def counts(self) -> tuple[int, int, int, int]:
        """(files done, files total, bytes done, bytes total); totals 0 when unknown."""
        with self.lock:
            bars = list(self.bars)
        file_bars = [b for b in bars if b.unit != "B"]
        byte_bars = [b for b in bars if b.unit == "B"]
        files_done = sum(int(b.n) for b in file_bars)
        files_total = sum(int(b.total or 0) for b in file_bars)
        done = max((int(b.n) for b in byte_bars), default=0)
        totals = [int(b.total) for b in byte_bars if b.total]
        total = max(min(totals), done) if totals else 0
        if self.single_file:  # hf_hub_download: one byte bar, no file bar
            files_total = 1
            files_done = int(bool(total) and done >= total)
        return files_done, files_total, done, total

    def line(self) -> str:
        files_done, files_total, done, total = self.counts()
        elapsed = max(time.monotonic() - self.start, 1e-6)
        of_total = f"/{total / 1e6:.1f}" if total else ""
        return (
            f"{self.name}: {files_done}/{files_total or '?'} files, "
            f"{done / 1e6:.1f}{of_total} MB, {done / 1e6 / elapsed:.1f} MB/s, "
            f"{elapsed:.1f} s"
        )

    def maybe_log(self) -> None:
        now = time.monotonic()
        with self.lock:
            if self.finished or now - self.last_log < PROGRESS_INTERVAL_S:
                return
            self.last_log = now
        logger.info("downloading %s", self.line())

    def finish(self) -> None:
        with self.lock:
            self.finished = True
        logger.info("downloaded %s", self.line())
