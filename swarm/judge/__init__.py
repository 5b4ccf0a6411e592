"""Judge rewards: an LLM scores a GRPO group's trajectories against each other (RULER-style).

- :mod:`swarm.judge.spec`: :class:`JudgeSpec`, what a judge reward is (from ``task.reward``);
- :mod:`swarm.judge.prompt`: trajectories -> judge messages + JSON schema; reply -> scores;
- :mod:`swarm.judge.service`: :class:`GroupJudge`, the pool service that judges complete groups.

Errors: :class:`~swarm.judge.prompt.JudgeReplyError` (a reply that is not the asked JSON; retried)
and :class:`~swarm.judge.service.JudgeFailed` (every attempt failed: the group is marked
``judge_failed``, never rewarded). Nothing here imports Hydra, Prefect or flows.
"""

from swarm.judge.prompt import JudgeReplyError, Trajectory, judge_messages, parse_scores, score_schema
from swarm.judge.service import GroupJudge, GroupOutcome, JudgeFailed, combine
from swarm.judge.spec import JudgeSpec

__all__ = ["JudgeSpec", "GroupJudge", "GroupOutcome", "JudgeFailed", "JudgeReplyError", "Trajectory",
           "judge_messages", "parse_scores", "score_schema", "combine"]
