"""Settling trained steps whatever happened to their lease, and keeping pending leases alive.

A trainer that checkpoints every k updates holds the leases of the updates since its last
checkpoint until a checkpoint containing them has committed. Two operations make that safe:

- ``renew``: push an active lease's expiry forward (the steps stay reserved while held).
- ``settle``: mark exactly the given steps of a lease consumed, **even when the lease has
  expired** (a resume after a crash, however late) unless another live lease holds them, and
  close the lease (its other, untrained steps are handed back). Settling twice is a no-op.
  :func:`settle_many` settles a checkpoint's leases in one transaction.

With one trainer per policy nobody else leases a policy's steps, so a checkpoint that records
``(lease_id, step_ids)`` and settles them on resume trains each step at most once and loses none.
Errors: ValidationError (bad arguments), LeaseError (unknown lease).
"""

from __future__ import annotations

import math

import sqlalchemy as sa

from swarm.errors import LeaseError, ValidationError
from swarm.pool.checks import chunks
from swarm.pool.engine import Database
from swarm.pool.schema import leases as LS
from swarm.pool.schema import steps as S
from swarm.records import now

__all__ = ["SettleMixin", "settle_many"]


class SettleMixin(Database):
    """``renew`` / ``settle`` for :class:`swarm.pool.store.Pool` (see the module docstring)."""

    def renew(self, lease_id: str, ttl_s: float) -> float:
        """Extend a lease that is still active to ``now + ttl_s``; returns the new expiry."""
        if not (isinstance(ttl_s, int | float) and math.isfinite(ttl_s) and ttl_s > 0):
            raise ValidationError(f"ttl_s: must be a positive number of seconds, got {ttl_s!r}")
        with self._tx(write=True) as c:
            row = c.execute(sa.select(LS.c.state).where(LS.c.lease_id == lease_id)).first()
            if row is None:
                raise LeaseError("no such lease", lease_id=lease_id)
            if row.state != "active":
                raise LeaseError(f"lease is already {row.state}", lease_id=lease_id)
            expires = now() + float(ttl_s)
            c.execute(S.update().where(S.c.lease_id == lease_id, S.c.consumed_version.is_(None))
                      .values(lease_expires_at=expires))
            c.execute(LS.update().where(LS.c.lease_id == lease_id).values(expires_at=expires))
            return expires

    def settle(self, lease_id: str, step_ids: list[str], consumed_version: int) -> int:
        """Mark ``step_ids`` consumed by ``consumed_version`` and close ``lease_id``; returns how many
        steps were marked now (0 when they already were)."""
        return settle_many(self, [(lease_id, step_ids, consumed_version)])


def settle_many(pool: Database, settlements: list[tuple[str, list[str], int]]) -> int:
    """``pool.settle`` each ``(lease_id, step_ids, consumed_version)`` in one transaction (a checkpoint's
    pending leases, :meth:`swarm.train.Ledger.commit`: all or none); returns how many steps were marked now."""
    for _, _, version in settlements:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValidationError(f"consumed_version: must be an integer >= 0, got {version!r}")
    with pool._tx(write=True) as c:
        return sum(_settle(c, lease_id, step_ids, version) for lease_id, step_ids, version in settlements)


def _settle(c: sa.Connection, lease_id: str, step_ids: list[str], consumed_version: int) -> int:
    row = c.execute(sa.select(LS.c.state).where(LS.c.lease_id == lease_id)).first()
    if row is None:
        raise LeaseError("no such lease", lease_id=lease_id)
    t = now()
    free = sa.or_(S.c.lease_id == lease_id, S.c.lease_id.is_(None), S.c.lease_expires_at <= t)
    n = 0
    for chunk in chunks(list(step_ids)):
        res = c.execute(
            S.update()
            .where(S.c.step_id.in_(chunk), S.c.consumed_version.is_(None), free)
            .values(consumed_version=consumed_version, consumed_at=t, lease_id=lease_id, lease_expires_at=None)
        )
        n += int(res.rowcount)
    # the lease's steps that were not trained (quarantined, or left out) go back to the pool
    c.execute(S.update().where(S.c.lease_id == lease_id, S.c.consumed_version.is_(None))
              .values(lease_id=None, lease_expires_at=None))
    if row.state != "acked":
        c.execute(LS.update().where(LS.c.lease_id == lease_id).values(state="acked", consumed_version=consumed_version))
    return n
