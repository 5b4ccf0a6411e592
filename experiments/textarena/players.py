"""Players of a TextArena game: an LLM seat behind the gateway, a random player and a TicTacToe heuristic.

Each player is ``act(observation, env) -> action string``. The LLM seat makes one chat call per turn
(the observation as the user message; with ``constrained`` and a listed set of legal moves, a strict
JSON schema of those moves); it never crashes the game on a bad reply: TextArena judges the action.
The rule-based players draw from ``random.Random(f"{kind}-{seed}-{turn}")``, so the games of one GRPO
group (one seed) meet the same opponent.
"""

from __future__ import annotations

import random
from typing import Any

from experiments.textarena.arena import action_of, legal_moves, move_schema
from swarm.client.task import AgentLLM

__all__ = ["LLMSeat", "RandomPlayer", "TicTacToeHeuristic"]

_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


class LLMSeat:
    """One LLM-played seat: its episode's endpoint and policy; counts calls and unusable replies."""

    def __init__(self, llm: AgentLLM, constrained: bool = True) -> None:
        self.llm, self.constrained = llm, constrained
        self.calls = 0
        self.unreadable = 0  # constrained replies without a move (cut short by max_tokens)

    def act(self, observation: str, env: Any) -> str:
        moves = legal_moves(observation) if self.constrained else []
        kwargs: dict[str, Any] = {"response_format": move_schema(moves)} if moves else {}
        self.calls += 1
        reply = self.llm.chat([{"role": "user", "content": observation}], **kwargs).content or ""
        action = action_of(reply, bool(moves))
        if moves and not action.startswith("["):
            self.unreadable += 1
        return action


class RandomPlayer:
    """A uniformly random legal move from the observation's list (``[0]`` when the game lists none)."""

    def __init__(self, seed: int) -> None:
        self.seed, self.turn = seed, 0

    def act(self, observation: str, env: Any) -> str:
        self.turn += 1
        moves = legal_moves(observation)
        return f"[{random.Random(f'random-{self.seed}-{self.turn}').choice(moves)}]" if moves else "[0]"


class TicTacToeHeuristic:
    """Win if it can, else block the opponent's line, else the centre, a corner, any cell (seeded choice)."""

    def __init__(self, player: int, seed: int) -> None:
        self.mark = "X" if player == 1 else "O"  # TextArena's TicTacToe: player 1 is X
        self.seed, self.turn = seed, 0

    def act(self, observation: str, env: Any) -> str:
        self.turn += 1
        board = [c for row in env.state.game_state["board"] for c in row]
        return f"[{self.choose(board, random.Random(f'heuristic-{self.seed}-{self.turn}'))}]"

    def choose(self, board: list[str], rng: random.Random) -> int:
        """The cell to play on a flat board of '', 'X', 'O'."""
        other = "O" if self.mark == "X" else "X"
        free = [i for i, c in enumerate(board) if not c]
        for mark in (self.mark, other):  # complete our line, else block theirs
            for line in _LINES:
                cells = [board[i] for i in line]
                if cells.count(mark) == 2 and cells.count("") == 1:
                    return line[cells.index("")]
        if 4 in free:
            return 4
        corners = [i for i in (0, 2, 6, 8) if i in free]
        return rng.choice(corners or free)
