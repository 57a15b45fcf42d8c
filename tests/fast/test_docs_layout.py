"""The layout of the code is told by its docstrings: every top-level package's docstring
names each of its modules (and names no module it lacks) and only names that exist, every
root module and package has one, and docs/DEVELOPING.md's layout table is their first
paragraphs, generated (``python tests/fast/test_docs_layout.py`` rewrites it)."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "DEVELOPING.md"
GENERATED = ("backend_pb2.py", "backend_pb2_grpc.py")
# The order a request flows in; a package not named here follows, alphabetically.
FLOW = (
    "backend.py", "edge", "params.py", "parsing", "engine", "prompting", "batch", "decoding",
    "prompt_cache.py", "caches", "seam", "loading", "tasks", "training", "distributed",
    "errors.py", "clients", "test.py",
)  # fmt: skip
BEGIN = (
    "<!-- layout table: generated from the docstrings of the root modules and packages;\n"
    "     python tests/fast/test_docs_layout.py rewrites it -->\n"
)
END = "<!-- end of the layout table -->\n"


def docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


def parts() -> dict[str, Path]:
    """{name: file holding its docstring}: root modules and top-level packages."""
    found = {p.name: p for p in ROOT.glob("*.py") if p.name not in GENERATED}
    for init in ROOT.glob("*/__init__.py"):
        if init.parent.name != "tests" and not init.parent.name.startswith("."):
            found[init.parent.name] = init
    order = {name: i for i, name in enumerate(FLOW)}
    return dict(sorted(found.items(), key=lambda kv: (order.get(kv[0], len(FLOW)), kv[0])))


def layout_table() -> str:
    lines = ["| module / package | what it is (its docstring's first paragraph) |", "|---|---|"]
    for name, path in parts().items():
        first = " ".join(docstring(path).split("\n\n")[0].split()).removesuffix(":")
        shown = f"`{name}/`" if path.name == "__init__.py" else f"`{name}`"
        cell = first.replace("``", "`").replace("|", "\\|")
        lines.append(f"| {shown} | {cell} |")
    return "\n".join(lines) + "\n"


def with_table(text: str) -> str:
    start, stop = text.find(BEGIN), text.find(END)
    if start < 0 or stop < start:
        raise ValueError("docs/DEVELOPING.md lacks the markers of the layout table")
    return text[: start + len(BEGIN)] + "\n" + layout_table() + "\n" + text[stop:]


def test_every_root_module_and_package_has_a_docstring() -> None:
    missing = [name for name, path in parts().items() if not docstring(path).strip()]
    assert missing == []
    assert {"edge", "engine", "batch", "seam", "params.py"} <= set(parts())


def test_each_package_docstring_names_its_modules_and_no_other() -> None:
    wrong = {}
    for name, path in parts().items():
        if path.name != "__init__.py":
            continue
        modules = {
            p.stem if p.suffix == ".py" else p.name
            for p in path.parent.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
        }
        doc = docstring(path)
        named = set(re.findall(r"`+(\w+)(?:\.py)?`+", doc))
        unnamed = modules - named
        # A list item names modules of the package ("- ``name``: ..." or "- ``a`` and ``b``").
        listed = {
            m
            for item in re.findall(r"^- (.*?):", doc, re.M)
            for m in re.findall(r"`+(\w+)(?:\.py)?`+", item)
        }
        gone = listed - modules
        if unnamed or gone:
            wrong[name] = {"not named": sorted(unnamed), "no such module": sorted(gone)}
    assert wrong == {}


def project_names() -> set[str]:
    """Every module, class, function, module-level and imported name of the product, and
    every message, field and RPC of backend.proto."""
    import backend_pb2

    names = set(parts()) | {n.removesuffix(".py") for n in parts()}
    for path in parts().values():
        files = path.parent.rglob("*.py") if path.name == "__init__.py" else [path]
        for file in files:
            names |= {file.stem, file.parent.name}
            for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Assign):
                    names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names.add(node.target.id)
                elif isinstance(node, ast.ImportFrom):  # a library's class it wraps
                    names |= {alias.name for alias in node.names}
    for message in backend_pb2.DESCRIPTOR.message_types_by_name.values():
        names |= {message.name, *(f.name for f in message.fields)}
    for service in backend_pb2.DESCRIPTOR.services_by_name.values():
        names |= {m.name for m in service.methods}
    return names


def test_package_docstrings_name_only_what_exists() -> None:
    known = project_names()
    stale = {}
    for name, path in parts().items():
        if path.name != "__init__.py":
            continue
        named = re.findall(r"`+([A-Za-z_][\w.]*)`+", docstring(path))
        gone = [
            n
            for n in named
            if not {n, n.removesuffix(".py"), n.split(".")[-1]} & known
            and importlib.util.find_spec(n.split(".")[0]) is None  # a library: mlx_lm.convert
        ]
        if gone:
            stale[name] = gone
    assert stale == {}


def test_the_layout_table_is_generated_from_the_docstrings() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert with_table(text) == text, (
        "docs/DEVELOPING.md's layout table differs from the docstrings: run "
        "`python tests/fast/test_docs_layout.py`"
    )
    assert "| `seam/` | The one seam to mlx-lm and mlx-vlm" in text


if __name__ == "__main__":
    PAGE.write_text(with_table(PAGE.read_text(encoding="utf-8")), encoding="utf-8")
    sys.exit(0)
