"""Named, versioned curations and the trainers' published lease plans.

A curation is a :class:`~swarm.pool.filter.StepFilter` saved under a name. Saving a changed filter
under an existing name adds version + 1; saving the newest version's filter again adds nothing, so
"clean@2" always means one exact selection. ``"name@3"`` selects a version, ``"name"`` the newest
(:func:`parse_ref`: the one parser of the HTTP API, the training flow and the export CLI). Names are
1..256 characters without ``@``.

A lease plan is, per trained policy, the filter its trainer's next lease uses, written each time the
trainer starts waiting for a batch (:func:`swarm.update.lease_usable`), so the dashboard shows exactly
it and counts what matches now.

A mixin of :class:`swarm.pool.store.Pool`; same transactions and errors (ValidationError for a bad
name or filter, NotFoundError naming the known curations). It does not combine a curation with
what training needs (:func:`swarm.loop.trainable_filter` does) and does not lease.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field

from swarm.errors import NotFoundError, ValidationError
from swarm.pool.checks import coerce
from swarm.pool.engine import Database
from swarm.pool.filter import StepFilter
from swarm.pool.schema import NAME_LEN
from swarm.pool.schema import curations as C
from swarm.pool.schema import lease_plans as P
from swarm.records import now

__all__ = ["Curation", "CurationsMixin", "parse_ref", "check_name"]


class Curation(BaseModel):
    """One saved version of a named selection of steps."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=NAME_LEN)
    version: int = Field(ge=1)
    filter: StepFilter
    note: str = ""
    created_at: float

    @property
    def ref(self) -> str:
        """``name@version``: what a run that trained on it records."""
        return f"{self.name}@{self.version}"

    def to_json(self) -> dict[str, Any]:
        """The HTTP shape: name, version, ``ref``, filter (its set fields), note, created_at."""
        return {"object": "curation", "name": self.name, "version": self.version, "ref": self.ref,
                "filter": _dump(self.filter), "note": self.note, "created_at": self.created_at}


def check_name(name: Any) -> str:
    """``name`` if it can name a curation (1..256 characters, no ``@`` and no NUL); else a ValidationError."""
    if not isinstance(name, str) or not 1 <= len(name) <= NAME_LEN:
        raise ValidationError(f"curation name: must be 1..{NAME_LEN} characters, got {name!r}")
    if "@" in name or "\x00" in name:
        raise ValidationError(f"curation name {name!r}: may not contain '@' (it separates the version) or NUL")
    return name


def parse_ref(ref: str) -> tuple[str, int | None]:
    """``"clean@3"`` -> ("clean", 3); ``"clean"`` -> ("clean", None): the newest version."""
    if not isinstance(ref, str):
        raise ValidationError(f"curation: expected 'name' or 'name@version', got {ref!r}")
    name, sep, version = ref.partition("@")
    if not sep:
        return check_name(name), None
    if not version.isdigit() or int(version) < 1:
        raise ValidationError(f"curation {ref!r}: the version after '@' must be an integer >= 1")
    return check_name(name), int(version)


def _dump(f: StepFilter) -> dict[str, Any]:
    """The stored form of a filter: its non-default fields (so equal selections compare equal)."""
    return f.model_dump(mode="json", exclude_defaults=True)


def _row(r: Mapping[str, Any]) -> Curation:
    return Curation(name=r["name"], version=r["version"], filter=StepFilter.model_validate(r["filter"]),
                    note=r["note"], created_at=r["created_at"])


class CurationsMixin(Database):
    """save_curation / curation / curations and set_lease_plan / lease_plans for :class:`swarm.pool.Pool`."""

    def save_curation(self, name: str, filter: StepFilter, note: str = "") -> Curation:
        """Save ``filter`` as the newest version of ``name`` (unchanged filter: the newest version, as is)."""
        check_name(name)
        f = coerce(StepFilter, filter, "filter")
        if not isinstance(note, str):
            raise ValidationError(f"note: must be a string, got {type(note).__name__}")
        stored = _dump(f)
        for attempt in range(3):
            try:
                with self._tx(write=True) as c:
                    top = c.execute(sa.select(C).where(C.c.name == name).order_by(C.c.version.desc())
                                    .limit(1)).mappings().first()
                    if top is not None and top["filter"] == stored:
                        return _row(top)
                    row = {"name": name, "version": 1 if top is None else top["version"] + 1, "filter": stored,
                           "note": note.replace("\x00", "\ufffd"), "created_at": now()}
                    c.execute(C.insert(), [row])
                return _row(row)
            except sa.exc.IntegrityError:  # another writer (PostgreSQL) saved this version first: look again
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def curation(self, name: str, version: int | None = None) -> Curation:
        """Version ``version`` (None: the newest) of curation ``name``; NotFoundError names the known ones."""
        check_name(name)
        q = sa.select(C).where(C.c.name == name)
        q = q.order_by(C.c.version.desc()).limit(1) if version is None else q.where(C.c.version == version)
        with self._tx() as c:
            row = c.execute(q).mappings().first()
            if row is not None:
                return _row(row)
            versions = list(c.execute(sa.select(C.c.version).where(C.c.name == name).order_by(C.c.version)).scalars())
            known = list(c.execute(sa.select(C.c.name).distinct().order_by(C.c.name).limit(50)).scalars())
        if versions:
            raise NotFoundError(f"curation {name!r} has no version {version} (it has versions {versions[0]}.."
                                f"{versions[-1]})", curation=name)
        raise NotFoundError(f"no curation named {name!r} (known: {', '.join(known) if known else 'none saved yet'})",
                            curation=name)

    def curations(self) -> list[Curation]:
        """The newest version of every curation, by name."""
        newest = sa.select(C.c.name, sa.func.max(C.c.version).label("v")).group_by(C.c.name).subquery()
        q = (sa.select(C).join(newest, sa.and_(C.c.name == newest.c.name, C.c.version == newest.c.v))
             .order_by(C.c.name))
        with self._tx() as c:
            return [_row(r) for r in c.execute(q).mappings()]

    def set_lease_plan(self, policy: str, filter: StepFilter, curation: str | None, version: int) -> None:
        """Publish the filter ``policy``'s trainer (at ``version``) leases with next (``curation``: "name@v")."""
        f = coerce(StepFilter, filter, "filter")
        row = {"policy": policy, "filter": _dump(f), "curation": curation, "version": int(version),
               "updated_at": now()}
        for attempt in range(3):
            try:
                with self._tx(write=True) as c:
                    c.execute(P.delete().where(P.c.policy == policy))
                    c.execute(P.insert(), [row])
                return
            except sa.exc.IntegrityError:  # two trainers of one policy (PostgreSQL) wrote at once: the last one wins
                if attempt == 2:
                    raise

    def lease_plans(self) -> list[dict[str, Any]]:
        """Every trained policy's published plan: policy, filter (JSON), curation, version, updated_at."""
        with self._tx() as c:
            return [dict(r) for r in c.execute(sa.select(P).order_by(P.c.policy)).mappings()]

