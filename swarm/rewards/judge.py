"""``task.reward.kind: judge`` (conf/reward/judge.yaml, docs/judge.md): an LLM judge scores each complete
GRPO group; the scores are the episodes' rewards. The settings are checked by :class:`swarm.judge.JudgeSpec`
(None: its default); the service is :class:`swarm.judge.GroupJudge`. The agent's own reward for the task
is kept in the history (authority ``judge``), so no group trains before the judge scores it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, model_validator

from swarm.judge import GroupJudge, JudgeSpec
from swarm.rewards import REWARDS, RewardSection

__all__ = ["JudgeReward"]


@REWARDS.declare("judge")
class JudgeReward(RewardSection):
    """The judge's settings as written in ``task.reward`` (``scale: [min, max]``, ``weights: {judge, task}``)."""

    policy: str = "judge"
    rubric: str | None = None
    scale: list[int] | None = None  # [min, max]
    view: Literal["final", "transcript"] | None = None
    chunk_size: int | None = None
    max_tokens: int | None = None
    max_chars: int | None = None
    retries: int | None = None
    weights: dict[str, float] | None = None  # {judge: w, task: w}
    timeout_s: float | None = None
    concurrency: int | None = None
    poll_s: float = Field(default=0.5, gt=0)
    pool_url: str | None = None  # None: the run's pool (pool.url)

    @model_validator(mode="after")
    def _spec(self) -> JudgeReward:
        self.spec()
        return self

    def spec(self) -> JudgeSpec:
        """The :class:`JudgeSpec` these keys describe (ValueError names ``task.reward.<key>``)."""
        return JudgeSpec.from_config(self.model_dump(exclude_none=True, exclude={"kind", "poll_s", "pool_url"}))

    def check(self, policies: Sequence[str], feedback_rating: str) -> None:
        if self.policy not in policies:
            raise ValueError(f"task.reward.policy={self.policy!r}: no such policy; serve a judge with "
                             f"+model@frozen_policies.{self.policy}=tiny (or =upstream), or name one of {list(policies)}")
        if feedback_rating == "fill":
            raise ValueError("feedback.rating=fill with task.reward.kind=judge: the judge's reward arrives after an "
                             "episode ends, and fill would set a rated episode's reward before it; use "
                             "feedback.rating=weighted or replace with a judge")

    def authority(self, task: str) -> dict[str, str]:
        # a module path's episodes are recorded under its last name: both keep the agent's report in the history
        return {name: "judge" for name in {task, task.rsplit(".", 1)[-1]}}

    def serve(self, pool_url: str, server: str, task: str, group_size: int, stop: threading.Event) -> Any:
        from swarm.pool import Pool

        pool = Pool(self.pool_url or pool_url)
        judge = GroupJudge(pool, server, self.spec(), task, group_size)
        try:
            return judge.run(stop, self.poll_s)
        finally:
            judge.close()
            pool.close()
