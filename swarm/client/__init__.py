"""Swarm clients: the SDK agents use to reach a gateway, and the worker that runs task episodes."""

from swarm.client.sdk import ClientError, EpisodeHandle, SwarmClient
from swarm.client.task import AgentLLM, TaskPackage, load_task
from swarm.client.worker import WorkerConfig, run_one_episode, run_worker

__all__ = ["SwarmClient", "EpisodeHandle", "ClientError", "AgentLLM", "TaskPackage", "load_task",
           "WorkerConfig", "run_worker", "run_one_episode"]
