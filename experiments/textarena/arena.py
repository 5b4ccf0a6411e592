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
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["PIP_HINT", "OPPONENTS", "ArenaOptions", "library", "legal_moves", "move_schema", "action_of"]

PIP_HINT = "pip install 'swarmpool[envs]' (or: pip install textarena==0.7.4)"
OPPONENTS = ("heuristic", "random")  # or "policy:<name>", a frozen policy served by the gateway
SEATS = ("alternate", 0, 1)
_MOVES_LINE = re.compile(r"(?:available|valid|legal) (?:moves|actions)\s*:?\s*(.*)$", re.I | re.M)
_BRACKETED = re.compile(r"\[([^\[\]\n]{1,40})\]")


def library() -> ModuleType:
    """``textarena``, imported on first use; ImportError naming the pip command when it is absent."""
    try:
        return importlib.import_module("textarena")
    except ModuleNotFoundError as exc:
        raise ImportError(f"the textarena task needs the TextArena library: {PIP_HINT}") from exc


@dataclass
class ArenaOptions:
    """Task options (``task.options``); the README lists each key."""

    env_id: str = "TicTacToe-v0-train"
    opponent: str = "heuristic"
    trainable_player: str | int = "alternate"  # alternate: seat seed % 2, so the policy plays both sides
    constrained: bool = True  # ask for one of the listed legal moves with a strict JSON schema
    max_turns: int = 200      # a game still running after this many moves ends as a draw (timeout)

    @classmethod
    def from_options(cls, options: dict[str, Any] | None) -> ArenaOptions:
        """Validate a plain dict; unknown keys and bad values raise ValueError naming the key and the fix."""
        opts = dict(options or {})
        unknown = sorted(set(opts) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"textarena: unknown option(s) {unknown}; known: {sorted(cls.__dataclass_fields__)}")
        o = cls(**opts)
        if o.opponent not in OPPONENTS and not (o.opponent.startswith("policy:") and len(o.opponent) > 7):
            raise ValueError(f"textarena: opponent={o.opponent!r}; use one of {OPPONENTS} or 'policy:<name>'")
        if o.opponent == "heuristic" and not o.env_id.startswith("TicTacToe-"):
            raise ValueError(f"textarena: the heuristic opponent plays TicTacToe only; for {o.env_id} use "
                             "opponent=random (games that list their legal moves) or opponent=policy:<name>")
        if o.trainable_player not in SEATS:
            raise ValueError(f"textarena: trainable_player={o.trainable_player!r}; use one of {SEATS}")
        if int(o.max_turns) < 1:
            raise ValueError(f"textarena: max_turns={o.max_turns!r}; use an integer >= 1")
        return o

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
