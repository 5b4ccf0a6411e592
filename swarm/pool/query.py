"""Turn a :class:`StepFilter` into SQL conditions over ``steps JOIN episodes``.

Every simple field but ``ended_since`` is one indexed comparison; group-level conditions (non-zero reward
variance, minimum group size) are one ``GROUP BY group_id ... HAVING`` subquery; labels are
``EXISTS`` lookups on the labels index. Nothing here filters rows in Python.

Reward resolution lives here too: a step's reward is its own when it has one, else its
episode's; it is final when whichever applies is final.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa

from swarm.pool.filter import StepFilter
from swarm.pool.schema import episodes as E
from swarm.pool.schema import labels as L
from swarm.pool.schema import steps as S
from swarm.records import RewardStatus, now

if TYPE_CHECKING:
    from swarm.pool.engines import Dialect

__all__ = ["JOIN", "REWARD", "REWARD_FINAL", "step_conditions", "episode_conditions", "group_key", "good_groups",
           "has_group_conditions", "singletons_pass"]

JOIN = S.join(E, E.c.episode_id == S.c.episode_id)
_OWN = S.c.reward.is_not(None)
REWARD = sa.case((_OWN, S.c.reward), else_=E.c.reward)
REWARD_FINAL = sa.or_(sa.and_(_OWN, S.c.reward_status == RewardStatus.final.value),
                      sa.and_(S.c.reward.is_(None), E.c.reward_status == RewardStatus.final.value))
_VARIANCE_EPS = 1e-12


def group_key() -> sa.ColumnElement:
    """A step's group: its group_id, or (ungrouped) the step itself."""
    return sa.func.coalesce(S.c.group_id, S.c.step_id)


def _labelled(target_col: sa.ColumnElement, target: str, *extra: sa.ColumnElement) -> sa.ColumnElement:
    return sa.exists().where(L.c.target_id == target_col, L.c.target == target, *extra)


def _has_label(*extra: sa.ColumnElement) -> sa.ColumnElement:
    return sa.or_(_labelled(S.c.step_id, "step", *extra), _labelled(S.c.episode_id, "episode", *extra))


def step_conditions(f: StepFilter, sql: Dialect, groups: bool = True) -> list[sa.ColumnElement]:
    """WHERE conditions selecting the steps ``f`` describes (``groups=False``: no group conditions)."""
    c: list[sa.ColumnElement] = []
    if f.policy is not None:
        c.append(S.c.policy == f.policy)
    if f.task is not None:
        c.append(S.c.task == f.task)
    if f.source is not None:
        c.append(S.c.source == f.source.value)
    if f.episode_id is not None:
        c.append(S.c.episode_id == f.episode_id)
    if f.group_id is not None:
        c.append(S.c.group_id == f.group_id)
    if f.group_ids is not None:
        # group_key() IN (...) spelled so that the group_id and step_id indexes apply
        c.append(sa.or_(sql.in_ids(S.c.group_id, f.group_ids),
                        sa.and_(S.c.group_id.is_(None), sql.in_ids(S.c.step_id, f.group_ids))))
    if f.episode_type is not None:
        c.append(E.c.type == f.episode_type.value)
    if f.reward_status is not None:
        c.append(REWARD_FINAL if f.reward_status == RewardStatus.final else sa.not_(REWARD_FINAL))
    if f.episode_status is not None:
        c.append(E.c.status == f.episode_status.value)
    if f.max_staleness is not None and f.current_version is not None:
        c.append(S.c.policy_version >= f.current_version - f.max_staleness)
    if f.min_length is not None:
        c.append(S.c.length >= f.min_length)
    if f.max_length is not None:
        c.append(S.c.length <= f.max_length)
    if f.since is not None:
        c.append(S.c.created_at >= f.since)
    if f.until is not None:
        c.append(S.c.created_at <= f.until)
    if f.ended_since is not None:
        c.append(E.c.ended_at >= f.ended_since)
    for key, value in f.metadata.items():
        # the step's own metadata wins; a key it lacks is looked up on its episode
        c.append(sa.or_(sql.json_eq(S.c.meta, key, value),
                        sa.and_(sa.not_(sql.json_has(S.c.meta, key)), sql.json_eq(E.c.meta, key, value))))
    if f.label is not None:
        c.append(_has_label(L.c.label == f.label))
    if not f.include_excluded:
        c.append(sa.not_(_has_label(L.c.exclude.is_(True))))
    if f.consumed is not None:
        c.append(S.c.consumed_version.is_not(None) if f.consumed else S.c.consumed_version.is_(None))
    if f.leased is not None:
        free = sa.or_(S.c.lease_id.is_(None), S.c.lease_expires_at <= now())
        c.append(sa.not_(free) if f.leased else free)
    if groups and has_group_conditions(f):
        c.append(_group_condition(f, sql))
    return c


def has_group_conditions(f: StepFilter) -> bool:
    return f.nonzero_variance or f.min_group_size is not None


def good_groups(f: StepFilter, sql: Dialect) -> sa.Select:
    """group_ids whose matching steps pass the group conditions (variance, size)."""
    having: list[sa.ColumnElement] = []
    if f.nonzero_variance:
        final_reward = sa.case((REWARD_FINAL, REWARD), else_=None)
        having.append(sa.func.max(final_reward) - sa.func.min(final_reward) > _VARIANCE_EPS)
    if f.min_group_size is not None:
        having.append(sa.func.count() >= f.min_group_size)
    return (sa.select(S.c.group_id).select_from(JOIN)
            .where(S.c.group_id.is_not(None), *step_conditions(f, sql, groups=False))
            .group_by(S.c.group_id).having(*having).correlate(None))


def singletons_pass(f: StepFilter) -> bool:
    """Whether an ungrouped step (a group of one: zero variance, size one) passes the group conditions."""
    return not f.nonzero_variance and (f.min_group_size or 1) <= 1


def _group_condition(f: StepFilter, sql: Dialect) -> sa.ColumnElement:
    cond = S.c.group_id.in_(good_groups(f, sql))
    return sa.or_(cond, S.c.group_id.is_(None)) if singletons_pass(f) else cond


_STEP_ONLY = ("policy", "source", "max_staleness", "min_length", "max_length", "consumed", "leased", "label")


def episode_conditions(f: StepFilter, sql: Dialect) -> list[sa.ColumnElement]:
    """WHERE conditions on ``episodes`` for ``f``.

    Episode fields (task, group, type, status, time range, metadata, labels on the episode)
    apply to the episode itself; step fields (policy, source, lengths, staleness, consumed, leased,
    step labels, group conditions) keep episodes with at least one matching step.
    """
    c: list[sa.ColumnElement] = []
    if f.task is not None:
        c.append(E.c.task == f.task)
    if f.episode_id is not None:
        c.append(E.c.episode_id == f.episode_id)
    if f.group_id is not None:
        c.append(E.c.group_id == f.group_id)
    if f.episode_type is not None:
        c.append(E.c.type == f.episode_type.value)
    if f.episode_status is not None:
        c.append(E.c.status == f.episode_status.value)
    if f.reward_status is not None:
        c.append(E.c.reward_status == f.reward_status.value)
    if f.since is not None:
        c.append(E.c.created_at >= f.since)
    if f.until is not None:
        c.append(E.c.created_at <= f.until)
    if f.ended_since is not None:
        c.append(E.c.ended_at >= f.ended_since)
    for key, value in f.metadata.items():
        c.append(sql.json_eq(E.c.meta, key, value))
    if not f.include_excluded:
        c.append(sa.not_(_labelled(E.c.episode_id, "episode", L.c.exclude.is_(True))))
    step_fields = {k: getattr(f, k) for k in _STEP_ONLY if getattr(f, k) is not None}
    if step_fields or f.nonzero_variance or f.min_group_size is not None:
        sf = StepFilter(**step_fields, current_version=f.current_version, nonzero_variance=f.nonzero_variance,
                        min_group_size=f.min_group_size, include_excluded=f.include_excluded)
        matching = sa.select(S.c.episode_id).select_from(JOIN).where(*step_conditions(sf, sql)).correlate(None)
        c.append(E.c.episode_id.in_(matching))
    return c
