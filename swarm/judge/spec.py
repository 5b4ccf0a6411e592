"""JudgeSpec: what a judge reward is (policy, rubric, scale, view, chunks, retries, weights).

Plain data, validated on construction so a bad value names its config key
(``task.reward.<key>``). It does not call any model; :mod:`swarm.judge.service` does.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["JudgeSpec", "VIEWS", "DEFAULT_RUBRIC"]

VIEWS = ("final", "transcript")
DEFAULT_RUBRIC = ("Score each trajectory on how well it achieves the user's goal. A trajectory that reaches a "
                  "correct, complete result scores higher than one that does not; among those that fail, "
                  "the one closer to success scores higher. Compare the trajectories with each other.")


@dataclass(frozen=True)
class JudgeSpec:
    """One judge reward: ``policy`` scores a group's trajectories against each other under ``rubric``.

    Scores are integers ``scale_min..scale_max``; an episode's reward is
    ``weight_judge * (score - scale_min) / (scale_max - scale_min) + weight_task * task_reward``.
    """

    policy: str = "judge"
    rubric: str = DEFAULT_RUBRIC
    scale_min: int = 0
    scale_max: int = 10
    view: str = "transcript"          # final: the last reply only; transcript: every turn after the shared prompt
    chunk_size: int = 8               # most trajectories per judge call (a larger group is split)
    max_tokens: int = 160             # the judge's reply budget (the JSON of scores)
    max_chars: int = 1200             # each trajectory's text is cut to this many characters (head and tail)
    retries: int = 2                  # more attempts after a failed one (junk, refusal, HTTP error)
    weight_judge: float = 1.0
    weight_task: float = 0.0          # the task's own reward (kept in the history by the gateway) mixed in
    timeout_s: float = 120.0
    concurrency: int = 4              # groups judged at once (the hf backend batches concurrent calls)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # e.g. {"reason": true}: nothing yet

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> ValueError:
            return ValueError(f"task.reward.{key}: {why}")

        if not self.policy:
            raise bad("policy", "name a served policy (a frozen_policies name, or one of policies)")
        if not self.rubric.strip():
            raise bad("rubric", "empty; say what a better trajectory does")
        if not self.scale_min < self.scale_max or self.scale_max - self.scale_min > 100:
            raise bad("scale", f"[{self.scale_min}, {self.scale_max}]: need min < max, at most 100 apart")
        if self.view not in VIEWS:
            raise bad("view", f"{self.view!r}; one of {list(VIEWS)}")
        if self.chunk_size < 2:
            raise bad("chunk_size", f"{self.chunk_size}: relative scoring needs at least 2 per call")
        if self.max_tokens < 8 or self.max_chars < 40 or self.retries < 0 or self.timeout_s <= 0:
            raise bad("max_tokens", "max_tokens >= 8, max_chars >= 40, retries >= 0, timeout_s > 0")
        if not 1 <= self.concurrency <= 64:
            raise bad("concurrency", f"{self.concurrency}: 1..64 groups at once")
        if self.weight_judge < 0 or self.weight_task < 0 or self.weight_judge + self.weight_task == 0:
            raise bad("weights", f"judge={self.weight_judge}, task={self.weight_task}: non-negative, not both 0")

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> JudgeSpec:
        """From a ``task.reward`` block: ``scale: [min, max]`` and ``weights: {judge, task}`` are unpacked."""
        d = {k: v for k, v in cfg.items() if k not in ("kind", "scale", "weights", "pool_url", "poll_s")}
        scale = cfg.get("scale") or [d.pop("scale_min", 0), d.pop("scale_max", 10)]
        weights = cfg.get("weights") or {"judge": d.pop("weight_judge", 1.0), "task": d.pop("weight_task", 0.0)}
        if not isinstance(scale, list | tuple) or len(scale) != 2:
            raise ValueError(f"task.reward.scale: {scale!r}; give [min, max], e.g. [0, 10]")
        unknown = set(weights) - {"judge", "task"}
        if unknown:
            raise ValueError(f"task.reward.weights: unknown {sorted(unknown)}; use judge and task")
        names = {f for f in cls.__dataclass_fields__}
        extra = sorted(set(d) - names)
        if extra:
            raise ValueError(f"task.reward.{extra[0]}: unknown key; known: {sorted(names - {'extra'})}")
        return cls(**d, scale_min=int(scale[0]), scale_max=int(scale[1]),
                   weight_judge=float(weights.get("judge", 1.0)), weight_task=float(weights.get("task", 0.0)))

    def identity(self) -> str:
        """A digest of everything that changes what the judge is asked (part of the cache key)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("retries", "timeout_s", "weight_judge",
                                                                 "weight_task", "concurrency", "extra")}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
