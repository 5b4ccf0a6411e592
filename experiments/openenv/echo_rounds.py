"""The example openenv environment shipped with the repo: a few rounds of "say <word>", each scored.

Written against openenv's own types (``Environment``, ``Action``, ``Observation``, ``State``) and served
by openenv's ``create_app`` like any openenv environment; nothing is downloaded. It mirrors openenv's
``echo_env`` (the action is ``{"message": str}``, the observation echoes it back) but asks for a word in
each of ``ROUNDS`` rounds: ``reset(seed)`` draws the words, each ``step`` scores the message against
the asked word with the echo task's similarity (:func:`experiments.echo.reward.echo_reward`) and asks
for the next one, with the last score as feedback. Step reward = similarity / ``ROUNDS``, so the
episode's return (the sum) is the mean similarity, in [0, 1]; ``done`` after the last round.
Load it as ``task.options.env=experiments.openenv.echo_rounds:EchoRoundsEnv``. It does not know the
swarm task that steps it.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State

from experiments.echo import VERBS, WORDS
from experiments.echo.reward import echo_reward

__all__ = ["ROUNDS", "EchoRoundsAction", "EchoRoundsObservation", "EchoRoundsState", "EchoRoundsEnv"]

ROUNDS = 3


class EchoRoundsAction(Action):
    """The agent's message (openenv's echo_env action shape)."""

    message: str


class EchoRoundsObservation(Observation):
    """The next instruction, and the last message echoed back with its score (``done``/``reward`` from openenv)."""

    prompt: str
    round: int = 0
    echoed_message: str = ""
    last_score: float | None = None


class EchoRoundsState(State):
    """The episode's words and how many rounds were played (``step_count``)."""

    words: list[str] = []


class EchoRoundsEnv(Environment[EchoRoundsAction, EchoRoundsObservation, EchoRoundsState]):
    """``ROUNDS`` rounds of "<verb> <word>"; the reward of a round is its similarity / ``ROUNDS``."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # one instance per WebSocket session, nothing shared

    def __init__(self) -> None:
        super().__init__()
        self._state = EchoRoundsState()
        self._verbs: list[str] = []

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoRoundsObservation:
        """Draw the episode's words from ``seed`` (a random draw without one) and ask for the first."""
        rng = random.Random(seed)
        self._state = EchoRoundsState(episode_id=episode_id or uuid.uuid4().hex, step_count=0,
                                      words=[rng.choice(WORDS) for _ in range(ROUNDS)])
        self._verbs = [rng.choice(VERBS) for _ in range(ROUNDS)]
        return EchoRoundsObservation(prompt=self._ask(0), round=0)

    def step(self, action: EchoRoundsAction, timeout_s: float | None = None, **kwargs: Any) -> EchoRoundsObservation:
        """Score the message against this round's word; ask for the next word, or end after the last round."""
        k = self._state.step_count
        if k >= ROUNDS:
            raise ValueError(f"EchoRoundsEnv: the episode ended after {ROUNDS} rounds; reset it")
        score = echo_reward(action.message, self._state.words[k])["reward"]
        self._state.step_count = k + 1
        done = k + 1 >= ROUNDS
        prompt = f"score {score:.2f}." + ("" if done else f" {self._ask(k + 1)}")
        return EchoRoundsObservation(prompt=prompt, round=k + 1, echoed_message=action.message, last_score=score,
                                     done=done, reward=score / ROUNDS)

    @property
    def state(self) -> EchoRoundsState:
        """The episode's words and rounds played."""
        return self._state

    def _ask(self, k: int) -> str:
        return f"{self._verbs[k]} {self._state.words[k]}"
