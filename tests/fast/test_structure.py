"""No import circle among the project's own modules, nor between its rooms (top-level
packages and root modules); seam/ imports nothing of ours; no test module imports another;
no class over MAX_CLASS_LINES lines.

The graph is read from the source with ``ast`` (nothing is imported): every ``import`` and
``from ... import`` of a project module counts, at module level, inside functions (a lazy
import only hides a circle from the interpreter) and under ``TYPE_CHECKING`` (a circle in
the types is one in the design). A package's ``__init__`` is not counted as imported by
its own submodules' imports (Python runs it first, but it only names its parts).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from helpers import ROOT

GENERATED = ("backend_pb2.py", "backend_pb2_grpc.py")


def project_modules() -> dict[str, Path]:
    """{dotted name: file} of the top-level modules and packages (not tests, not .venv)."""
    modules: dict[str, Path] = {}
    for path in sorted(ROOT.glob("*.py")):
        if path.name not in GENERATED:
            modules[path.stem] = path
    for init in sorted(ROOT.glob("*/__init__.py")):
        package = init.parent
        if package.name in ("tests", ".venv") or package.name.startswith("."):
            continue
        for path in sorted(package.rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that module ``name`` (file ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def add(target: str) -> None:
        # The longest project module that ``target`` names (a.b.c -> a.b when c is a name).
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in modules else base)
    return found


@functools.cache  # read once per run: every test here only reads it
def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_graph_is_read():
    graph = import_graph()
    # Known edges, one of each import form: the reader sees what it must.
    assert "engine.status" in graph["engine.core"]  # from engine import status as ...
    assert "distributed.collectives" in graph["distributed.sharding"]  # under TYPE_CHECKING
    assert "errors" in graph["engine.core"]  # from errors import ...
    assert "backend" in graph and "edge.startup" in graph


def test_cycles_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_import_circle_among_our_modules():
    circles = cycles(import_graph())
    assert not circles, "import circles (cut each one): " + "; ".join(
        " <-> ".join(c) for c in circles
    )


def rooms(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between rooms: a top-level package or a module at the root (what
    ``farm-studio look`` draws as one room). An edge a -> b when a module of a imports one of b."""
    out: dict[str, set[str]] = {}
    for name, targets in graph.items():
        room = name.split(".")[0]
        out.setdefault(room, set()).update(t.split(".")[0] for t in targets)
        out[room].discard(room)
    return out


def test_rooms_folds_modules_into_their_room():
    graph = {"a.x": {"b.y", "a.z"}, "a.z": set(), "b.y": {"c"}, "c": set()}
    assert rooms(graph) == {"a": {"b"}, "b": {"c"}, "c": set()}
    # a -> b -> a through different modules: no module circle, but a circle of rooms.
    assert cycles(rooms({"a.x": {"b.y"}, "b.z": {"a.w"}})) == [["a", "b"]]


def test_no_circle_between_rooms():
    """The rooms stand on floors, each above every room it imports: no import runs back up
    (a circle between rooms is one that does, e.g. decoding -> seam -> decoding)."""
    circles = cycles(rooms(import_graph()))
    assert not circles, "rooms that import each other (move what one needs down): " + "; ".join(
        " <-> ".join(c) for c in circles
    )


def test_each_task_is_reached_from_the_engine_in_one_call():
    """Issue 40 item 5: Score, Rerank and Embedding go from the engine straight to their
    task (`engine.core.TASKS`: the task module's own ``prepare_on`` and ``run_on``); no other
    engine module imports a task, so no layer in between passes them on."""
    from engine.core import EMBED, RERANK, SCORE, TASKS

    modules = {op: {t.prepare_on.__module__, t.run_on.__module__} for op, t in TASKS.items()}
    assert modules == {
        SCORE: {"tasks.scoring"},
        RERANK: {"tasks.rerank"},
        EMBED: {"tasks.embedding"},
    }
    graph = import_graph()
    importers = sorted(
        name
        for name, targets in graph.items()
        if name.startswith("engine.") and any(t.startswith("tasks.") for t in targets)
    )
    assert importers == ["engine.core"]


def test_seam_imports_nothing_of_ours():
    """seam/ (what touches mlx-lm's and mlx-vlm's internals) is the ground floor."""
    graph = import_graph()
    outside = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name.split(".")[0] == "seam"
        for target in targets
        if target.split(".")[0] != "seam"
    )
    assert outside == []


def test_no_test_module_imports_another():
    """Helpers shared by test modules live in tests/helpers.py (or a tier's conftest.py),
    not in a test module that another one imports."""
    offenders = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                if name.rpartition(".")[2].startswith("test_"):
                    offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, offenders


#: The longest a class of ours may be (issue 29): past it, split it by job.
MAX_CLASS_LINES = 400


def test_no_class_is_over_400_lines() -> None:
    long = []
    for name, path in project_modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert not long, "split these classes by job: " + "; ".join(long)


def test_only_batch_release_clears_mlx_buffers() -> None:
    """Issue 32: every ``mx.clear_cache`` waits for the work in flight first, so one
    function owns the call (`batch.release.release_cache`)."""
    callers = []
    for name, path in project_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "clear_cache":
                callers.append(name)
    assert sorted(set(callers)) == ["batch.release"], callers


def _record_fields() -> set[str]:
    from helpers import gen_params

    from engine.jobs import Job
    from engine.sequence import Sequence
    from params import GenerationRequest, PromptSpec

    return set(vars(Sequence(Job(GenerationRequest(gen_params(), PromptSpec()), (1, 2)))))


def test_only_the_sequence_record_writes_its_fields() -> None:
    """Issue 40: one engine-side record per request (`engine.sequence.Sequence`); other
    modules call its methods (`admitted`, `running`, `decoded`, `preempted`...) and
    never assign ``x.field = ...`` for one of its fields on another object."""
    fields = _record_fields()
    writes = []
    for name, path in project_modules().items():
        # Where sequences are handled (batch/ and decoding/ keep records of their own:
        # a batch row's tokens, a draft's counts).
        if name == "engine.sequence" or name.split(".")[0] not in ("engine", "distributed"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[ast.expr] = []
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if (
                        isinstance(t, ast.Attribute)
                        and isinstance(t.ctx, ast.Store)
                        and t.attr in fields
                        and not (isinstance(t.value, ast.Name) and t.value.id == "self")
                    ):
                        writes.append(f"{name}:{t.lineno}: .{t.attr}")
    assert writes == []


def test_a_job_holds_no_engine_thread_state() -> None:
    """`Job` is the event-loop handle: the prepared request, its events, its cancel flag."""
    from helpers import gen_params

    from engine.jobs import Job
    from params import GenerationRequest, PromptSpec

    job = Job(GenerationRequest(gen_params(), PromptSpec()), (1, 2))
    engine_side = _record_fields() - {
        "job", "request", "prompt_ids", "initial_state", "checkpoints", "model_serial",
        "vision", "max_tokens", "submitted", "params",
    }  # fmt: skip
    assert engine_side & set(vars(job)) == set()
    assert {"uid", "tokens", "runner", "pipeline", "resume_ids"} <= engine_side
