"""Run one verifiers rollout against a swarm gateway: the environment's own episode, scored by its rubric.

:func:`load_env` builds a verifiers v1 environment from a taskset id (a module or installed entry point
exporting a ``Taskset`` subclass), with one single-agent seat that runs in this process
(:mod:`experiments.verifiers.harness`) in the local subprocess runtime. :func:`rollout` runs
``env.run_episode(task, ctx)`` inside ``env.serving()`` (verifiers' interception server on 127.0.0.1),
with the model context's OpenAI client pointed at the episode's gateway URL and key; the rubric's
weighted rewards are the reward. verifiers reads an endpoint's key from an environment variable, so
each rollout sets its own uniquely named variable for its duration. Nothing here knows the swarm SDK.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import itertools
import os
import sys
import threading
import uuid
from types import ModuleType
from typing import Any

__all__ = ["PIP_HINT", "library", "plugin_id", "load_env", "rows", "rollout"]

PIP_HINT = ("pip install verifiers==0.4.0 (in its own venv: it needs openai<3, which the project's openai 3.x "
            "and the 'agents' extra's openai-agents>=3 refuse; docs/environments.md)")
HARNESS_ID = "experiments.verifiers.harness"
MAX_ROWS = 100_000  # an infinite taskset's rows are read up to here


def library() -> ModuleType:
    """``verifiers.v1``, imported on first use; ImportError naming the pip command when it is absent."""
    try:
        return importlib.import_module("verifiers.v1")
    except ModuleNotFoundError as exc:
        raise ImportError(f"the verifiers task needs the verifiers library: {PIP_HINT}") from exc


def plugin_id(module: str) -> str:
    """An id verifiers' plugin loader can import: a dotted module path is aliased as one top-level name.

    The loader first looks for ``verifiers.v1.tasksets.<id>``, and ``importlib.util.find_spec`` raises on a
    dotted id whose first part is not a package there; a top-level name (an installed environment) is
    used as is.
    """
    if "." not in module:
        return module
    alias = module.replace(".", "__").lower()
    sys.modules.setdefault(alias, importlib.import_module(module))
    return alias


_LOCAL = threading.local()


def load_env(env: str) -> Any:
    """The verifiers environment of taskset ``env``, its seat on the in-process harness (one per thread:
    ``serving()`` keeps the rollout's interception server on the environment object)."""
    cache = _LOCAL.__dict__.setdefault("envs", {})
    if env not in cache:
        cache[env] = _build_env(env)
    return cache[env]


def _build_env(env: str) -> Any:
    library()
    from verifiers.v1.utils.loaders import load_environment, resolve_env_config

    config = resolve_env_config({"taskset": {"id": plugin_id(env)},
                                 "agent": {"harness": {"id": plugin_id(HARNESS_ID)}, "runtime": {"type": "subprocess"}}})
    return load_environment(config)


@functools.lru_cache(maxsize=8)
def rows(env: str) -> tuple[Any, ...]:
    """The taskset's tasks in load order (the first :data:`MAX_ROWS` of an infinite one)."""
    return tuple(itertools.islice(iter(load_env(env).taskset), MAX_ROWS))


async def _run(environment: Any, task: Any, ctx: Any) -> Any:
    async with environment.serving():
        return await environment.run_episode(task, ctx)


def rollout(env: str, row: int, base_url: str, api_key: str, model: str, temperature: float,
            max_tokens: int) -> dict[str, float]:
    """One episode of row ``row`` (mod the row count): ``reward`` (the rubric's weighted sum, verifiers'
    ``trace.reward``), each rubric function's unweighted score as ``rubric_<name>``, and ``ok``."""
    vf = library()
    from verifiers.v1.configs.client import EvalClientConfig

    environment, tasks = load_env(env), rows(env)
    if not tasks:
        raise ValueError(f"verifiers: taskset {env!r} has no rows")
    var = f"SWARM_VF_KEY_{uuid.uuid4().hex}"
    os.environ[var] = api_key
    try:
        ctx = vf.ModelContext(model=model, client=EvalClientConfig(base_url=base_url, api_key_var=var),
                              sampling=vf.SamplingConfig(temperature=temperature, max_tokens=max_tokens))
        episode = asyncio.run(_run(environment, tasks[row % len(tasks)], ctx))
    finally:
        os.environ.pop(var, None)
    if episode.errors or not episode.traces:
        raise RuntimeError(f"verifiers episode failed: {[e.message for e in episode.errors][:3]}")
    trace = episode.traces[0]
    parts = {f"rubric_{k}": float(r.score) for k, r in trace.rewards.items() if r is not None}
    return {"reward": float(trace.reward), **parts, "ok": float(episode.ok)}
