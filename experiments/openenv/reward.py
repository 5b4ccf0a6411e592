"""Reward of the openenv task: the environment's own step rewards, summed (the return) or the last one.

``episode_reward(step_rewards, how)`` returns ``{"reward", "return", "last"}`` where

    return = sum of the step rewards          # a step without a reward (None) counts 0
    last   = the last step's reward (0 when there was no step or it had none)
    reward = return when how == "sum", last when how == "last"

The adapter adds nothing of its own: a truncated episode (``max_turns``) keeps what it earned.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["episode_reward"]


def episode_reward(step_rewards: Sequence[float | int | bool | None], how: str = "sum") -> dict[str, float]:
    """Combine one episode's step rewards (see the module docstring for the formula and the parts)."""
    values = [0.0 if r is None else float(r) for r in step_rewards]
    total, last = sum(values), (values[-1] if values else 0.0)
    if how not in ("sum", "last"):
        raise ValueError(f"openenv: reward={how!r}; use 'sum' or 'last'")
    return {"reward": total if how == "sum" else last, "return": total, "last": last}
