"""Episode lifecycle in the pool: open, keep alive, end (with final rewards), abort, abandon.

A mixin of :class:`swarm.pool.store.Pool`; same transactions and errors (ValidationError,
NotFoundError, ConflictError). Reading episodes back lives in :mod:`swarm.pool.store`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from swarm.errors import ConflictError, NotFoundError, ValidationError
from swarm.pool.checks import check_reward, chunks, coerce, coerce_enum
from swarm.pool.schema import episodes as E
from swarm.pool.schema import steps as S
from swarm.records import Episode, EpisodeStatus, RewardStatus, now

if TYPE_CHECKING:
    from swarm.pool.store import Pool

_clock = now  # abandon_stale's parameter is called ``now``

__all__ = ["EpisodesMixin"]


class EpisodesMixin:
    """``add_episode`` / ``heartbeat`` / ``end_episode`` / ``abort_episode`` / ``abandon_stale`` for the Pool."""

    def add_episode(self: Pool, ep: Episode) -> Episode:
        ep = coerce(Episode, ep, "episode")
        row = {
            "episode_id": ep.episode_id,
            "task": ep.task,
            "group_id": ep.group_id,
            "client_id": ep.client_id,
            "type": ep.type.value,
            "status": ep.status.value,
            "reward": ep.reward,
            "reward_status": ep.reward_status.value,
            "timeout_s": ep.timeout_s,
            "created_at": ep.created_at,
            "updated_at": ep.updated_at,
            "ended_at": ep.ended_at,
            "meta": ep.metadata,
        }
        with self._tx(write=True) as c:
            if c.execute(sa.select(E.c.episode_id).where(E.c.episode_id == ep.episode_id)).first():
                raise ConflictError("an episode with this id already exists", episode_id=ep.episode_id)
            c.execute(E.insert(), row)
        return ep

    def heartbeat(self: Pool, episode_id: str) -> None:
        """Record activity on an open episode (keeps abandon_stale away)."""
        with self._tx(write=True) as c:
            self._open_episode(c, episode_id)
            c.execute(E.update().where(E.c.episode_id == episode_id).values(updated_at=now()))

    def end_episode(
        self: Pool,
        episode_id: str,
        status: EpisodeStatus = EpisodeStatus.finished,
        reward: float | None = None,
        step_rewards: Mapping[str, float] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Episode:
        """End an open episode; ``reward`` / ``step_rewards`` given here are final."""
        status = coerce_enum(EpisodeStatus, status, "status")
        if status == EpisodeStatus.open:
            raise ValidationError("status: an episode cannot be ended as open", episode_id=episode_id)
        check_reward(reward, "reward")
        for sid, r in (step_rewards or {}).items():
            check_reward(r, f"step_rewards[{sid}]")
        with self._tx(write=True) as c:
            ep = self._open_episode(c, episode_id)
            t = now()
            values: dict[str, Any] = {"status": status.value, "updated_at": t, "ended_at": t}
            if reward is not None:
                values |= {"reward": float(reward), "reward_status": RewardStatus.final.value}
            if metadata:
                values["meta"] = {**ep.metadata, **dict(metadata)}
            c.execute(E.update().where(E.c.episode_id == episode_id).values(**values))
            for sid, r in (step_rewards or {}).items():
                res = c.execute(
                    S.update()
                    .where(S.c.step_id == sid, S.c.episode_id == episode_id)
                    .values(reward=float(r), reward_status=RewardStatus.final.value)
                )
                if res.rowcount != 1:
                    raise NotFoundError(
                        "step_rewards names a step not in this episode", episode_id=episode_id, step_id=sid
                    )
            return self._episode(c, episode_id)

    def abort_episode(self: Pool, episode_id: str) -> Episode:
        """End an open episode as failed."""
        return self.end_episode(episode_id, status=EpisodeStatus.failed)

    def abandon_stale(self: Pool, now: float | None = None) -> list[str]:
        """Mark open episodes idle for longer than their ``timeout_s`` abandoned; returns their ids.

        Their steps stay in the pool (for analysis) but are never leased for training.
        """
        t = _clock() if now is None else now
        stale = sa.and_(
            E.c.status == EpisodeStatus.open.value,
            E.c.timeout_s.is_not(None),
            E.c.updated_at + E.c.timeout_s < t,
        )
        with self._tx(write=True) as c:
            ids = list(c.execute(sa.select(E.c.episode_id).where(stale)).scalars())
            for chunk in chunks(ids):
                c.execute(
                    E.update()
                    .where(E.c.episode_id.in_(chunk), E.c.status == EpisodeStatus.open.value)
                    .values(status=EpisodeStatus.abandoned.value, ended_at=t, updated_at=t)
                )
        return ids
