"""Credit assignment, group keys and GRPO advantages on hand-computed values."""

from __future__ import annotations

import pytest

from swarm.errors import ValidationError
from swarm.records import Step
from swarm.train import advantage_stats, assign_credit, group_keys, grpo_advantages, items_from_steps


def test_grpo_with_and_without_std():
    adv = grpo_advantages([1.0, 0.0, 1.0, 0.0], ["g"] * 4)
    assert adv == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-5)  # mean 0.5, population std 0.5
    assert grpo_advantages([3.0, 1.0, 2.0], ["g"] * 3, scale_std=False) == pytest.approx([1.0, -1.0, 0.0])


def test_groups_are_independent_and_singletons_get_zero():
    adv = grpo_advantages([1.0, 3.0, 10.0, 5.0], ["a", "a", "b", "c"], scale_std=False)
    assert adv == pytest.approx([-1.0, 1.0, 0.0, 0.0])
    assert grpo_advantages([2.0, 2.0], ["g", "g"]) == [0.0, 0.0]  # no variance, no signal


def test_episode_units_count_once():
    # Episode A has three steps (reward 1), episode B one step (reward 0): stats over 2 episodes.
    rewards, groups, units = [1.0, 1.0, 1.0, 0.0], ["g"] * 4, ["A", "A", "A", "B"]
    assert grpo_advantages(rewards, groups, scale_std=False, units=units) == pytest.approx([0.5, 0.5, 0.5, -0.5])
    assert grpo_advantages(rewards, groups, scale_std=False) == pytest.approx([0.25, 0.25, 0.25, -0.75])


def test_assign_credit_prefers_step_reward():
    assert assign_credit([None, 0.5, None], ["e1", "e1", "e2"], {"e1": 1.0, "e2": -1.0}) == [1.0, 0.5, -1.0]
    with pytest.raises(ValidationError, match="no finite reward"):
        assign_credit([None], ["e3"], {"e1": 1.0})


def test_group_keys_and_items_from_steps():
    def step(ep, group, role, reward, idx=0):
        return Step(episode_id=ep, group_id=group, task="ww", index=idx, prompt_ids=[1, 2], response_ids=[3],
                    response_logprobs=[-0.5], reward=reward, metadata={"role": role})

    steps = [step("e1", "game1", "wolf", 1.0), step("e2", "game1", "villager", 0.0),
             step("e3", "game2", "wolf", 0.0), step("e4", "game2", "villager", 1.0)]
    assert group_keys(steps, "group") == ["game1", "game1", "game2", "game2"]
    assert group_keys(steps, "task_role") == ["ww/wolf", "ww/villager", "ww/wolf", "ww/villager"]
    items = items_from_steps(steps, group_by="task_role", scale_std=False)
    assert [it.advantage for it in items] == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert items[0].step_id == steps[0].step_id and items[0].behaviour_logprobs == (-0.5,)
    assert items[0].prompt_ids == (1, 2) and items[0].response_ids == (3,)
    stats = advantage_stats([it.advantage for it in items])
    assert stats["adv/mean"] == pytest.approx(0.0) and stats["adv/max"] == pytest.approx(0.5)
    with pytest.raises(ValidationError, match="group_by"):
        group_keys(steps, "role")
