"""cocktail: several single-episode tasks trained into one policy, mixed by per-task ratios.

``make_instance(seed)`` draws a sub-task by weight from the mix (seeded, so the same seed
gives the same sub-task and instance) and returns ``{"task": name, "instance": sub_instance,
"seed": sub_seed}``; the worker records the episode under ``instance["task"]``, so per-task
metrics stay separate. ``run_episode`` delegates to that task's ``run_episode``.

The mix is ``task.options.mix`` (:class:`Options`; weights need not sum to 1), :data:`DEFAULT_MIX`
when unset; its sub-tasks are loaded when the run is checked (:meth:`Options.check`). No environment
variables are read. Multi-agent tasks (``run_multiagent`` only) cannot be mixed in. This module has
no reward of its own: each sub-task's reward is reported as is (each sub-task runs on its own default
options).
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field, field_validator

from swarm.client import AgentLLM, TaskOptions, TaskPackage, load_task

__all__ = ["DEFAULT_MIX", "Options", "make_instance", "run_episode", "pick_task"]

DEFAULT_MIX: dict[str, float] = {"echo": 0.5, "math": 0.5}
_TASKS: dict[str, TaskPackage] = {}


def _task(name: str) -> TaskPackage:
    if name not in _TASKS:
        task = load_task(name)
        if task.run_episode is None:
            raise ValueError(f"cocktail: task {name!r} has no run_episode (multi-agent tasks cannot be mixed)")
        _TASKS[name] = task
    return _TASKS[name]


class Options(TaskOptions):
    """``task.options``: ``mix``, task name -> weight (numbers >= 0, at least one positive)."""

    mix: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_MIX))

    @field_validator("mix", mode="before")
    @classmethod
    def _weights(cls, mix: Any) -> Any:
        if not isinstance(mix, dict):
            return mix  # the type's own message
        if not mix:
            raise ValueError("the mix is empty; give at least one task, e.g. {echo: 1.0}")
        for name, weight in mix.items():
            if name == "cocktail":
                raise ValueError("a cocktail cannot contain itself")
            if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight < 0:
                raise ValueError(f"weight of {name!r} must be a number >= 0, got {weight!r}")
        if sum(mix.values()) <= 0:
            raise ValueError("all weights are 0; give at least one task a positive weight")
        return mix

    def check(self) -> None:
        """Every task of the mix loads and has a ``run_episode``."""
        for name in self.mix:
            try:
                _task(name)
            except ValueError as exc:
                raise ValueError(f"task.options.mix: {exc}") from None


def pick_task(seed: int, mix: dict[str, float] | None = None) -> tuple[str, int]:
    """(sub-task name, sub-instance seed) for a seed: a weighted draw, then an independent seed."""
    mix = Options.current().mix if mix is None else mix
    rng = random.Random(f"cocktail-{seed}")
    names = sorted(mix)  # sorted: the draw must not depend on dict insertion order
    name = rng.choices(names, weights=[mix[n] for n in names])[0]
    return name, rng.getrandbits(48)


def make_instance(seed: int) -> dict[str, Any]:
    """``{"task", "instance", "seed"}``: the drawn sub-task, its instance and the seed it came from."""
    name, sub_seed = pick_task(seed)
    return {"task": name, "instance": _task(name).make_instance(sub_seed), "seed": sub_seed}


def run_episode(instance: dict[str, Any], llm: AgentLLM) -> dict[str, float]:
    """Run the sub-task's agent on its instance; returns that task's reward parts unchanged."""
    run = _task(instance["task"]).run_episode
    assert run is not None
    return run(instance["instance"], llm)
