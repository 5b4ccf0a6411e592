"""echo: the tiny learnable default task. The user says "<verb> <word>"; the agent must answer
with exactly that word. Reward = character similarity (see :mod:`experiments.echo.reward`).

Chosen so the warm-started tiny model scores low at first and GRPO on a CPU raises the mean
reward clearly within minutes: one short turn, a dense reward, 16 words.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from experiments.echo.loops import LOOPS, require
from experiments.echo.reward import echo_reward
from swarm.client import AgentLLM, TaskOptions

__all__ = ["WORDS", "VERBS", "Options", "make_instance", "run_episode", "echo_reward"]

WORDS = ("apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "candle",
         "garden", "rocket", "silver", "window", "forest", "button", "planet", "castle")
VERBS = ("say", "repeat", "echo")


class Options(TaskOptions):
    """``task.options``: ``loop``, the client stack that sends the turn (see :mod:`experiments.echo.loops`)."""

    loop: Literal["openai", "langchain", "langgraph", "httpx"] = "openai"

    def check(self) -> None:
        """The loop's framework imports (ImportError naming the package to install otherwise)."""
        require(self.loop)


def make_instance(seed: int) -> dict[str, Any]:
    """A deterministic instance: which verb and which word."""
    rng = random.Random(seed)
    return {"verb": rng.choice(VERBS), "word": rng.choice(WORDS)}


def run_episode(instance: dict[str, Any], llm: AgentLLM) -> dict[str, float]:
    """One turn through the configured loop (the OpenAI SDK by default): ask, read the reply, score it."""
    reply = LOOPS[Options.current().loop]([{"role": "user", "content": f"{instance['verb']} {instance['word']}"}], llm)
    return echo_reward(reply, instance["word"])
