"""Swarm clients: the SDK agents use to reach a gateway, a task's options, and the worker that runs task episodes."""

from swarm.client.options import TaskOptions
from swarm.client.sdk import ClientError, EpisodeHandle, EpisodeSet, SwarmClient
from swarm.client.task import AgentLLM, TaskPackage, check_options, load_task
from swarm.client.worker import WorkerConfig, run_one_episode, run_worker

__all__ = ["SwarmClient", "EpisodeHandle", "EpisodeSet", "ClientError", "AgentLLM", "TaskOptions", "TaskPackage",
           "load_task", "check_options", "WorkerConfig", "run_worker", "run_one_episode"]
