"""Trainer claims: at most one process trains a policy on one pool (``trainer_claims``, one row per policy).

A training run claims each of its policies when it starts (:meth:`ClaimsMixin.claim_policy`), heartbeats the
claim while it runs and releases it at its end. Another claim on a held policy is a
:class:`~swarm.errors.ConflictError` naming the holder. A claim is free again when its heartbeat is older than
its ``ttl_s``, or at once when its holder ran on this host and that process is gone (a crashed run resumed on
the same machine does not wait). The holder is ``host:pid:nonce`` (:func:`holder_id`). Claims are
serialised like lease claims (``BEGIN IMMEDIATE`` on SQLite, an advisory lock on PostgreSQL). A mixin of
:class:`swarm.pool.store.Pool`; it does not heartbeat by itself (the flow does).
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

import sqlalchemy as sa

from swarm.errors import ConflictError, ValidationError
from swarm.pool.engine import Database
from swarm.pool.schema import NAME_LEN
from swarm.pool.schema import trainer_claims as T
from swarm.records import now

__all__ = ["ClaimsMixin", "holder_id", "holder_alive"]


def holder_id() -> str:
    """``host:pid:nonce`` of this process (a fresh nonce: two runs in one process are two holders)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def holder_alive(holder: str) -> bool:
    """False only when ``holder`` ran on this host and its process is gone; elsewhere: unknown, so True."""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


class ClaimsMixin(Database):
    """claim_policy / heartbeat_claim / release_claim / trainer_claims for :class:`swarm.pool.Pool`."""

    def claim_policy(self, policy: str, holder: str, ttl_s: float = 30.0) -> None:
        """Claim ``policy`` for ``holder``; ConflictError when another live holder has it."""
        if not policy or len(policy) > NAME_LEN or not holder or len(holder) > NAME_LEN:
            raise ValidationError(f"claim: policy and holder need 1..{NAME_LEN} characters")
        if not ttl_s > 0:
            raise ValidationError(f"claim: ttl_s={ttl_s} must be > 0")
        t = now()
        with self._tx(write=True) as c:
            self.sql.claim_lock(c)
            row = c.execute(sa.select(T).where(T.c.policy == policy)).mappings().first()
            if row is not None and row["holder"] != holder:
                age = t - row["heartbeat_at"]
                if age < row["ttl_s"] and holder_alive(row["holder"]):
                    raise ConflictError(
                        f"policy {policy!r} is being trained on this pool by {row['holder']} (heartbeat {age:.0f} s "
                        f"ago): two runs cannot train one policy at once; stop that run, or train another policy "
                        f"(its claim lapses {row['ttl_s']:g} s after its last heartbeat)", policy=policy,
                        code="policy_claimed")
            c.execute(T.delete().where(T.c.policy == policy))
            c.execute(T.insert(), [{"policy": policy, "holder": holder, "ttl_s": float(ttl_s),
                                    "claimed_at": t, "heartbeat_at": t}])

    def heartbeat_claim(self, policy: str, holder: str) -> bool:
        """Renew ``holder``'s claim on ``policy``; False when it no longer holds it (taken over after lapsing)."""
        with self._tx(write=True) as c:
            n = c.execute(T.update().where(T.c.policy == policy, T.c.holder == holder)
                          .values(heartbeat_at=now())).rowcount
        return n == 1

    def release_claim(self, policy: str, holder: str) -> bool:
        """Drop ``holder``'s claim on ``policy`` (a no-op when another holds it); True when one was dropped."""
        with self._tx(write=True) as c:
            return c.execute(T.delete().where(T.c.policy == policy, T.c.holder == holder)).rowcount == 1

    def trainer_claims(self) -> list[dict[str, Any]]:
        """Every claim: policy, holder, ttl_s, claimed_at, heartbeat_at."""
        with self._tx() as c:
            return [dict(r) for r in c.execute(sa.select(T).order_by(T.c.policy)).mappings()]
