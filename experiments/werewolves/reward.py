"""Rewards of the werewolves task: team result plus a per-player format penalty.

    player_reward(won, format_errors) = float(won) - min(MAX_PENALTY, FORMAT_PENALTY * format_errors)

with ``FORMAT_PENALTY = 0.1`` per decision whose answer was unparsable or illegal (the engine
then played the fallback) and ``MAX_PENALTY = 0.5``, so a winning player is never scored below
a losing one. :func:`side_reward` averages the players of the trainable side for logging.
These are plain functions of the game result; nothing here opens or ends episodes.
"""

from __future__ import annotations

from collections.abc import Sequence

from experiments.werewolves.game import GameResult, side_of

__all__ = ["FORMAT_PENALTY", "MAX_PENALTY", "player_reward", "side_reward"]

FORMAT_PENALTY = 0.1
MAX_PENALTY = 0.5


def player_reward(won: bool, format_errors: int) -> dict[str, float]:
    """``{"reward", "win", "format_penalty", "format_errors"}`` for one player (penalty <= 0)."""
    penalty = -min(MAX_PENALTY, FORMAT_PENALTY * format_errors)
    return {"reward": float(won) + penalty, "win": float(won), "format_penalty": penalty,
            "format_errors": float(format_errors)}


def side_reward(result: GameResult, roles: Sequence[str], side: str, players: Sequence[int]) -> dict[str, float]:
    """``{"reward", "win", "format_penalty", "rounds"}``: the mean over ``players`` of ``side``.

    ``players`` are the seats whose format errors count (the LLM-controlled ones); with none
    the reward is the bare team result.
    """
    won = result.winner == side
    if any(side_of(roles[p]) != side for p in players):
        raise ValueError(f"players {list(players)} are not all on side {side!r}")
    parts = [player_reward(won, result.format_errors[p]) for p in players] or [player_reward(won, 0)]
    return {"reward": sum(p["reward"] for p in parts) / len(parts), "win": float(won),
            "format_penalty": sum(p["format_penalty"] for p in parts) / len(parts), "rounds": float(result.rounds)}
