"""verifiers: a verifiers (v1) environment as a swarm task, its rubric as the reward.

``python -m flows.train --config-dir experiments/verifiers/conf +task=verifiers task.options.env=<taskset module>``
(in a venv with verifiers; the task file lives beside the package, see its README) runs the
environment's own episode for each swarm episode (:mod:`experiments.verifiers.rollout`): verifiers'
interception server relays the seat's model calls to the episode's gateway URL with its key, so every
call is recorded as a step; the task's ``@vf.reward`` functions score the trace and their weighted sum
is the reward. Row ``seed % rows`` of the taskset is the instance, so a GRPO group is one row. An
environment may drive several turns (its ``Env.run`` through ``interaction()``) and serve tools (its
``Toolset`` MCP servers); ``task.options.tool_choice`` sets the ``tool_choice`` of each rollout's first
model call. The example environments (:mod:`experiments.verifiers.echo_env`, one call;
:mod:`experiments.verifiers.lookup_env`, a tool call and a feedback turn) are built offline. verifiers 0.4.0
needs ``openai<3`` and cannot share the project's venv (docs/environments.md); it is imported on first
use, and without it the run is refused at start-up with the pip command (:meth:`Options.check`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from swarm.client import AgentLLM, TaskOptions

__all__ = ["DEFAULT_ENV", "Options", "make_instance", "run_episode"]

DEFAULT_ENV = "experiments.verifiers.echo_env"


class Options(TaskOptions):
    """Task options (``task.options``); the README lists each key."""

    env: str = Field(default=DEFAULT_ENV, min_length=1)  # the taskset module, e.g. experiments.verifiers.echo_env
    tool_choice: str | None = Field(default=None, min_length=1)  # the first model call's tool_choice: auto, required,
    #                                                               none or a tool's name (unset: the seat decides)

    def check(self) -> None:
        """The library imports and the environment loads, has rows and one seat."""
        from experiments.verifiers.rollout import library, rows, seats

        library()
        try:
            if not rows(self.env):
                raise ValueError(f"verifiers: environment {self.env!r} has no rows")
            roles = seats(self.env)
        except (ImportError, TypeError, AttributeError) as exc:
            raise ValueError(f"verifiers: environment {self.env!r} does not load: {exc}") from None
        if len(roles) != 1:
            raise ValueError(f"verifiers: environment {self.env!r} has seats {roles}; the adapter runs one-seat "
                             "environments (every seat's calls would share the swarm episode's key and reward)")


def make_instance(seed: int) -> dict[str, Any]:
    """``{"seed", "env", "tool_choice"}``: the rollout plays row ``seed % rows`` of the environment's taskset."""
    opts = Options.current()
    return {"seed": int(seed), "env": opts.env, "tool_choice": opts.tool_choice}


def run_episode(instance: dict[str, Any], llm: AgentLLM) -> dict[str, float]:
    """One verifiers episode against the episode's gateway endpoint; returns the rubric's reward and parts."""
    from experiments.verifiers.rollout import rollout

    return rollout(instance["env"], int(instance["seed"]), llm.base_url, llm.api_key, llm.model, llm.temperature,
                   llm.max_tokens, instance.get("tool_choice"))
