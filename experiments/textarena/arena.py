"""The TextArena side of the adapter: options, the lazy library import and the legal moves of an observation.

TextArena games are text in, text out: each turn a player gets an observation string and answers
an action string such as ``[4]``; the environment judges it (an illegal move is answered once with
a warning, then loses the game: TextArena's own rule). Many games list their legal moves in the
observation (``Available Moves: '[0]', '[4]'``); :func:`legal_moves` reads that list, so a random
player and constrained decoding work on any game that prints one. This module plays nothing
(see :mod:`experiments.textarena.game`).
"""

from __future__ import annotations

import importlib
import re
from types import ModuleType
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from swarm.client import TaskOptions
from swarm.client.options import import_optional

__all__ = ["PIP_HINT", "OPPONENTS", "Options", "library", "check_env", "legal_moves", "move_schema", "action_of"]

PIP_HINT = "pip install 'swarmpool[envs]' (or: pip install textarena==0.7.4)"
OPPONENTS = ("heuristic", "random")  # or "policy:<name>", a frozen policy served by the gateway
_MOVES_LINE = re.compile(r"(?:available|valid|legal) (?:moves|actions)\s*:?\s*(.*)$", re.I | re.M)
_BRACKETED = re.compile(r"\[([^\[\]\n]{1,40})\]")


def library() -> ModuleType:
    """``textarena``, imported on first use; ImportError naming the pip command when it is absent."""
    return import_optional("textarena", f"the textarena task needs the TextArena library: {PIP_HINT}")


class Options(TaskOptions):
    """Task options (``task.options``); the README lists each key."""

    env_id: str = "TicTacToe-v0-train"
    opponent: str = "heuristic"  # heuristic (TicTacToe) | random | policy:<name>
    trainable_player: Literal["alternate", 0, 1] = "alternate"  # alternate: seat seed % 2, so the policy plays both
    constrained: bool = True  # ask for one of the listed legal moves with a strict JSON schema
    max_turns: int = Field(default=200, ge=1)  # a game still running after this many moves ends as a draw (timeout)

    @field_validator("opponent")
    @classmethod
    def _opponent(cls, opponent: str, info: ValidationInfo) -> str:
        if opponent not in OPPONENTS and not (opponent.startswith("policy:") and len(opponent) > 7):
            raise ValueError(f"use one of {OPPONENTS} or 'policy:<name>'")
        env_id = info.data.get("env_id", "")
        if opponent == "heuristic" and env_id and not env_id.startswith("TicTacToe-"):
            raise ValueError(f"the heuristic opponent plays TicTacToe only; for {env_id} use opponent=random "
                             "(games that list their legal moves) or opponent=policy:<name>")
        return opponent

    def check(self) -> None:
        """The library imports and ``env_id`` is a two-player game that loads here (see :func:`check_env`)."""
        check_env(self.env_id, self.opponent)

    def seat(self, seed: int) -> int:
        """The trained player's id in the game of ``seed``."""
        return int(seed) % 2 if self.trainable_player == "alternate" else int(self.trainable_player)


def check_env(env_id: str, opponent: str = "heuristic") -> None:
    """Raise ValueError unless TextArena registers ``env_id`` as a two-player game that loads here (and, for
    the random opponent, lists its legal moves)."""
    ta = library()
    registry = importlib.import_module("textarena.envs.registration").ENV_REGISTRY
    if env_id not in registry:
        close = sorted(k for k in registry if k.split("-")[0].lower() == env_id.split("-")[0].lower())
        raise ValueError(f"textarena: no environment {env_id!r}" + (f"; did you mean one of {close}?" if close else ""))
    try:  # textarena 0.7.4's Chess, Checkers and ReverseTicTacToe use Python 3.12 f-strings: SyntaxError on 3.11
        env = ta.make(env_id=env_id)
    except Exception as exc:  # noqa: BLE001 - whatever importing the game's module raised, said in one line
        raise ValueError(f"textarena: {env_id} does not load here: {type(exc).__name__}: {exc}") from None
    try:
        env.reset(num_players=2, seed=0)
    except Exception as exc:  # noqa: BLE001 - a game for another number of players refuses 2 in its own way
        raise ValueError(f"textarena: {env_id} cannot be played by two players: {exc}") from None
    if opponent == "random" and not legal_moves(env.get_observation()[1]):
        raise ValueError(f"textarena: {env_id} does not list its legal moves, so opponent=random cannot play it; "
                         "use opponent=policy:<name>")


def legal_moves(observation: str) -> list[str]:
    """The moves the latest "Available Moves: '[a]', '[b]'" line of an observation lists (bracket contents)."""
    found = _MOVES_LINE.findall(observation or "")
    return _BRACKETED.findall(found[-1]) if found else []


def move_schema(moves: list[str]) -> dict[str, Any]:
    """A strict ``response_format`` asking for one of ``moves`` (integers when every move is a number)."""
    numeric = all(m.strip().isdigit() for m in moves)
    prop = {"type": "integer", "enum": [int(m) for m in moves]} if numeric else {"type": "string", "enum": moves}
    return {"type": "json_schema", "json_schema": {"name": "move", "strict": True, "schema": {
        "type": "object", "properties": {"move": prop}, "required": ["move"], "additionalProperties": False}}}


def action_of(reply: str, constrained: bool) -> str:
    """The action string to send: ``[move]`` from a constrained JSON reply, else the reply itself."""
    if constrained:
        match = re.search(r'"move"\s*:\s*"?([^",}]+)"?', reply or "")
        if match:
            return f"[{match.group(1).strip()}]"
    return (reply or "").strip()
