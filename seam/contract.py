"""What this backend needs of mlx-lm and mlx-vlm: the supported versions and the private members.

- ``SUPPORTED``: the version ranges the suite passes on: mlx-lm 0.32.x (the pinned 0.32.2 and
  mlx-lm's main branch, which still calls itself 0.32.0), mlx-vlm 0.7.x from the pinned 0.7.10.
- ``declared()``: every ``PRIVATE`` entry of the ``seam`` package's modules, ``(module, owner,
  name, reason)`` (owner: a class name, or "" for a module-level name).
- ``missing(entries)``: those the installed libraries lack, each said in a line.
- ``check_at_startup()``: run by ``edge/startup.py``. A version outside ``SUPPORTED`` only logs a
  warning naming both: a newer mlx-lm is how new model families arrive, and what can break is
  checked member by member just after. A declared private member that is missing stops the
  process (exit 2) naming it: the code that uses it would fail later, in the middle of a request.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import pkgutil
import textwrap
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

logger = logging.getLogger("localai.mlx." + __name__)

# distribution -> (import name, supported versions)
SUPPORTED: dict[str, tuple[str, str]] = {
    "mlx-lm": ("mlx_lm", ">=0.32.0,<0.33"),
    "mlx-vlm": ("mlx_vlm", ">=0.7.10,<0.8"),
}

Entry = tuple[str, str, str, str]


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (its metadata), None when not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_problems() -> list[str]:
    """One line per installed library whose version is outside ``SUPPORTED``."""
    problems = []
    for distribution, (_module, spec) in SUPPORTED.items():
        version = installed_version(distribution)
        if version is None:
            continue
        try:
            supported = Version(version) in SpecifierSet(spec, prereleases=True)
        except InvalidVersion:
            supported = False
        if not supported:
            problems.append(
                f"{distribution} {version} is installed; this backend supports {spec} "
                '(docs/DEVELOPING.md, "Supported versions")'
            )
    return problems


def declared() -> list[Entry]:
    """Every ``PRIVATE`` entry of the modules of the ``seam`` package (each imported).
    Raises ImportError naming a module that cannot be imported."""
    import seam

    entries: list[Entry] = []
    for info in sorted(pkgutil.iter_modules(seam.__path__), key=lambda i: i.name):
        name = f"seam.{info.name}"
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ImportError(f"{name} cannot be imported: {exc}") from exc
        for entry in getattr(module, "PRIVATE", ()):
            entries.append(tuple(entry))
    return entries


def _installed(library: str) -> bool:
    return importlib.util.find_spec(library) is not None


def missing(entries: Iterable[Sequence[str]]) -> list[str]:
    """The entries the installed mlx-lm / mlx-vlm lack, one line each (``module.owner.name``
    and the reason it is used). Entries of a library that is not installed are skipped
    (mlx-vlm is optional: without it models load text-only)."""
    problems = []
    for module_name, owner, name, reason, *_ in entries:
        if not _installed(module_name.split(".")[0]):
            continue
        where = ".".join(p for p in (module_name, owner, name) if p)
        try:
            found = has_member(module_name, owner, name)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{where}: {type(exc).__name__}: {exc} (used for: {reason})")
            continue
        if not found:
            problems.append(f"{where} does not exist (used for: {reason})")
    return problems


def has_member(module_name: str, owner: str, name: str) -> bool:
    """Whether ``module_name`` has ``name`` (owner ""), or its class ``owner`` has it: a class
    attribute or method, or an instance attribute that some method of the class or of a
    base class assigns (``self.<name> = ...``). Raises ImportError / AttributeError when
    the module or the class does not exist."""
    module = importlib.import_module(module_name)
    if not owner:
        return hasattr(module, name)
    cls: Any = module
    for part in owner.split("."):
        cls = getattr(cls, part)
    if not inspect.isclass(cls):
        raise AttributeError(f"{module_name}.{owner} is not a class")
    if hasattr(cls, name):
        return True
    return any(name in _assigned_on_self(klass) for klass in cls.__mro__ if klass is not object)


@cache
def _assigned_on_self(cls: type) -> frozenset[str]:
    """The names X of every ``self.X = ...`` (also augmented, annotated, tuple targets) in
    ``cls``'s own source."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return frozenset()
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        while targets:
            target = targets.pop()
            if isinstance(target, (ast.Tuple, ast.List)):
                targets.extend(target.elts)
            elif isinstance(target, ast.Starred):
                targets.append(target.value)
            elif (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                names.add(target.attr)
    return frozenset(names)


def problems() -> list[str]:
    """What stops the start: a ``seam`` module that cannot be imported, or a declared
    private member the installed libraries lack."""
    try:
        entries = declared()
    except ImportError as exc:
        return [str(exc)]
    return missing(entries)


def check_at_startup() -> None:
    """Warn about library versions outside ``SUPPORTED``; exit 2 (SystemExit), after
    logging each one, when a declared private member is missing."""
    for line in version_problems():
        logger.warning("%s: running anyway, the private members it needs are checked", line)
    found = problems()
    if not found:
        return
    versions = ", ".join(
        f"{d} {installed_version(d) or 'not installed'}" for d in sorted(SUPPORTED)
    )
    for line in found:
        logger.error("mlx-lm/mlx-vlm contract: %s", line)
    logger.error(
        "%s: this backend cannot run on the installed %s; install the versions of "
        "requirements.txt / requirements-vision.txt",
        "missing private member" if len(found) == 1 else f"{len(found)} problems",
        versions,
    )
    raise SystemExit(2)
