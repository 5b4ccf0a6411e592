"""swarm/pool's import graph: no module imports another that imports it back, only __init__ imports store, and
the engine modules stand alone."""

from __future__ import annotations

import ast
from pathlib import Path

import swarm.pool

PKG = Path(swarm.pool.__file__).parent


def _name(path: Path) -> str:
    """A module's name inside swarm.pool: ``store``, ``engines`` (a package's __init__), ``engines.sqlite``."""
    parts = path.relative_to(PKG).with_suffix("").parts
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    """Module -> the swarm.pool modules it imports anywhere (function bodies and TYPE_CHECKING blocks too)."""
    files = {_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for m, path in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
                if node.module.startswith("swarm.pool"):  # `from swarm.pool.x import y`: a submodule x.y, else x
                    base = node.module.removeprefix("swarm.pool").lstrip(".")
                    names = [f"{base}.{a.name}".lstrip(".") if f"{base}.{a.name}".lstrip(".") in files
                             else base or "__init__" for a in node.names]
                    deps.update(names)
                    continue
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            deps.update(n.removeprefix("swarm.pool.") for n in names if n.startswith("swarm.pool."))
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
    assert {"store", "roles", "engine", "engines", "engines.sqlite", "engines.postgresql"} <= graph.keys()
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_only_the_package_imports_store() -> None:
    assert {m for m, deps in _graph().items() if "store" in deps} == {"__init__"}


def test_the_engines_know_no_pool_module_but_each_other() -> None:
    """An engine module is the one place of its database's differences: it builds on the registry only."""
    graph = _graph()
    for m in ("engines", "engines.sqlite", "engines.postgresql"):
        assert graph[m] <= {"engines"}, (m, graph[m])
    # the schema's DDL variants (JSONB, partial indexes) are SQLAlchemy's declarative per-dialect options
    dialect_tests = [m for m, path in ((_name(p), p) for p in PKG.rglob("*.py"))
                     if not m.startswith("engines") and m != "schema"
                     and ('"postgresql"' in path.read_text() or '"sqlite"' in path.read_text())]
    assert dialect_tests == [], f"dialect names outside the engine modules: {dialect_tests}"


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
