"""The role interfaces of swarm.pool.interfaces: Pool satisfies each, and each names Pool's methods exactly."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from swarm.pool import Database, LeaseBook, Lookup, Pool, Reader, Recorder

ROLES = (Lookup, Recorder, Reader, LeaseBook)
UNROLED = {"close", "optimize"}  # the owner's calls (flows open and close pools), no role's


def _members(proto: type) -> set[str]:
    """The method names a protocol declares, its bases' included."""
    return {n for k in proto.__mro__ if k.__module__ == "swarm.pool.interfaces" for n in vars(k)
            if not n.startswith("_")}


@pytest.mark.parametrize("proto", ROLES, ids=lambda p: p.__name__)
def test_pool_satisfies_the_role(proto: type, tmp_path: Path) -> None:
    with Pool(f"sqlite:///{tmp_path / 'p.db'}") as pool:
        assert isinstance(pool, proto)
        assert isinstance(pool, Database)


@pytest.mark.parametrize("proto", ROLES, ids=lambda p: p.__name__)
def test_each_method_is_pools_with_its_exact_signature(proto: type) -> None:
    for name in sorted(_members(proto)):
        assert hasattr(Pool, name), f"{proto.__name__}.{name}: Pool has no such method"
        want = inspect.signature(getattr(Pool, name))
        got = inspect.signature(getattr(proto, name))
        assert got == want, f"{proto.__name__}.{name}{got} differs from Pool.{name}{want}"


def test_every_public_pool_method_has_a_role() -> None:
    public = {n for n in dir(Pool) if not n.startswith("_") and callable(getattr(Pool, n))}
    roled = set().union(*map(_members, ROLES))
    assert public - roled == UNROLED


def test_a_partial_pool_is_not_a_lease_book() -> None:
    class LabelsOnly:
        def label(self, target: str, target_id: str, label: str, exclude: bool = False, note: str = "") -> None: ...

    assert not isinstance(LabelsOnly(), LeaseBook)
