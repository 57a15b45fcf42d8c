"""Commands the docs give a newcomer, run as written (what the reader types), and the names
they give (make targets, client and backend flags, environment variables, request bodies)
checked against the code."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

from loading import model_loader

LOCALAI = (ROOT / "docs" / "LOCALAI.md").read_text(encoding="utf-8")


def test_the_command_that_prints_the_embedded_models_path_works() -> None:
    """docs/LOCALAI.md 2: ``.venv/bin/python -c '...'`` in this backend's directory."""
    found = re.findall(r"python -c '([^']*embedded_model_path[^']*)'", LOCALAI)
    assert len(found) == 1, found
    run = subprocess.run(
        [sys.executable, "-c", found[0]], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert Path(run.stdout.strip()) == model_loader.embedded_model_path()


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_make_targets_the_docs_name_exist() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    named = set()
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        named |= set(re.findall(r"`make(?: [A-Z_]+=\S+)* ([a-z][\w-]*)", text))
        named |= set(re.findall(r"^make(?: [A-Z_]+=\S+)* ([a-z][\w-]*)", text, re.M))
    assert {"run", "test", "test-fast", "install", "install-test"} <= named
    assert named <= targets, sorted(named - targets)
    # CI runs exactly the README's test command.
    assert (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().endswith("make test")


def test_the_client_flags_the_readme_uses_exist() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = re.findall(r"python -m clients\.cli (.*)", readme)
    flags = {f for line in lines for f in re.findall(r"(--[a-z-]+)", line)}
    assert {"--chat", "--prompt", "--help"} <= flags
    helped = subprocess.run(
        [sys.executable, "-m", "clients.cli", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert helped.returncode == 0, helped.stderr
    assert all(f in helped.stdout for f in flags - {"--help"}), helped.stdout


def test_the_grpcurl_requests_in_the_docs_are_valid_messages() -> None:
    """Each ``grpcurl -d '{...}' ... backend.Backend/Method`` reads as the method's input
    message, as grpcurl reads it (protobuf's JSON mapping: an unknown field is an error)."""
    from google.protobuf import json_format

    import backend_pb2

    service = backend_pb2.DESCRIPTOR.services_by_name["Backend"]
    checked = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8").replace("\\\n", " ")
        for body, method in re.findall(
            r"grpcurl [^\n]*?-d '([^']*)'[^\n]*?backend\.Backend/(\w+)", text
        ):
            message = getattr(backend_pb2, service.methods_by_name[method].input_type.name)
            json_format.Parse(body, message())
            checked.append(method)
    assert {"Predict", "LoadModel"} <= set(checked)


# Set by the backend for itself (the fast-BLAS re-exec guard): nothing for a user to set.
INTERNAL_ENV = {"LOCALAI_MLX_BLAS_REEXEC"}


def product_files() -> list[Path]:
    paths = [p for p in sorted(ROOT.glob("*.py")) if "pb2" not in p.name]
    for package in sorted(ROOT.glob("*/__init__.py")):
        if package.parent.name != "tests":
            paths += sorted(package.parent.rglob("*.py"))
    return paths


def test_every_variable_of_ours_the_code_reads_has_a_row_in_operating() -> None:
    ours = {
        node.value
        for path in product_files()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"LOCALAI_[A-Z0-9_]+", node.value)
    }
    assert {"LOCALAI_GRPC_AUTH_TOKEN", "LOCALAI_MLX_WARMUP"} <= ours
    table = (ROOT / "docs" / "OPERATING.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `([A-Z0-9_]+)` \|", table, re.M))
    assert ours - INTERNAL_ENV <= rows, sorted(ours - INTERNAL_ENV - rows)


def test_every_flag_of_the_backend_is_documented() -> None:
    flags = set()
    for path in (ROOT / "edge" / "startup.py", ROOT / "engine" / "metrics.py"):
        text = path.read_text(encoding="utf-8")
        flags |= set(re.findall(r'add_argument\(\s*"(--[a-z-]+)"', text))
    assert {"--addr", "--model", "--grace", "--worker"} <= flags
    docs = "\n".join(d.read_text(encoding="utf-8") for d in DOCS)
    assert [f for f in sorted(flags) if not re.search(rf"{f}\b", docs)] == []


def test_every_prometheus_series_is_documented() -> None:
    source = (ROOT / "engine" / "metrics.py").read_text(encoding="utf-8")
    series = set(re.findall(r'PREFIX \+ "(\w+)"', source))
    assert {"time_to_first_token_seconds", "preemptions", "memory_bytes"} <= series
    page = (ROOT / "docs" / "OPERATING.md").read_text(encoding="utf-8")
    metrics = page[page.index("## Metrics") : page.index("## Health")]
    named = set(re.findall(r"`(\w+?)(?:_total)?(?:\{[^}]*\})?`", metrics))
    assert series <= named, sorted(series - named)
