"""Pool feedback reads: ratings of steps and episodes, unrewarded ratings for fill, corrections and their use bound."""

from __future__ import annotations

from pool_helpers import episode, step

from swarm.pool import Pool
from swarm.pool.feedback import CORRECTION_KEY
from swarm.records import Event, Source


def _finished(pool: Pool, reward: float | None, policy: str = "default", n_steps: int = 2):
    ep = episode(pool, group_id="g")
    steps = [step(ep, index=i, seed=i, policy=policy) for i in range(n_steps)]
    pool.add_steps(steps)
    pool.end_episode(ep.episode_id, reward=reward)
    return ep, steps


def _correction(pool: Pool, s, ids, policy="default", t=0.0) -> str:
    return pool.add_event(Event(kind="feedback", step_id=s.step_id, correction="fix", created_at=t,
                                payload={CORRECTION_KEY: {"step_id": s.step_id, "policy": policy, "ids": ids}}))


def test_ratings_of_steps_and_their_episodes(pool: Pool):
    ep, (s0, s1) = _finished(pool, 1.0)
    _, (other, _) = _finished(pool, 0.0)
    pool.add_event(Event(kind="feedback", step_id=s0.step_id, rating=4.0, source=Source.blackbox))
    pool.add_event(Event(kind="feedback", episode_id=ep.episode_id, rating=2.0))
    pool.add_event(Event(kind="feedback", step_id=other.step_id, rating=5.0))
    pool.add_event(Event(kind="feedback", step_id=s1.step_id, correction="text only"))  # no rating
    got = pool.feedback_ratings([s0.step_id, s1.step_id])
    assert [(r.step_id, r.episode_id, r.rating, r.source) for r in got] == [
        (s0.step_id, ep.episode_id, 4.0, "agent"), (None, ep.episode_id, 2.0, "judge")]
    assert pool.feedback_ratings([]) == []


def test_unrewarded_ratings_only_where_no_final_reward(pool: Pool):
    rewarded, (r0, _) = _finished(pool, 1.0)
    bare, (b0, b1) = _finished(pool, None)
    _, (o0, _) = _finished(pool, None, policy="other")
    for s in (r0, b0, o0):
        pool.add_event(Event(kind="feedback", step_id=s.step_id, rating=1.0))
    pool.add_event(Event(kind="feedback", episode_id=bare.episode_id, rating=0.5))
    got = pool.unrewarded_ratings("default")
    assert {(r.step_id, r.episode_id) for r in got} == {(b0.step_id, bare.episode_id), (None, bare.episode_id)}
    pool.report_reward(step_id=b0.step_id, reward=1.0, source="judge")  # what fill writes
    pool.report_reward(episode_id=bare.episode_id, reward=0.5, source="judge")
    assert pool.unrewarded_ratings("default") == []


def test_corrections_pending_until_used_their_bound(pool: Pool):
    _, (s0, s1) = _finished(pool, 1.0)
    first = _correction(pool, s0, [7, 8, 2], t=1.0)
    second = _correction(pool, s1, [9, 2], t=2.0)
    _correction(pool, s1, [9, 2], policy="other", t=3.0)
    pool.add_event(Event(kind="feedback", step_id=s1.step_id, correction="no ids"))  # not tokenized: skipped
    got = pool.pending_corrections("default", max_uses=2, limit=8)
    assert [(c.event_id, c.step_id, c.response_ids, c.uses) for c in got] == [
        (first, s0.step_id, (7, 8, 2), 0), (second, s1.step_id, (9, 2), 0)]
    assert got[0].prompt_ids == tuple(s0.prompt_ids)
    assert [c.event_id for c in pool.pending_corrections("default", max_uses=2, limit=1)] == [first]

    assert pool.record_feedback_uses([first], consumed_version=1, policy="default") == 1
    pool.record_feedback_uses([first], consumed_version=1, policy="default")  # idempotent
    assert [(c.event_id, c.uses) for c in pool.pending_corrections("default", max_uses=2)] == [(first, 1), (second, 0)]
    pool.record_feedback_uses([first, second], consumed_version=2, policy="default")
    assert [c.event_id for c in pool.pending_corrections("default", max_uses=2)] == [second]
    assert pool.pending_corrections("default", max_uses=1) == []
    assert pool.feedback_uses([first, second, "nope"]) == {first: [1, 2], second: [2]}


def test_episode_correction_names_its_step(pool: Pool):
    ep, (_, s1) = _finished(pool, 1.0)
    ev = pool.add_event(Event(kind="feedback", episode_id=ep.episode_id, correction="fix",
                              payload={CORRECTION_KEY: {"step_id": s1.step_id, "policy": "default", "ids": [3]}}))
    (c,) = pool.pending_corrections("default")
    assert (c.event_id, c.step_id, c.prompt_ids) == (ev, s1.step_id, tuple(s1.prompt_ids))
