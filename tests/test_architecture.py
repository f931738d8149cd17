"""The architecture of sparktf, checked on its import graph (grimp, the library under
import-linter): no import cycles anywhere, ``sparktf.models`` a leaf (it may raise
sparktf.errors), and the layers contract of pyproject.toml.

Every import statement counts, including those inside functions and under ``TYPE_CHECKING``:
a lazy import still ties two modules together. A package ``__init__`` that imports its
submodules while one of them imports the package is a cycle too (import-linter's own
``acyclic_siblings`` contract only sees cycles between siblings, so the whole-graph check is
here). Building the graph parses the sources; nothing of sparktf is imported. The layers
contract itself is checked by ``lint-imports``, which scripts/test.sh runs before pytest.
"""

from __future__ import annotations

import collections
from pathlib import Path

import grimp
import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("sparktf", include_external_packages=False, cache_dir=None)


def _imports(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    return {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components of more than one module, and the modules
    that import themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges.get(node, ()):
                    found.append(sorted(component))
    return sorted(found)


def _shortest_cycle(edges: dict[str, set[str]], component: list[str]) -> list[str]:
    """One shortest cycle through the first module of a component (breadth-first)."""
    members = set(component)
    start = component[0]
    came_from: dict[str, str] = {}
    queue = collections.deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(edges[node] & members):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if child not in came_from:
                came_from[child] = node
                queue.append(child)
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover (a component has one)


def _where(graph: grimp.ImportGraph, importer: str, imported: str) -> str:
    details = graph.get_import_details(importer=importer, imported=imported)
    return ", ".join(f"line {d['line_number']}: {d['line_contents']}" for d in details)


def test_strongly_connected_finds_cycles_and_only_them():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"d"}}
    assert _strongly_connected(edges) == [["a", "b", "c"], ["e"]]
    assert _shortest_cycle(edges, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert _strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles(graph):
    edges = _imports(graph)
    cycles = _strongly_connected(edges)
    report = []
    for component in cycles:
        cycle = _shortest_cycle(edges, component)
        report.append(f"{len(component)} modules import each other: {', '.join(component)}")
        report.append("  for example " + " -> ".join(cycle))
        for importer, imported in zip(cycle, cycle[1:]):
            report.append(f"    {importer} -> {imported} ({_where(graph, importer, imported)})")
    assert not cycles, "import cycles in sparktf:\n" + "\n".join(report)


def test_models_import_nothing_of_sparktf_but_themselves(graph):
    """sparktf.models may use sparktf.errors (the exceptions' root, which imports nothing)."""
    assert graph.find_modules_directly_imported_by("sparktf.errors") == set()
    allowed = {"sparktf.models", *graph.find_descendants("sparktf.models"), "sparktf.errors"}
    outside = sorted(
        f"{importer} -> {imported} ({_where(graph, importer, imported)})"
        for importer in allowed - {"sparktf.errors"}
        for imported in graph.find_modules_directly_imported_by(importer)
        if imported not in allowed
    )
    assert not outside, "sparktf.models imports other sparktf modules:\n" + "\n".join(outside)
