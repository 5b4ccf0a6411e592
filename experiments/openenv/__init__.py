"""openenv: an openenv (openenv-core) environment stepped over HTTP as a multi-turn swarm task.

``python -m flows.train +task=openenv`` serves the environment class ``task.options.env``
(``module:Class``, default the offline example :mod:`experiments.openenv.echo_rounds`) with openenv's own
``create_app`` on 127.0.0.1 inside the worker process (:mod:`experiments.openenv.server`), or steps the
server at ``task.options.url``. Each episode is one openenv session through openenv's own client: the
observation is the user message, the policy's reply (one chat call through the episode's gateway
endpoint, so a recorded step) is the action, the environment's reward and ``done`` drive the episode
(:mod:`experiments.openenv.episode`); the episode's reward is the sum of the step rewards, or the last
one (:mod:`experiments.openenv.reward`). ``reset(seed)`` gets the instance seed, so a GRPO group is one
seeded environment instance. The library is imported on first use; without it ``check_options``
refuses the run with the pip command. The hub / Docker environments openenv publishes are not fetched
here (docs/environments.md).
"""

from __future__ import annotations

from typing import Any

from experiments.openenv.options import DEFAULT_ENV, PIP_HINT, EnvOptions, env_types, library
from experiments.openenv.reward import episode_reward
from swarm.client.task import AgentLLM

__all__ = ["DEFAULT_ENV", "PIP_HINT", "EnvOptions", "check_options", "configure", "make_instance", "run_episode",
           "episode_reward"]

OPTIONS = EnvOptions()  # set by configure() in each worker process


def check_options(options: dict[str, Any]) -> None:
    """Refuse bad options, a missing library, an environment class that cannot be served, or a server that does
    not answer or whose action takes no text, before a run starts (starts no server)."""
    from experiments.openenv.episode import action_field, server_schema

    opts = EnvOptions.from_options(options)
    try:
        library()
    except ImportError as exc:
        raise ValueError(str(exc)) from None
    if opts.url is None:
        _, action_cls, _ = env_types(opts.env)
        action_field(action_cls.model_json_schema(), opts.action_field)
    else:
        action_field(server_schema(opts.url)["action"], opts.action_field)


def configure(**options: Any) -> EnvOptions:
    """Set this process's options (the worker calls it with ``task.options``); returns them."""
    global OPTIONS
    OPTIONS = EnvOptions.from_options(options)
    return OPTIONS


def make_instance(seed: int) -> dict[str, Any]:
    """``{"seed"}``: the environment's reset seed."""
    return {"seed": int(seed)}


def run_episode(instance: dict[str, Any], llm: AgentLLM) -> dict[str, float]:
    """One openenv session on this process's server (started on first use) or on ``url``; the reward parts."""
    from experiments.openenv.episode import play

    opts = OPTIONS
    if opts.url is not None:
        return play(opts.url, llm, opts, int(instance["seed"]), opts.sessions())
    from experiments.openenv.server import serve

    url, sessions = serve(opts)
    return play(url, llm, opts, int(instance["seed"]), sessions)
