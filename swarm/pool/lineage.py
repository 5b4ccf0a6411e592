"""Lineage: from a step to the update that consumed it and that version's evals, and from a version
back to the steps that made it.

- :meth:`LineageMixin.step_lineage`: the step; its episode with the reward history (who gave each
  reward, applied or not and why) and feedback; its group; the lease that took it; the version its
  update produced (``consumed_version``), that version's record and its eval results.
- :meth:`LineageMixin.version_lineage`: a version's record and the one it was trained from; the leases
  acked into it; counts of the steps, episodes, groups, tasks, code versions and staleness that made it,
  and a page of those steps; how many steps it generated itself; its eval results.

Every query is bounded and walks an index: one step, one episode (``ix_rewards_episode``,
``ix_events_episode``, ``ix_labels_target``), one group (``ix_episodes_group``, at most
``_GROUP_MAX`` members), one lease's steps (``ix_steps_lease``), one version's generated steps
(``ix_steps_policy_version``). The leases table (one row per training batch) is read whole for the
leases acked into a version, as the dashboard does. A step consumed by version ``v`` keeps the
``lease_id`` of the lease that was acked or settled into ``v``, so "the steps that made ``v``" are
those leases' steps with ``consumed_version = v``.

A mixin of :class:`swarm.pool.store.Pool`: NotFoundError for an unknown step or version. It writes nothing.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import sqlalchemy as sa

from swarm.errors import NotFoundError, ValidationError
from swarm.pool.checks import check_page
from swarm.pool.engine import Database
from swarm.pool.evals import EvalResult, eval_summary
from swarm.pool.query import JOIN, REWARD, REWARD_FINAL
from swarm.pool.schema import INT32_MAX
from swarm.pool.schema import episodes as E
from swarm.pool.schema import eval_results as R
from swarm.pool.schema import events as EV
from swarm.pool.schema import labels as L
from swarm.pool.schema import leases as LS
from swarm.pool.schema import policy_versions as PV
from swarm.pool.schema import rewards as RW
from swarm.pool.schema import steps as S

__all__ = ["LineageMixin"]

_GROUP_MAX = 64  # group members listed (a group is one prompt's samples: a handful)
_HISTORY_MAX = 200  # reward records and feedback events listed per episode
_EVALS_MAX = 200  # eval rows listed per version
_STEP_COLS = (S.c.step_id, S.c.episode_id, S.c.idx.label("index"), S.c.parent_step_id, S.c.task, S.c.group_id,
              S.c.policy, S.c.policy_version, S.c.source, S.c.response_id, REWARD.label("reward"),
              REWARD_FINAL.label("reward_final"), S.c.length, S.c.n_prompt, S.c.created_at, S.c.lease_id,
              S.c.consumed_version, S.c.consumed_at)


def _version_record(c: sa.Connection, policy: str, version: int | None) -> dict[str, Any] | None:
    if version is None:
        return None
    r = c.execute(sa.select(PV).where(PV.c.policy == policy, PV.c.version == version)).mappings().first()
    if r is None:
        return None
    return {"policy": r["policy"], "version": r["version"], "adapter_path": r["adapter_path"],
            "created_at": r["created_at"], "metadata": r["meta"]}


def _evals(c: sa.Connection, policy: str, version: int | None) -> list[EvalResult]:
    if version is None:
        return []
    q = (sa.select(R).where(R.c.policy == policy, R.c.version == version)
         .order_by(R.c.created_at, R.c.eval_id).limit(_EVALS_MAX))
    return [EvalResult(**{**{k: v for k, v in m.items() if k != "meta"}, "metadata": m["meta"]})
            for m in c.execute(q).mappings()]


def _evals_json(rows: list[EvalResult]) -> dict[str, Any]:
    return {"rows": [r.model_dump(mode="json") for r in rows], "summary": eval_summary(rows)}


def _lease(c: sa.Connection, lease_id: str | None) -> dict[str, Any] | None:
    if lease_id is None:
        return None
    r = c.execute(sa.select(LS).where(LS.c.lease_id == lease_id)).mappings().first()
    return None if r is None else dict(r)


class LineageMixin(Database):
    """``step_lineage`` / ``version_lineage`` for :class:`swarm.pool.store.Pool` (see the module docstring)."""

    def step_lineage(self, step_id: str) -> dict[str, Any]:
        """From one step: its episode (reward history, feedback, labels), group, lease, the update that
        consumed it (the version it produced, with its record) and that version's eval results."""
        with self._tx() as c:
            row = c.execute(sa.select(*_STEP_COLS).select_from(JOIN).where(S.c.step_id == step_id)).mappings().first()
            if row is None:
                raise NotFoundError("no such step", step_id=step_id)
            step = dict(row)
            step["reward_final"] = bool(step["reward_final"])
            ep = c.execute(sa.select(E).where(E.c.episode_id == step["episode_id"])).mappings().one()
            history = c.execute(sa.select(RW).where(RW.c.episode_id == ep["episode_id"])
                                .order_by(RW.c.created_at, RW.c.reward_id).limit(_HISTORY_MAX)).mappings().all()
            # feedback, late rewards, and the judge's verdicts (its score, the judge step that gave it, or why it failed)
            feedback = c.execute(sa.select(EV.c.record).where(EV.c.episode_id == ep["episode_id"],
                                                              EV.c.kind.in_(["feedback", "reward"])
                                                              | EV.c.record["name"].as_string().in_(["judge", "judge_failed"]))
                                 .order_by(EV.c.created_at, EV.c.event_id).limit(_HISTORY_MAX)).scalars().all()
            labels = c.execute(sa.select(L).where(L.c.target_id.in_([step_id, ep["episode_id"]]))
                               .order_by(L.c.created_at).limit(_HISTORY_MAX)).mappings().all()
            group = self._group(c, step, ep)
            lease = _lease(c, step["lease_id"])
            consumed = step["consumed_version"]
            produced = _version_record(c, step["policy"], consumed)
            generated_by = _version_record(c, step["policy"], step["policy_version"])
            evals = _evals(c, step["policy"], consumed)
        meta = ep["meta"] or {}
        episode = {k: ep[k] for k in ("episode_id", "task", "group_id", "client_id", "type", "status", "reward",
                                      "reward_status", "created_at", "ended_at")}
        episode.update(code_version=meta.get("code_version"), metrics=meta.get("metrics") or {},
                       policy=meta.get("policy"), role=meta.get("role"))
        episode["reward_history"] = [{k: v for k, v in r.items() if k != "authority"} for r in history]
        episode["feedback"] = list(feedback)
        episode["labels"] = [dict(r) for r in labels]
        return {
            "step": step, "episode": episode, "group": group, "lease": lease,
            "update": None if consumed is None else {"policy": step["policy"], "consumed_version": consumed,
                                                     "consumed_at": step["consumed_at"],
                                                     "trained_from": consumed - 1, "version": produced},
            "generated_by": generated_by,
            "evals": _evals_json(evals),
        }

    def _group(self, c: sa.Connection, step: dict[str, Any], ep: Any) -> dict[str, Any]:
        """The step's group: its member episodes and their rewards (an ungrouped step: its own episode)."""
        gid = step["group_id"]
        where = E.c.group_id == gid if gid is not None else E.c.episode_id == ep["episode_id"]
        q = (sa.select(E.c.episode_id, E.c.status, E.c.reward, E.c.reward_status, E.c.client_id)
             .where(where).order_by(E.c.created_at, E.c.episode_id).limit(_GROUP_MAX + 1))
        members = [dict(r) for r in c.execute(q).mappings()]
        rewards = [m["reward"] for m in members[:_GROUP_MAX] if m["reward"] is not None]
        mean = sum(rewards) / len(rewards) if rewards else None
        return {"group_id": gid, "members": members[:_GROUP_MAX], "more": len(members) > _GROUP_MAX,
                "reward_mean": mean,
                "reward_std": None if mean is None else (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5}

    def version_lineage(self, policy: str, version: int, limit: int = 50, offset: int = 0) -> dict[str, Any]:
        """Back from ``version`` of ``policy``: its record, the version it was trained from, the leases acked
        into it, what made it (counts of steps, episodes, groups, tasks, code versions, staleness; a page of
        ``limit`` steps from ``offset``), the steps it generated, and forward: its eval results."""
        check_page(limit, offset)
        if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= INT32_MAX:
            raise ValidationError(f"version: must be an integer in [0, {INT32_MAX}], got {version!r}")
        with self._tx() as c:
            record = _version_record(c, policy, version)
            parent = _version_record(c, policy, version - 1) if version > 0 else None
            candidates = c.execute(sa.select(LS).where(LS.c.consumed_version == version)
                                   .order_by(LS.c.created_at, LS.c.lease_id)).mappings().all()
            # policy written so no index applies: the planner must walk ix_steps_lease over these leases,
            # not ix_steps_policy_version over every step of the policy
            made = [S.c.policy.concat("") == policy, S.c.consumed_version == version]
            if candidates:
                made.append(self.sql.in_ids(S.c.lease_id, [r["lease_id"] for r in candidates]))
                data, per_lease = self._made_of(c, made, version)
            else:
                data, per_lease = dict(_EMPTY_MADE), {}
            leases = [{**dict(r), "steps_of_policy": per_lease[r["lease_id"]]}
                      for r in candidates if r["lease_id"] in per_lease]
            page = ([dict(r) for r in c.execute(sa.select(*_STEP_COLS).select_from(JOIN).where(*made)
                                                .order_by(S.c.created_at, S.c.step_id).limit(limit).offset(offset))
                     .mappings()] if leases else [])
            for r in page:
                r["reward_final"] = bool(r["reward_final"])
            gen = sa.and_(S.c.policy == policy, S.c.policy_version == version)
            generated, generated_consumed = c.execute(
                sa.select(sa.func.count(), sa.func.count(S.c.consumed_version)).where(gen)).one()
            evals = _evals(c, policy, version)
        if record is None and not leases and not generated and not evals:
            raise NotFoundError("no such policy version", policy=policy, version=version)
        return {
            "policy": policy, "version": version, "record": record,
            "trained_from": None if version == 0 else {"version": version - 1, "record": parent},
            "leases": leases, "made_of": data,
            "steps": {"data": page, "limit": limit, "offset": offset, "total": data["steps"]},
            "generated": {"steps": int(generated), "consumed": int(generated_consumed)},
            "evals": _evals_json(evals),
        }

    def _made_of(self, c: sa.Connection, made: list[sa.ColumnElement],
                 version: int) -> tuple[dict[str, Any], dict[str, int]]:
        """Counts over the steps consumed into ``version`` (``made``: their conditions), and steps per lease.

        Three passes over those steps: one grouped by (lease, task, generating version), one for the
        distinct episodes and groups, one joined to the episodes for their code versions."""
        per_lease: Counter[str] = Counter()
        tasks: Counter[str] = Counter()
        stale: Counter[int] = Counter()
        n = tokens = 0
        cols = (S.c.lease_id, S.c.task, S.c.policy_version)
        for lease_id, task, pv, k, length in c.execute(
                sa.select(*cols, sa.func.count(), sa.func.sum(S.c.length)).where(*made).group_by(*cols)):
            per_lease[lease_id] += int(k)
            tasks[str(task)] += int(k)
            # staleness = the trainer's version when it leased the step (version - 1) - the step's version
            stale[max(0, version - 1 - int(pv))] += int(k)
            n += int(k)
            tokens += int(length or 0)
        n_eps, n_groups = c.execute(
            sa.select(sa.func.count(sa.distinct(S.c.episode_id)),
                      sa.func.count(sa.distinct(sa.func.coalesce(S.c.group_id, S.c.step_id)))).where(*made)).one()
        cv = self.sql.json_text(E.c.meta, "code_version")
        codes = {("none" if k is None else str(k)): int(m) for k, m in c.execute(
            sa.select(cv, sa.func.count(sa.distinct(S.c.episode_id))).select_from(JOIN).where(*made).group_by(cv))}
        data = {"steps": n, "episodes": int(n_eps), "groups": int(n_groups), "tokens": tokens,
                "tasks": dict(sorted(tasks.items())), "code_versions": dict(sorted(codes.items())),
                "staleness": {str(k): v for k, v in sorted(stale.items())}}
        return data, dict(per_lease)


_EMPTY_MADE: dict[str, Any] = {"steps": 0, "episodes": 0, "groups": 0, "tokens": 0, "tasks": {},
                               "code_versions": {}, "staleness": {}}
