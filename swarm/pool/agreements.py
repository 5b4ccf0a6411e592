"""Client agreements for the C4 / C5 batching strategies, kept in the pool so every gateway sees them.

A client asks for an update with ``POST /v1/sync/agree`` on any gateway; the gateway records an
agreement row here. The trainer reads who is *active* and who *agreed* (:meth:`sync_clients`) and,
once an update fires on them, consumes the agreements (:meth:`take_agreements`): the rows stay,
stamped with ``taken_at``, so the history of who asked and which update answered is auditable.

A client is active while it opened an episode, or agreed, within ``active_window_s``: activity is
read from the episodes table (no extra write per episode) and from the agreements themselves.

A mixin of :class:`swarm.pool.store.Pool`; same transactions and errors (ValidationError for a
client id that is empty or longer than the pool's id columns). It does not decide whether an
update fires (:mod:`swarm.batching` does).
"""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa

from swarm.errors import ValidationError
from swarm.pool.engine import Database
from swarm.pool.schema import ID_LEN
from swarm.pool.schema import agreements as A
from swarm.pool.schema import episodes as E
from swarm.records import now

__all__ = ["AgreementsMixin", "ACTIVE_WINDOW_S"]

ACTIVE_WINDOW_S = 60.0  # a client that neither opened an episode nor agreed for this long is inactive

_OPEN_AGREEMENTS = sa.select(A.c.client_id).where(A.c.taken_at.is_(None)).distinct()
_OPEN_OF = sa.select(A.c.agreement_id).where(A.c.taken_at.is_(None), A.c.client_id == sa.bindparam("client_id")).limit(1)


class AgreementsMixin(Database):
    """``agree``, ``sync_clients``, ``take_agreements`` and ``agreement_log`` for :class:`swarm.pool.store.Pool`."""

    def agree(self, client_id: str, at: float | None = None) -> None:
        """Record that ``client_id`` asks for an update (it counts until an update takes it; asking again before
        that is the same request, so a client has at most one open agreement and the table grows per update)."""
        if not isinstance(client_id, str) or not 0 < len(client_id) <= ID_LEN:
            raise ValidationError(f"client_id must be a string of 1..{ID_LEN} characters", client_id=client_id)
        row = {"agreement_id": uuid.uuid4().hex, "client_id": client_id, "created_at": now() if at is None else at,
               "taken_at": None}
        with self._tx(write=True) as c:
            if c.execute(_OPEN_OF, {"client_id": client_id}).first() is None:
                c.execute(A.insert(), [row])

    def sync_clients(self, active_window_s: float = ACTIVE_WINDOW_S) -> tuple[frozenset[str], frozenset[str]]:
        """(active clients, clients with an agreement not yet taken), across every gateway of this pool."""
        cutoff = now() - active_window_s
        with self._tx() as c:
            opened = c.execute(sa.select(E.c.client_id).where(E.c.created_at >= cutoff, E.c.client_id.is_not(None))
                               .distinct()).scalars()
            active = set(opened)
            active.update(c.execute(sa.select(A.c.client_id).where(A.c.created_at >= cutoff).distinct()).scalars())
            agreed = frozenset(c.execute(_OPEN_AGREEMENTS).scalars())
        return frozenset(active), agreed

    def take_agreements(self, clients: frozenset[str] | set[str] | None = None) -> frozenset[str]:
        """Consume the open agreements (of ``clients``, or all): an update fired on them. Returns whose."""
        t = now()
        where = [A.c.taken_at.is_(None)]
        if clients is not None:
            if not clients:
                return frozenset()
            where.append(A.c.client_id.in_(sorted(clients)))
        with self._tx(write=True) as c:  # one UPDATE .. RETURNING: an agreement is taken exactly once
            return frozenset(c.execute(A.update().where(*where).values(taken_at=t).returning(A.c.client_id)).scalars())

    def agreement_log(self, limit: int = 1000) -> list[dict[str, Any]]:
        """The newest agreements, oldest first: ``client_id``, ``created_at``, ``taken_at`` (None: still open)."""
        q = sa.select(A.c.client_id, A.c.created_at, A.c.taken_at).order_by(A.c.created_at.desc()).limit(limit)
        with self._tx() as c:
            rows = [dict(r) for r in c.execute(q).mappings()]
        return rows[::-1]
