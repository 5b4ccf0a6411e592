"""Reward authority: who gave a reward, and whose reward trains.

Every reward reported through the gateway is recorded (table ``rewards``) with its source:
``agent`` (the episode's own api key), ``judge`` (a service with the client token) or ``admin``
(the admin token); authority grows in that order. A reward becomes the target's reward when its
authority is higher than the one that set the current reward, or equal to it while the current
reward is not yet final; otherwise it is kept in the history, not applied, with the reason. A
reward set without a record (an agent's at ``/end``, on a white-box step, by the pool API directly)
counts as the agent's. When a judge or admin sets an episode's reward, the step rewards of that episode set
by a lower authority are cleared, so every step trains on the highest-authority reward.

A task may raise the lowest source whose reward is applied at all (``min_source``: e.g. ``judge``
for tasks whose agent must not grade itself); the gateway passes it from its settings.

An episode ended with a ``source`` (:class:`swarm.pool.episodes.EpisodeEnding`) goes by the same rules
under the episode's lock (:func:`ending_rewards`): its rewards apply unless the task's floor or a higher
authority's episode reward refuses them all, a step reward a higher authority set stands, and what is
refused (and a judge's or admin's applied rewards) is recorded.

A mixin of :class:`swarm.pool.store.Pool`; same transactions and errors (NotFoundError for an unknown
target, ValidationError for an unknown source). It does not decide which source a caller is.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from swarm.errors import NotFoundError, ValidationError
from swarm.pool.checks import check_reward, chunks
from swarm.pool.engine import Database
from swarm.pool.engines import Dialect
from swarm.pool.schema import episodes as E
from swarm.pool.schema import rewards as RW
from swarm.pool.schema import steps as S
from swarm.records import RewardStatus, now

__all__ = ["RewardsMixin", "RewardOutcome", "AUTHORITY", "SOURCES", "authority", "step_authorities",
           "clear_lower_step_rewards", "ending_rewards"]

AUTHORITY = {"agent": 1, "judge": 2, "admin": 3}
SOURCES = tuple(AUTHORITY)
_NAMES = {v: k for k, v in AUTHORITY.items()}
_FINAL, _PENDING = RewardStatus.final.value, RewardStatus.pending.value


@dataclass(frozen=True)
class RewardOutcome:
    """What became of one reported reward."""

    applied: bool
    source: str
    reason: str
    current_source: str | None  # whose reward the target has now

    def json(self) -> dict[str, Any]:
        return {"reward_applied": self.applied, "reward_source": self.source, "reward_reason": self.reason,
                "reward_current_source": self.current_source}


def authority(c: sa.Connection, episode_id: str, step_id: str | None, has_reward: bool) -> int:
    """Authority of the target's current reward: the highest applied record, else the agent's if set."""
    q = sa.select(sa.func.max(RW.c.authority)).where(RW.c.episode_id == episode_id, RW.c.applied.is_(True))
    q = q.where(RW.c.step_id == step_id) if step_id is not None else q.where(RW.c.step_id.is_(None))
    best = c.execute(q).scalar()
    return int(best) if best is not None else (AUTHORITY["agent"] if has_reward else 0)


class RewardsMixin(Database):
    """:meth:`report_reward` and :meth:`reward_history` for :class:`swarm.pool.store.Pool`."""

    def report_reward(self, *, episode_id: str | None = None, step_id: str | None = None, reward: float,
                      source: str, final: bool = True, min_source: str = "agent") -> RewardOutcome:
        """Record a reward from ``source`` and apply it if its authority allows (see the module docstring)."""
        if (episode_id is None) == (step_id is None):
            raise ValidationError("report_reward needs exactly one of episode_id and step_id")
        if source not in AUTHORITY or min_source not in AUTHORITY:
            raise ValidationError(f"reward source must be one of {list(SOURCES)}, got {source!r} / {min_source!r}")
        check_reward(reward, "reward")
        a = AUTHORITY[source]
        with self._tx(write=True) as c:
            # PostgreSQL: hold the episode's row from here on, so the read-decide-write below is atomic
            # against another report (or the episode's end) for the same episode; SQLite's write lock does it
            _lock_episode(c, self.sql, episode_id, step_id)
            if step_id is not None:
                row = c.execute(sa.select(S.c.episode_id, S.c.reward, S.c.reward_status,
                                          E.c.reward.label("ep_reward"), E.c.reward_status.label("ep_status"))
                                .select_from(S.join(E, E.c.episode_id == S.c.episode_id))
                                .where(S.c.step_id == step_id)).first()
                if row is None:
                    raise NotFoundError("no such step", step_id=step_id)
                episode_id = row.episode_id
                own = row.reward is not None
                ep_auth = authority(c, episode_id, None, row.ep_reward is not None)
                # a step without its own reward trains on the episode's
                cur = authority(c, episode_id, step_id, True) if own else ep_auth
                cur_final = (row.reward_status if own else row.ep_status) == _FINAL and (own or row.ep_reward is not None)
            else:
                row = c.execute(sa.select(E.c.reward, E.c.reward_status).where(E.c.episode_id == episode_id)).first()
                if row is None:
                    raise NotFoundError("no such episode", episode_id=episode_id)
                cur = authority(c, episode_id, None, row.reward is not None)
                cur_final = row.reward is not None and row.reward_status == _FINAL
            what = "step" if step_id is not None else "episode"
            if a < AUTHORITY[min_source]:
                applied, reason = False, (f"this task takes rewards from {min_source} or higher; the {source}'s "
                                          "report is kept in the history")
            elif a < cur:
                applied, reason = False, (f"the {what}'s reward was set by the {_NAMES[cur]}, which a {source} "
                                          "cannot supersede; kept in the history")
            elif a == cur and cur_final:
                applied, reason = False, (f"the {what}'s reward is already final (set by the {_NAMES[cur]}); "
                                          "a late one is kept in the history, never an overwrite")
            else:
                applied = True
                reason = ("applied" if cur == 0 else f"applied: supersedes the {_NAMES[cur]}'s reward" if a > cur
                          else "applied: replaces a pending reward")
            c.execute(RW.insert(), {"reward_id": f"rw-{uuid.uuid4().hex}", "episode_id": episode_id,
                                    "step_id": step_id, "value": float(reward), "final": bool(final),
                                    "source": source, "authority": a, "applied": applied, "reason": reason,
                                    "created_at": now()})
            if applied:
                values = {"reward": float(reward), "reward_status": _FINAL if final else _PENDING}
                if step_id is not None:
                    c.execute(S.update().where(S.c.step_id == step_id).values(**values))
                else:
                    c.execute(E.update().where(E.c.episode_id == episode_id).values(**values, updated_at=now()))
                    if a > AUTHORITY["agent"]:
                        clear_lower_step_rewards(c, episode_id, a)
        return RewardOutcome(applied, source, reason, _NAMES.get(a if applied else cur))

    def episode_reward_authority(self, episode_id: str) -> str | None:
        """The source of an episode's current reward (None: no reward yet)."""
        with self._tx() as c:
            r = c.execute(sa.select(E.c.reward).where(E.c.episode_id == episode_id)).first()
            if r is None:
                raise NotFoundError("no such episode", episode_id=episode_id)
            return _NAMES.get(authority(c, episode_id, None, r.reward is not None))

    def reward_history(self, episode_id: str) -> list[dict[str, Any]]:
        """Every reward reported for an episode and its steps, oldest first, with source and outcome."""
        q = sa.select(RW).where(RW.c.episode_id == episode_id).order_by(RW.c.created_at, RW.c.reward_id)
        with self._tx() as c:
            return [{k: v for k, v in r.items() if k != "authority"} for r in c.execute(q).mappings()]


def ending_rewards(c: sa.Connection, episode_id: str, source: str, min_source: str, reward: float | None,
                   step_rewards: Mapping[str, float] | None, has_reward: bool,
                   ) -> tuple[float | None, dict[str, float] | None, RewardOutcome, dict[str, str], list[dict[str, Any]]]:
    """What an ending from ``source`` may apply, decided under the episode's lock: (reward, step rewards) to
    apply, the outcome, the refused steps (id -> why) and the ``rewards`` rows to record.

    All of it stays history when ``source`` is below the task's floor ``min_source`` or below the authority of
    the episode's current reward (``has_reward``: it has one); otherwise a step reward a higher authority set
    stands (its step is refused). A judge's or admin's applied rewards are recorded too (an agent's need no
    record: an unrecorded reward counts as the agent's)."""
    mine = AUTHORITY[source]
    current = authority(c, episode_id, None, has_reward)
    note = None
    if mine < AUTHORITY[min_source]:
        note = f"this task takes rewards from {min_source} or higher; the {source}'s report is kept in the history"
    elif current > mine:
        note = (f"the episode's reward was set by the {_NAMES[current]}, which a {source} cannot supersede; "
                "kept in the history")
    if note is not None:
        return (None, None, RewardOutcome(False, source, note, _NAMES.get(current)), {},
                _history(episode_id, source, reward, step_rewards, False, note))
    steps = dict(step_rewards or {})
    higher = step_authorities(c, episode_id, list(steps))
    refused = {s: v for s, v in steps.items() if higher.get(s, 0) > mine}
    steps = {s: v for s, v in steps.items() if s not in refused}
    rows = (_history(episode_id, source, reward, steps, True, "applied when the episode ended")
            if mine > AUTHORITY["agent"] else [])
    why = f"a higher authority set these steps' rewards, which a {source} cannot supersede; kept in the history"
    rows += _history(episode_id, source, None, refused, False, why)
    outcome = RewardOutcome(True, source, "applied", source if reward is not None else _NAMES.get(current))
    return reward, steps or None, outcome, dict.fromkeys(refused, why), rows


def _history(episode_id: str, source: str, reward: float | None, step_rewards: Mapping[str, float] | None,
             applied: bool, reason: str) -> list[dict[str, Any]]:
    """``rewards`` rows of an episode's reward and step rewards reported by ``source`` (final ones)."""
    t = now()
    return [{"reward_id": f"rw-{uuid.uuid4().hex}", "episode_id": episode_id, "step_id": sid, "value": float(v),
             "final": True, "source": source, "authority": AUTHORITY[source], "applied": applied, "reason": reason,
             "created_at": t}
            for sid, v in ([(None, reward)] if reward is not None else []) + list((step_rewards or {}).items())]


def step_authorities(c: sa.Connection, episode_id: str, step_ids: list[str]) -> dict[str, int]:
    """Authority of each of ``step_ids``' own reward applied with a record (steps without one are absent)."""
    out: dict[str, int] = {}
    for chunk in chunks(sorted(set(step_ids))):
        q = (sa.select(RW.c.step_id, sa.func.max(RW.c.authority))
             .where(RW.c.episode_id == episode_id, RW.c.applied.is_(True), RW.c.step_id.in_(chunk))
             .group_by(RW.c.step_id))
        out.update({sid: int(a) for sid, a in c.execute(q)})
    return out


def _lock_episode(c: sa.Connection, sql: Dialect, episode_id: str | None, step_id: str | None) -> None:
    """Lock the target's episode row for the rest of the transaction (a no-op on a single-writer engine)."""
    if sql.single_writer:
        return
    if episode_id is None:
        episode_id = c.execute(sa.select(S.c.episode_id).where(S.c.step_id == step_id)).scalar()
        if episode_id is None:
            return  # no such step: the caller's read reports it
    c.execute(sql.lock_rows(sa.select(E.c.episode_id).where(E.c.episode_id == episode_id)))


def clear_lower_step_rewards(c: sa.Connection, episode_id: str, authority: int) -> None:
    """Step rewards of ``episode_id`` set below ``authority`` go: those steps train on the episode's reward."""
    kept = sa.select(RW.c.step_id).where(RW.c.episode_id == episode_id, RW.c.step_id.is_not(None),
                                         RW.c.applied.is_(True), RW.c.authority >= authority)
    c.execute(S.update().where(S.c.episode_id == episode_id, S.c.reward.is_not(None), S.c.step_id.not_in(kept))
              .values(reward=None, reward_status=_PENDING))
