"""One werewolves game against a gateway: which seats are LLMs, their episodes and their rewards.

:func:`run_multiagent` (the worker's entry point) reads the process's :class:`Options`, opens one
episode per LLM-controlled seat (``type`` = the group's kind for the trainable side, ``"eval"`` for
frozen opponents so they are never trained), plays the game with each seat's calls going through its
own episode key and policy (``model``), and ends every episode with ``player_reward``. Rule-based
seats open no episode. If anything fails, every open episode of the game is aborted and the error
re-raised (:class:`swarm.client.EpisodeSet`). This module has no game rules (see
:mod:`experiments.werewolves.game`).
"""

from __future__ import annotations

import random
import secrets
from typing import Any, Literal

from pydantic import Field, field_validator

from experiments.werewolves.game import MAX_ROUNDS, Action, Decision, Game, side_of
from experiments.werewolves.heuristic import HeuristicPlayer
from experiments.werewolves.llm_player import ALL_KINDS, LLMPlayer, openai_chat
from experiments.werewolves.reward import (
    MAX_VOTE_SHAPING,
    SHAPING_PAYS,
    paid_votes,
    player_reward,
    side_reward,
    vote_record,
    vote_step_rewards,
)
from swarm.client import EpisodeSet, TaskOptions

__all__ = ["Options", "WerewolvesOptions", "run_multiagent", "HEARTBEAT_S"]

HEARTBEAT_S = 10.0
ROLE_NAMES = ("werewolf", "villager", "seer", "witch", "hunter")


class Options(TaskOptions):
    """Task options (``task.options``); see the README for each key."""

    trainable_side: Literal["wolves", "village"] = "village"
    role_policies: dict[str, str] = Field(default_factory=dict)  # role of the trainable side -> policy name
    opponents: str = "heuristic"  # or policy:<name>
    max_rounds: int = Field(default=MAX_ROUNDS, ge=1, le=MAX_ROUNDS)
    day_discussion: int = Field(default=1, ge=0)
    max_tokens: int | None = None
    temperature: float | None = None
    observation: Literal["compact", "transcript"] = "compact"
    constrained: bool = True
    llm_decisions: list[str] = Field(default_factory=lambda: list(ALL_KINDS), min_length=1)
    vote_shaping: float = Field(default=0.0, ge=0.0, le=MAX_VOTE_SHAPING)
    vote_shaping_pays: str = "eliminated"

    @field_validator("role_policies")
    @classmethod
    def _roles(cls, role_policies: dict[str, str]) -> dict[str, str]:
        if not set(role_policies) <= set(ROLE_NAMES):
            raise ValueError(f"map roles {ROLE_NAMES} to policy names")
        return role_policies

    @field_validator("opponents")
    @classmethod
    def _opponents(cls, opponents: str) -> str:
        if opponents != "heuristic" and not (opponents.startswith("policy:") and len(opponents) > 7):
            raise ValueError("use 'heuristic' or 'policy:<name>'")
        return opponents

    @field_validator("llm_decisions")
    @classmethod
    def _decisions(cls, kinds: list[str]) -> list[str]:
        if not set(kinds) <= set(ALL_KINDS):
            raise ValueError(f"use a non-empty subset of {ALL_KINDS}")
        return kinds

    @field_validator("vote_shaping_pays")
    @classmethod
    def _pays(cls, pays: str) -> str:
        if pays not in SHAPING_PAYS:
            raise ValueError(f"use one of {SHAPING_PAYS}")
        return pays

    def seat_policy(self, role: str, default: str) -> tuple[str | None, str]:
        """(policy name or None for a rule-based seat, episode type) of a seat with this role."""
        if side_of(role) == self.trainable_side:
            return self.role_policies.get(role, default), "train"
        if self.opponents.startswith("policy:"):
            return self.opponents.split(":", 1)[1], "eval"
        return None, ""


WerewolvesOptions = Options  # the name benchmarks/werewolves_bench.py imports


def run_multiagent(instance: dict[str, Any], client: Any, group_id: str, cfg: Any, kind: str = "train"
                   ) -> dict[str, float]:
    """Play one game; returns the trainable side's reward parts and game statistics.

    ``kind`` is the episode type of the trainable seats ("train" or "eval"). An eval game with
    ``cfg.group_size == 1`` (the bench's held-out games) replays exactly: every LLM call asks for a
    sampling seed derived from (game seed, player, call index) and the rule fallbacks are seeded, so the
    same weights play the same game on any run and machine. The returned dict:
    ``reward``, ``win``, ``format_penalty``, ``vote_bonus``, ``rounds`` (means over the trainable
    LLM seats, see :func:`side_reward`), ``format_error_rate`` (invalid answers per LLM decision of
    the trainable side) and ``llm_calls`` (per trainable seat).
    """
    opts = Options.current()
    seed, roles = int(instance["seed"]), list(instance["roles"])
    wolves = [i for i, r in enumerate(roles) if r == "werewolf"]
    max_tokens = opts.max_tokens or cfg.max_tokens
    temperature = cfg.temperature if opts.temperature is None else opts.temperature
    agents: list[Any] = []
    game_id = secrets.token_hex(8)  # the seats of one game (several games of a group share the group id)
    # an eval game that is its seed's only game replays exactly: seeded sampling per call and seeded rule
    # fallbacks, so the same weights give the same game on every run (before/after pairs share their randomness)
    replay = kind == "eval" and int(getattr(cfg, "group_size", 0)) == 1
    with EpisodeSet(client, HEARTBEAT_S) as episodes:  # a failing game aborts its open episodes
        for i, role in enumerate(roles):
            policy, ep_type = opts.seat_policy(role, cfg.model)
            if policy is None:
                agents.append(HeuristicPlayer(i, seed))
                continue
            ep_type = kind if ep_type == "train" else ep_type
            ep = episodes.begin(i, task="werewolves", group_id=group_id, type=ep_type, client_id=cfg.client_id,
                                timeout_s=cfg.episode_timeout_s,
                                metadata={"role": role, "player": i, "seed": seed, "policy": policy, "game": game_id})
            chat = openai_chat(ep.openai(max_retries=0), policy, temperature, max_tokens,
                               seed=f"eval-{seed}-{i}" if replay else None)
            agents.append(LLMPlayer(i, role, wolves, seed, chat, observation=opts.observation,
                                    constrained=opts.constrained, llm_kinds=opts.llm_decisions))

        def heartbeat(_d: Decision, _a: Action) -> None:
            episodes.heartbeat()

        # fallbacks draw from fresh randomness: two games of one seed (a training group) must not share them
        fallback = None if replay else random.Random(secrets.randbits(64))
        game = Game(roles, seed, opts.max_rounds, opts.day_discussion, fallback_rng=fallback)
        result = game.play(agents, heartbeat)
        votes = vote_record(result, roles)
        for i, ep in episodes.items():
            shaping = opts.vote_shaping if side_of(roles[i]) == opts.trainable_side else 0.0
            cast, hits, kills = votes.get(i, (0, 0, 0))
            parts = player_reward(result.winner == side_of(roles[i]), result.format_errors[i], cast,
                                  paid_votes(hits, kills, opts.vote_shaping_pays),
                                  vote_shaping=shaping)
            player = agents[i]
            steps = None
            if shaping:
                steps = vote_step_rewards(result, roles, i, {r: sid for k, r, sid in player.steps if k == "vote"},
                                          shaping, opts.vote_shaping_pays)
            ep.end(reward=parts.pop("reward"), step_rewards=steps or None, **parts, rounds=float(result.rounds),
                   calls=float(player.calls), llm_errors=float(player.llm_errors), timeout=float(result.timeout),
                   format_error_rate=result.format_errors[i] / player.calls if player.calls else 0.0,
                   votes=float(cast), vote_hits=float(hits), vote_kills=float(kills),
                   **{f"win_{roles[i]}": parts["win"]})
        trainable = [i for i in episodes if side_of(roles[i]) == opts.trainable_side]
    out = side_reward(result, roles, opts.trainable_side, trainable, opts.vote_shaping, opts.vote_shaping_pays)
    calls = sum(agents[i].calls for i in trainable)
    out["format_error_rate"] = sum(result.format_errors[i] for i in trainable) / calls if calls else 0.0
    out["llm_calls"] = calls / len(trainable) if trainable else 0.0
    return out
