"""The pool's roles (swarm.pool.roles): Pool satisfies each with Pool's exact signatures; each public method
of Pool is in exactly one role; roles stay small; the app's side types its pool by role, never as Pool."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import swarm
from swarm.pool import LeaseBook, Pool, Served
from swarm.pool.roles import ROLES

OWNER = {"close"}  # the owner's call (whoever opened the pool closes it), no role's
MAX_METHODS = 9  # a role is a few methods; a consumer needing more names several roles
BEFORE = 64  # public methods of Pool before the roles were made disjoint (issue 43)
SWARM = Path(swarm.__file__).parent
APP_SIDE = ["gateway", "web", "dashboard", "stack.py", "app.py"]


def _members(proto: type) -> set[str]:
    """The names a role declares itself (methods, and the properties it requires)."""
    return {n for n in vars(proto) if not n.startswith("_")}


def _public() -> set[str]:
    return {n for n in dir(Pool) if not n.startswith("_") and callable(getattr(Pool, n))}


@pytest.mark.parametrize("proto", [*ROLES, Served], ids=lambda p: p.__name__)
def test_pool_satisfies_the_role(proto: type, tmp_path: Path) -> None:
    with Pool(f"sqlite:///{tmp_path / 'p.db'}") as pool:
        assert isinstance(pool, proto)


@pytest.mark.parametrize("proto", ROLES, ids=lambda p: p.__name__)
def test_each_method_is_pools_with_its_exact_signature(proto: type) -> None:
    for name in sorted(_members(proto)):
        assert hasattr(Pool, name), f"{proto.__name__}.{name}: Pool has no such member"
        member = getattr(proto, name)
        if isinstance(member, property):
            assert isinstance(getattr(Pool, name), property), f"{proto.__name__}.{name}: Pool's is no property"
            continue
        want = inspect.signature(getattr(Pool, name))
        got = inspect.signature(member)
        assert got == want, f"{proto.__name__}.{name}{got} differs from Pool.{name}{want}"


def test_every_public_method_is_in_exactly_one_small_role() -> None:
    seen: dict[str, str] = {}
    for proto in ROLES:
        methods = {n for n in _members(proto) if not isinstance(getattr(proto, n), property)}
        assert len(methods) <= MAX_METHODS, f"{proto.__name__} has {len(methods)} methods: split it"
        for n in _members(proto):
            assert n not in seen, f"{n} is in both {seen[n]} and {proto.__name__}"
            seen[n] = proto.__name__
    assert _public() - set(seen) == OWNER


def test_the_public_surface_shrank() -> None:
    assert len(_public()) < BEFORE, sorted(_public())


def test_a_partial_pool_is_not_a_lease_book() -> None:
    class RenewOnly:
        def renew(self, lease_id: str, ttl_s: float) -> float: ...

    assert not isinstance(RenewOnly(), LeaseBook)


def _annotations(path: Path) -> list[tuple[int, str]]:
    """(line, annotation) of every parameter, return and attribute annotation in a module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            out.append((node.lineno, ast.unparse(node.annotation)))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            out.append((node.lineno, ast.unparse(node.returns)))
    return out


def test_the_app_side_takes_roles_not_the_concrete_pool() -> None:
    files = [p for part in APP_SIDE for p in ([SWARM / part] if part.endswith(".py")
                                              else sorted((SWARM / part).rglob("*.py")))]
    bad = [f"{p.relative_to(SWARM)}:{line}: {ann}" for p in files for line, ann in _annotations(p)
           if "Pool" in ann.replace("Overview", "").split("[")[0].split(" | ")]
    assert not bad, "type these with the role they use (swarm.pool.roles):\n" + "\n".join(bad)
