"""Every link between the documents resolves: relative links and their anchors in
README.md and docs/*.md, and the references written as text (docs/MEMORY.md, or
docs/DECODING.md, "Tool-call grammars") in the documents and the product's Python files."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# docs/NAME.md, optionally followed by , "Section" (or README "Section", the old form).
TEXT_REF = re.compile(r'\b(docs/[A-Z_]+\.md|README)(?:,? "([^"]+)")?')


def headings(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return [m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", text, re.M)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower())
    return text.replace(" ", "-")


def broken_links(path: Path) -> list[str]:
    broken = []
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in map(slug, headings(dest)):
            broken.append(f"{target}: no such heading")
    return broken


def test_relative_links_and_anchors_resolve() -> None:
    broken = {p.name: b for p in DOCS if (b := broken_links(p))}
    assert broken == {}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    # The README links every page of docs/.
    assert {p.name for p in DOCS[1:]} <= set(re.findall(r"\(docs/(\w+\.md)\)", readme))


def test_a_link_to_a_missing_heading_is_found(tmp_path: Path) -> None:
    page = tmp_path / "a.md"
    page.write_text("# Title\n\n## Memory budget\n\n[x](a.md#memory-budget) [y](#nope) [z](b.md)\n")
    assert broken_links(page) == ["#nope: no such heading", "b.md: no such file"]
    assert (
        slug("Volatile spans and prompt-cache misses") == "volatile-spans-and-prompt-cache-misses"
    )
    assert slug("`LoadModel` (re)loads, v1.2") == "loadmodel-reloads-v12"


def python_text(path: Path) -> str:
    """The strings (implicit concatenations joined, f-strings' literal parts) and comments
    of a Python file: where its references to the documents are written."""
    source = path.read_text(encoding="utf-8")
    parts = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline)
             if t.type == tokenize.COMMENT]  # fmt: skip
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            parts.append("".join(v.value for v in node.values if isinstance(v, ast.Constant)))
    return "\n".join(parts)


def text_references() -> list[tuple[str, str, str]]:
    """(where, file, section) of every text reference in the documents and product code."""
    found = []
    sources = [*DOCS]
    for package in ROOT.glob("*/__init__.py"):  # the product's packages, and its root modules
        if package.parent.name != "tests":
            sources += sorted(package.parent.rglob("*.py"))
    sources += [p for p in sorted(ROOT.glob("*.py")) if "pb2" not in p.name]
    for path in sources:
        text = python_text(path) if path.suffix == ".py" else path.read_text(encoding="utf-8")
        text = " ".join(text.split())  # references across lines
        for file, section in TEXT_REF.findall(text):
            found.append((str(path.relative_to(ROOT)), file, section))
    return found


def test_text_references_name_pages_and_sections_that_exist() -> None:
    refs = text_references()
    assert any(file == "docs/MEMORY.md" for _, file, _ in refs)
    wrong = []
    for where, file, section in refs:
        dest = ROOT / ("README.md" if file == "README" else file)
        if not dest.exists():
            wrong.append(f"{where}: {file}")
        elif section and not any(h.startswith(section) for h in headings(dest)):
            wrong.append(f'{where}: {file}, "{section}"')
    assert wrong == []
