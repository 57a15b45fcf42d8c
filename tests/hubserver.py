"""A small Hugging Face Hub stand-in on 127.0.0.1 for download tests (HF_ENDPOINT).

It speaks the part of the hub's HTTP protocol that huggingface_hub's ``snapshot_download``
and ``hf_hub_download`` use, as read from huggingface_hub's source:

- ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}``: ``id``, ``sha``
  (the commit) and ``siblings``;
- ``GET /api/models/{repo}/tree/{rev}``: the recursive file list (``type``, ``path``,
  ``size``, ``oid``, and ``lfs`` {``oid`` = sha256, ``size``, ``pointerSize``} for weights);
- ``HEAD`` / ``GET /{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag`` (the git
  blob sha1, or for LFS files the sha256 also sent as ``X-Linked-Etag`` with
  ``X-Linked-Size``), ``Content-Length``, and ``Range`` requests answered 206;
- errors as the hub sends them: 404 ``X-Error-Code: RepoNotFound`` for an unknown repo,
  401 ``GatedRepo`` for a gated repo without the right ``Authorization: Bearer`` token,
  404 ``RevisionNotFound`` / ``EntryNotFound``.

Written for the tests (no library serves the hub's protocol locally). Every request is
recorded in ``requests`` (method, path, Range header) so tests can tell downloads from
cache hits; ``drop_once`` cuts the connection once in the middle of a file, and
``fail_once`` answers one GET of a file with an HTTP error.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")
CHUNK = 1 << 20


@dataclass
class RepoFile:
    path: str
    source: Path
    size: int
    git_sha1: str
    sha256: str
    lfs: bool


@dataclass
class Repo:
    repo_id: str
    sha: str
    files: dict[str, RepoFile]
    token: str | None = None  # set: the repo is gated, this token has access


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class HubServer:
    """The stand-in hub; ``url`` is its endpoint once ``start()`` ran."""

    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)  # repo path -> bytes sent before cut
    failures: dict[str, int] = field(default_factory=dict)  # repo path -> HTTP status
    lock: threading.Lock = field(default_factory=threading.Lock)
    digests: dict[Path, tuple[int, str, str]] = field(default_factory=dict)  # size, sha1, sha256

    def add_repo(
        self, repo_id: str, content: Path | dict[str, Path], token: str | None = None
    ) -> Repo:
        """Serve ``content`` as ``repo_id`` (gated when ``token``): every file under a
        directory, or a {path in repo: source file} dict."""
        if isinstance(content, Path):
            content = {
                p.relative_to(content).as_posix(): p for p in content.rglob("*") if p.is_file()
            }
        files: dict[str, RepoFile] = {}
        for rel, source in sorted(content.items()):
            if source not in self.digests:
                data = source.read_bytes()
                self.digests[source] = (
                    len(data),
                    hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
                    hashlib.sha256(data).hexdigest(),
                )
            size, git_sha1, sha256 = self.digests[source]
            files[rel] = RepoFile(rel, source, size, git_sha1, sha256, rel.endswith(LFS_SUFFIXES))
        commit = hashlib.sha1(
            repo_id.encode() + b"".join(f.git_sha1.encode() for f in files.values())
        ).hexdigest()
        repo = Repo(repo_id, commit, files, token)
        self.repos[repo_id] = repo
        return repo

    def drop_once(self, path: str, after_bytes: int) -> None:
        """Cut the connection after ``after_bytes`` of the next GET of file ``path``."""
        self.drops[path] = after_bytes

    def fail_once(self, path: str, status: int = 500) -> None:
        """Answer the next GET of file ``path`` with HTTP ``status``."""
        self.failures[path] = status

    def file_gets(self) -> list[Request]:
        """The GET requests for files (not the API) seen so far."""
        with self.lock:
            return [r for r in self.requests if r.method == "GET" and "/resolve/" in r.path]

    def start(self) -> HubServer:
        server = self

        class Handler(_Handler):
            hub = server

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    # ------------------------------------------------------------------ routing
    def _route(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        with self.hub.lock:
            self.hub.requests.append(
                Request(
                    self.command,
                    path,
                    self.headers.get("Range"),
                    self.headers.get("Authorization"),
                )
            )
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo = self._repo("/".join(parts[2:4]))
            if repo is None:
                return
            rest = parts[4:]
            if not rest or rest[0] == "revision":
                if rest and not self._revision(repo, "/".join(rest[1:])):
                    return
                self._json(
                    {
                        "id": repo.repo_id,
                        "sha": repo.sha,
                        "private": False,
                        "gated": "manual" if repo.token else False,
                        "siblings": [{"rfilename": name} for name in repo.files],
                    }
                )
                return
            if rest[0] == "tree" and len(rest) >= 2 and self._revision(repo, rest[1]):
                self._json([self._tree_entry(f) for f in repo.files.values()])
                return
            self._error(404, "EntryNotFound", "unknown API path")
            return
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self._repo("/".join(parts[:2]))
            if repo is None or not self._revision(repo, parts[3]):
                return
            name = "/".join(parts[4:])
            entry = repo.files.get(name)
            if entry is None:
                self._error(404, "EntryNotFound", f"{name} does not exist", repo)
                return
            self._file(repo, entry, head)
            return
        self._error(404, None, "not found")

    def _repo(self, repo_id: str) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}":
            self._error(
                401,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it and "
                "be authenticated to access it. Please log in.",
            )
            return None
        return repo

    def _revision(self, repo: Repo, rev: str) -> bool:
        if rev in ("main", repo.sha):
            return True
        self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", repo)
        return False

    @staticmethod
    def _tree_entry(f: RepoFile) -> dict:
        entry = {"type": "file", "path": f.path, "size": f.size, "oid": f.git_sha1}
        if f.lfs:
            entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
        return entry

    # ------------------------------------------------------------------ answers
    def _json(self, data) -> None:
        body = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str | None, message: str, repo: Repo | None = None):
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if repo is not None:
            self.send_header("X-Repo-Commit", repo.sha)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _file(self, repo: Repo, f: RepoFile, head: bool) -> None:
        if not head:
            with self.hub.lock:
                status = self.hub.failures.pop(f.path, None)
                drop_at = self.hub.drops.pop(f.path, None)
            if status is not None:
                self._error(status, None, "injected failure", repo)
                return
        else:
            drop_at = None
        start, end = 0, f.size - 1
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng[len("bytes=") :].partition("-")
            start = int(first) if first else 0
            end = int(last) if last else f.size - 1
        partial = rng is not None and not head
        self.send_response(206 if partial else 200)
        etag = f.sha256 if f.lfs else f.git_sha1
        self.send_header("ETag", f'"{etag}"')
        if f.lfs:
            self.send_header("X-Linked-Etag", f'"{f.sha256}"')
            self.send_header("X-Linked-Size", str(f.size))
        self.send_header("X-Repo-Commit", repo.sha)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start + 1))
        if partial:
            self.send_header("Content-Range", f"bytes {start}-{end}/{f.size}")
        self.end_headers()
        if head:
            return
        sent = 0
        with f.source.open("rb") as fh:
            fh.seek(start)
            remaining = end - start + 1
            while remaining > 0:
                n = min(CHUNK, remaining)
                if drop_at is not None:
                    n = min(n, drop_at - sent)
                    if n <= 0:
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        return
                chunk = fh.read(n)
                self.wfile.write(chunk)
                sent += len(chunk)
                remaining -= len(chunk)


# The embedded SmolLM2 as the tests serve it.
REPO = "test-org/smollm2-mlx"  # its converted MLX directory
GATED = "test-org/gated"  # the same, gated: needs TOKEN
GGUF_REPO = "test-org/smollm2-gguf"  # the GGUF file itself
TOKEN = "hf_test_token"


def serve_embedded(mlx_dir: Path) -> HubServer:
    """A started hub serving ``mlx_dir`` (the embedded model converted) as ``REPO`` and
    ``GATED``, and the embedded GGUF as ``GGUF_REPO``."""
    from loading import model_loader

    server = HubServer()
    server.add_repo(REPO, mlx_dir)
    server.add_repo(GATED, mlx_dir, token=TOKEN)
    gguf = model_loader.embedded_model_path()
    server.add_repo(GGUF_REPO, {gguf.name: gguf})
    return server.start()
