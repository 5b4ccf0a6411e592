"""Episode lifecycle in the pool: open, keep alive, end (with final rewards, or as failed), abandon.

A mixin of :class:`swarm.pool.store.Pool`; same transactions and errors (ValidationError,
NotFoundError, ConflictError). ``add_episodes`` / ``end_episodes`` do many opens / ends in one
transaction, all or none, with the result ``add_episode`` / ``end_episode`` would have given one
after the other (the gateway's group commit batches concurrent requests through them). Reading
episodes back lives in :mod:`swarm.pool.store`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from swarm.errors import ConflictError, NotFoundError, ValidationError
from swarm.pool.checks import check_reward, chunks, coerce, coerce_enum
from swarm.pool.engine import Database
from swarm.pool.rewards import AUTHORITY, RewardOutcome, clear_lower_step_rewards, ending_rewards
from swarm.pool.rows import EPISODE_COLS, open_episode, to_episode
from swarm.pool.schema import episodes as E
from swarm.pool.schema import rewards as RW
from swarm.pool.schema import steps as S
from swarm.records import Episode, EpisodeStatus, RewardStatus, now

_clock = now  # abandon_stale's parameter is called ``now``

__all__ = ["EpisodeEnding", "Ended", "EpisodesMixin"]

# built once (SQLAlchemy reuses their compiled form); an UPDATE without .values() sets the
# columns its parameter dicts name
_IDS = sa.bindparam("ids", expanding=True)
_TAKEN = sa.select(E.c.episode_id).where(E.c.episode_id.in_(_IDS))
_ROWS = sa.select(E).where(E.c.episode_id.in_(_IDS))
_OWNERS = sa.select(S.c.step_id, S.c.episode_id).where(S.c.step_id.in_(_IDS))
_SET_EPISODE = E.update().where(E.c.episode_id == sa.bindparam("_id"))
_SET_STEP = S.update().where(S.c.step_id == sa.bindparam("_id"))
_ENDED = ("status", "reward", "reward_status", "meta", "updated_at", "ended_at")  # what ending changes


@dataclasses.dataclass(frozen=True)
class EpisodeEnding:
    """One episode to end: the arguments of :meth:`EpisodesMixin.end_episode`."""

    episode_id: str
    status: EpisodeStatus = EpisodeStatus.finished
    reward: float | None = None
    step_rewards: Mapping[str, float] | None = None
    metadata: Mapping[str, Any] | None = None
    # who gives the rewards ("agent" | "judge" | "admin"): they go by authority, decided under the episode's
    # lock (swarm.pool.rewards.ending_rewards), and are recorded (None: applied unchecked, unrecorded)
    source: str | None = None
    min_source: str = "agent"  # the task's floor: rewards from a lower source stay history


@dataclasses.dataclass(frozen=True)
class Ended:
    """An ended episode as stored, and what became of the rewards its ending gave with a ``source``."""

    episode: Episode
    rewards: RewardOutcome | None = None  # None: the ending had no source or gave no reward
    refused_steps: Mapping[str, str] = dataclasses.field(default_factory=dict)  # step id -> why it stays history


class EpisodesMixin(Database):
    """Opening, keeping alive and ending episodes, one or many at a time, for the Pool."""

    def add_episode(self, ep: Episode) -> Episode:
        """Store a new episode; ConflictError if its id is taken."""
        return self.add_episodes([coerce(Episode, ep, "episode")])[0]

    def add_episodes(self, episodes: list[Episode]) -> list[Episode]:
        """Store new episodes in one transaction (all or none); ConflictError if an id is taken."""
        eps = [coerce(Episode, ep, f"episodes[{i}]") for i, ep in enumerate(episodes)]
        ids = sorted(ep.episode_id for ep in eps)
        for a, b in zip(ids, ids[1:], strict=False):
            if a == b:
                raise ConflictError("two episodes in one batch share an episode_id", episode_id=a)
        if not eps:
            return []
        with self._tx(write=True) as c:
            for chunk in chunks(ids):
                taken = c.execute(_TAKEN, {"ids": chunk}).scalar()
                if taken is not None:
                    raise ConflictError("an episode with this id already exists", episode_id=taken)
            c.execute(E.insert(), [_row(ep) for ep in eps])
        return eps

    def heartbeat(self, episode_id: str) -> None:
        """Record activity on an open episode (keeps abandon_stale away)."""
        with self._tx(write=True) as c:
            open_episode(c, episode_id)
            c.execute(E.update().where(E.c.episode_id == episode_id).values(updated_at=now()))

    def end_episode(
        self,
        episode_id: str,
        status: EpisodeStatus = EpisodeStatus.finished,
        reward: float | None = None,
        step_rewards: Mapping[str, float] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Episode:
        """End an open episode; ``reward`` / ``step_rewards`` given here are final."""
        return self.end_episodes([EpisodeEnding(episode_id, status, reward, step_rewards, metadata)])[0].episode

    def end_episodes(self, endings: list[EpisodeEnding]) -> list[Ended]:
        """End open episodes in one transaction (all or none), in order; the ended episodes as stored, with
        what became of the rewards of endings with a ``source`` (:func:`swarm.pool.rewards.ending_rewards`).

        Ending one episode twice in a batch is a ConflictError, as it is one call after the other.
        """
        endings = [_checked(e) for e in endings]
        if not endings:
            return []
        ids = sorted({e.episode_id for e in endings})
        with self._tx(write=True) as c:
            # the update writes every _ENDED column back, changed or not, so the rows stay locked from
            # this read on: SQLite's write lock does it, PostgreSQL locks them (in id order: concurrent
            # batches queue, never deadlock)
            rows = _rows(c, self.sql.lock_rows(_ROWS), ids)
            t = now()
            updates: list[dict[str, Any]] = []
            outcomes: dict[int, tuple[RewardOutcome, dict[str, str]]] = {}
            history: list[dict[str, Any]] = []
            for i, e in enumerate(endings):
                row = rows.get(e.episode_id)
                if row is None:
                    raise NotFoundError("no such episode", episode_id=e.episode_id)
                if row["status"] != EpisodeStatus.open.value:
                    raise ConflictError(f"episode is {row['status']}, not open", episode_id=e.episode_id)
                if e.source is not None and (e.reward is not None or e.step_rewards):
                    reward, steps, outcome, refused, recorded = ending_rewards(
                        c, e.episode_id, e.source, e.min_source, e.reward, e.step_rewards, row["reward"] is not None)
                    e = endings[i] = dataclasses.replace(e, reward=reward, step_rewards=steps)
                    outcomes[i] = (outcome, refused)
                    history += recorded
                row.update(status=e.status.value, updated_at=t, ended_at=t)
                if e.reward is not None:
                    row.update(reward=float(e.reward), reward_status=RewardStatus.final.value)
                if e.metadata:
                    row["meta"] = {**row["meta"], **dict(e.metadata)}
                updates.append({"_id": e.episode_id, **{k: row[k] for k in _ENDED}})
            c.execute(_SET_EPISODE, updates)
            _clear_below_enders(c, endings)  # first: the step rewards given with the ending then stand
            _final_step_rewards(c, endings)
            if history:
                c.execute(RW.insert(), history)
            stored = _rows(c, _ROWS, ids)
        return [Ended(to_episode(stored[e.episode_id]), *outcomes.get(i, (None, {}))) for i, e in enumerate(endings)]

    def abandon_stale(self, now: float | None = None) -> list[str]:
        """Mark open episodes idle for longer than their ``timeout_s`` abandoned; returns their ids.

        Their steps stay in the pool (for analysis) but are never leased for training.
        """
        t = _clock() if now is None else now
        stale = sa.and_(E.c.status == EpisodeStatus.open.value, E.c.timeout_s.is_not(None),
                        E.c.updated_at + E.c.timeout_s < t)
        with self._tx(write=True) as c:
            ids = list(c.execute(sa.select(E.c.episode_id).where(stale)).scalars())
            for chunk in chunks(ids):
                c.execute(
                    E.update()
                    .where(E.c.episode_id.in_(chunk), E.c.status == EpisodeStatus.open.value)
                    .values(status=EpisodeStatus.abandoned.value, ended_at=t, updated_at=t)
                )
        return ids


def _row(ep: Episode) -> dict[str, Any]:
    """The ``episodes`` row of ``ep``."""
    return ({k: getattr(ep, k) for k in EPISODE_COLS} | {"type": ep.type.value, "status": ep.status.value,
            "reward_status": ep.reward_status.value, "meta": ep.metadata})


def _checked(e: EpisodeEnding) -> EpisodeEnding:
    status = coerce_enum(EpisodeStatus, e.status, "status")
    for name in ("source", "min_source"):
        value = getattr(e, name)
        if value is not None and value not in AUTHORITY:
            raise ValidationError(f"{name}: must be one of {list(AUTHORITY)}, got {value!r}", episode_id=e.episode_id)
    if status == EpisodeStatus.open:
        raise ValidationError("status: an episode cannot be ended as open", episode_id=e.episode_id)
    check_reward(e.reward, "reward")
    for sid, r in (e.step_rewards or {}).items():
        check_reward(r, f"step_rewards[{sid}]")
    return dataclasses.replace(e, status=status)


def _clear_below_enders(c: sa.Connection, endings: list[EpisodeEnding]) -> None:
    """A judge's or admin's episode reward given at the end clears the step rewards a lower authority set
    (as the same reward reported any other way does); the step rewards given with it are set afterwards."""
    for e in endings:
        a = AUTHORITY.get(e.source or "", 0)
        if e.reward is not None and a > AUTHORITY["agent"]:
            clear_lower_step_rewards(c, e.episode_id, a)


def _rows(c: sa.Connection, q: sa.Select, ids: list[str]) -> dict[str, dict[str, Any]]:
    return {r["episode_id"]: dict(r) for chunk in chunks(ids) for r in c.execute(q, {"ids": chunk}).mappings()}


def _final_step_rewards(c: sa.Connection, endings: list[EpisodeEnding]) -> None:
    """Set the endings' step rewards (final); NotFoundError for a step not in its ending's episode."""
    wanted = [(e.episode_id, sid, float(r)) for e in endings for sid, r in (e.step_rewards or {}).items()]
    if not wanted:
        return
    owner: dict[str, str] = {}
    for chunk in chunks(sorted({sid for _, sid, _ in wanted})):
        owner.update(c.execute(_OWNERS, {"ids": chunk}).all())
    for episode_id, sid, _ in wanted:
        if owner.get(sid) != episode_id:
            raise NotFoundError("step_rewards names a step not in this episode", episode_id=episode_id, step_id=sid)
    # each step belongs to one episode, and its episode's row is locked above: no lock order needed here
    c.execute(_SET_STEP, [{"_id": sid, "reward": r, "reward_status": RewardStatus.final.value} for _, sid, r in wanted])
