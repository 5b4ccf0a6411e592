"""textarena: a two-player TextArena game as a multi-agent swarm task, win rate logged like werewolves.

``python -m flows.train +task=textarena`` trains one seat of a TextArena game (default
``TicTacToe-v0-train``) against a rule-based opponent (``heuristic`` for TicTacToe, ``random`` for any
game that lists its legal moves) or a frozen policy (``policy:<name>``). The game is TextArena's own
(``textarena.make``); its observations go to the policy through the seat's episode
(:mod:`experiments.textarena.players`), its result is the reward (:mod:`experiments.textarena.reward`).
Each episode reports ``win``, so the flow logs ``episodes/win`` and ``eval/win`` and the run's summary
the eval win rate (``summary/eval_win_*``). The options are :class:`Options`; the library is imported on
first use, and without it the run is refused at start-up with the pip command (``Options.check``).
"""

from __future__ import annotations

from typing import Any

from experiments.textarena.arena import PIP_HINT, Options, action_of, check_env, legal_moves, library, move_schema
from experiments.textarena.game import play, run_multiagent
from experiments.textarena.players import LLMSeat, RandomPlayer, TicTacToeHeuristic
from experiments.textarena.reward import seat_reward

__all__ = ["Options", "make_instance", "run_multiagent", "play", "LLMSeat", "RandomPlayer", "TicTacToeHeuristic",
           "seat_reward", "check_env", "legal_moves", "library", "move_schema", "action_of", "PIP_HINT"]


def make_instance(seed: int) -> dict[str, Any]:
    """``{"seed"}``: the game seed (TextArena's reset seed; the trained seat is ``seed % 2`` by default)."""
    return {"seed": int(seed)}
