"""The judge reward in flows.train: `+reward=judge` composes and wires up; one math update trains on judge rewards."""

from __future__ import annotations

import pytest

from flows.config import ConfigError, check_task, validate
from flows.train import train_flow
from swarm.pool import Pool, StepFilter


def test_reward_judge_config_is_wired_and_checked(flow_config) -> None:
    cfg = validate(flow_config("+task=math", "+reward=judge"))
    assert cfg.task.reward is not None and cfg.task.reward.kind == "judge" and cfg.task.reward.policy == "judge"
    assert cfg.frozen_policies["judge"].backend == "hf"  # a frozen tiny judge: offline in a fresh clone
    authority = cfg.task.reward.authority(cfg.task.name)  # the reward kind's: what the flow's gateway gets
    assert cfg.gateway.settings(authority).reward_authority == {"math": "judge"}  # the agent's own reward waits
    assert cfg.task.reward.pool_url is None  # None: the run's pool (the flow passes pool.url to its service)
    assert validate(flow_config("+task=math")).task.reward is None  # no block: the task's own reward
    kept = validate(flow_config("+task=math", "+reward=judge", "gateway.reward_authority={math: admin}"))
    assert kept.gateway.settings(authority).reward_authority == {"math": "admin"}  # an explicit setting stands
    with pytest.raises(ConfigError, match=r"^task.reward.policy='nobody': no such policy; serve a judge with "):
        validate(flow_config("+task=math", "+reward=judge", "task.reward.policy=nobody"))
    with pytest.raises(ConfigError, match=r"^task.reward.scale: \[3, 3\]"):
        validate(flow_config("+task=math", "+reward=judge", "task.reward.scale=[3,3]"))
    with pytest.raises(ConfigError, match=r"^task.reward.view=all: "):
        validate(flow_config("+task=math", "+reward=judge", "task.reward.view=all"))
    self_judged = validate(flow_config("+task=math", "+reward=judge", "task.reward.policy=default"))
    assert self_judged.task.reward.policy == "default"
    check_task(cfg.task)
    game = validate(flow_config("+task=werewolves", "+reward=judge"))
    with pytest.raises(ConfigError, match=r"^task.reward.kind=judge: werewolves is a multi-agent game"):
        check_task(game.task)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_math_trains_on_judge_rewards(flow_config) -> None:
    """One update of math with the frozen tiny judge: judged groups train, judge steps are recorded, never trained."""
    cfg = flow_config("+task=math", "+reward=judge", "train.updates=1")
    summary = train_flow(cfg)
    assert summary["status"] == "FINISHED" and summary["updates"] == 1
    pool = Pool(cfg["pool"]["url"])
    try:
        consumed = pool.query_steps(StepFilter(consumed=True, include_excluded=True), limit=10_000)
        assert consumed and {s.task for s in consumed} == {"math"}
        for eid in {s.episode_id for s in consumed}:
            assert pool.episode_reward_authority(eid) == "judge"
            assert [e.name for e in pool.events(eid)] == ["judge"]
        judges = pool.query_episodes(StepFilter(task="judge", include_excluded=True), limit=1000)
        assert judges and all(j.type.value == "eval" and j.reward is None for j in judges)
        done = [j for j in judges if j.status.value == "finished"]
        assert done and all(j.metadata["judge_result"]["status"] == "ok" for j in done)
        steps = pool.query_steps(StepFilter(task="judge", include_excluded=True), limit=1000)
        assert steps and {s.policy for s in steps} == {"judge"}
        assert not {s.step_id for s in steps} & {s.step_id for s in consumed}  # recorded, never trained
    finally:
        pool.close()
