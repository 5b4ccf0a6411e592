"""A test task: echo, but every odd-seeded group is scored flat (0.5 for every member), like a judge
that cannot tell the replies apart. The C3 flow test runs it as the flow's real workers' task
(``task.name=tests.flows.half_flat_echo``) so zero-variance groups really reach the pool."""

from __future__ import annotations

from typing import Any

from experiments.echo import make_instance as echo_instance
from experiments.echo import run_episode as echo_episode
from swarm.client.task import AgentLLM

__all__ = ["FLAT_REWARD", "make_instance", "run_episode"]

FLAT_REWARD = 0.5


def make_instance(seed: int) -> dict[str, Any]:
    """The echo instance for ``seed``, marked flat when the seed is odd; recorded under task ``echo``."""
    return {**echo_instance(seed), "flat": seed % 2 == 1, "task": "echo"}


def run_episode(instance: dict[str, Any], llm: AgentLLM) -> dict[str, float]:
    """Run the echo turn for real; a flat instance's reward is FLAT_REWARD whatever the reply."""
    parts = echo_episode(instance, llm)
    return {**parts, "reward": FLAT_REWARD} if instance["flat"] else parts
