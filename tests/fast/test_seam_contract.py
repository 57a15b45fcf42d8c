"""The seam to mlx-lm and mlx-vlm (``seam/``): its contract, its enforcement, the start-up check.

- Contract: every private member the ``seam`` modules declare (``PRIVATE``) exists in the
  installed mlx-lm / mlx-vlm, and the checker fails on one that does not.
- Enforcement: no module outside ``seam/`` (``tests/`` and ``bench/`` aside) names a private
  member of mlx-lm or mlx-vlm. The private names are read from the libraries' own source:
  every ``_x`` they define (module-level functions, classes and assignments, class attributes,
  methods, ``self._x = ...``; found with regular expressions over the source, as parsing their
  ~1,800 files takes ~20 s here, which makes the set a little larger: local names count too),
  less the private names our own classes define (their methods, class attributes and
  ``self._x``, outside ``seam/`` and outside classes derived from a library class). A
  violation is then, in a module outside ``seam/``: an access ``obj._x`` or ``getattr(obj,
  "_x")`` with ``_x`` in that set; any ``self._x`` of that set, method override or
  ``super()._x`` in a class derived from an mlx-lm/mlx-vlm class; an import of a private name
  or module from them; an assignment to a global of one of their modules (or ``vars()`` of
  one). Limits: a name that
  both they and one of our classes define (``_lock``, ``_step``...) passes when read on
  another object, and a module reached dynamically (``sys.modules[...]``) is not seen.
- Start-up: ``seam.contract.check_at_startup`` warns on versions outside the supported range
  and stops the process naming a missing member (``edge/startup.py`` calls it).
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from seam import contract

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = ("mlx_lm", "mlx_vlm")
# Folders whose modules are not checked (and whose names are not "ours").
SKIP = {"seam", "tests", "bench", ".venv", "venv", ".git", "__pycache__"}


# --------------------------------------------------------------------------- the scanner
def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_lib(dotted: str) -> bool:
    return dotted.split(".")[0] in LIBRARIES


_DEFINES = (
    re.compile(r"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+(_\w+)", re.M),
    re.compile(r"^[ \t]*(_\w+)[ \t]*(?::[^=\n]+)?=(?!=)", re.M),
    # self._x = / += / : T = ..., and tuple targets (self._a, self._b = ...)
    re.compile(
        r"\bself\.(_\w+)[ \t]*"
        r"(?:(?::[^=\n]+)?(?:[-+*/%|&^@]|//|\*\*|<<|>>)?=(?!=)|,|\)[ \t]*=(?!=))"
    ),
)


@cache
def library_private_names() -> frozenset[str]:
    """Every private name mlx-lm and mlx-vlm define (see the module docstring)."""
    names: set[str] = set()
    for library in LIBRARIES:
        spec = importlib.util.find_spec(library)
        if spec is None or not spec.submodule_search_locations:
            continue
        for folder in spec.submodule_search_locations:
            for path in Path(folder).rglob("*.py"):
                text = path.read_text(encoding="utf-8", errors="replace")
                for pattern in _DEFINES:
                    names.update(pattern.findall(text))
    return frozenset(n for n in names if _private(n))


def _targets(node: ast.AST) -> Iterator[ast.expr]:
    if isinstance(node, ast.Assign):
        todo = list(node.targets)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        todo = [node.target]
    else:
        return
    while todo:
        target = todo.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            todo.extend(target.elts)
        elif isinstance(target, ast.Starred):
            todo.append(target.value)
        else:
            yield target


def _class_members(cls: ast.ClassDef) -> set[str]:
    """The private names a class defines: methods, class attributes, ``self._x``."""
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        names.update(t.id for t in _targets(node) if isinstance(t, ast.Name))
    for node in ast.walk(cls):
        for t in _targets(node):
            if (
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
            ):
                names.add(t.attr)
    return {n for n in names if _private(n)}


def _imports(tree: ast.Module, module: str) -> dict[str, str]:
    """Local name -> the dotted name it was imported as."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    out[alias.asname] = alias.name
                else:
                    out[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[: -node.level]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                out[alias.asname or alias.name] = f"{base}.{alias.name}"
    return out


def _dotted(expr: ast.expr, imports: dict[str, str]) -> str | None:
    """The dotted name an expression stands for through the module's imports."""
    if isinstance(expr, ast.Name):
        return imports.get(expr.id)
    if isinstance(expr, ast.Attribute):
        base = _dotted(expr.value, imports)
        return f"{base}.{expr.attr}" if base else None
    return None


def _is_lib_module(dotted: str) -> bool:
    if not _is_lib(dotted):
        return False
    try:
        return importlib.util.find_spec(dotted) is not None
    except (ImportError, ValueError, AttributeError):
        return False


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


@dataclass
class _Module:
    name: str
    path: str
    tree: ast.Module
    imports: dict[str, str]


def _parse_module(root: Path, path: Path) -> _Module:
    rel = path.relative_to(root)
    parts = rel.with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return _Module(name, rel.as_posix(), tree, _imports(tree, name))


class Scanner:
    """Finds the uses of mlx-lm's / mlx-vlm's private members in our modules."""

    def __init__(self, root: Path = ROOT) -> None:
        self.library = library_private_names()
        self.modules = {}
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root)
            if SKIP.intersection(rel.parts[:-1]) or rel.name.endswith("_pb2_grpc.py"):
                continue
            mod = _parse_module(root, path)
            self.modules[mod.name] = mod
        self.derived = self._derived(self.modules.values())
        self.ours: set[str] = set()
        for mod in self.modules.values():
            if not self._in_seam(mod):
                for node in ast.walk(mod.tree):
                    if isinstance(node, ast.ClassDef) and self._qual(mod, node) not in self.derived:
                        self.ours |= _class_members(node)
        self.names = self.library - self.ours

    @staticmethod
    def _qual(mod: _Module, cls: ast.ClassDef) -> str:
        return f"{mod.name}.{cls.name}"

    @staticmethod
    def _in_seam(mod: _Module) -> bool:
        return mod.name.split(".")[0] == "seam"

    def _derived(self, modules) -> set[str]:
        """Our classes ("module.Class") derived, directly or through ours, from a class of
        mlx-lm or mlx-vlm."""
        bases: dict[str, list[str]] = {}
        for mod in modules:
            for node in ast.walk(mod.tree):
                if isinstance(node, ast.ClassDef):
                    found = []
                    for base in node.bases:
                        dotted = _dotted(base, mod.imports)
                        if dotted is None and isinstance(base, ast.Name):
                            dotted = f"{mod.name}.{base.id}"
                        if dotted:
                            found.append(dotted)
                    bases[self._qual(mod, node)] = found
        derived = set(getattr(self, "derived", ()))
        changed = True
        while changed:
            changed = False
            for cls, found in bases.items():
                if cls not in derived and any(_is_lib(b) or b in derived for b in found):
                    derived.add(cls)
                    changed = True
        return derived

    def violations(self) -> list[Violation]:
        """Every violation in our modules outside ``seam/``, sorted by file and line."""
        out = []
        for mod in self.modules.values():
            if not self._in_seam(mod):
                out.extend(self._scan(mod, self.derived))
        return sorted(out, key=lambda v: (v.path, v.line, v.what))

    def scan_source(self, source: str, name: str = "snippet") -> list[Violation]:
        """The violations in ``source``, as if it were one more module of the tree."""
        tree = ast.parse(source)
        mod = _Module(name, f"{name}.py", tree, _imports(tree, name))
        return self._scan(mod, self._derived([mod]))

    def _scan(self, mod: _Module, derived: set[str]) -> list[Violation]:
        out: list[Violation] = []

        def add(node: ast.AST, what: str) -> None:
            out.append(Violation(mod.path, getattr(node, "lineno", 0), what))

        def visit(node: ast.AST, cls: str | None) -> None:
            if isinstance(node, ast.ClassDef):
                qual = self._qual(mod, node)
                if qual in derived:
                    for item in node.body:
                        method = isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                        if method and item.name in self.library:  # type: ignore[union-attr]
                            add(item, f"{node.name} overrides the private {item.name}")
                for child in ast.iter_child_nodes(node):
                    visit(child, qual)
                return
            if isinstance(node, ast.ImportFrom) and node.module and _is_lib(node.module):
                if any(_private(p) for p in node.module.split(".")):
                    add(node, f"imports the private module {node.module}")
                for alias in node.names:
                    if _private(alias.name):
                        add(node, f"imports the private {node.module}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if _is_lib(alias.name) and any(_private(p) for p in alias.name.split(".")):
                        add(node, f"imports the private module {alias.name}")
            elif isinstance(node, ast.Attribute):
                self._attribute(node, mod, cls, derived, add)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                self._call(node, mod, add)
            for child in ast.iter_child_nodes(node):
                visit(child, cls)

        visit(mod.tree, None)
        return out

    def _call(self, node: ast.Call, mod: _Module, add: Callable) -> None:
        func = node.func.id  # type: ignore[attr-defined]
        if func == "vars" and node.args:
            dotted = _dotted(node.args[0], mod.imports)
            if dotted and _is_lib_module(dotted):
                add(node, f"vars({dotted}): reaches into the module's globals")
        if func not in ("getattr", "setattr", "hasattr", "delattr") or len(node.args) < 2:
            return
        name = node.args[1]
        if isinstance(name, ast.Constant) and name.value in self.names:
            add(node, f"{func}(..., {name.value!r}): a private member of mlx-lm/mlx-vlm")
        if func in ("setattr", "delattr"):
            dotted = _dotted(node.args[0], mod.imports)
            if dotted and _is_lib_module(dotted):
                add(node, f"{func} on the module {dotted}: replaces one of its globals")

    def _attribute(
        self, node: ast.Attribute, mod: _Module, cls: str | None, derived: set[str], add
    ) -> None:
        name, receiver = node.attr, node.value
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            dotted = _dotted(receiver, mod.imports)
            if dotted and _is_lib_module(dotted):
                add(node, f"assigns {dotted}.{name}: replaces a global of the module")
                return
        if name not in self.library:
            return
        if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls") and cls:
            if cls in derived:
                add(node, f"{receiver.id}.{name}: a private member of the mlx-lm/mlx-vlm base")
            return
        if (
            isinstance(receiver, ast.Call)
            and isinstance(receiver.func, ast.Name)
            and receiver.func.id == "super"
            and cls in derived
        ):
            add(node, f"super().{name}: a private member of the mlx-lm/mlx-vlm base")
            return
        if name in self.ours or _dotted(receiver, mod.imports) in self.modules:
            return  # one of our classes' members, or our module's global
        add(node, f".{name}: a private member of mlx-lm/mlx-vlm")


@pytest.fixture(scope="module")
def scanner() -> Scanner:
    return Scanner()


# --------------------------------------------------------------------------- the contract
def test_every_declared_private_member_exists_in_the_installed_libraries():
    entries = contract.declared()
    for entry in entries:
        assert len(entry) == 4 and all(isinstance(part, str) for part in entry), entry
        module, _owner, name, reason = entry
        assert _is_lib(module) and name, entry
        assert reason.strip(), f"{entry}: say why it is used"
    keys = {e[:3] for e in entries}
    assert ("mlx_lm.models.cache", "RotatingKVCache", "_idx") in keys  # seam/kv.py
    assert ("mlx_lm.tokenizer_utils", "TokenizerWrapper", "_think_start") in keys
    assert ("mlx_vlm.models.base", "", "to_mlx") in keys  # seam/vision.py
    assert contract.missing(entries) == []


def test_the_checker_fails_on_a_member_that_does_not_exist():
    fake = [
        ("mlx_lm.models.cache", "RotatingKVCache", "_no_such_member", "a fake"),
        ("mlx_lm.models.cache", "", "_no_such_global", "a fake"),
        ("mlx_lm.models.cache", "NoSuchClass", "_idx", "a fake"),
        ("mlx_lm.no_such_module", "", "x", "a fake"),
    ]
    problems = contract.missing(fake)
    assert len(problems) == 4, problems
    assert problems[0].startswith("mlx_lm.models.cache.RotatingKVCache._no_such_member does not")
    assert problems[1].startswith("mlx_lm.models.cache._no_such_global does not exist")
    assert "NoSuchClass" in problems[2] and "no_such_module" in problems[3]
    assert all("(used for: a fake)" in p for p in problems)


class _Base:
    def __init__(self) -> None:
        self._set_in_init = 1

    def later(self) -> None:
        self._a, (self._b, *self._c) = 1, (2, 3)
        self._d: int = 4


class _Child(_Base):
    _class_attr = 0


@pytest.mark.parametrize(
    ("owner", "name", "exists"),
    [
        ("_Child", "_set_in_init", True),  # an instance attribute set in a base's __init__
        ("_Child", "_a", True),
        ("_Child", "_b", True),
        ("_Child", "_c", True),
        ("_Child", "_d", True),
        ("_Child", "_class_attr", True),
        ("_Child", "later", True),
        ("_Base", "_class_attr", False),
        ("_Child", "_e", False),
    ],
)
def test_instance_attributes_are_found_in_the_classes_source(owner, name, exists):
    assert contract.has_member(__name__, owner, name) is exists


# --------------------------------------------------------------------------- the enforcement
def test_no_module_outside_seam_names_a_private_member_of_mlx_lm_or_mlx_vlm(scanner):
    found = scanner.violations()
    assert found == [], "\n".join(map(str, found))


SNIPPET = """\
import mlx_lm.models.cache as lm_cache
import mlx_vlm.models.base
from mlx_lm.generate import GenerationBatch
from mlx_lm.models.cache import _BaseCache, RotatingKVCache


def read(layer, gen):
    at = layer._idx
    gen._generation_batch = None
    return getattr(gen, "_unprocessed_sequences", None)


class Ours:
    def __init__(self):
        self._uids = set()
        self._lock = None

    def use(self, other):
        with self._lock:
            return self._uids, other._uids


class Lean(GenerationBatch):
    def _step(self):
        self._next_tokens = None
        return super()._step()


lm_cache.Extra = Ours
mlx_vlm.models.base.to_mlx = None
vars(lm_cache).setdefault("Lean", Lean)
"""


def _line(text: str) -> int:
    return next(i for i, line in enumerate(SNIPPET.splitlines(), 1) if text in line)


def test_the_scanner_flags_private_members_and_not_our_own(scanner):
    found = {(v.line, v.what.split(":")[0]) for v in scanner.scan_source(SNIPPET)}
    assert found == {
        (_line("import _BaseCache"), "imports the private mlx_lm.models.cache._BaseCache"),
        (_line("layer._idx"), "._idx"),
        (_line("gen._generation_batch"), "._generation_batch"),
        (_line('"_unprocessed_sequences"'), "getattr(..., '_unprocessed_sequences')"),
        (_line("def _step"), "Lean overrides the private _step"),
        (_line("self._next_tokens"), "self._next_tokens"),
        (_line("super()._step"), "super()._step"),
        (_line("lm_cache.Extra"), "assigns mlx_lm.models.cache.Extra"),
        (_line("base.to_mlx"), "assigns mlx_vlm.models.base.to_mlx"),
        (_line("vars(lm_cache)"), "vars(mlx_lm.models.cache)"),
    }
    # Our own class's members pass, also when mlx-lm has a member of that name (_lock).
    assert {"_lock", "_idx", "_generation_batch"} <= scanner.library


# --------------------------------------------------------------------------- start-up
def _versions(**installed: str | None) -> Callable[[str], str | None]:
    return lambda distribution: installed.get(distribution.replace("-", "_"))


def test_startup_passes_quietly_on_the_supported_versions(monkeypatch, caplog):
    monkeypatch.setattr(contract, "installed_version", _versions(mlx_lm="0.32.2", mlx_vlm="0.7.10"))
    with caplog.at_level(logging.WARNING, logger=contract.logger.name):
        contract.check_at_startup()
    assert caplog.records == []


@pytest.mark.parametrize(
    ("installed", "named"),
    [
        (
            {"mlx_lm": "0.33.0", "mlx_vlm": "0.7.10"},
            "mlx-lm 0.33.0 is installed; this backend supports >=0.32.0,<0.33",
        ),
        ({"mlx_lm": "0.31.9", "mlx_vlm": "0.7.10"}, "mlx-lm 0.31.9"),
        (
            {"mlx_lm": "0.32.2", "mlx_vlm": "0.8.1"},
            "mlx-vlm 0.8.1 is installed; this backend supports >=0.7.10,<0.8",
        ),
    ],
)
def test_startup_warns_on_a_version_outside_the_range(monkeypatch, caplog, installed, named):
    """Only a warning: a newer mlx-lm brings new model families, and the members we need
    are checked one by one (next test)."""
    monkeypatch.setattr(contract, "installed_version", _versions(**installed))
    with caplog.at_level(logging.WARNING, logger=contract.logger.name):
        contract.check_at_startup()
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert named in caplog.text and "running anyway" in caplog.text


def test_startup_stops_naming_a_missing_private_member(monkeypatch, caplog):
    entries = [*contract.declared(), ("mlx_lm.models.cache", "KVCache", "_gone", "a fake")]
    monkeypatch.setattr(contract, "declared", lambda: entries)
    with (
        caplog.at_level(logging.ERROR, logger=contract.logger.name),
        pytest.raises(SystemExit) as stop,
    ):
        contract.check_at_startup()
    assert stop.value.code == 2
    assert "mlx_lm.models.cache.KVCache._gone does not exist (used for: a fake)" in caplog.text
    assert "missing private member" in caplog.text and "mlx-lm " in caplog.text


def test_startup_stops_when_a_seam_module_cannot_be_imported(monkeypatch, caplog):
    def broken():
        raise ImportError("seam.x cannot be imported: cannot import name 'Gone' from 'mlx_lm'")

    monkeypatch.setattr(contract, "declared", broken)
    with (
        caplog.at_level(logging.ERROR, logger=contract.logger.name),
        pytest.raises(SystemExit),
    ):
        contract.check_at_startup()
    assert "seam.x cannot be imported" in caplog.text


def test_the_server_start_runs_the_check(monkeypatch):
    from edge import startup

    entries = [("mlx_lm.models.cache", "KVCache", "_gone", "a fake")]
    monkeypatch.setattr(contract, "declared", lambda: entries)

    def past_the_check() -> None:
        raise AssertionError("the start went on past the contract check")

    monkeypatch.setattr(startup.lifecycle, "parent_watch_interval", past_the_check)
    with pytest.raises(SystemExit) as stop:
        startup.main(["--addr", "127.0.0.1:0"])
    assert stop.value.code == 2
