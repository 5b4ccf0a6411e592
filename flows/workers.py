"""Client workers for the training flow, as Prefect tasks: threads in this process
(``runner=thread``) or ``python -m swarm.client`` subprocesses (``runner=process``), which can be
killed and restarted at any time without disturbing the gateway or the trainer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from swarm.client import WorkerConfig, run_worker

__all__ = ["worker_config", "thread_worker", "process_worker", "process_command", "start_workers"]


def worker_config(server: str, task_cfg: dict[str, Any], workers: int, seed: int | None,
                  model: str = "default", agree_every: int = 0) -> WorkerConfig:
    return WorkerConfig(server=server, task=task_cfg["name"], workers=workers,
                        group_size=int(task_cfg["group_size"]), model=model,
                        temperature=float(task_cfg["temperature"]), max_tokens=int(task_cfg["max_tokens"]),
                        episode_timeout_s=float(task_cfg["episode_timeout_s"]),
                        eval_every=int(task_cfg.get("eval_every", 0)), seed=seed, agree_every=agree_every,
                        options=dict(task_cfg.get("options") or {}))


@task(name="client-workers", cache_policy=NONE)
def thread_worker(cfg: WorkerConfig, stop: threading.Event) -> dict[str, Any]:
    """Run episodes in threads until ``stop`` is set."""
    return run_worker(cfg, stop)


def process_command(cfg: WorkerConfig) -> list[str]:
    cmd = [sys.executable, "-m", "swarm.client", "--server", cfg.server, "--task", cfg.task,
           "--workers", str(cfg.workers), "--group-size", str(cfg.group_size), "--model", cfg.model,
           "--temperature", str(cfg.temperature), "--max-tokens", str(cfg.max_tokens),
           "--episode-timeout", str(cfg.episode_timeout_s), "--eval-every", str(cfg.eval_every),
           "--agree-every", str(cfg.agree_every), "--options", json.dumps(cfg.options)]
    if cfg.seed is not None:
        cmd += ["--seed", str(cfg.seed)]
    return cmd


@task(name="client-process", cache_policy=NONE)
def process_worker(cfg: WorkerConfig, stop: threading.Event, procs: list[subprocess.Popen]) -> int:
    """Keep one worker process running until ``stop``; a killed worker is restarted (hot swap)."""
    restarts = 0
    while not stop.is_set():
        proc = subprocess.Popen(process_command(cfg), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        while proc.poll() is None and not stop.is_set():
            stop.wait(0.2)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        elif not stop.is_set():
            restarts += 1
    return restarts


def start_workers(runner: dict[str, Any], server: str, task_cfg: dict[str, Any], seed: int, agree_every: int,
                  stop: threading.Event, procs: list[subprocess.Popen]) -> list[Any]:
    """Submit the client workers the ``runner`` config group asks for; returns their Prefect futures."""
    workers = int(runner["workers"])
    if runner["kind"] == "process":
        return [process_worker.submit(worker_config(server, task_cfg, workers, None, agree_every=agree_every),
                                      stop, procs) for _ in range(int(runner.get("processes", 1)))]
    if runner["kind"] == "thread":
        return [thread_worker.submit(worker_config(server, task_cfg, workers, seed * 1_000_000,
                                                   agree_every=agree_every), stop)]
    raise ValueError(f"runner.kind={runner['kind']!r} is unknown; use thread or process")
