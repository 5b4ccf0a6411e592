"""What a task package is, and how the worker finds one.

A task package is a module ``experiments.<name>`` (or any importable module path) with:

- ``make_instance(seed: int) -> dict``: one task instance, deterministic in the seed;
- ``run_episode(instance: dict, llm: AgentLLM) -> dict``: the agent workflow; it talks to the
  policy only through ``llm`` (an OpenAI base_url + api key) and returns reward parts, at least
  ``{"reward": float}``;
- or, for multi-agent tasks, ``run_multiagent(instance, client, group_id, cfg, kind) -> dict``: one
  game that opens its own episodes (one per LLM player) through ``client``
  (:class:`swarm.client.sdk.SwarmClient`; :class:`swarm.client.sdk.EpisodeSet` keeps them alive and
  aborts them together), ends them with their rewards, and returns the trainable side's reward parts.
  ``cfg`` is the :class:`swarm.client.worker.WorkerConfig`; ``kind`` is the episode type ("train" or
  "eval") of the trainable seats;
- ``Options``: its task options (``task.options``), a :class:`swarm.client.options.TaskOptions`
  subclass, one typed field with a default per knob (an empty one when it has none). :func:`check_options`
  validates ``task.options`` into it and runs its ``check()`` before a run starts; the worker makes the
  validated object the process's ``Options.current()``, which the task's code reads. A package without
  ``Options`` takes no options. (A package written before this may still define ``configure(**options)``:
  the worker calls it with the validated options' values.)

An instance may carry a ``"task"`` key naming the task its episodes are recorded under (a
mixture task such as ``cocktail`` uses it so per-task metrics stay separate).

Each loaded package has a ``code_version`` (:func:`code_version`): 12 hex characters hashing its
source and data files. The worker tags every episode it opens with it (episode metadata
``code_version``), so a pool filter ``StepFilter(metadata={"code_version": ...})`` selects the
episodes one version of the task's code produced (a hot-swapped worker changes it).

This module does not run anything; :mod:`swarm.client.worker` does.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

from swarm.client.options import TaskOptions, task_options, validate_options

__all__ = ["AgentLLM", "TaskPackage", "TaskOptions", "load_task", "check_options", "configure_task", "task_options",
           "code_version"]


@dataclass
class AgentLLM:
    """Everything agent code needs to reach the policy: an OpenAI endpoint, key and model name."""

    base_url: str
    api_key: str
    model: str = "default"
    temperature: float = 1.0
    max_tokens: int = 32
    extra: dict[str, Any] = field(default_factory=dict)

    def openai(self, **kwargs: Any) -> Any:
        """An OpenAI client for this episode (its connections shared process-wide, see ``_shared_http``)."""
        import openai

        kwargs.setdefault("http_client", _shared_http())
        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0, **kwargs)

    def sampling(self, **kwargs: Any) -> dict[str, Any]:
        """The sampling parameters of this LLM's next call (``temperature``, ``max_tokens``, and ``seed`` when
        the worker seeds calls), ``kwargs`` winning: agent code on another framework sends these to match ``chat``."""
        params: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        params.update(kwargs)
        return params

    def chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        """One chat completion with this LLM's sampling defaults; returns the first choice's message."""
        params = self.sampling(**kwargs)
        resp = self.openai().chat.completions.create(model=self.model, messages=messages, **params)
        return resp.choices[0].message


@functools.cache
def _shared_http() -> Any:
    """One pooled HTTP client for every AgentLLM of this process (httpx clients are thread-safe).

    A new OpenAI client per call builds its own SSL context (loading the CA bundle) and opens a
    new connection: measured as 20% of all CPU of a default ``flows.train`` run before this.
    """
    import openai

    return openai.DefaultHttpxClient(limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))


@dataclass
class TaskPackage:
    name: str
    make_instance: Callable[[int], dict[str, Any]]
    run_episode: Callable[[dict[str, Any], AgentLLM], dict[str, float]] | None
    run_multiagent: Callable[..., dict[str, float]] | None = None
    module: ModuleType | None = None
    code_version: str = ""  # hash of the package's files (:func:`code_version`); "" when it has none


_SKIP_DIRS = frozenset({"__pycache__", ".git", ".mypy_cache", ".pytest_cache", ".ruff_cache"})


def code_version(module: ModuleType) -> str:
    """12 hex characters of SHA-256 over the files of ``module``'s package (sorted relative paths and bytes).

    A package (a directory) hashes every file under it except bytecode and cache directories, so its
    ``*.py`` files and data files (prompts, word lists) count; a single-file module hashes that file.
    The same files give the same version on any machine; a module without files gives "".
    """
    paths = list(getattr(module, "__path__", None) or [])
    if paths:
        root = Path(paths[0])
        files = sorted((p for p in root.rglob("*") if p.is_file() and p.suffix not in (".pyc", ".pyo")
                        and not _SKIP_DIRS.intersection(p.relative_to(root).parts)),
                       key=lambda p: p.relative_to(root).as_posix())
    elif getattr(module, "__file__", None):
        root = Path(module.__file__).parent  # type: ignore[arg-type]
        files = [Path(module.__file__)]  # type: ignore[arg-type]
    else:
        return ""
    h = hashlib.sha256()
    for p in files:
        rel = p.relative_to(root).as_posix().encode()
        data = p.read_bytes()
        h.update(len(rel).to_bytes(8, "big") + rel + len(data).to_bytes(8, "big") + data)
    return h.hexdigest()[:12]


def load_task(name: str) -> TaskPackage:
    """Import ``experiments.<name>`` (or a dotted module path) and check it has the task shape."""
    module_name = name if "." in name else f"experiments.{name}"
    try:
        mod = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ValueError(f"task {name!r}: no module {module_name!r} ({exc})") from exc
    make_instance = getattr(mod, "make_instance", None)
    run_episode = getattr(mod, "run_episode", None)
    run_multiagent = getattr(mod, "run_multiagent", None)
    if not callable(make_instance):
        raise ValueError(f"task {name!r}: {module_name} has no make_instance(seed) function")
    if not callable(run_episode) and not callable(run_multiagent):
        raise ValueError(f"task {name!r}: {module_name} needs run_episode(instance, llm) or run_multiagent(...)")
    return TaskPackage(name.rsplit(".", 1)[-1], make_instance, run_episode, run_multiagent, mod, code_version(mod))


def check_options(task: TaskPackage, options: Mapping[str, Any] | None) -> Any:
    """The task's ``Options`` validated from ``options`` and checked (its ``check()``: the library is
    installed, the environment loads), before any worker starts; ValueError names each bad
    ``task.options.<key>`` (and the close key for a mistyped one) or says what to install."""
    opts = validate_options(getattr(task.module, "Options", TaskOptions), options)
    check = getattr(opts, "check", None)
    if callable(check):
        try:
            check()
        except ImportError as exc:  # an optional library is absent: the message says what to install
            raise ValueError(str(exc)) from None
    return opts


def configure_task(task: TaskPackage, options: Mapping[str, Any] | None) -> Any:
    """:func:`check_options`, then make the result this process's ``Options.current()`` (the worker calls it
    once at start); returns it. A package's own ``configure`` (the older shape) gets the options' values."""
    opts = check_options(task, options)
    use = getattr(opts, "use", None)
    if callable(use):
        use()
    configure = getattr(task.module, "configure", None)
    if callable(configure):
        configure(**{name: getattr(opts, name) for name in type(opts).model_fields})
    return opts
