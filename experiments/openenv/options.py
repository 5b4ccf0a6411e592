"""The openenv side of the adapter: options, the lazy library import and the environment class a spec names.

``task.options.env`` names an openenv ``Environment`` subclass as ``module:Class``; its action and
observation types are read from its generic parameters (``Environment[MyAction, MyObservation, MyState]``),
which is what openenv's ``create_app`` needs to serve it. ``task.options.url`` names a server someone
else runs instead. This module starts no server (:mod:`experiments.openenv.server`) and plays nothing
(:mod:`experiments.openenv.episode`).
"""

from __future__ import annotations

import importlib
import inspect
import typing
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["PIP_HINT", "DEFAULT_ENV", "REWARDS", "EnvOptions", "library", "env_types"]

PIP_HINT = "pip install 'swarmpool[envs]' (or: pip install openenv-core==0.3.0)"
DEFAULT_ENV = "experiments.openenv.echo_rounds:EchoRoundsEnv"
REWARDS = ("sum", "last")
_STARTED_SESSIONS = 64  # sessions of a task-started server whose environment allows concurrent sessions


def library() -> ModuleType:
    """``openenv``, imported on first use; ImportError naming the pip command when it is absent."""
    try:
        return importlib.import_module("openenv")
    except ModuleNotFoundError as exc:
        raise ImportError(f"the openenv task needs the openenv-core library: {PIP_HINT}") from exc


@dataclass(frozen=True)
class EnvOptions:
    """Task options (``task.options``); the README lists each key."""

    env: str = DEFAULT_ENV      # module:Class of an openenv Environment, served by the task itself
    url: str | None = None      # or the http(s):// URL of a running openenv server (then env is unused)
    max_turns: int = 16         # an episode still running after this many steps ends (truncated)
    reward: str = "sum"         # the episode's reward: sum of the step rewards (the return) or the last one
    prompt_field: str = ""      # observation field shown to the policy; "" = "prompt", else its only text field
    action_field: str = ""      # action field the reply fills; "" = the action schema's only text field
    system_prompt: str = ""     # a system message before the first observation ("" = none)
    history: bool = True        # the chat keeps earlier turns (False: only the latest observation)
    max_sessions: int | None = None  # episodes of one worker process open on the server at once (None: see sessions())

    @classmethod
    def from_options(cls, options: dict[str, Any] | None) -> EnvOptions:
        """Validate a plain dict; unknown keys and bad values raise ValueError naming the key and the fix."""
        opts = dict(options or {})
        unknown = sorted(set(opts) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"openenv: unknown option(s) {unknown}; known: {sorted(cls.__dataclass_fields__)}")
        o = cls(**opts)
        if o.url is not None and not (isinstance(o.url, str) and o.url.startswith(("http://", "https://"))):
            raise ValueError(f"openenv: url={o.url!r}; give the server's http:// or https:// base URL, "
                             "or leave it null to serve task.options.env here")
        if o.url is None and not (isinstance(o.env, str) and o.env.count(":") == 1 and all(o.env.split(":"))):
            raise ValueError(f"openenv: env={o.env!r}; name an openenv Environment class as module:Class, "
                             f"e.g. {DEFAULT_ENV}")
        if not isinstance(o.max_turns, int) or o.max_turns < 1:
            raise ValueError(f"openenv: max_turns={o.max_turns!r}; use an integer >= 1")
        if o.reward not in REWARDS:
            raise ValueError(f"openenv: reward={o.reward!r}; use one of {REWARDS}")
        if o.max_sessions is not None and (not isinstance(o.max_sessions, int) or o.max_sessions < 1):
            raise ValueError(f"openenv: max_sessions={o.max_sessions!r}; use an integer >= 1 or null")
        for key in ("prompt_field", "action_field", "system_prompt"):
            if not isinstance(getattr(o, key), str):
                raise ValueError(f"openenv: {key}={getattr(o, key)!r}; use a string")
        return o

    def sessions(self, concurrent: bool = True) -> int:
        """Episodes open at once: ``max_sessions``, else 64 on a task-started server whose environment allows
        concurrent sessions (``concurrent``), else 1 (openenv's default server capacity)."""
        if self.url is not None:
            return self.max_sessions or 1
        return (self.max_sessions or _STARTED_SESSIONS) if concurrent else 1


def env_types(spec: str) -> tuple[type, type, type]:
    """(Environment class, its Action class, its Observation class) of ``module:Class``; ValueError says why not."""
    core = importlib.import_module("openenv.core.env_server")
    module_name, _, name = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except ModuleNotFoundError as exc:
        raise ValueError(f"openenv: env={spec!r}: no module {module_name!r} ({exc})") from None
    except AttributeError:
        raise ValueError(f"openenv: env={spec!r}: {module_name} has no {name!r}") from None
    if not (inspect.isclass(cls) and issubclass(cls, core.Environment)):
        raise ValueError(f"openenv: env={spec!r} is not a subclass of openenv's Environment")
    if inspect.isabstract(cls):
        raise ValueError(f"openenv: env={spec!r} is abstract (it lacks {sorted(cls.__abstractmethods__)})")
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            origin, args = typing.get_origin(base), typing.get_args(base)
            if (inspect.isclass(origin) and issubclass(origin, core.Environment) and len(args) >= 2
                    and all(inspect.isclass(a) for a in args[:2])
                    and issubclass(args[0], core.Action) and issubclass(args[1], core.Observation)):
                return cls, args[0], args[1]
    raise ValueError(f"openenv: env={spec!r} does not name its types: subclass "
                     "Environment[MyAction, MyObservation, MyState] so the server knows how to read actions")
