"""The swarm worker: runs a task's episodes against a gateway until stopped.

Any number of workers on any machines may run the same task; each claims whole prompt groups
(``group_size`` episodes on one instance, group id ``<task>-<seed>``) from its own seed stream,
so workers never collide. A worker killed mid-episode leaves that episode open; the gateway
abandons it after its timeout and it is never trained. The worker does not train anything.

Every episode a worker opens carries the task package's ``code_version`` in its metadata
(:func:`swarm.client.task.code_version`). Hot swap: stop a worker and start another on changed task
code against the same gateway; the run keeps training and the new episodes carry the new version.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from swarm.client.sdk import ClientError, SwarmClient
from swarm.client.task import AgentLLM, TaskPackage, configure_task, load_task

__all__ = ["WorkerConfig", "episode_llm", "run_worker", "run_one_episode"]

log = logging.getLogger(__name__)


@dataclass
class WorkerConfig:
    server: str
    task: str
    workers: int = 4
    group_size: int = 4
    model: str = "default"
    temperature: float = 1.0
    max_tokens: int = 32
    episode_timeout_s: float = 60.0
    eval_every: int = 0  # every k-th group is an eval group (never trained); 0 = none
    seed: int | None = None  # None: a random base, so workers on several machines never collide
    client_id: str = field(default_factory=lambda: f"worker-{os.getpid()}-{random.randrange(1 << 30):x}")
    max_groups: int | None = None  # stop after this many groups (None: until stopped)
    token: str | None = None
    agree_every: int = 0  # post /v1/sync/agree after every k finished groups (C4/C5); 0 = never
    options: dict[str, Any] = field(default_factory=dict)  # task.options: validated into the task's Options at start
    eval_only: bool = False  # every group is an eval group (flows.eval: a pinned version's held-out episodes)
    metadata: dict[str, Any] = field(default_factory=dict)  # added to every episode's metadata (flows.eval's tags)
    seeded: bool = False  # each chat call carries a sampling seed of (instance seed, group member, call): a seeding
    #                       backend then gives the same replies for the same weights (flows.eval)


@dataclass
class _SeededLLM(AgentLLM):
    """An AgentLLM whose calls carry a seed: a hash of the episode's key and the call's index (``chat``, and
    agent code on other frameworks through ``sampling``)."""

    key: str = ""
    calls: int = 0

    def sampling(self, **kwargs: Any) -> dict[str, Any]:
        digest = hashlib.blake2b(f"{self.key}/{self.calls}".encode(), digest_size=8).digest()
        kwargs.setdefault("seed", int.from_bytes(digest, "big") & (2**63 - 1))
        self.calls += 1
        return super().sampling(**kwargs)


def _slots(cfg: WorkerConfig, stop: threading.Event) -> Iterator[tuple[int, str, str, int]]:
    """(seed, group_id, type, member) for each episode to run, group members back to back."""
    base = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(1 << 40)
    k = 0
    while not stop.is_set() and (cfg.max_groups is None or k < cfg.max_groups):
        seed = base + k
        kind = "eval" if cfg.eval_only or (cfg.eval_every and (k + 1) % cfg.eval_every == 0) else "train"
        for member in range(cfg.group_size):
            yield seed, f"{cfg.task}-{seed}", kind, member
        k += 1


def episode_llm(ep: Any, cfg: WorkerConfig, key: str, model: str | None = None) -> AgentLLM:
    """The agent's LLM for an open episode ``ep``: with ``cfg.seeded`` each call carries a sampling seed
    from ``key`` and the call's index (a multi-agent task passes its own key, e.g. the instance seed and
    split), so the same weights give the same replies; ``model``: the policy to call (``cfg.model``)."""
    args = (ep.base_url, ep.api_key, model or cfg.model, cfg.temperature, cfg.max_tokens)
    return _SeededLLM(*args, key=key) if getattr(cfg, "seeded", False) else AgentLLM(*args)


def run_one_episode(client: SwarmClient, task: TaskPackage, cfg: WorkerConfig, seed: int, group_id: str,
                    kind: str = "train", member: int = 0) -> dict[str, float]:
    """Begin an episode, run the task's agent in it, end it with the reward; returns the reward parts
    (``member``: its place in the group, which seeds its sampling when ``cfg.seeded``)."""
    instance = task.make_instance(seed)
    assert task.run_episode is not None
    with client.episode(task=instance.get("task", task.name), group_id=group_id, type=kind, client_id=cfg.client_id,
                        timeout_s=cfg.episode_timeout_s, metadata={"seed": seed}) as ep:
        llm = episode_llm(ep, cfg, f"{seed}/{member}")
        parts = task.run_episode(instance, llm)
        reward = float(parts["reward"])
        ep.end(reward=reward, **{k: v for k, v in parts.items() if k != "reward"})
    return parts


def run_worker(cfg: WorkerConfig, stop: threading.Event | None = None) -> dict[str, float]:
    """Run episodes with ``cfg.workers`` threads until ``stop`` is set or ``max_groups`` are done."""
    stop = stop or threading.Event()
    task = load_task(cfg.task)
    log.info("task %s code_version %s", task.name, task.code_version or "-")
    configure_task(task, cfg.options)  # validated once: the task's code reads Options.current()
    slots = _slots(cfg, stop)
    lock = threading.Lock()
    stats: dict[str, float] = {"episodes": 0, "failed": 0, "reward_sum": 0.0}

    def next_slot() -> tuple[int, str, str, int] | None:
        with lock:
            return next(slots, None)

    def loop() -> None:
        tags = {"code_version": task.code_version} if task.code_version else {}
        tags.update(cfg.metadata)
        with SwarmClient(cfg.server, token=cfg.token, metadata=tags) as client:
            while not stop.is_set():
                slot = next_slot()
                if slot is None:
                    return
                seed, group_id, kind, member = slot
                try:
                    if task.run_multiagent is not None:
                        parts = task.run_multiagent(task.make_instance(seed), client, group_id, cfg, kind=kind)
                    else:
                        parts = run_one_episode(client, task, cfg, seed, group_id, kind, member)
                except ClientError as exc:
                    if stop.is_set():
                        return
                    log.warning("episode in %s failed: %s", group_id, exc)
                    with lock:
                        stats["failed"] += 1
                    continue
                except Exception as exc:  # agent code failing is a result, not a crash of the worker
                    log.warning("agent error in %s: %r", group_id, exc)
                    with lock:
                        stats["failed"] += 1
                    continue
                with lock:
                    stats["episodes"] += 1
                    stats["reward_sum"] += float(parts.get("reward", 0.0))
                    agree = cfg.agree_every and stats["episodes"] % (cfg.agree_every * cfg.group_size) == 0
                if agree:
                    client.agree(cfg.client_id)

    with ThreadPoolExecutor(cfg.workers, thread_name_prefix="swarm-worker") as pool:
        for f in [pool.submit(loop) for _ in range(cfg.workers)]:
            f.result()
    return stats
