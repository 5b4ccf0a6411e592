"""StepFilter on both backends: every field selects what it says, as indexed SQL."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
from pool_helpers import episode, group, step

from swarm.errors import ValidationError
from swarm.pool import Pool, StepFilter
from swarm.pool.query import JOIN, step_conditions
from swarm.pool.schema import steps as S
from swarm.records import EpisodeStatus, EpisodeType, RewardStatus, Source


def ids(pool: Pool, **kw) -> set[str]:
    f = StepFilter(**kw)
    got = {s.step_id for s in pool.query_steps(f, limit=1000)}
    assert pool.count_steps(f) == len(got)
    return got


def test_scalar_fields(pool: Pool):
    ep_a = episode(pool, task="a", group_id="g1", type=EpisodeType.eval)
    ep_b = episode(pool, task="b")
    a0 = step(
        ep_a, 0, policy="p", policy_version=1, source=Source.whitebox, n_prompt=10, n_response=2, created_at=100.0
    )
    a1 = step(ep_a, 1, policy="p", policy_version=4, n_prompt=3, n_response=1, created_at=200.0)
    b0 = step(ep_b, 0, policy="q", policy_version=5, group_id="g2", created_at=300.0)
    pool.add_steps([a0, a1, b0])
    pool.end_episode(ep_b.episode_id, reward=1.0)
    A, B = {a0.step_id, a1.step_id}, {b0.step_id}
    assert ids(pool) == A | B
    assert ids(pool, policy="p") == A
    assert ids(pool, task="a") == A  # step task defaults to its episode's
    assert ids(pool, source="whitebox") == {a0.step_id}
    assert ids(pool, episode_id=ep_b.episode_id) == B
    assert ids(pool, group_id="g1") == A and ids(pool, group_id="g2") == B
    assert ids(pool, episode_type="eval") == A and ids(pool, episode_type="train") == B
    assert ids(pool, reward_status=RewardStatus.final) == B
    assert ids(pool, reward_status=RewardStatus.pending) == A
    assert ids(pool, episode_status=EpisodeStatus.finished) == B
    assert ids(pool, episode_status=EpisodeStatus.open) == A
    assert ids(pool, max_staleness=1, current_version=5) == {a1.step_id, b0.step_id}
    assert ids(pool, max_staleness=0, current_version=5) == B
    assert ids(pool, min_length=10) == {a0.step_id}
    assert ids(pool, max_length=4) == {a1.step_id}
    assert ids(pool, min_length=5, max_length=8) == B
    assert ids(pool, since=150.0) == {a1.step_id, b0.step_id}
    assert ids(pool, until=200.0) == A
    assert ids(pool, since=150.0, until=250.0) == {a1.step_id}
    assert ids(pool, policy="p", task="b") == set()
    ended = pool.query_episodes(StepFilter(episode_id=ep_b.episode_id))[0].ended_at
    assert ended is not None
    assert ids(pool, ended_since=ended) == B  # ep_a is still open: never matches
    assert ids(pool, ended_since=ended + 1) == set()
    assert {e.episode_id for e in pool.query_episodes(StepFilter(ended_since=ended))} == {ep_b.episode_id}


def test_ordering_and_paging(pool: Pool):
    ep = episode(pool)
    made = [step(ep, i, created_at=float(100 - i)) for i in range(5)]
    pool.add_steps(made)
    newest_first = [s.step_id for s in made]
    assert [s.step_id for s in pool.query_steps(order="-created")] == newest_first
    assert [s.step_id for s in pool.query_steps(order="created", limit=2, offset=1)] == newest_first[::-1][1:3]
    assert [s.index for s in pool.query_steps(order="episode")] == [0, 1, 2, 3, 4]
    with_tokens = pool.query_steps(limit=1, with_tokens=True)[0]
    assert with_tokens.response_ids and with_tokens.response_logprobs
    with pytest.raises(ValidationError, match="order"):
        pool.query_steps(order="reward")
    with pytest.raises(ValidationError, match="limit"):
        pool.query_steps(limit=-1)


def test_metadata_equality(pool: Pool):
    ep = episode(pool, metadata={"difficulty": "hard", "level": 3})
    s1 = step(ep, 0, metadata={"tool": "python", "ok": True, "n": 2.5, "nothing": None, "deep": {"a": [1, 2]}})
    s2 = step(ep, 1, metadata={"tool": "bash", "level": 4, "ok": False})
    pool.add_steps([s1, s2])
    assert ids(pool, metadata={"tool": "python"}) == {s1.step_id}
    assert ids(pool, metadata={"ok": True}) == {s1.step_id}
    assert ids(pool, metadata={"ok": False}) == {s2.step_id}
    assert ids(pool, metadata={"n": 2.5}) == {s1.step_id}
    assert ids(pool, metadata={"nothing": None}) == {s1.step_id}
    assert ids(pool, metadata={"deep": {"a": [1, 2]}}) == {s1.step_id}
    assert ids(pool, metadata={"tool": "2.5"}) == set()
    # keys a step lacks are looked up on its episode; the step's own value wins
    assert ids(pool, metadata={"difficulty": "hard"}) == {s1.step_id, s2.step_id}
    assert ids(pool, metadata={"level": 3}) == {s1.step_id}
    assert ids(pool, metadata={"level": 4}) == {s2.step_id}
    assert ids(pool, metadata={"difficulty": "hard", "tool": "bash"}) == {s2.step_id}


def test_group_variance_and_size(pool: Pool):
    same = group(pool, "same", [1.0, 1.0, 1.0])
    mixed = group(pool, "mixed", [0.0, 1.0, 1.0])
    pair = group(pool, "pair", [0.0, 1.0])
    lone_ep = episode(pool)  # no group: a group of one
    lone = step(lone_ep)
    pool.add_step(lone)
    pool.end_episode(lone_ep.episode_id, reward=1.0)
    sid = lambda ss: {s.step_id for s in ss}  # noqa: E731
    assert ids(pool, nonzero_variance=True) == sid(mixed) | sid(pair)
    assert ids(pool, min_group_size=3) == sid(same) | sid(mixed)
    assert ids(pool, min_group_size=1) == sid(same) | sid(mixed) | sid(pair) | {lone.step_id}
    assert ids(pool, nonzero_variance=True, min_group_size=3) == sid(mixed)
    # variance counts final rewards only, over the steps the rest of the filter selects
    pool.report_reward(step_id=pair[0].step_id, reward=5.0, source="admin", final=False)
    assert ids(pool, nonzero_variance=True) == sid(mixed)
    pool.label("step", mixed[0].step_id, "bad", exclude=True)
    assert ids(pool, nonzero_variance=True) == set()  # what is left of "mixed" has zero variance


def test_labels_and_exclusion(pool: Pool):
    ep1, ep2 = episode(pool), episode(pool)
    a, b, c = step(ep1, 0), step(ep1, 1), step(ep2, 0)
    pool.add_steps([a, b, c])
    pool.label("step", a.step_id, "gold")
    pool.label("episode", ep2.episode_id, "gold", note="reviewed")
    assert ids(pool, label="gold") == {a.step_id, c.step_id}
    pool.label("step", b.step_id, "broken", exclude=True)
    assert ids(pool) == {a.step_id, c.step_id}
    assert ids(pool, include_excluded=True) == {a.step_id, b.step_id, c.step_id}
    assert ids(pool, label="broken", include_excluded=True) == {b.step_id}
    pool.label("episode", ep2.episode_id, "cheated", exclude=True)
    assert ids(pool) == {a.step_id}
    assert [e.episode_id for e in pool.query_episodes(StepFilter())] == [ep1.episode_id]
    assert len(pool.query_episodes(StepFilter(include_excluded=True))) == 2


def test_consumed_and_query_episodes(pool: Pool):
    g = group(pool, "g", [0.0, 1.0], policy="p")
    other = episode(pool, task="other", metadata={"k": "v"})  # no steps yet
    lease = pool.lease(StepFilter(group_id="g"), max_groups=1)
    assert ids(pool, consumed=False) == {s.step_id for s in g}
    pool.ack(lease.lease_id, consumed_version=1)
    assert ids(pool, consumed=True) == {s.step_id for s in g}
    assert ids(pool, consumed=False) == set()
    eps = lambda **kw: {e.episode_id for e in pool.query_episodes(StepFilter(**kw))}  # noqa: E731
    assert eps() == {s.episode_id for s in g} | {other.episode_id}
    assert eps(task="other") == eps(metadata={"k": "v"}) == eps(episode_status="open") == {other.episode_id}
    assert eps(policy="p") == eps(group_id="g") == eps(episode_status="finished") == {s.episode_id for s in g}
    assert eps(policy="nobody") == set()


def test_filter_validation():
    with pytest.raises(ValueError, match="current_version"):
        StepFilter(max_staleness=1)
    with pytest.raises(ValueError, match="min_length"):
        StepFilter(min_length=5, max_length=1)
    with pytest.raises(ValueError):
        StepFilter(polcy="typo")


def test_simple_filters_use_indexes(sqlite_url: str):
    pool = Pool(sqlite_url)
    try:
        for f, index in [
            (StepFilter(task="t"), "ix_steps_task"),
            (StepFilter(episode_id="e"), "ix_steps_episode_idx"),
            (StepFilter(group_id="g"), "ix_steps_group"),
            (StepFilter(policy="p", current_version=3, max_staleness=1), "ix_steps_policy_version"),
        ]:
            q = sa.select(S.c.step_id).select_from(JOIN).where(*step_conditions(f, pool.sql))
            sql = str(q.compile(pool.engine, compile_kwargs={"literal_binds": True}))
            with pool.engine.connect() as c:
                plan = " ".join(str(r[-1]) for r in c.exec_driver_sql("EXPLAIN QUERY PLAN " + sql))
            assert index in plan, plan
    finally:
        pool.close()


def test_leased_selects_steps_under_a_live_lease(pool: Pool):
    """``leased=False`` is what a lease could take now: a live lease hides its steps, an expired one does not."""
    g1, g2 = group(pool, "g1", [0.0, 1.0]), group(pool, "g2", [0.0, 1.0])
    held = pool.lease(StepFilter(group_id="g1"), max_groups=1, ttl_s=600)
    assert {s.step_id for s in held.steps} == {s.step_id for s in g1}
    assert ids(pool, leased=True) == {s.step_id for s in g1}
    assert ids(pool, leased=False) == {s.step_id for s in g2}
    assert ids(pool, leased=False, consumed=False) == {s.step_id for s in g2}
    gone = pool.lease(StepFilter(group_id="g2"), max_groups=1, ttl_s=1e-3)
    assert gone.steps
    time.sleep(0.01)
    assert ids(pool, leased=False) == {s.step_id for s in g2}  # expired: available again
