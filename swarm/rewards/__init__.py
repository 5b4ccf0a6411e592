"""Reward kinds: where a task's episode rewards come from (``task.reward``), declared once each.

``REWARDS`` is the registry (:class:`swarm.settings.Registry`): a kind is one module of this package
(or a dotted module path elsewhere) declaring its section with ``@REWARDS.declare("kind")``, plus its
``conf/reward/<kind>.yaml``. No ``task.reward`` block (the default) means the task package's own
reward; :mod:`swarm.rewards.judge` declares ``judge`` (an LLM judge scores complete groups).

A section implements :class:`RewardSection`'s hooks: ``check`` (against the run's policies and
feedback rule), ``authority`` (which reports the gateway keeps in the history instead of applying)
and ``serve`` (the service that rewards the pool while the run lasts). It does not start anything
by itself; the flow's workers call ``serve``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from swarm.settings import Registry, Section

__all__ = ["REWARDS", "RewardSection"]


class RewardSection(Section):
    """Base of every ``task.reward`` section; the defaults are those of a reward that needs nothing."""

    def check(self, policies: Sequence[str], feedback_rating: str) -> None:
        """Raise ValueError (naming ``task.reward.<key>``) when this reward cannot work in such a run."""

    def authority(self, task: str) -> dict[str, str]:
        """Task name -> the lowest reward source the gateway applies for it (``gateway.reward_authority``)."""
        return {}

    def serve(self, pool_url: str, server: str, task: str, group_size: int, stop: threading.Event) -> object:
        """Reward the run's episodes until ``stop`` (in the flow's process); returns its summary."""
        raise NotImplementedError(f"{type(self).__name__} runs no service")


REWARDS = Registry(point="task.reward", key="kind", home="swarm.rewards", base=RewardSection)
