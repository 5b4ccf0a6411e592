"""add_episodes / end_episodes: many opens or ends in one transaction, all or none, as one call after the other."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from pool_helpers import episode, step

from swarm.errors import ConflictError, NotFoundError, ValidationError
from swarm.pool import Pool, StepFilter
from swarm.pool.episodes import EpisodeEnding
from swarm.records import Episode, EpisodeStatus, RewardStatus


@contextmanager
def transactions(pool: Pool) -> Iterator[list[int]]:
    """Counts the transactions the pool begins inside the block (in ``[0]``)."""
    n = [0]

    def begin(_conn: sa.Connection) -> None:
        n[0] += 1

    sa.event.listen(pool.engine, "begin", begin)
    try:
        yield n
    finally:
        sa.event.remove(pool.engine, "begin", begin)


def test_add_episodes_one_transaction_all_or_none(pool: Pool) -> None:
    eps = [Episode(task="t", group_id=f"g{i}") for i in range(5)]
    with transactions(pool) as n:
        assert pool.add_episodes(eps) == eps
    assert n[0] == 1
    assert [pool.get_episode(e.episode_id) for e in eps] == eps
    fresh = Episode(task="t")
    with pytest.raises(ConflictError, match="already exists"):
        pool.add_episodes([fresh, Episode(episode_id=eps[2].episode_id, task="t")])
    with pytest.raises(ConflictError, match="share an episode_id"):
        pool.add_episodes([fresh, fresh])
    with pytest.raises(ValidationError, match=r"episodes\[1\]"):
        pool.add_episodes([fresh, {"task": ""}])
    with pytest.raises(NotFoundError):
        pool.get_episode(fresh.episode_id)  # none of the failed batches stored it
    assert pool.add_episodes([]) == []


def test_end_episodes_one_transaction_same_result_as_one_by_one(pool: Pool) -> None:
    a, b, c = episode(pool, metadata={"seed": 1}), episode(pool), episode(pool)
    sa_, sb = step(a), step(b)
    pool.add_steps([sa_, sb])
    endings = [
        EpisodeEnding(a.episode_id, reward=0.5, step_rewards={sa_.step_id: 2.0}, metadata={"won": True}),
        EpisodeEnding(b.episode_id, status="failed"),
        EpisodeEnding(c.episode_id, reward=1.0),
    ]
    with transactions(pool) as n:
        done = [e.episode for e in pool.end_episodes(endings)]
    assert n[0] == 1
    assert done == [pool.get_episode(e.episode_id) for e in endings]  # as stored, in order
    assert [d.status for d in done] == [EpisodeStatus.finished, EpisodeStatus.failed, EpisodeStatus.finished]
    assert done[0].metadata == {"seed": 1, "won": True} and done[0].reward == 0.5
    assert (done[1].reward, done[1].reward_status) == (None, RewardStatus.pending)
    assert (done[2].reward, done[2].reward_status) == (1.0, RewardStatus.final)
    got = pool.get_step(sa_.step_id)
    assert (got.reward, got.reward_status) == (2.0, RewardStatus.final)
    assert pool.end_episodes([]) == []


@pytest.mark.parametrize("source", ["agent", "judge"])
def test_end_episodes_with_a_reward_source_batch_like_one_by_one(pool: Pool, source: str) -> None:
    """The gateway's endings carry their caller's source; several in one batch end in one transaction
    (a shadowed variable once made every second ending of a batch fail, so each batch retried one by one)."""
    eps = [episode(pool) for _ in range(3)]
    steps = [step(e) for e in eps]
    pool.add_steps(steps)
    endings = [EpisodeEnding(e.episode_id, reward=0.25 * i, step_rewards={s.step_id: 1.0}, source=source)
               for i, (e, s) in enumerate(zip(eps, steps, strict=True))]
    with transactions(pool) as n:
        ended = pool.end_episodes(endings)
    assert n[0] == 1
    assert [x.episode.reward for x in ended] == [0.0, 0.25, 0.5]
    assert all(x.rewards is not None and x.rewards.applied for x in ended)
    assert all(pool.get_step(s.step_id).reward == 1.0 for s in steps)
    recorded = [h for e in eps for h in pool.reward_history(e.episode_id)]
    assert len(recorded) == (6 if source == "judge" else 0)  # an agent's applied rewards need no record


@pytest.mark.parametrize("bad", ["ended", "twice", "unknown", "foreign_step", "open"])
def test_end_episodes_one_bad_ending_changes_nothing(pool: Pool, bad: str) -> None:
    ended, ok, other = episode(pool), episode(pool), episode(pool)
    s = step(other)
    pool.add_step(s)
    pool.end_episode(ended.episode_id)
    wrong, error = {
        "ended": (EpisodeEnding(ended.episode_id), ConflictError),
        "twice": (EpisodeEnding(ok.episode_id, reward=0.0), ConflictError),  # ``ok`` is ended first in the batch
        "unknown": (EpisodeEnding("ep-nope"), NotFoundError),
        "foreign_step": (EpisodeEnding(other.episode_id, step_rewards={"step-nope": 1.0}), NotFoundError),
        "open": (EpisodeEnding(other.episode_id, status=EpisodeStatus.open), ValidationError),
    }[bad]
    with pytest.raises(error):
        pool.end_episodes([EpisodeEnding(ok.episode_id, reward=1.0), wrong])
    for ep_id in (ok.episode_id, other.episode_id):
        assert pool.get_episode(ep_id).status == EpisodeStatus.open  # rolled back
    assert pool.get_step(s.step_id).reward_status == RewardStatus.pending
    assert pool.count_episodes(StepFilter(episode_status=EpisodeStatus.open)) == 2


def test_concurrent_batches_ending_the_same_episodes_in_opposite_orders(pool: Pool) -> None:
    """Each episode is ended once; the losing batch gets a ConflictError, never a deadlock."""

    def end(order: list[str], results: list[object]) -> None:
        try:
            results.append(pool.end_episodes([EpisodeEnding(i, reward=1.0) for i in order]))
        except ConflictError as exc:
            results.append(exc)

    for _ in range(5):
        ids = [episode(pool).episode_id for _ in range(20)]
        results: list[object] = []
        threads = [threading.Thread(target=end, args=(o, results)) for o in (ids, ids[::-1])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(type(r).__name__ for r in results) == ["ConflictError", "list"]
        assert all(pool.get_episode(i).status == EpisodeStatus.finished for i in ids)


def test_an_ending_with_a_source_goes_by_authority(pool: Pool) -> None:
    """end_episodes decides an ending's rewards by its source under the episode's lock: a judge's episode
    reward keeps an agent's ending rewards all history; a judge's step reward stands while the agent's
    others apply; a higher source supersedes; the task's floor refuses; no source (the pool API directly)
    applies all unrecorded, as before. Refused and non-agent rewards land in the reward history."""
    ep = episode(pool)
    s1, s2 = pool.add_steps([step(ep, 0, seed=1), step(ep, 1, seed=2)])
    assert pool.report_reward(step_id=s1, reward=0.25, source="judge").applied
    assert pool.report_reward(episode_id=ep.episode_id, reward=0.0, source="judge").applied
    (ended,) = pool.end_episodes([EpisodeEnding(ep.episode_id, reward=1.0, step_rewards={s1: 1.0, s2: 0.5},
                                                source="agent")])
    assert ended.episode.reward == 0.0 and not ended.rewards.applied and "set by the judge" in ended.rewards.reason
    assert pool.get_step(s1, with_tokens=False).reward == 0.25
    assert pool.get_step(s2, with_tokens=False).reward == 0.0  # the judge's episode reward, not the agent's 0.5
    history = [(h["step_id"], h["source"], h["value"], h["applied"]) for h in pool.reward_history(ep.episode_id)]
    assert sorted(history[-3:], key=str) == sorted([(None, "agent", 1.0, False), (s1, "agent", 1.0, False),
                                                    (s2, "agent", 0.5, False)], key=str)  # one ending: one time

    steps = episode(pool)
    j, own = pool.add_steps([step(steps, 0, seed=3), step(steps, 1, seed=4)])
    pool.report_reward(step_id=j, reward=0.0, source="judge")
    (ended,) = pool.end_episodes([EpisodeEnding(steps.episode_id, reward=1.0, step_rewards={j: 1.0, own: 0.5},
                                                source="agent")])
    assert ended.rewards.applied and list(ended.refused_steps) == [j] and ended.episode.reward == 1.0
    assert pool.get_step(j, with_tokens=False).reward == 0.0 and pool.get_step(own, with_tokens=False).reward == 0.5

    other = episode(pool)
    pool.report_reward(episode_id=other.episode_id, reward=0.0, source="judge")
    (ended,) = pool.end_episodes([EpisodeEnding(other.episode_id, reward=1.0, source="admin")])
    assert ended.episode.reward == 1.0 and ended.rewards.applied
    assert pool.episode_reward_authority(other.episode_id) == "admin"  # recorded: it counts as the admin's

    floor = episode(pool)
    (ended,) = pool.end_episodes([EpisodeEnding(floor.episode_id, reward=1.0, source="agent", min_source="judge")])
    assert ended.episode.reward is None and "judge or higher" in ended.rewards.reason
    with pytest.raises(ValidationError, match="source"):
        pool.end_episodes([EpisodeEnding(episode(pool).episode_id, reward=1.0, source="robot")])

    third = episode(pool)
    pool.report_reward(episode_id=third.episode_id, reward=0.0, source="judge")
    assert pool.end_episode(third.episode_id, reward=1.0).reward == 1.0  # no source: unchecked, as before
