"""From pool steps to train items: rewards -> group-relative advantages -> :class:`TrainSeq`.

The one function the training flow calls between ``lease`` and ``Trainer.update``. Rewards
come from each step (the pool resolves them) or from ``episode_rewards``; advantages are
GRPO's within each group (``group_by``), with episode-level statistics by default.
Does not filter or curate steps (the pool does) and does not merge them (the trainer does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from swarm.merge.items import TrainSeq
from swarm.records import Step
from swarm.train.advantages import GroupBy, assign_credit, group_keys, grpo_advantages

__all__ = ["items_from_steps"]


def items_from_steps(
    steps: Sequence[Step],
    *,
    episode_rewards: Mapping[str, float | None] | None = None,
    group_by: GroupBy = "group",
    scale_std: bool = True,
    per_episode_stats: bool = True,
) -> list[TrainSeq]:
    """One :class:`TrainSeq` per step, in order, with its group-relative advantage."""
    rewards = assign_credit([s.reward for s in steps], [s.episode_id for s in steps], episode_rewards)
    advantages = grpo_advantages(rewards, group_keys(steps, group_by), scale_std=scale_std,
                                 units=[s.episode_id for s in steps] if per_episode_stats else None)
    return [TrainSeq.from_step(s, a) for s, a in zip(steps, advantages, strict=False)]
