"""The import graph of harness/ points one way: no cycles, no upward imports.

The graph is built from the source with `ast` (every import, also those inside
functions and under TYPE_CHECKING), so a lazy import cannot hide a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO

ROOT = REPO / "harness"

# The layering, lowest first; a module may import only from its own layer or lower ones.
# The root `harness/__init__.py` (the public API) sits above all and may import anything;
# nothing may import the root package itself.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_version", "errors"),
    ("evidence",),
    ("records",),
    ("stats",),
    ("providers",),
    ("meter",),
    ("workers",),
    ("gate",),
    ("evals",),
    ("prereg",),
    ("run",),
    ("audit",),
    ("analysis",),
    ("notebooks",),
    ("cli",),
)
RANK: dict[str, int] = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def _module_name(path: Path) -> str:
    parts = ["harness", *path.relative_to(ROOT).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every harness module `name` imports (`from pkg import mod` imports pkg.mod, not pkg)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                drop = node.level - 1 if is_package else node.level
                base = base[: len(base) - drop] if drop else base
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                found.add(submodule if submodule in known else module)
    return {target for target in found if target in known and target != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _package(module: str) -> str:
    """The top-level part of harness a module belongs to ('' for the root: __init__, __main__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] != "__main__" else ""


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_one_cycle(graph, set(component)) for component in components]


def _one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A concrete cycle inside a strongly connected component, as a path a -> ... -> a."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for target in sorted(graph[node] & component):
                if target == start:
                    return [*paths[node], start]
                if target not in paths:
                    paths[target] = [*paths[node], target]
                    nxt.append(target)
        frontier = nxt
    raise AssertionError(f"no cycle in {component}")  # pragma: no cover


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for source, targets in graph.items():
        if not _package(source):
            continue
        edges = packages.setdefault(_package(source), set())
        edges.update(_package(t) for t in targets if _package(t) and _package(t) != _package(source))
    return packages


def test_every_part_has_a_layer() -> None:
    parts = {_package(name) for name in _modules()} - {""}
    assert not parts - set(RANK), f"parts of harness/ with no layer in LAYERS: {sorted(parts - set(RANK))}"


def test_no_import_cycle_between_modules() -> None:
    cycles = [" -> ".join(cycle) for cycle in _cycles(_graph())]
    assert not cycles, "import cycles between modules:\n" + "\n".join(cycles)


def test_no_import_cycle_between_packages() -> None:
    cycles = [" -> ".join(cycle) for cycle in _cycles(_package_graph(_graph()))]
    assert not cycles, "import cycles between packages:\n" + "\n".join(cycles)


def test_no_upward_import() -> None:
    upward = []
    for source, targets in sorted(_graph().items()):
        low = _package(source)
        for target in sorted(targets):
            high = _package(target)
            if not low:
                continue  # the root public API may import anything
            if not high:
                upward.append(f"{source} -> {target} (nothing imports the root package)")
            elif RANK[high] > RANK[low]:
                upward.append(f"{source} -> {target} ({low} is below {high})")
    assert not upward, "upward imports (see LAYERS):\n" + "\n".join(upward)


def _example_graph() -> dict[str, set[str]]:
    return {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}


def test_cycle_finder_names_the_cycle() -> None:
    assert _cycles(_example_graph()) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize(
    ("source", "name", "expected"),
    [
        ("from .chain import x", "harness.evidence.tree", {"harness.evidence.chain"}),
        ("from . import chain", "harness.evidence.tree", {"harness.evidence.chain"}),
        ("from . import chain, x", "harness.evidence.tree", {"harness.evidence", "harness.evidence.chain"}),
        ("from harness import run_stage", "harness.run.x", {"harness"}),
        ("from .. import errors", "harness.evidence.tree", {"harness.errors"}),
        ("from .chain import x", "harness.evidence", {"harness.evidence.chain"}),
        ("import harness.evidence.chain", "harness.run.x", {"harness.evidence.chain"}),
        ("def f():\n    from harness.evidence.tree import x\n", "harness.run.x", {"harness.evidence.tree"}),
        (
            "if TYPE_CHECKING:\n    from harness.evidence import chain\n",
            "harness.run.x",
            {"harness.evidence.chain"},
        ),
    ],
)
def test_imports_resolve_relative_and_nested(tmp_path: Path, source: str, name: str, expected: set[str]) -> None:
    path = tmp_path / ("__init__.py" if name == "harness.evidence" else "mod.py")
    path.write_text(source, encoding="utf-8")
    known = {"harness", "harness.errors", "harness.evidence", "harness.evidence.chain", "harness.evidence.tree"}
    assert _imports(name, path, known) == expected
