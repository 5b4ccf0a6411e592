"""A reward kind declared out of tree (tests/flows/test_declare.py): only this module and a config."""

from __future__ import annotations

from swarm.rewards import REWARDS, RewardSection


@REWARDS.declare(__name__)
class RefereeReward(RewardSection):
    """A referee's verdicts supersede the agent's own reports for the task."""

    level: str = "admin"

    def authority(self, task: str) -> dict[str, str]:
        return {task: self.level}
