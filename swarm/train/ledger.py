"""Exactly-once bookkeeping for one trainer: a leased step is trained at most once, whatever
crashes and however late the restart, and none is lost (docs/reliability.md):

- After each update its lease's trained step ids join ``pending``, not settled yet; while held,
  they are renewed right before this trainer leases again (those with under half their TTL left: a
  lease far from its expiry needs no write), so its own lease never takes them back.
- Every ``every`` updates (and on a clean stop) :meth:`Ledger.commit` writes a checkpoint whose
  ``extra["pending"]`` lists ``(lease_id, step_ids, version)``, and only then settles them.
- :meth:`Ledger.resume` settles the checkpoint's pending steps (a crash before the settle), even
  with long-expired leases; updates after the checkpoint are lost with their weights, and their
  steps are trained (once) after the restart. Versions the pool has beyond the checkpoint (a
  crash after publishing) are never reused: the restored weights get a new version.

The one writer of policy versions into the pool (:meth:`Ledger.publish`; the number itself comes from
:meth:`~swarm.train.Trainer.publish`, the one place that assigns it). One trainer per policy and pool
(what ``flows.run`` and :func:`swarm.update.run_updates` run). It does not lease or log.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

from swarm.errors import LeaseError
from swarm.pool import LeaseBook, Versions
from swarm.pool.engine import Database
from swarm.pool.settle import settle_many
from swarm.train import journal
from swarm.train.faults import crash_point
from swarm.train.publish import adapter_state, save_adapter

__all__ = ["Ledger", "LedgerPool"]



class LedgerPool(LeaseBook, Versions, Protocol):
    """What a ledger uses of the pool: its leases (renew, settle) and the published versions."""


class Ledger:
    """Pending leases and the checkpoint cadence of one :class:`~swarm.train.Trainer` over a pool."""

    def __init__(self, trainer: Any, pool: LedgerPool, every: int = 10, ttl_s: float = 600.0) -> None:
        if int(every) < 1:
            raise ValueError(f"train.checkpoint_every must be >= 1, got {every}")
        self.trainer, self.pool, self.every, self.ttl_s = trainer, pool, int(every), float(ttl_s)
        self.pending: list[tuple[str, list[str], int]] = []
        self.last_commit = trainer.updates  # updates contained in the last committed checkpoint
        self.version_metadata: dict[str, Any] = {}  # recorded on every version it publishes (the MLflow run id)
        self._expires: dict[str, float] = {}  # pending lease -> its expiry as last set (lease or renew)

    # -- during the run ---------------------------------------------------------------------
    def due(self) -> bool:
        """Whether the updates since the last checkpoint fill the cadence (check after an update)."""
        return self.trainer.updates - self.last_commit >= self.every

    def dirty(self) -> bool:
        """Whether there is anything a checkpoint would add."""
        return bool(self.pending) or self.trainer.updates != self.last_commit

    @property
    def journal_path(self) -> Path | None:
        """``out_dir/checkpoints/<policy>/journal.jsonl`` (see :mod:`swarm.train.journal`)."""
        tr = self.trainer
        return None if tr.out_dir is None else tr.out_dir / "checkpoints" / tr.policy / "journal.jsonl"

    def trained(self, lease_id: str, step_ids: list[str], expires_at: float | None = None) -> None:
        """Record an update's lease and trained steps (after publish; settled at the next commit); ``expires_at``
        (the lease's) lets :meth:`renew` skip it while it has more than half its TTL left."""
        self.pending.append((lease_id, list(step_ids), int(self.trainer.version)))
        if expires_at is not None:
            self._expires[lease_id] = float(expires_at)
        if self.journal_path is not None:
            journal.append(self.journal_path, {"event": "update", "update": self.trainer.updates,
                                               "version": self.trainer.version, "lease_id": lease_id,
                                               "steps": list(step_ids)})

    def publish(self, save: bool = True, *, after: int | None = None, **metadata: Any) -> dict[str, float]:
        """Weights into the backend, the next version (:meth:`Trainer.publish`: after ``after`` when given),
        and that version (with ``metadata``) into the pool."""
        record, metrics = self.trainer.publish(save=save, after=after)
        meta = {**self.version_metadata, **metadata}
        self.pool.add_policy_version(record.model_copy(update={"metadata": meta}) if meta else record)
        return metrics

    def renew(self, now: float | None = None) -> int:
        """Keep the pending leases reserved (call right before leasing again): each one with less than half
        the TTL left (or an unknown expiry) is pushed to ``now + ttl_s``; returns how many were renewed. A lease
        far from its expiry needs no write: only an expired one could be leased again."""
        t = time.time() if now is None else now
        n = 0
        for lease_id, _, _ in self.pending:
            if self._expires.get(lease_id, t) - t > self.ttl_s / 2:
                continue
            self._expires[lease_id] = self.pool.renew(lease_id, self.ttl_s)
            n += 1
        return n

    def commit(self, extra: dict[str, Any] | None = None) -> tuple[Path, Path | None] | None:
        """Checkpoint (with the pending leases), then settle them; returns (checkpoint, adapter dir), None when
        nothing changed. The current version's adapter (``out_dir/adapters/<policy>/v<version>``) is saved if missing."""
        if not self.dirty():
            return None
        tr = self.trainer
        ckpt = tr.save_checkpoint(extra={**(extra or {}), "pending": self.pending})
        adapter = None
        if tr.out_dir is not None:
            adapter = tr.out_dir / "adapters" / tr.policy / f"v{tr.version:06d}"
            if not adapter.exists():
                save_adapter(tr.model, adapter, policy=tr.policy, version=tr.version)
        crash_point("after_checkpoint")
        if isinstance(self.pool, Database):  # one transaction for the checkpoint's leases
            if self.pending:
                settle_many(self.pool, self.pending)
        else:
            for lease_id, ids, version in self.pending:
                self.pool.settle(lease_id, ids, version)
        crash_point("after_settle")
        self.pending = []
        self._expires.clear()
        self.last_commit = tr.updates
        return ckpt, adapter

    # -- restart ----------------------------------------------------------------------------
    def resume(self, load: bool = True) -> dict[str, Any] | None:
        """Restore the last checkpoint, settle what it contains, publish its weights; returns its extra.
        ``load=False`` (``train.resume=false``) keeps fresh weights, still never reusing a pool's version."""
        tr = self.trainer
        extra = tr.resume() if load else None
        if extra is not None:
            for lease_id, ids, version in extra.get("pending", []):
                try:
                    self.pool.settle(lease_id, ids, version)
                except LeaseError:
                    pass  # a checkpoint from another pool: nothing of it is here
            if "lease_id" in extra:  # a checkpoint written before the ledger: one acked lease
                try:
                    self.pool.ack(extra["lease_id"], tr.version)
                except LeaseError:
                    pass  # acked before the restart, or expired (the old format cannot settle)
        self.last_commit = tr.updates
        if self.journal_path is not None and (extra is not None or self.journal_path.exists()):
            journal.append(self.journal_path, {"event": "resume", "update": tr.updates})
        latest = self.pool.latest_version(tr.policy)
        if latest > tr.version:  # versions after the checkpoint were served: never reuse a number
            self.publish(save=True, after=latest, restored_update=tr.updates)
        elif extra is not None and tr.backend is not None:
            tr.backend.load_weights(tr.policy, adapter_state(tr.model), tr.version)
        return extra
