"""openenv: an openenv (openenv-core) environment stepped over HTTP as a multi-turn swarm task.

``python -m flows.train +task=openenv`` serves the environment class ``task.options.env``
(``module:Class``, default the offline example :mod:`experiments.openenv.echo_rounds`) with openenv's own
``create_app`` on 127.0.0.1 inside the worker process (:mod:`experiments.openenv.server`), or steps the
server at ``task.options.url``. Each episode is one openenv session through openenv's own client: the
observation is the user message, the policy's reply (one chat call through the episode's gateway
endpoint, so a recorded step) is the action, the environment's reward and ``done`` drive the episode
(:mod:`experiments.openenv.episode`); the episode's reward is the sum of the step rewards, or the last
one (:mod:`experiments.openenv.reward`). ``reset(seed)`` gets the instance seed, so a GRPO group is one
seeded environment instance. The options are :class:`Options`; the library is imported on first use, and
without it the run is refused at start-up with the pip command (``Options.check``). The hub / Docker environments openenv publishes are not fetched
here (docs/environments.md).
"""

from __future__ import annotations

from typing import Any

from experiments.openenv.options import DEFAULT_ENV, PIP_HINT, Options
from experiments.openenv.reward import episode_reward
from swarm.client import AgentLLM

__all__ = ["DEFAULT_ENV", "PIP_HINT", "Options", "make_instance", "run_episode", "episode_reward"]


def make_instance(seed: int) -> dict[str, Any]:
    """``{"seed"}``: the environment's reset seed."""
    return {"seed": int(seed)}


def run_episode(instance: dict[str, Any], llm: AgentLLM) -> dict[str, float]:
    """One openenv session on this process's server (started on first use) or on ``url``; the reward parts."""
    from experiments.openenv.episode import play

    opts = Options.current()
    if opts.url is not None:
        return play(opts.url, llm, opts, int(instance["seed"]), opts.sessions())
    from experiments.openenv.server import serve

    url, sessions = serve(opts)
    return play(url, llm, opts, int(instance["seed"]), sessions)
