"""No import circle in the product (`supervisor`, `sandbox`, `ledger`): no module imports one
that imports it back, directly or around a ring, counting the imports made only for the type
checker (``if TYPE_CHECKING:``) and those made inside functions. Where two modules need each
other, the lower one says what it needs as a Protocol (as `sandbox.runtime.view` and
`supervisor.executors.host` do). Checked on the AST of every module."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("supervisor", "sandbox", "ledger")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PRODUCT:
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(path: Path, known: Mapping[str, Path]) -> set[str]:
    """The product modules *path* imports. ``from package import name`` imports the module
    ``package.name`` when there is one (else the package itself)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            submodules = [f"{node.module}.{a.name}" for a in node.names]
            found = [m for m in submodules if m in known]
            out.update(found)
            if len(found) < len(submodules):
                out.add(node.module)
    return {name for name in out if name in known}


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(start: str) -> None:
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_product_has_no_import_circle() -> None:
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    assert circles(graph) == []


def test_the_check_finds_a_ring() -> None:
    """The check itself: a ring of three, and a pair, are found; a chain is not."""
    ring = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert sorted(circles(ring)) == [["a", "b", "c"], ["d", "e"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
