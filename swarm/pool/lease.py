"""Leases: how a trainer takes steps out of the pool without losing or repeating any.

``lease`` atomically reserves matching, unconsumed, unleased steps (whole groups at a time)
and returns them with their tokens; ``ack`` marks them consumed by a policy version;
``release`` hands them back; a lease that is neither acked nor released before it expires
returns its steps by itself (a step whose lease has expired is simply available again).

Atomicity: on SQLite the claim runs under ``BEGIN IMMEDIATE`` (the database write lock); on
PostgreSQL under a transaction-scoped advisory lock, with a conditional UPDATE whose row
count is checked, so two leases never share a step across threads, processes or machines.
Steps of abandoned episodes are never leased.

Errors: ValidationError (bad arguments), LeaseError (unknown, expired, released or acked).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict

from swarm.errors import ConflictError, LeaseError, ValidationError
from swarm.pool.checks import chunks, coerce
from swarm.pool.engine import Database
from swarm.pool.engines import Dialect
from swarm.pool.filter import StepFilter
from swarm.pool.query import JOIN, good_groups, has_group_conditions, singletons_pass, step_conditions
from swarm.pool.rows import read_steps
from swarm.pool.schema import episodes as E
from swarm.pool.schema import leases as LS
from swarm.pool.schema import steps as S
from swarm.records import EpisodeStatus, Step, new_id, now

__all__ = ["Lease", "LeaseMixin", "ready_rewards", "finished_count", "open_groups"]

# the waiting trainer's probes, built once (they run many times a second)
_FINISHED = sa.select(sa.func.count()).select_from(E).where(E.c.status == EpisodeStatus.finished.value)
_OPEN = (sa.select(E.c.group_id, sa.func.count()).where(E.c.status == EpisodeStatus.open.value,
                                                       E.c.type == sa.bindparam("type")).group_by(E.c.group_id))


class Lease(BaseModel):
    """Steps reserved for one consumer until ``expires_at``.

    ``group_ids`` lists the leased groups in lease order: a step's ``group_id``, or the
    ``step_id`` of a step without a group (a group of one). Steps come grouped in that order.
    """

    model_config = ConfigDict(extra="forbid")

    lease_id: str
    steps: list[Step]
    expires_at: float
    group_ids: list[str]


class LeaseMixin(Database):
    """Lease / ack / release for :class:`swarm.pool.store.Pool`."""

    def lease(
        self,
        filter: StepFilter,
        max_steps: int | None = None,
        max_groups: int | None = None,
        ttl_s: float = 60,
    ) -> Lease:
        """Reserve up to ``max_steps`` steps and/or ``max_groups`` groups matching ``filter``.

        Oldest groups first; a group is taken whole or not at all, so with ``max_steps`` a
        group that does not fit is skipped (one larger than ``max_steps`` is never taken by
        a ``max_steps``-only lease: use ``max_groups``). Returns an empty lease when nothing
        is available.
        """
        f = _check_lease_args(filter, max_steps, max_groups, ttl_s)
        lease_id = new_id("lease")
        with self._tx(write=True) as c:
            self.sql.claim_lock(c)
            t = now()
            expires = t + float(ttl_s)
            unclaimed = _unclaimed(t)
            chosen, ids = _select(c, f, self.sql, unclaimed, max_steps, max_groups)
            _claim(c, lease_id, ids, unclaimed, expires)
            c.execute(LS.insert(), {"lease_id": lease_id, "state": "active", "n_steps": len(ids), "created_at": t,
                                    "expires_at": expires, "consumed_version": None, "filter": f.model_dump(mode="json")})
            steps = read_steps(c, [S.c.lease_id == lease_id], with_tokens=True) if ids else []
        rank = {k: i for i, k in enumerate(chosen)}
        steps.sort(key=lambda s: (rank[s.group_id or s.step_id], s.created_at, s.step_id))
        return Lease(lease_id=lease_id, steps=steps, expires_at=expires, group_ids=chosen)

    def ack(self, lease_id: str, consumed_version: int) -> int:
        """Mark a live lease's steps consumed by ``consumed_version``; returns how many."""
        if isinstance(consumed_version, bool) or not isinstance(consumed_version, int) or consumed_version < 0:
            raise ValidationError(f"consumed_version: must be an integer >= 0, got {consumed_version!r}")
        with self._tx(write=True) as c:
            row = _live(c, lease_id)
            t = now()
            res = c.execute(S.update().where(S.c.lease_id == lease_id, S.c.consumed_version.is_(None))
                            .values(consumed_version=consumed_version, consumed_at=t))
            if res.rowcount != row.n_steps:
                raise LeaseError("lease lost some of its steps", lease_id=lease_id)
            c.execute(LS.update().where(LS.c.lease_id == lease_id)
                      .values(state="acked", consumed_version=consumed_version))
            return int(res.rowcount)

    def release(self, lease_id: str) -> int:
        """Hand a lease's steps back to the pool; returns how many. Releasing twice is a no-op."""
        with self._tx(write=True) as c:
            row = c.execute(sa.select(LS).where(LS.c.lease_id == lease_id)).first()
            if row is None:
                raise LeaseError("no such lease", lease_id=lease_id)
            if row.state == "acked":
                raise LeaseError("lease is already acknowledged", lease_id=lease_id)
            if row.state == "released":
                return 0
            res = c.execute(S.update().where(S.c.lease_id == lease_id, S.c.consumed_version.is_(None))
                            .values(lease_id=None, lease_expires_at=None))
            c.execute(LS.update().where(LS.c.lease_id == lease_id).values(state="released"))
            return int(res.rowcount)


def _live(c: sa.Connection, lease_id: str) -> Any:
    row = c.execute(sa.select(LS).where(LS.c.lease_id == lease_id)).first()
    if row is None:
        raise LeaseError("no such lease", lease_id=lease_id)
    if row.state != "active":
        raise LeaseError(f"lease is already {row.state}", lease_id=lease_id)
    if row.expires_at <= now():
        raise LeaseError("lease has expired; its steps went back to the pool", lease_id=lease_id)
    return row


def _check_lease_args(filter: Any, max_steps: int | None, max_groups: int | None, ttl_s: Any) -> StepFilter:
    """The validated filter of a lease call; a ValidationError names any bad argument."""
    f = coerce(StepFilter, filter, "filter")
    if max_steps is None and max_groups is None:
        raise ValidationError("lease needs max_steps or max_groups")
    for name, v in (("max_steps", max_steps), ("max_groups", max_groups)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValidationError(f"{name}: must be a positive integer, got {v!r}")
    if not (isinstance(ttl_s, int | float) and math.isfinite(ttl_s) and ttl_s > 0):
        raise ValidationError(f"ttl_s: must be a positive number of seconds, got {ttl_s!r}")
    if f.consumed:
        raise ValidationError("consumed: a lease only takes unconsumed steps; leave consumed unset or False")
    return f


def _unclaimed(t: float) -> list[sa.ColumnElement]:
    """Steps neither consumed nor under a live lease at time ``t``."""
    return [S.c.consumed_version.is_(None), sa.or_(S.c.lease_id.is_(None), S.c.lease_expires_at <= t)]


def _select(
    c: sa.Connection,
    f: StepFilter,
    sql: Dialect,
    unclaimed: list[sa.ColumnElement],
    max_steps: int | None,
    max_groups: int | None,
) -> tuple[list[str], list[str]]:
    """The group keys to lease (oldest first) and their available step ids."""
    sel = f.model_copy(update={"consumed": None})  # stated once, in ``unclaimed``
    # group conditions are checked on candidate groups only, not over the whole pool
    where = [*step_conditions(sel, sql, groups=False), *unclaimed, E.c.status != EpisodeStatus.abandoned.value]
    check = _group_check(c, sel, sql) if has_group_conditions(sel) else None
    order = _candidate_groups(c, where, max_groups or 2 * (max_steps or 0), check)
    return _fit(order, _members(c, where, order), max_steps, max_groups)


def _fit(
    order: list[str], members: dict[str, list[str]], max_steps: int | None, max_groups: int | None
) -> tuple[list[str], list[str]]:
    """Whole groups in ``order`` within ``max_groups`` and ``max_steps`` (a group that does not fit is skipped)."""
    chosen: list[str] = []
    ids: list[str] = []
    for key in order:
        size = len(members.get(key, ()))
        if size == 0:
            continue
        if max_groups is not None and len(chosen) >= max_groups:
            break
        if max_steps is not None and len(ids) + size > max_steps:
            continue
        chosen.append(key)
        ids.extend(members[key])
        if max_steps is not None and len(ids) == max_steps:
            break
    return chosen, ids


def _claim(c: sa.Connection, lease_id: str, ids: list[str], unclaimed: list[sa.ColumnElement], expires: float) -> None:
    """Put ``ids`` under the lease; a ConflictError if any was claimed meanwhile."""
    claimed = 0
    for chunk in chunks(ids):
        q = S.update().where(S.c.step_id.in_(chunk), *unclaimed).values(lease_id=lease_id, lease_expires_at=expires)
        claimed += c.execute(q).rowcount
    if claimed != len(ids):  # cannot happen under the claim lock; never hand out a shared step
        raise ConflictError("steps were claimed concurrently; retry the lease", lease_id=lease_id)


def _group_check(c: sa.Connection, f: StepFilter, sql: Dialect) -> Callable[[list[str]], set[str]]:
    """A function keeping the group keys that pass ``f``'s group conditions."""

    def keep(keys: list[str]) -> set[str]:
        ok = {k for k in keys if k.startswith("\0")} if singletons_pass(f) else set()
        grouped = [k for k in keys if not k.startswith("\0")]
        for chunk in chunks(grouped):
            ok.update(c.execute(good_groups(f, sql).where(S.c.group_id.in_(chunk))).scalars())
        return ok

    return keep


def _candidate_groups(
    c: sa.Connection,
    where: list[sa.ColumnElement],
    want: int,
    check: Callable[[list[str]], set[str]] | None,
) -> list[str]:
    """The ``want`` oldest available group keys that pass ``check``, oldest first.

    Pages through the unconsumed-steps index; an ungrouped step's key is its step_id.
    """
    keys: list[str] = []
    seen: set[str] = set()
    page = max(256, 4 * want)
    offset = 0
    while len(keys) < want:
        q = (sa.select(S.c.step_id, S.c.group_id).select_from(JOIN).where(*where)
             .order_by(S.c.created_at, S.c.step_id).limit(page).offset(offset))
        rows = c.execute(q).all()
        fresh: list[str] = []
        for sid, gid in rows:
            # "\0" marks ungrouped steps while checking (a group_id could look like a step id)
            k = gid if gid is not None else "\0" + sid
            if k not in seen:
                seen.add(k)
                fresh.append(k)
        passed = check(fresh) if check is not None else set(fresh)
        keys.extend(k for k in fresh if k in passed)
        if len(rows) < page:
            break
        offset += page
    return [k.removeprefix("\0") for k in keys[:want]]


def _members(c: sa.Connection, where: list[sa.ColumnElement], keys: list[str]) -> dict[str, list[str]]:
    """Available step ids of each group key (whole groups)."""
    out: dict[str, list[str]] = {}
    for chunk in chunks(keys):
        q = (sa.select(S.c.step_id, S.c.group_id).select_from(JOIN)
             .where(*where, sa.or_(S.c.group_id.in_(chunk), sa.and_(S.c.group_id.is_(None), S.c.step_id.in_(chunk))))
             .order_by(S.c.created_at, S.c.step_id))
        for sid, gid in c.execute(q):
            out.setdefault(gid or sid, []).append(sid)
    return out


# -- what a waiting trainer reads (swarm.loop.wait_for_batch), several times a second: light on purpose.
# Functions of an open pool rather than Pool methods: they serve one caller, not a role of the pool.

def ready_rewards(pool: Database, filter: StepFilter, limit: int = 100_000) -> list[tuple[str | None, str, float | None]]:
    """``(group_id, episode_id, reward)`` of the steps matching ``filter``, oldest first, at most ``limit``:
    what a waiting trainer's snapshot reads (:func:`swarm.loop.snapshot`), three columns instead of whole
    steps (the reward: the step's own, else its episode's, as ``query_steps`` gives it)."""
    f = coerce(StepFilter, filter, "filter")
    q = (sa.select(S.c.group_id, S.c.episode_id, sa.func.coalesce(S.c.reward, E.c.reward)).select_from(JOIN)
         .where(*step_conditions(f, pool.sql)).order_by(S.c.created_at, S.c.step_id).limit(limit))
    with pool._tx() as c:
        return [(g, e, r) for g, e, r in c.execute(q)]


def finished_count(pool: Database) -> int:
    """How many episodes have finished (an index range count): a waiting trainer reads the pool again
    when enough more have finished to change its decision."""
    with pool._tx() as c:
        return int(c.execute(_FINISHED).scalar_one())


def open_groups(pool: Database, episode_type: str = "train") -> dict[str | None, int]:
    """Open episodes of ``episode_type`` per group id (one grouped count, no episode records)."""
    with pool._tx() as c:
        return {g: int(n) for g, n in c.execute(_OPEN, {"type": episode_type})}
