"""Reward of the textarena task: the game's outcome for one seat, from TextArena's own result.

``seat_reward(outcome, invalid_move, timeout)`` returns ``{"reward", "win", "draw", "loss", "invalid_move",
"timeout"}`` where ``outcome`` is TextArena's reward of the seat (1 win, 0 draw, -1 loss) and

    reward = (outcome + 1) / 2        # win 1.0, draw 0.5, loss 0.0

A game cut at ``max_turns`` (``outcome`` None) counts as a draw with ``timeout`` 1. A seat that lost by
playing an illegal move twice (TextArena's rule) has ``invalid_move`` 1: no extra penalty, the loss is it.
"""

from __future__ import annotations

__all__ = ["seat_reward"]


def seat_reward(outcome: float | None, invalid_move: bool = False, timeout: bool = False) -> dict[str, float]:
    """Score one seat's game (see the module docstring for the formula and the parts)."""
    value = 0.0 if outcome is None else max(-1.0, min(1.0, float(outcome)))
    return {"reward": (value + 1.0) / 2.0, "win": float(value > 0), "draw": float(value == 0),
            "loss": float(value < 0), "invalid_move": float(bool(invalid_move)), "timeout": float(bool(timeout))}
