"""swarm/pool's import graph: no module imports another that imports it back, and only __init__ imports store."""

from __future__ import annotations

import ast
from pathlib import Path

import swarm.pool

PKG = Path(swarm.pool.__file__).parent


def _graph() -> dict[str, set[str]]:
    """Module -> the swarm.pool modules it imports anywhere (function bodies and TYPE_CHECKING blocks too)."""
    mods = {p.stem for p in PKG.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for m in mods:
        deps: set[str] = set()
        for node in ast.walk(ast.parse((PKG / f"{m}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
                if node.module == "swarm.pool":  # `from swarm.pool import x`: a submodule x, else __init__
                    names = [f"swarm.pool.{a.name}" if a.name in mods else "swarm.pool.__init__" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            deps.update(n.split(".")[2] for n in names if n.startswith("swarm.pool."))
            deps.update("__init__" for n in names if n == "swarm.pool")
        graph[m] = deps - {m}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        state[m] = 2
        path.pop()
        return None

    return next((c for m in sorted(graph) if m not in state and (c := visit(m))), None)


def test_swarm_pool_has_no_import_cycle() -> None:
    graph = _graph()
    assert {"store", "interfaces", "engine"} <= graph.keys()
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_only_the_package_imports_store() -> None:
    assert {m for m, deps in _graph().items() if "store" in deps} == {"__init__"}


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
