"""Credit assignment and group-relative advantages (GRPO), as pure functions of plain values.

- :func:`assign_credit`: a step's own reward where one was given, else its episode's reward.
- :func:`group_keys`: the comparison group of each step: its prompt group id, or task + role
  for multi-agent games (a werewolf is compared with werewolves, not with villagers).
- :func:`grpo_advantages`: ``(r - mean_g) / (std_g + eps)`` per group, or ``r - mean_g`` without
  std scaling (Dr. GRPO). Statistics can be taken over *units* (episodes) rather than steps, so
  an episode with twenty calls does not count twenty times in its group's mean. Std is the
  population std (ddof = 0). A group of one unit gets advantage 0.

Nothing here reads the pool, a config or a model.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Literal

from swarm.errors import ValidationError
from swarm.records import Step

__all__ = ["assign_credit", "group_keys", "grpo_advantages", "advantage_stats", "GroupBy"]

GroupBy = Literal["group", "task_role", "group_role"]


def assign_credit(
    step_rewards: Sequence[float | None],
    episode_ids: Sequence[str],
    episode_rewards: Mapping[str, float | None] | None = None,
) -> list[float]:
    """Each step's reward: its own if given, else its episode's; raises if neither exists."""
    if len(step_rewards) != len(episode_ids):
        raise ValidationError(f"{len(step_rewards)} step rewards but {len(episode_ids)} episode ids")
    episode_rewards = episode_rewards or {}
    out = []
    for i, (r, ep) in enumerate(zip(step_rewards, episode_ids, strict=False)):
        if r is None:
            r = episode_rewards.get(ep)
        if r is None or not math.isfinite(r):
            raise ValidationError(f"step {i} has no finite reward (neither its own nor its episode's)", episode_id=ep)
        out.append(float(r))
    return out


def group_keys(steps: Sequence[Step], by: GroupBy = "group", role_key: str = "role") -> list[str]:
    """Comparison group per step; a step without a group id falls back to its episode id.

    ``task_role`` uses ``step.metadata[role_key]`` (steps without a role share the task's group).
    """
    if by not in ("group", "task_role", "group_role"):
        raise ValidationError(f"group_by must be 'group', 'task_role' or 'group_role', got {by!r}")
    keys = []
    for s in steps:
        role = str(s.metadata.get(role_key, ""))
        if by == "group":
            keys.append(s.group_id or s.episode_id)
        elif by == "task_role":
            keys.append(f"{s.task}/{role}")
        else:
            keys.append(f"{s.group_id or s.episode_id}/{role}")
    return keys


def grpo_advantages(
    rewards: Sequence[float],
    groups: Sequence[str],
    *,
    scale_std: bool = True,
    units: Sequence[str] | None = None,
    eps: float = 1e-6,
) -> list[float]:
    """Group-relative advantages; with ``units`` each unit's mean reward counts once per group."""
    n = len(rewards)
    if len(groups) != n or (units is not None and len(units) != n):
        raise ValidationError("rewards, groups and units must have the same length")
    units = units if units is not None else [str(i) for i in range(n)]
    unit_rewards: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r, g, u in zip(rewards, groups, units, strict=False):
        unit_rewards[g][u].append(float(r))
    stats: dict[str, tuple[float, float, int]] = {}
    for g, per_unit in unit_rewards.items():
        vals = [sum(v) / len(v) for v in per_unit.values()]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
        stats[g] = (mean, std, len(vals))
    out = []
    for r, g in zip(rewards, groups, strict=False):
        mean, std, count = stats[g]
        if count < 2:
            out.append(0.0)
            continue
        a = float(r) - mean
        out.append(a / (std + eps) if scale_std else a)
    return out


def advantage_stats(advantages: Sequence[float], prefix: str = "adv/") -> dict[str, float]:
    """Mean, std, min, max and the fraction of exact zeros (groups with no signal)."""
    if not advantages:
        return {}
    n = len(advantages)
    mean = sum(advantages) / n
    return {f"{prefix}mean": mean, f"{prefix}std": math.sqrt(sum((a - mean) ** 2 for a in advantages) / n),
            f"{prefix}min": min(advantages), f"{prefix}max": max(advantages),
            f"{prefix}zero_frac": sum(1 for a in advantages if a == 0.0) / n}
