"""Lineage on both backends: a pool written by hand (steps -> lease -> settle at version 2), traced both ways, and run evals attributed per version."""

from __future__ import annotations

import pytest
from pool_helpers import episode, step

from swarm.errors import NotFoundError
from swarm.pool import Pool, StepFilter
from swarm.pool.evals import EvalResult, eval_summary, record_run_evals
from swarm.records import EpisodeType, Event, PolicyVersion, now


def _trained_group(pool: Pool) -> tuple[list[str], str]:
    """Group g1 (two one-step episodes played by version 1, code "abc"), leased and settled into version 2."""
    ids = []
    for r in (1.0, 0.0):
        ep = episode(pool, group_id="g1", metadata={"code_version": "abc"})
        s = step(ep, policy_version=1, response_id=f"resp-{r}")
        pool.add_step(s)
        pool.end_episode(ep.episode_id, reward=r)
        ids.append(s.step_id)
    other = episode(pool, group_id="g2")  # not leased: must not show up in version 2's lineage
    pool.add_step(step(other, policy_version=1))
    pool.end_episode(other.episode_id, reward=0.5)
    pool.add_policy_version(PolicyVersion(policy="default", version=1, adapter_path="/ckpt/v1"))
    lease = pool.lease(StepFilter.trainable(group_id="g1"), max_groups=4)
    assert {s.step_id for s in lease.steps} == set(ids)
    assert pool.settle(lease.lease_id, ids, consumed_version=2) == 2
    pool.add_policy_version(PolicyVersion(policy="default", version=2, adapter_path="/ckpt/v2"))
    return ids, lease.lease_id


def _eval_episode(pool: Pool, versions: list[int], win: float, reward: float, policy: str = "default") -> str:
    ep = episode(pool, task="wolves", type=EpisodeType.eval)
    for i, v in enumerate(versions):
        pool.add_step(step(ep, index=i, policy=policy, policy_version=v))
    pool.end_episode(ep.episode_id, reward=reward, metadata={"metrics": {"win": win, "rounds": 3, "ok": True}})
    return ep.episode_id


def test_step_lineage_reaches_episode_group_lease_update_and_evals(pool: Pool):
    ids, lease_id = _trained_group(pool)
    ep_id = pool.get_step(ids[0]).episode_id
    assert pool.report_reward(episode_id=ep_id, reward=0.3, source="judge").applied
    assert not pool.report_reward(episode_id=ep_id, reward=0.9, source="agent").applied
    pool.add_event(Event(kind="feedback", episode_id=ep_id, rating=0.2))
    pool.add_eval_result({"policy": "default", "version": 2, "task": "wolves", "episodes": 4, "reward": 0.5,
                          "metrics": {"win": 0.25}})

    d = pool.step_lineage(ids[0])
    assert d["step"]["step_id"] == ids[0] and d["step"]["policy_version"] == 1
    assert d["step"]["response_id"] == "resp-1.0" and d["step"]["reward"] == 0.3
    assert d["episode"]["episode_id"] == ep_id and d["episode"]["code_version"] == "abc"
    hist = d["episode"]["reward_history"]
    assert [(h["source"], h["value"], h["applied"]) for h in hist] == [("judge", 0.3, True), ("agent", 0.9, False)]
    assert hist[1]["reason"]  # why the agent's reward was not applied
    assert [f["rating"] for f in d["episode"]["feedback"]] == [0.2]
    assert d["group"]["group_id"] == "g1" and len(d["group"]["members"]) == 2
    assert d["lease"]["lease_id"] == lease_id and d["lease"]["state"] == "acked"
    assert d["lease"]["consumed_version"] == 2 and d["lease"]["filter"]["group_id"] == "g1"
    assert d["update"]["consumed_version"] == 2 and d["update"]["trained_from"] == 1
    assert d["update"]["version"]["adapter_path"] == "/ckpt/v2"
    assert d["generated_by"]["adapter_path"] == "/ckpt/v1"
    assert [r["metrics"] for r in d["evals"]["rows"]] == [{"win": 0.25}]

    fresh = pool.step_lineage(pool.query_steps(StepFilter(group_id="g2"))[0].step_id)
    assert fresh["lease"] is None and fresh["update"] is None and fresh["evals"]["rows"] == []
    with pytest.raises(NotFoundError):
        pool.step_lineage("no-such-step")


def test_version_lineage_is_exactly_the_consumed_steps(pool: Pool):
    ids, lease_id = _trained_group(pool)
    d = pool.version_lineage("default", 2)
    assert d["record"]["adapter_path"] == "/ckpt/v2"
    assert d["trained_from"]["record"]["adapter_path"] == "/ckpt/v1"
    assert [ls["lease_id"] for ls in d["leases"]] == [lease_id] and d["leases"][0]["steps_of_policy"] == 2
    made = d["made_of"]
    assert (made["steps"], made["episodes"], made["groups"]) == (2, 2, 1)
    assert made["tasks"] == {"math": 2} and made["code_versions"] == {"abc": 2} and made["staleness"] == {"0": 2}
    assert {s["step_id"] for s in d["steps"]["data"]} == set(ids) == {
        s.step_id for s in pool.query_steps(StepFilter(consumed=True))}
    assert d["generated"] == {"steps": 0, "consumed": 0}
    assert pool.version_lineage("default", 2, limit=1, offset=1)["steps"]["data"][0]["step_id"] in ids

    v1 = pool.version_lineage("default", 1)  # made nothing by training here; generated 3 steps
    assert v1["leases"] == [] and v1["made_of"]["steps"] == 0 and v1["generated"] == {"steps": 3, "consumed": 2}
    with pytest.raises(NotFoundError):
        pool.version_lineage("default", 9)
    with pytest.raises(NotFoundError):
        pool.version_lineage("other", 2)  # version 2 of another policy: its leases are not this one's


def test_run_evals_are_attributed_to_the_version_that_played_them(pool: Pool):
    since = now() - 1
    _eval_episode(pool, [2, 2], win=1.0, reward=1.0)
    _eval_episode(pool, [2], win=0.0, reward=0.0)
    _eval_episode(pool, [3], win=1.0, reward=0.5)
    _eval_episode(pool, [2, 3], win=1.0, reward=1.0)  # spans versions: counts for none
    _eval_episode(pool, [0], win=0.0, reward=0.0, policy="frozen")  # an opponent's seat
    train = episode(pool, task="wolves")  # a train episode: not an eval result
    pool.add_step(step(train, policy_version=2))
    pool.end_episode(train.episode_id, reward=1.0)

    rows = record_run_evals(pool, since, policies=["default"], metadata={"mlflow_run_id": "r1"})
    got = {(r.version, r.task): (r.episodes, r.reward, r.metrics) for r in rows}
    assert got == {(2, "wolves"): (2, 0.5, {"rounds": 3.0, "win": 0.5}), (3, "wolves"): (1, 0.5, {"rounds": 3.0, "win": 1.0})}
    assert all(r.source == "run" and r.metadata["mlflow_run_id"] == "r1" for r in rows)
    assert [(r.episodes, r.reward) for r in pool.eval_results("default", 2)] == [(2, 0.5)]
    # recording again replaces the version's row: it always equals all the version's eval episodes
    t = now()
    _eval_episode(pool, [2], win=1.0, reward=1.0)
    again = record_run_evals(pool, t, policies=["default"], lag_s=0.0)
    assert [(r.version, r.episodes) for r in again] == [(2, 3)]  # only version 2 played since
    stored = pool.eval_results("default", 2)
    assert [(r.episodes, r.reward, r.metrics["win"]) for r in stored] == [(3, pytest.approx(2 / 3), pytest.approx(2 / 3))]
    assert [r.episodes for r in pool.eval_results("default", 3)] == [1]  # untouched, kept
    pinned = EvalResult(policy="default", version=2, task="wolves", source="pinned", episodes=1, reward=0.0)
    two = eval_summary([pinned, pinned.model_copy(update={"eval_id": "x", "episodes": 3, "reward": 1.0})])
    assert two == [{"policy": "default", "version": 2, "task": "wolves", "source": "pinned", "episodes": 4, "rows": 2,
                    "reward": 0.75, "metrics": {}}]  # several rows of one version: weighted by episodes
    assert pool.version_lineage("default", 3)["evals"]["summary"][0]["episodes"] == 1
    assert record_run_evals(pool, since, policies=["frozen"])[0].version == 0
