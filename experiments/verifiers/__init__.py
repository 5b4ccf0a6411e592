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
use, and without it ``check_options`` refuses the run with the pip command.
"""

from __future__ import annotations

from typing import Any

from swarm.client.task import AgentLLM

__all__ = ["DEFAULT_ENV", "OPTIONS", "check_options", "configure", "make_instance", "run_episode"]

DEFAULT_ENV = "experiments.verifiers.echo_env"
OPTIONS: dict[str, Any] = {"env": DEFAULT_ENV, "tool_choice": None}


def _valid(options: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"verifiers: unknown option(s) {unknown}; its options are {sorted(OPTIONS)}")
    env = options.get("env", DEFAULT_ENV)
    if not isinstance(env, str) or not env:
        raise ValueError("verifiers: task.options.env names a taskset module, e.g. experiments.verifiers.echo_env")
    choice = options.get("tool_choice")
    if choice is not None and (not isinstance(choice, str) or not choice):
        raise ValueError("verifiers: task.options.tool_choice is auto, required, none or a tool's name (the first "
                         "model call's tool_choice; unset: the environment's seat decides, else auto)")
    return {"env": env, "tool_choice": choice}


def check_options(options: dict[str, Any]) -> None:
    """Refuse unknown options, a missing library or an environment that does not load, before a run starts."""
    from experiments.verifiers.rollout import library, rows, seats

    opts = _valid(options)
    try:
        library()
    except ImportError as exc:
        raise ValueError(str(exc)) from None
    try:
        if not rows(opts["env"]):
            raise ValueError(f"verifiers: environment {opts['env']!r} has no rows")
        roles = seats(opts["env"])
    except (ImportError, TypeError, AttributeError) as exc:
        raise ValueError(f"verifiers: environment {opts['env']!r} does not load: {exc}") from None
    if len(roles) != 1:
        raise ValueError(f"verifiers: environment {opts['env']!r} has seats {roles}; the adapter runs one-seat "
                         "environments (every seat's calls would share the swarm episode's key and reward)")


def configure(**options: Any) -> dict[str, Any]:
    """Set this process's environment (the worker calls it with ``task.options``); returns the options."""
    OPTIONS.update(_valid(options))
    return dict(OPTIONS)


def make_instance(seed: int) -> dict[str, Any]:
    """``{"seed", "env", "tool_choice"}``: the rollout plays row ``seed % rows`` of the environment's taskset."""
    return {"seed": int(seed), "env": OPTIONS["env"], "tool_choice": OPTIONS["tool_choice"]}


def run_episode(instance: dict[str, Any], llm: AgentLLM) -> dict[str, float]:
    """One verifiers episode against the episode's gateway endpoint; returns the rubric's reward and parts."""
    from experiments.verifiers.rollout import rollout

    return rollout(instance["env"], int(instance["seed"]), llm.base_url, llm.api_key, llm.model, llm.temperature,
                   llm.max_tokens, instance.get("tool_choice"))
