"""One TextArena game against a gateway: the seats, their episodes and their rewards.

:func:`run_multiagent` (the worker's entry point) reads the process's :class:`Options`, opens an episode for the trained seat (``type`` = the group's kind) and, against ``policy:<name>``,
one of type ``"eval"`` for the frozen opponent (never trained), plays the game with TextArena's
loop (``get_observation`` -> ``step(action)`` -> ``close``) and ends each episode with
:func:`experiments.textarena.reward.seat_reward`. A rule-based opponent opens no episode. If anything
fails, every open episode of the game is aborted and the error re-raised
(:class:`swarm.client.EpisodeSet`).
"""

from __future__ import annotations

import secrets
from typing import Any

from experiments.textarena.arena import Options, library
from experiments.textarena.players import LLMSeat, RandomPlayer, TicTacToeHeuristic
from experiments.textarena.reward import seat_reward
from swarm.client import AgentLLM, EpisodeSet

__all__ = ["TASK", "HEARTBEAT_S", "run_multiagent", "play"]

TASK = "textarena"
HEARTBEAT_S = 10.0


def play(env: Any, players: dict[int, Any], seed: int, max_turns: int, on_turn: Any = None
         ) -> tuple[dict[int, float] | None, dict[int, Any], int]:
    """Play one game to its end or ``max_turns``: (TextArena rewards or None on timeout, game info, turns)."""
    env.reset(num_players=2, seed=seed)
    done, turns = False, 0
    while not done and turns < max_turns:
        pid, observation = env.get_observation()
        done, _ = env.step(action=players[pid].act(observation, env))
        turns += 1
        if on_turn is not None:
            on_turn()
    if not done:
        return None, {}, turns
    rewards, info = env.close()
    return rewards, info, turns


def run_multiagent(instance: dict[str, Any], client: Any, group_id: str, cfg: Any, kind: str = "train"
                   ) -> dict[str, float]:
    """Play one game; returns the trained seat's reward parts (``reward``, ``win``, ``draw``, ``loss``, ...)."""
    opts = Options.current()
    env = library().make(env_id=opts.env_id)
    seed = int(instance["seed"])
    me, other = opts.seat(seed), 1 - opts.seat(seed)
    game = secrets.token_hex(8)  # the seats of one game (the games of a group share the group id)
    seats: dict[int, LLMSeat] = {}
    out: dict[str, float] = {}

    with EpisodeSet(client, HEARTBEAT_S) as episodes:  # a failing game aborts its open episodes
        def seat(player: int, policy: str, ep_type: str) -> LLMSeat:
            ep = episodes.begin(player, task=TASK, group_id=group_id, type=ep_type, client_id=cfg.client_id,
                                timeout_s=cfg.episode_timeout_s,
                                metadata={"seed": seed, "player": player, "env_id": opts.env_id, "policy": policy,
                                          "game": game})
            seats[player] = LLMSeat(AgentLLM(ep.base_url, ep.api_key, policy, cfg.temperature, cfg.max_tokens),
                                    opts.constrained)
            return seats[player]

        players: dict[int, Any] = {me: seat(me, cfg.model, kind)}
        if opts.opponent.startswith("policy:"):
            players[other] = seat(other, opts.opponent.split(":", 1)[1], "eval")
        elif opts.opponent == "heuristic":
            players[other] = TicTacToeHeuristic(other, seed)
        else:
            players[other] = RandomPlayer(seed)
        rewards, info, turns = play(env, players, seed, int(opts.max_turns), episodes.heartbeat)
        for player, ep in episodes.items():
            parts = seat_reward(None if rewards is None else rewards.get(player),
                                bool((info.get(player) or {}).get("invalid_move")), rewards is None)
            extra = {"turns": float(turns), "calls": float(seats[player].calls),
                     "unreadable": float(seats[player].unreadable), "first": float(player == 0)}
            ep.end(reward=parts["reward"], **{k: v for k, v in parts.items() if k != "reward"}, **extra)
            if player == me:
                out = {**parts, **extra}
    return out
