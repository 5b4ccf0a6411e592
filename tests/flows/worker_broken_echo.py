"""A test task: echo, whose import fails in a ``python -m swarm.client`` worker process (as a task needing a driver
or a package the worker machines lack would) and works in the flow, which checks the task in its own process. The
flow test runs it with ``runner=process`` (``task.name=tests.flows.worker_broken_echo``)."""

from __future__ import annotations

import sys

from experiments.echo import Options, make_instance, run_episode

__all__ = ["Options", "make_instance", "run_episode"]

if sys.orig_argv[1:3] == ["-m", "swarm.client"]:
    raise ImportError("worker_broken_echo: this worker machine lacks the task's driver")
