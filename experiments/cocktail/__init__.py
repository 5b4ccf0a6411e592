"""cocktail: several single-episode tasks trained into one policy, mixed by per-task ratios.

``make_instance(seed)`` draws a sub-task by weight from :data:`MIX` (seeded, so the same seed
gives the same sub-task and instance) and returns ``{"task": name, "instance": sub_instance,
"seed": sub_seed}``; the worker records the episode under ``instance["task"]``, so per-task
metrics stay separate. ``run_episode`` delegates to that task's ``run_episode``.

The mix is module state, set before workers start: ``configure({"echo": 1, "math": 3})``
(weights need not sum to 1), or ``configure()`` to restore :data:`DEFAULT_MIX`. No
environment variables are read. Multi-agent tasks (``run_multiagent`` only) cannot be
mixed in. This module has no reward of its own: each sub-task's reward is reported as is.
"""

from __future__ import annotations

import random
from typing import Any

from swarm.client.task import AgentLLM, TaskPackage, load_task

__all__ = ["DEFAULT_MIX", "MIX", "check_options", "configure", "make_instance", "run_episode", "pick_task"]

DEFAULT_MIX: dict[str, float] = {"echo": 0.5, "math": 0.5}
MIX: dict[str, float] = dict(DEFAULT_MIX)
_TASKS: dict[str, TaskPackage] = {}


def _task(name: str) -> TaskPackage:
    if name not in _TASKS:
        task = load_task(name)
        if task.run_episode is None:
            raise ValueError(f"cocktail: task {name!r} has no run_episode (multi-agent tasks cannot be mixed)")
        _TASKS[name] = task
    return _TASKS[name]


def _valid_mix(mix: dict[str, float] | None) -> dict[str, float]:
    """``mix`` (``None``: the default) as floats, after checking every task and weight."""
    mix = dict(DEFAULT_MIX if mix is None else mix)
    if not mix:
        raise ValueError("cocktail: the mix is empty; give at least one task, e.g. {'echo': 1.0}")
    for name, weight in mix.items():
        if name == "cocktail":
            raise ValueError("cocktail: a cocktail cannot contain itself")
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight < 0:
            raise ValueError(f"cocktail: weight of {name!r} must be a number >= 0, got {weight!r}")
        _task(name)
    if sum(mix.values()) <= 0:
        raise ValueError("cocktail: all weights are 0; give at least one task a positive weight")
    return {k: float(v) for k, v in mix.items()}


def check_options(options: dict[str, Any]) -> None:
    """Refuse a bad mix at start-up, before any worker runs (the flow calls it; MIX is not changed)."""
    unknown = sorted(set(options) - {"mix"})
    if unknown:
        raise ValueError(f"cocktail: unknown option(s) {unknown}; its only option is mix")
    _valid_mix(options.get("mix"))


def configure(mix: dict[str, float] | None = None) -> dict[str, float]:
    """Set the mixing weights (``None``: the default); validates every task; returns the mix in use."""
    valid = _valid_mix(mix)
    MIX.clear()
    MIX.update(valid)
    return dict(MIX)


def pick_task(seed: int, mix: dict[str, float] | None = None) -> tuple[str, int]:
    """(sub-task name, sub-instance seed) for a seed: a weighted draw, then an independent seed."""
    mix = MIX if mix is None else mix
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
