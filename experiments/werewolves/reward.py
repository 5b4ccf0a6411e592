"""Rewards of the werewolves task: the team result, a per-player format penalty and optional vote shaping.

    player_reward = float(won)
                    - min(MAX_PENALTY, FORMAT_PENALTY * format_errors)
                    + vote_shaping * (paid votes / votes cast)   [0 when no votes]

  paid votes (``vote_shaping_pays``): "eliminated" (default) the votes that eliminated a member of
  the other side; "named" the votes that named one.

- ``won``: the player's side won the game (1/0); this is what the task is scored on.
- the format penalty (``FORMAT_PENALTY = 0.1`` per decision whose answer was unparsable or
  illegal, capped at ``MAX_PENALTY = 0.5``) only bites on backends that do not enforce the
  JSON schema; with constrained decoding no decision is malformed.
- vote shaping (``vote_shaping``, a task option, 0 by default, at most 0.5) is documented
  shaping: the *fraction* of the player's day votes that eliminated a member of the other side
  (the vote named the player the day's vote put out, and that player was an opponent). It pays
  for what the team needs, agreeing on the right player, not for a lone correct vote that
  changes nothing (measured: tabular policy-gradient runs of the vote in
  ``benchmarks/werewolves_shaping.py``). A fraction, not a count, so a player who dies early
  earns nothing for it, and with ``vote_shaping <= 0.5`` a losing player never outscores a
  winning one without penalties.
  ``vote_shaping_pays="named"`` pays instead the fraction of the player's votes that *named* a
  member of the other side, agreed on or not: the direct signal for reading the prompt (who a
  seer claim accused), which a model that can copy a number from its prompt learns from and
  the agreement shaping pays only once enough voters follow.
  Where the gateway told us the step of each vote, :func:`vote_step_rewards` gives every vote
  step its own reward (the same formula with that one vote as the fraction), so the mean over
  a player's vote steps is the player's reward and each vote gets its own credit.

:func:`side_reward` averages the players of the trainable side for logging. These are plain
functions of the game result; nothing here opens or ends episodes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from experiments.werewolves.game import GameResult, side_of

__all__ = ["FORMAT_PENALTY", "MAX_PENALTY", "MAX_VOTE_SHAPING", "SHAPING_PAYS", "paid_votes", "player_reward", "side_reward", "vote_record",
           "vote_step_rewards"]

FORMAT_PENALTY = 0.1
MAX_PENALTY = 0.5
MAX_VOTE_SHAPING = 0.5
SHAPING_PAYS = ("eliminated", "named")  # what vote shaping pays: votes that put an opponent out / that named one
_VOTE = re.compile(r"(\d+)->(\d+)")


def _ballots(result: GameResult, roles: Sequence[str]) -> Iterator[tuple[int, int, int, bool, bool]]:
    """(round, voter, target, hit, kill) per day vote: ``hit`` the target is on the voter's other side,
    ``kill`` such a vote whose target the day put out."""
    for e in result.events:
        if e.kind == "vote":
            for voter, target in _VOTE.findall(e.text.split(".")[0]):
                v, t = int(voter), int(target)
                hit = side_of(roles[t]) != side_of(roles[v])
                yield e.round, v, t, hit, hit and e.target == t


def vote_record(result: GameResult, roles: Sequence[str]) -> dict[int, tuple[int, int, int]]:
    """player -> (votes cast, votes for a member of the other side, such votes that eliminated that player)."""
    out: dict[int, tuple[int, int, int]] = {}
    for _, v, _, hit, kill in _ballots(result, roles):
        cast, hits, kills = out.get(v, (0, 0, 0))
        out[v] = (cast + 1, hits + hit, kills + kill)
    return out


def player_reward(won: bool, format_errors: int, votes: int = 0, vote_kills: int = 0,
                  vote_shaping: float = 0.0) -> dict[str, float]:
    """``{"reward", "win", "format_penalty", "format_errors", "vote_bonus"}`` for one player.

    ``vote_kills``: the player's votes that shaping pays (``vote_shaping_pays``: by default those that
    eliminated a member of the other side).
    """
    if not 0.0 <= vote_shaping <= MAX_VOTE_SHAPING:
        raise ValueError(f"vote_shaping={vote_shaping}; use 0 <= vote_shaping <= {MAX_VOTE_SHAPING}")
    penalty = -min(MAX_PENALTY, FORMAT_PENALTY * format_errors)
    bonus = vote_shaping * vote_kills / votes if votes else 0.0
    return {"reward": float(won) + penalty + bonus, "win": float(won), "format_penalty": penalty,
            "format_errors": float(format_errors), "vote_bonus": bonus}


def paid_votes(hits: int, kills: int, pays: str) -> int:
    """The votes vote shaping pays: ``kills`` for ``pays="eliminated"``, ``hits`` for ``"named"``."""
    _check_pays(pays)
    return kills if pays == "eliminated" else hits


def _check_pays(pays: str) -> None:
    if pays not in SHAPING_PAYS:
        raise ValueError(f"vote_shaping_pays={pays!r}; use one of {SHAPING_PAYS}")


def side_reward(result: GameResult, roles: Sequence[str], side: str, players: Sequence[int],
                vote_shaping: float = 0.0, pays: str = "eliminated") -> dict[str, float]:
    """``{"reward", "win", "format_penalty", "vote_bonus", "rounds"}``: the mean over ``players`` of ``side``.

    ``players`` are the seats whose format errors count (the LLM-controlled ones); with none
    the reward is the bare team result.
    """
    _check_pays(pays)
    won = result.winner == side
    if any(side_of(roles[p]) != side for p in players):
        raise ValueError(f"players {list(players)} are not all on side {side!r}")
    votes = vote_record(result, roles)
    parts = []
    for p in players:
        cast, hits, kills = votes.get(p, (0, 0, 0))
        parts.append(player_reward(won, result.format_errors[p], cast, paid_votes(hits, kills, pays),
                                   vote_shaping=vote_shaping))
    parts = parts or [player_reward(won, 0)]
    n = len(parts)
    return {"reward": sum(p["reward"] for p in parts) / n, "win": float(won),
            "format_penalty": sum(p["format_penalty"] for p in parts) / n,
            "vote_bonus": sum(p["vote_bonus"] for p in parts) / n, "rounds": float(result.rounds)}


def vote_step_rewards(result: GameResult, roles: Sequence[str], player: int, vote_steps: dict[int, str],
                      vote_shaping: float, pays: str = "eliminated") -> dict[str, float]:
    """step id -> reward for ``player``'s vote steps (``vote_steps``: round -> step id); see the module docstring."""
    _check_pays(pays)
    won = result.winner == side_of(roles[player])
    out: dict[str, float] = {}
    for rnd, voter, _, hit, kill in _ballots(result, roles):
        if voter == player and rnd in vote_steps:
            out[vote_steps[rnd]] = player_reward(won, result.format_errors[player], 1, paid_votes(hit, kill, pays),
                                                 vote_shaping)["reward"]
    return out
