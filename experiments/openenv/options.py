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
from types import ModuleType
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from swarm.client import TaskOptions
from swarm.client.options import import_optional

__all__ = ["PIP_HINT", "DEFAULT_ENV", "REWARDS", "Options", "library", "env_types"]

PIP_HINT = "pip install 'swarmpool[envs]' (or: pip install openenv-core==0.3.0)"
DEFAULT_ENV = "experiments.openenv.echo_rounds:EchoRoundsEnv"
Reward = Literal["sum", "last"]
REWARDS: tuple[str, ...] = typing.get_args(Reward)
_STARTED_SESSIONS = 64  # sessions of a task-started server whose environment allows concurrent sessions


def library() -> ModuleType:
    """``openenv``, imported on first use; ImportError naming the pip command when it is absent."""
    return import_optional("openenv", f"the openenv task needs the openenv-core library: {PIP_HINT}")


class Options(TaskOptions):
    """Task options (``task.options``); the README lists each key."""

    url: str | None = None      # the http(s):// URL of a running openenv server (then env is unused)
    env: str = DEFAULT_ENV      # or module:Class of an openenv Environment, served by the task itself
    max_turns: int = Field(default=16, ge=1)  # an episode still running after this many steps ends (truncated)
    reward: Reward = "sum"      # the episode's reward: sum of the step rewards (the return) or the last one
    prompt_field: str = ""      # observation field shown to the policy; "" = "prompt", else its only text field
    action_field: str = ""      # action field the reply fills; "" = the action schema's only text field
    system_prompt: str = ""     # a system message before the first observation ("" = none)
    history: bool = True        # the chat keeps earlier turns (False: only the latest observation)
    max_sessions: int | None = Field(default=None, ge=1)  # episodes of one worker process open on the server at
    #                                                       once (None: see sessions())

    @field_validator("url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError("give the server's http:// or https:// base URL, or leave it null to serve "
                             "task.options.env here")
        return url

    @field_validator("env")
    @classmethod
    def _env(cls, env: str, info: ValidationInfo) -> str:
        if info.data.get("url") is None and not (env.count(":") == 1 and all(env.split(":"))):
            raise ValueError(f"name an openenv Environment class as module:Class, e.g. {DEFAULT_ENV}")
        return env

    def check(self) -> None:
        """The library imports, and the environment class can be served or the server at ``url`` answers, with
        an action that takes the reply's text (starts no server)."""
        from experiments.openenv.episode import action_field, server_schema

        library()
        if self.url is None:
            _, action_cls, _ = env_types(self.env)
            action_field(action_cls.model_json_schema(), self.action_field)
        else:
            action_field(server_schema(self.url)["action"], self.action_field)

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
