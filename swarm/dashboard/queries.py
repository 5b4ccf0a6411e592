"""Read-only SQL over the pool's tables for the dashboard: bounded, index-driven queries.

Queries over ``steps`` and ``episodes`` walk an index over a bounded range (a time window on
``created_at``, the open episodes on ``(status, updated_at)``, one episode's or one lease's
steps) or stop after ``limit`` rows. The exceptions are :func:`breakdown` without a lower time
bound and :func:`episode_counts`: grouped scans, which only :mod:`swarm.dashboard.snapshot`
runs, in the background at a bounded duty cycle, never per request. The small tables (leases:
one row per training batch; labels: one per human mark; policy versions: one per update)
are read whole when a view needs them.

It never writes (labels and exports go through :class:`swarm.pool.Pool`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import sqlalchemy as sa

from swarm.pool import Pool, StepFilter
from swarm.pool.query import JOIN, REWARD, REWARD_FINAL, step_conditions
from swarm.pool.schema import episodes as E
from swarm.pool.schema import labels as L
from swarm.pool.schema import leases as LS
from swarm.pool.schema import policy_versions as PV
from swarm.pool.schema import steps as S
from swarm.records import EpisodeStatus

__all__ = [
    "breakdown",
    "episode_counts",
    "open_count",
    "open_by_client",
    "recent_episodes",
    "rate_buckets",
    "recent_leases",
    "lease_totals",
    "step_rows",
    "policy_versions",
    "capped_count",
    "recent_labels",
    "labels_of",
    "read",
]


def read(pool: Pool):
    """A read-only transaction on the pool's engine."""
    from swarm.pool.engine import transaction

    return transaction(pool.engine, write=False)


def _floor_div(col: sa.ColumnElement, width: float, dialect: str) -> sa.ColumnElement:
    """``floor(col / width)`` as an integer on both dialects (times are positive)."""
    if dialect == "postgresql":
        return sa.cast(sa.func.floor(col / width), sa.BigInteger)
    return sa.cast(col / width, sa.Integer)  # SQLite truncates towards zero


def breakdown(pool: Pool, *, after: float | None = None, upto: float | None = None) -> list[dict[str, Any]]:
    """Step counts per (source, task, policy, policy_version, consumed_version) with final rewards.

    ``after`` bounds the scan to ``created_at > after`` (an index range: the live delta);
    ``upto`` keeps ``created_at <= upto`` without using the index (the background snapshot).
    """
    where: list[sa.ColumnElement] = []
    if after is not None:
        where.append(S.c.created_at > after)
    if upto is not None:
        where.append(S.c.created_at + 0 <= upto)  # "+ 0": scan the table, not the created_at index
    final_reward = sa.case((REWARD_FINAL, REWARD), else_=None)
    cols = (S.c.source, S.c.task, S.c.policy, S.c.policy_version, S.c.consumed_version)
    q = (
        sa.select(*cols, sa.func.count(), sa.func.count(final_reward), sa.func.sum(final_reward),
                  sa.func.sum(S.c.length))
        .select_from(JOIN)
        .where(*where)
        .group_by(*cols)
    )
    with read(pool) as c:
        return [
            {"source": r[0], "task": r[1], "policy": r[2], "version": int(r[3]),
             "consumed": None if r[4] is None else int(r[4]), "n": int(r[5]), "n_final": int(r[6]),
             "reward_sum": float(r[7] or 0.0), "tokens": int(r[8] or 0)}
            for r in c.execute(q)
        ]


def episode_counts(pool: Pool) -> list[dict[str, Any]]:
    """Episodes per (task, type, status): a grouped scan (background snapshot only)."""
    q = sa.select(E.c.task, E.c.type, E.c.status, sa.func.count()).group_by(E.c.task, E.c.type, E.c.status)
    with read(pool) as c:
        return [{"task": r[0], "type": r[1], "status": r[2], "n": int(r[3])} for r in c.execute(q)]


def open_count(pool: Pool) -> int:
    """Open episodes right now (an index range: open episodes are the live few)."""
    q = sa.select(sa.func.count()).select_from(E).where(E.c.status == EpisodeStatus.open.value)
    with read(pool) as c:
        return int(c.execute(q).scalar_one())


def open_by_client(pool: Pool, limit: int = 200) -> list[dict[str, Any]]:
    """Clients with open episodes: how many, on which tasks, last activity (open episodes only)."""
    q = (
        sa.select(E.c.client_id, sa.func.count(), sa.func.max(E.c.updated_at), sa.func.min(E.c.task))
        .where(E.c.status == EpisodeStatus.open.value)
        .group_by(E.c.client_id)
        .order_by(sa.func.count().desc())
        .limit(limit)
    )
    with read(pool) as c:
        return [{"client_id": r[0], "open_episodes": int(r[1]), "last_seen": float(r[2]), "task": r[3]}
                for r in c.execute(q)]


def recent_episodes(pool: Pool, limit: int = 12) -> list[dict[str, Any]]:
    """The newest episodes (created_at index, descending)."""
    q = (
        sa.select(E.c.episode_id, E.c.task, E.c.group_id, E.c.client_id, E.c.type, E.c.status, E.c.reward,
                  E.c.reward_status, E.c.created_at, E.c.ended_at)
        .order_by(E.c.created_at.desc())
        .limit(limit)
    )
    with read(pool) as c:
        return [dict(r) for r in c.execute(q).mappings()]


def rate_buckets(pool: Pool, start: float, end: float, width: float) -> dict[int, dict[str, int]]:
    """Steps per time bucket (``floor(created_at / width)``) and source in ``[start, end)``."""
    b = _floor_div(S.c.created_at, width, pool.dialect)
    q = (
        sa.select(b.label("b"), S.c.source, sa.func.count())
        .where(S.c.created_at >= start, S.c.created_at < end)
        .group_by(b, S.c.source)
    )
    out: dict[int, dict[str, int]] = defaultdict(dict)
    with read(pool) as c:
        for i, src, n in c.execute(q):
            out[int(i)][src] = int(n)
    return out


def recent_leases(pool: Pool, limit: int = 40) -> list[dict[str, Any]]:
    """The newest leases (a lease is one training batch: the table has one row per batch)."""
    q = sa.select(LS.c.lease_id, LS.c.state, LS.c.n_steps, LS.c.created_at, LS.c.expires_at,
                  LS.c.consumed_version, LS.c.filter).order_by(LS.c.created_at.desc()).limit(limit)
    with read(pool) as c:
        return [dict(r) for r in c.execute(q).mappings()]


def lease_totals(pool: Pool, now: float) -> dict[str, int]:
    """Leases by outcome: acked, active, released, or expired (active past its expiry)."""
    outcome = sa.case(
        (LS.c.state == "active", sa.case((LS.c.expires_at <= now, "expired"), else_="active")),
        else_=LS.c.state,
    )
    with read(pool) as c:
        return {o: int(n) for o, n in c.execute(sa.select(outcome, sa.func.count()).group_by(outcome))}


def _forced(c: sa.Connection, q: sa.Select, index: str) -> list[dict[str, Any]]:
    """Run ``q`` on SQLite with ``steps INDEXED BY index``.

    SQLite's planner (no statistics) prefers e.g. the task or the policy index and then sorts or
    filters every step of that task / policy, up to the whole pool, where walking the
    created_at index (or the unconsumed steps' partial index) stops after one page. SQLAlchemy
    cannot render ``INDEXED BY``, so it is added to the compiled statement here.
    """
    compiled = q.compile(dialect=c.dialect, compile_kwargs={"render_postcompile": True})
    sql = str(compiled)
    marker = "FROM steps JOIN episodes"
    if sql.count(marker) != 1 or not compiled.positiontup:
        return [dict(r) for r in c.execute(q).mappings()]
    sql = sql.replace(marker, f"FROM steps INDEXED BY {index} JOIN episodes", 1)
    params = tuple(compiled.params[k] for k in compiled.positiontup)
    return [dict(r) for r in c.exec_driver_sql(sql, params).mappings()]


def _selective(f: StepFilter) -> bool:
    """Filters that name a few steps (an episode, a group, a label): let the planner pick their index."""
    return bool(f.episode_id or f.group_id or f.group_ids or f.label)


def step_rows(pool: Pool, f: StepFilter, limit: int, offset: int = 0, order: str = "-created") -> list[dict[str, Any]]:
    """One page of matching steps as table rows (no tokens, no message bodies)."""
    orders = {
        "-created": (S.c.created_at.desc(), S.c.step_id.desc()),
        "created": (S.c.created_at, S.c.step_id),
        "episode": (S.c.episode_id, S.c.idx, S.c.created_at),
    }
    q = (
        sa.select(S.c.step_id, S.c.episode_id, S.c.idx.label("index"), S.c.task, S.c.group_id, S.c.policy,
                  S.c.policy_version, S.c.source, REWARD.label("reward"), REWARD_FINAL.label("reward_final"),
                  S.c.length, S.c.n_prompt, S.c.created_at, S.c.consumed_version, S.c.lease_id,
                  S.c.lease_expires_at, E.c.status.label("episode_status"), E.c.type.label("episode_type"))
        .select_from(JOIN)
        .where(*step_conditions(f, pool.dialect))
        .order_by(*orders[order])
        .limit(limit)
        .offset(offset)
    )
    with read(pool) as c:
        if order != "episode" and not _selective(f) and c.dialect.name == "sqlite":
            rows = _forced(c, q, "ix_steps_created")
        else:
            rows = [dict(r) for r in c.execute(q).mappings()]
    for r in rows:
        r["reward_status"] = "final" if r.pop("reward_final") else "pending"
        r["n_response"] = r["length"] - r["n_prompt"]
    return rows


def policy_versions(pool: Pool, limit: int = 500) -> list[dict[str, Any]]:
    """Published policy versions, newest first."""
    q = sa.select(PV.c.policy, PV.c.version, PV.c.created_at, PV.c.adapter_path).order_by(
        PV.c.created_at.desc()).limit(limit)
    with read(pool) as c:
        return [dict(r) for r in c.execute(q).mappings()]


def capped_count(pool: Pool, f: StepFilter, cap: int | None) -> dict[str, Any]:
    """Matching steps, and their episodes, among at most ``cap`` + 1 matching steps (None: exact).

    When the steps are capped the episode count is a lower bound (the episodes of the first
    ``cap`` steps found); both are then shown as "at least".
    """
    inner = sa.select(S.c.step_id, S.c.episode_id).select_from(JOIN).where(*step_conditions(f, pool.dialect))
    if cap is not None:
        inner = inner.limit(cap + 1)
    sub = inner.subquery()
    q = sa.select(sa.func.count(), sa.func.count(sa.distinct(sub.c.episode_id)))
    q = q.select_from(sub)
    with read(pool) as c:
        if f.consumed is False and not _selective(f) and c.dialect.name == "sqlite":
            # the unconsumed steps' partial index, not e.g. the policy index over every consumed step
            n, eps = _forced(c, q, "ix_steps_unconsumed_created")[0].values()
        else:
            n, eps = c.execute(q).one()
    capped = cap is not None and n > cap
    return {"steps": min(n, cap) if capped else n, "steps_capped": capped, "episodes": eps, "episodes_capped": capped}


def recent_labels(pool: Pool, limit: int = 30) -> list[dict[str, Any]]:
    """The newest curation labels (labels are human-made: a small table)."""
    q = sa.select(L).order_by(L.c.created_at.desc()).limit(limit)
    with read(pool) as c:
        return [dict(r) for r in c.execute(q).mappings()]


def labels_of(pool: Pool, target_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Labels on each of ``target_ids`` (steps or episodes), via the target index."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    ids = sorted(set(target_ids))
    with read(pool) as c:
        for i in range(0, len(ids), 500):
            q = sa.select(L).where(L.c.target_id.in_(ids[i:i + 500])).order_by(L.c.created_at)
            for r in c.execute(q).mappings():
                out[r["target_id"]].append(dict(r))
    return out
