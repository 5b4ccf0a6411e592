"""werewolves: a 9-player social deduction game; LLM seats play through their own episodes.

``make_instance(seed)`` deals the roles; ``run_multiagent(instance, client, group_id, cfg)``
plays one game (:mod:`experiments.werewolves.task`) with the pure engine
(:mod:`experiments.werewolves.game`), rule-based seats (:mod:`.heuristic`) and LLM seats
(:mod:`.llm_player`, replies parsed by :mod:`.parse`); rewards in :mod:`.reward`.
"""

from __future__ import annotations

from typing import Any

from experiments.werewolves.game import MAX_ROUNDS, SETUP, Action, Decision, Game, GameResult, deal_roles, winner_of
from experiments.werewolves.heuristic import HeuristicPlayer
from experiments.werewolves.llm_player import LLMPlayer
from experiments.werewolves.parse import extract_json, parse_action
from experiments.werewolves.reward import FORMAT_PENALTY, MAX_PENALTY, player_reward, side_reward
from experiments.werewolves.task import Options, WerewolvesOptions, run_multiagent

__all__ = ["Options", "make_instance", "run_multiagent", "Game", "GameResult", "Action", "Decision", "HeuristicPlayer",
           "LLMPlayer", "WerewolvesOptions", "deal_roles", "winner_of", "extract_json", "parse_action",
           "player_reward", "side_reward", "FORMAT_PENALTY", "MAX_PENALTY", "MAX_ROUNDS", "SETUP"]


def make_instance(seed: int) -> dict[str, Any]:
    """``{"seed", "roles"}``: the roles of players 0-8 for this game seed."""
    return {"seed": seed, "roles": deal_roles(seed)}
