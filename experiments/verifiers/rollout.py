"""Run one verifiers rollout against a swarm gateway: the environment's own episode, scored by its rubric.

:func:`load_env` builds a verifiers v1 environment from a taskset id (a module or installed entry point
exporting a ``Taskset`` subclass, and optionally an ``Env`` subclass whose ``run()`` drives several turns
through ``agents.<seat>.interaction(task)``). Its one seat runs the in-process harness
(:mod:`experiments.verifiers.harness`) in the local subprocess runtime; the seat's declared in-process
harness knobs are kept, and ``tool_choice`` (when given) overrides its ``first_tool_choice``. The
environment stays inside ``env.serving()`` for the life of the process (:mod:`experiments.verifiers.serving`),
so its taskset's tool servers start once. :func:`rollout` runs ``env.run_episode(task, ctx)`` with the model
context's OpenAI client pointed at the episode's gateway URL and key; the rubric's weighted rewards are the
reward. verifiers reads an endpoint's key from an environment variable, so each rollout sets its own
uniquely named variable for its duration. Nothing here knows the swarm SDK.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import os
import sys
import threading
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

from experiments.verifiers.plugins import HARNESS_ID, plugin_id

__all__ = ["PIP_HINT", "library", "plugin_id", "seats", "load_env", "rows", "rollout"]

PIP_HINT = ("pip install verifiers==0.4.0 (in its own venv: it needs openai<3, which the project's openai 3.x "
            "and the 'agents' extra's openai-agents>=3 refuse; docs/environments.md)")
MAX_ROWS = 100_000  # an infinite taskset's rows are read up to here


def library() -> ModuleType:
    """``verifiers.v1``, imported on first use; ImportError naming the pip command when it is absent."""
    try:
        return importlib.import_module("verifiers.v1")
    except ModuleNotFoundError as exc:
        raise ImportError(f"the verifiers task needs the verifiers library: {PIP_HINT}") from exc


def _export_import_root(module: str) -> None:
    """Put the folder that holds ``module``'s top-level package on ``PYTHONPATH``.

    verifiers starts a toolset's server as ``python -m <its module>`` in a fresh process whose working
    directory is a scratch folder: a module of this checkout (not installed) is found through this path.
    """
    loaded = sys.modules.get(module)
    if loaded is None:
        return
    path = getattr(loaded, "__file__", None)
    if not path:
        return
    depth = loaded.__name__.count(".") + (1 if Path(path).name == "__init__.py" else 0)
    root = str(Path(path).resolve().parents[depth])
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *parts])


def seats(env: str) -> list[str]:
    """The agent seats (role fields) of ``env``'s environment config: ``["agent"]`` for a plain taskset."""
    library()
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.utils.loaders import env_config_type

    cls = env_config_type(plugin_id(env))
    return [name for name, field in cls.model_fields.items() if isinstance(field.default, AgentConfig)]


_LOCK = threading.Lock()
_SERVED: dict[tuple[str, str | None], Any] = {}


@functools.lru_cache(maxsize=16)
def load_env(env: str, tool_choice: str | None = None) -> Any:
    """The verifiers environment of taskset ``env``, each seat on the in-process harness (not yet serving)."""
    library()
    from verifiers.v1.runtimes import SubprocessConfig
    from verifiers.v1.utils.loaders import load_environment, resolve_env_config

    from experiments.verifiers.harness import InProcessChatHarnessConfig

    config = resolve_env_config({"taskset": {"id": plugin_id(env)}})
    updates = {}
    for name in seats(env):
        seat = getattr(config, name)
        declared = seat.harness if isinstance(seat.harness, InProcessChatHarnessConfig) else None
        knobs = declared.model_dump(exclude={"id"}) if declared is not None else {}
        if tool_choice is not None:
            knobs["first_tool_choice"] = tool_choice
        harness = InProcessChatHarnessConfig(**knobs, id=plugin_id(HARNESS_ID))
        updates[name] = seat.model_copy(update={"harness": harness, "runtime": SubprocessConfig()})
    environment = load_environment(config.model_copy(update=updates))
    taskset = environment.taskset
    for toolset in [*taskset.toolsets(taskset.config), *type(taskset).task_type().toolsets(taskset.config.task)]:
        _export_import_root(type(toolset).__module__)
    return environment


def _served(env: str, tool_choice: str | None) -> Any:
    """The environment held in ``serving()`` for this process (started on first use)."""
    from experiments.verifiers.serving import ServedEnv

    key = (env, tool_choice)
    with _LOCK:
        if key not in _SERVED:
            _SERVED[key] = ServedEnv(load_env(env, tool_choice))
        return _SERVED[key]


@functools.lru_cache(maxsize=8)
def rows(env: str) -> tuple[Any, ...]:
    """The taskset's tasks in load order (the first :data:`MAX_ROWS` of an infinite one)."""
    return tuple(itertools.islice(iter(load_env(env).taskset), MAX_ROWS))


def rollout(env: str, row: int, base_url: str, api_key: str, model: str, temperature: float,
            max_tokens: int, tool_choice: str | None = None) -> dict[str, float]:
    """One episode of row ``row`` (mod the row count): ``reward`` (the rubric's weighted sum, verifiers'
    ``trace.reward``), each rubric function's unweighted score as ``rubric_<name>``, ``turns`` (model
    calls), ``tool_calls`` and ``ok``. A seat's own sampling settings (e.g. its ``max_tokens``) win."""
    vf = library()
    from verifiers.v1.configs.client import EvalClientConfig

    tasks = rows(env)
    if not tasks:
        raise ValueError(f"verifiers: taskset {env!r} has no rows")
    served = _served(env, tool_choice)
    var = f"SWARM_VF_KEY_{uuid.uuid4().hex}"
    os.environ[var] = api_key
    try:
        ctx = vf.ModelContext(model=model, client=EvalClientConfig(base_url=base_url, api_key_var=var),
                              sampling=vf.SamplingConfig(temperature=temperature, max_tokens=max_tokens))
        episode = served.run_episode(tasks[row % len(tasks)], ctx)
    finally:
        os.environ.pop(var, None)
    if episode.errors or not episode.traces:
        raise RuntimeError(f"verifiers episode failed: {[e.message for e in episode.errors][:3]}")
    if len(episode.traces) != 1:
        raise RuntimeError(f"verifiers episode has {len(episode.traces)} agent runs; the adapter scores one-run "
                           "episodes (every run's calls share the swarm episode's key)")
    trace = episode.traces[0]
    if trace.errors:
        raise RuntimeError(f"verifiers rollout failed: {[e.message for e in trace.errors][:3]}")
    parts = {f"rubric_{k}": float(r.score) for k, r in trace.rewards.items() if r is not None}
    calls = sum(len(m.tool_calls or []) for m in trace.assistant_messages)
    return {"reward": float(trace.reward), **parts, "turns": float(trace.num_turns), "tool_calls": float(calls),
            "ok": float(episode.ok)}
