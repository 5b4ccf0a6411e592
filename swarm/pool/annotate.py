"""Everything attached to steps and episodes after they are written: rewards (late ones too),
events and feedback, curation labels, published policy versions, and pool statistics.

A mixin of :class:`swarm.pool.store.Pool`; same transactions and errors (ValidationError,
NotFoundError, ConflictError).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from swarm.errors import ConflictError, NotFoundError, ValidationError
from swarm.pool.checks import check_reward, coerce
from swarm.pool.engine import Database
from swarm.pool.query import JOIN, REWARD, REWARD_FINAL
from swarm.pool.rows import read_episode
from swarm.pool.schema import blocks as B
from swarm.pool.schema import episodes as E
from swarm.pool.schema import events as EV
from swarm.pool.schema import labels as L
from swarm.pool.schema import leases as LS
from swarm.pool.schema import policy_versions as PV
from swarm.pool.schema import steps as S
from swarm.records import Event, Label, PolicyVersion, RewardStatus, now

__all__ = ["AnnotateMixin"]


class AnnotateMixin(Database):
    """Rewards, events, labels, policy versions and stats for :class:`swarm.pool.store.Pool`."""

    def _set_reward(
        self, *, episode_id: str | None = None, step_id: str | None = None, reward: float, final: bool = True,
        keep_final: bool = False,
    ) -> bool:
        """Set an episode's or a step's reward without a record (it counts as the agent's: see
        :mod:`swarm.pool.rewards`); callers go through :meth:`report_reward` or a ``reward`` event.

        With ``keep_final`` a reward that is already final stays as it is (the caller keeps the
        late one as an event); returns whether the reward was set.
        """
        if (episode_id is None) == (step_id is None):
            raise ValidationError("a reward needs exactly one of episode_id and step_id")
        check_reward(reward, "reward")
        status = (RewardStatus.final if final else RewardStatus.pending).value
        table, col, ident = (S, S.c.step_id, step_id) if step_id is not None else (E, E.c.episode_id, episode_id)
        values: dict[str, Any] = {"reward": float(reward), "reward_status": status}
        if table is E:
            values["updated_at"] = now()
        what = "step" if table is S else "episode"
        with self._tx(write=True) as c:
            if keep_final and _final_now(c, table, ident):
                return False
            res = c.execute(table.update().where(col == ident).values(**values))
            if res.rowcount != 1:
                raise NotFoundError(f"no such {what}", **{f"{what}_id": ident})
            return True

    def add_event(self, ev: Event, apply_reward: bool = True) -> str:
        """Store an event or feedback; a ``reward`` event also sets the (final) reward unless not
        ``apply_reward`` (the gateway applies it by authority: :meth:`report_reward`)."""
        ev = coerce(Event, ev, "event")
        with self._tx(write=True) as c:
            if ev.step_id is not None:
                owner = c.execute(sa.select(S.c.episode_id).where(S.c.step_id == ev.step_id)).scalar()
                if owner is None:
                    raise NotFoundError("event names a step that does not exist", step_id=ev.step_id)
                if ev.episode_id is not None and ev.episode_id != owner:
                    raise ValidationError("episode_id: the step belongs to another episode", step_id=ev.step_id)
                ev = ev.model_copy(update={"episode_id": owner})
            else:
                read_episode(c, ev.episode_id)
            if c.execute(sa.select(EV.c.event_id).where(EV.c.event_id == ev.event_id)).first():
                raise ConflictError("an event with this id already exists", event_id=ev.event_id)
            c.execute(EV.insert(), {"event_id": ev.event_id, "kind": ev.kind, "episode_id": ev.episode_id,
                                    "step_id": ev.step_id, "created_at": ev.created_at,
                                    "record": ev.model_dump(mode="json")})
        if ev.kind == "reward" and apply_reward:  # a final reward is kept; a later one stays in the history as this event
            target = {"step_id": ev.step_id} if ev.step_id is not None else {"episode_id": ev.episode_id}
            self._set_reward(**target, reward=ev.value, final=True, keep_final=True)
        return ev.event_id

    def events(self, episode_id: str | None = None, step_id: str | None = None) -> list[Event]:
        """Events of an episode (all of them, step events included) or of one step."""
        if episode_id is None and step_id is None:
            raise ValidationError("events needs an episode_id or a step_id")
        q = sa.select(EV.c.record).order_by(EV.c.created_at, EV.c.event_id)
        q = q.where(EV.c.step_id == step_id) if step_id is not None else q.where(EV.c.episode_id == episode_id)
        with self._tx() as c:
            return [Event.model_validate(r) for r in c.execute(q).scalars()]

    def label(self, target: str, target_id: str, label: str, exclude: bool = False, note: str = "") -> Label:
        """Mark a step or an episode; ``exclude=True`` drops it from filters (and training)."""
        lbl = coerce(Label, {"target": target, "target_id": target_id, "label": label, "exclude": exclude,
                             "note": note}, "label")
        table, col = (S, S.c.step_id) if lbl.target == "step" else (E, E.c.episode_id)
        with self._tx(write=True) as c:
            if c.execute(sa.select(col).where(col == target_id)).first() is None:
                raise NotFoundError(f"no such {lbl.target}", **{f"{lbl.target}_id": target_id})
            c.execute(L.insert(), lbl.model_dump())
        return lbl

    def labels(self, target_id: str) -> list[Label]:
        q = sa.select(L).where(L.c.target_id == target_id).order_by(L.c.created_at, L.c.label_id)
        with self._tx() as c:
            return [Label.model_validate(dict(r)) for r in c.execute(q).mappings()]

    # ---------------------------------------------------------------- policy versions
    def add_policy_version(self, pv: PolicyVersion) -> PolicyVersion:
        """Record a published version; re-adding the same one is a no-op, a different one a ConflictError."""
        pv = coerce(PolicyVersion, pv, "policy version")
        with self._tx(write=True) as c:
            q = sa.select(PV.c.adapter_path).where(PV.c.policy == pv.policy, PV.c.version == pv.version)
            old = c.execute(q).first()
            if old is not None:
                if old.adapter_path != pv.adapter_path:
                    raise ConflictError("this policy version already exists", policy=pv.policy, version=pv.version)
                return pv
            c.execute(PV.insert(), {"policy": pv.policy, "version": pv.version, "adapter_path": pv.adapter_path,
                                    "created_at": pv.created_at, "meta": pv.metadata})
        return pv

    def latest_version(self, policy: str) -> int:
        """The highest published version of ``policy``; 0 when none was published."""
        with self._tx() as c:
            v = c.execute(sa.select(sa.func.max(PV.c.version)).where(PV.c.policy == policy)).scalar()
        return int(v or 0)

    def policy_versions(self, policy: str) -> list[PolicyVersion]:
        q = sa.select(PV).where(PV.c.policy == policy).order_by(PV.c.version)
        with self._tx() as c:
            return [PolicyVersion(policy=r["policy"], version=r["version"], adapter_path=r["adapter_path"],
                                  created_at=r["created_at"], metadata=r["meta"]) for r in c.execute(q).mappings()]

    # ---------------------------------------------------------------- stats
    def stats(self) -> dict[str, Any]:
        """Counts of steps and episodes by status, source, task and policy; token storage."""
        t = now()

        def by(c: sa.Connection, col: sa.ColumnElement, frm: Any) -> dict[str, int]:
            q = sa.select(col, sa.func.count()).select_from(frm).group_by(col)
            return {str(k): int(n) for k, n in c.execute(q)}

        with self._tx() as c:
            n_steps = c.execute(sa.select(sa.func.count()).select_from(S)).scalar_one()
            logical = c.execute(sa.select(sa.func.coalesce(sa.func.sum(S.c.length), 0))).scalar_one()
            tail_tokens = c.execute(sa.select(sa.func.coalesce(sa.func.sum(_n_tokens(S.c.tail)), 0))).scalar_one()
            block_tokens_q = sa.func.coalesce(sa.func.sum(_n_tokens(B.c.tokens)), 0)
            n_blocks, block_tokens = c.execute(sa.select(sa.func.count(), block_tokens_q)).one()
            status = sa.case((REWARD_FINAL, "final"), else_="pending")
            n = sa.select(sa.func.count())
            consumed = c.execute(n.select_from(S).where(S.c.consumed_version.is_not(None))).scalar_one()
            leased = c.execute(n.select_from(S).where(S.c.consumed_version.is_(None), S.c.lease_id.is_not(None),
                                                      S.c.lease_expires_at > t)).scalar_one()
            active = c.execute(n.select_from(LS).where(LS.c.state == "active", LS.c.expires_at > t)).scalar_one()
            mean_reward = c.execute(sa.select(sa.func.avg(REWARD)).select_from(JOIN).where(REWARD_FINAL)).scalar()
            stored = int(block_tokens) + int(tail_tokens)
            return {
                "steps": {
                    "total": int(n_steps),
                    "by_source": by(c, S.c.source, S),
                    "by_task": by(c, S.c.task, S),
                    "by_policy": by(c, S.c.policy, S),
                    "by_policy_version": by(c, S.c.policy + ":" + sa.cast(S.c.policy_version, sa.String), S),
                    "by_reward_status": by(c, status, JOIN),
                    "by_episode_status": by(c, E.c.status, JOIN),
                    "consumed": int(consumed),
                    "leased": int(leased),
                    "mean_final_reward": None if mean_reward is None else float(mean_reward),
                },
                "episodes": {"total": int(c.execute(n.select_from(E)).scalar_one()), "by_status": by(c, E.c.status, E),
                             "by_task": by(c, E.c.task, E), "by_type": by(c, E.c.type, E)},
                "tokens": {"logical": int(logical), "stored": stored, "blocks": int(n_blocks),
                           "dedupe_ratio": (int(logical) / stored) if stored else None},
                "leases": {"active": int(active)},
            }


def _n_tokens(col: sa.ColumnElement) -> sa.ColumnElement:
    """How many token ids a packed block or tail holds (:func:`swarm.pool.blocks.pack_tokens`): an even length
    is plain uint32; an odd one ends in its width, 2 or 4."""
    n = sa.func.length(col)
    return sa.case((n % 2 == 0, n // 4),
                   (sa.func.substr(col, n, 1) == sa.literal(b"\x02", sa.LargeBinary), (n - 1) // 2),
                   else_=(n - 1) // 4)


def _final_now(c: sa.Connection, table: sa.Table, ident: str) -> bool:
    """Whether a step's effective reward (its own, else its episode's) or an episode's reward is final."""
    final = RewardStatus.final.value
    if table is E:
        return c.execute(sa.select(E.c.reward_status).where(E.c.episode_id == ident)).scalar() == final
    row = c.execute(
        sa.select(S.c.reward, S.c.reward_status, E.c.reward_status.label("ep_status"))
        .select_from(S.join(E, E.c.episode_id == S.c.episode_id))
        .where(S.c.step_id == ident)
    ).first()
    if row is None:
        return False
    return (row.reward_status if row.reward is not None else row.ep_status) == final
