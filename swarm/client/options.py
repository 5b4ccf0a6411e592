"""A task's options: the one pydantic model a task package declares, validated in one place.

A task package declares ``class Options(TaskOptions)``: one typed field with a default per knob of
``task.options`` (an empty body when the task has none, so any key is refused). The SDK validates
``task.options`` into it here (:func:`task_options`); a problem is one line naming the key path, with
the close key for a mistyped one (``task.options.max_operand=0: Input should be greater than or equal
to 1``, ``task.options.opss: unknown key (did you mean task.options.ops?)``, from
:func:`swarm.explain.explain`). :meth:`TaskOptions.check` holds what validation cannot see (the library
is installed, the environment loads) and runs before a run starts.

The worker makes the validated object this process's :meth:`TaskOptions.current`, and the task's
code reads it there (``Options.current()`` in ``make_instance``, ``run_episode`` or ``run_multiagent``),
so a task writes no validation or module state of its own.

This module loads no task package (:mod:`swarm.client.task` does) and runs no episode.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from swarm.explain import explain
from swarm.settings import Section

__all__ = ["TaskOptions", "task_options", "validate_options", "reset_options", "import_optional"]

PREFIX = "task.options"
_CURRENT: dict[type, Any] = {}  # Options class -> this process's options (set by TaskOptions.use)


class TaskOptions(Section):
    """The base of a task's ``Options``: frozen, unknown keys refused; see the module docstring."""

    def check(self) -> None:
        """What validation cannot see, before a run starts (the library is installed, the environment
        loads); raise ValueError (or ImportError naming what to install) when the run cannot work."""

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> Self:
        """``options`` (a plain mapping) validated into this class; ValueError names each bad key."""
        return validate_options(cls, options)

    @classmethod
    def current(cls) -> Self:
        """This process's options of the task (what the worker validated and :meth:`use`-d); the defaults before."""
        opts = _CURRENT.get(cls)
        if opts is None:
            opts = _CURRENT.setdefault(cls, cls())
        return opts

    def use(self) -> Self:
        """Make these the process's :meth:`current` options of their task (the worker calls it once at start)."""
        _CURRENT[type(self)] = self
        return self


def reset_options() -> None:
    """Forget every task's current options (back to the defaults): for tests that set some."""
    _CURRENT.clear()


@functools.cache
def _forbidding(model: type[BaseModel]) -> type[BaseModel]:
    """``model``, or a subclass of it that refuses unknown keys when ``model`` would ignore them (a package
    written before :class:`TaskOptions` may declare a plain ``pydantic.BaseModel``)."""
    if model.model_config.get("extra") == "forbid":
        return model
    return type(model.__name__, (model,), {"model_config": ConfigDict(extra="forbid"), "__module__": model.__module__,
                                           "__qualname__": model.__qualname__, "__doc__": model.__doc__})


def validate_options(model: type[Any], options: Mapping[str, Any] | None) -> Any:
    """``options`` validated into ``model`` (unknown keys refused whatever its ``extra``); ValueError with one
    line per problem, each naming its ``task.options.<key>`` (and the close key for a mistyped one)."""
    data = dict(options or {})
    strict = _forbidding(model)
    try:
        return strict.model_validate(data)
    except ValidationError as exc:
        raise ValueError(explain(exc, strict, data, prefix=PREFIX)) from None


def task_options(module: ModuleType | str, options: Mapping[str, Any] | None) -> Any:
    """``options`` validated into the task module's ``Options`` (a module that declares none takes no options:
    every key is refused); ValueError as :func:`validate_options`."""
    module = importlib.import_module(module) if isinstance(module, str) else module
    return validate_options(getattr(module, "Options", TaskOptions), options)


def import_optional(module: str, needs: str) -> ModuleType:
    """``module`` imported on first use; ImportError saying ``needs`` (what to install) when it is absent."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and not module.startswith(exc.name):  # the library is there, one of its own imports is not
            raise
        raise ImportError(needs) from exc
