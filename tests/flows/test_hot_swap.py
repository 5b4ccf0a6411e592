"""Hot swap, proven (#33): a running flow keeps training while a task's reward code is replaced.

The flow (gateway + trainer, in this process) runs with ``runner.processes=0``; the test runs the
client workers itself as ``python -m swarm.client`` processes on a copy of ``experiments/echo``.
After the first update it changes the copy's reward function, starts a new worker on it and stops
the old one. The gateway is never restarted; every episode names the code that ran it
(``metadata["code_version"]``), and the pool's metadata filter selects the new code's episodes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from flow_waits import health, wait_for

from flows.shutdown import end_process
from flows.train import train_flow
from swarm.pool import Pool, StepFilter
from swarm.stack import free_port

pytestmark = pytest.mark.usefixtures("prefect_harness")

REPO = Path(__file__).resolve().parents[2]
OLD = '"reward": 0.1 * similarity'  # old rewards in [0, 0.1]
NEW = '"reward": 0.9 + 0.1 * similarity'  # new ones in [0.9, 1.0] (a longer file: no stale bytecode either way)


def _copy_echo(root: Path) -> Path:
    """``hs_tasks.echo``: experiments/echo under another name, rewards scaled to [0, 0.1]."""
    pkg = root / "hs_tasks" / "echo"
    shutil.copytree(REPO / "experiments" / "echo", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "hs_tasks" / "__init__.py").write_text("")
    init = pkg / "__init__.py"
    init.write_text(init.read_text().replace("experiments.echo.reward", "hs_tasks.echo.reward"))
    reward = pkg / "reward.py"
    text = reward.read_text()
    assert '"reward": similarity' in text
    reward.write_text(text.replace('"reward": similarity', OLD))
    return pkg


def _worker(root: Path, url: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)]), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.Popen([sys.executable, "-m", "swarm.client", "--server", url, "--task", "hs_tasks.echo",
                             "--workers", "4", "--group-size", "4", "--max-tokens", "8"],
                            env=env, cwd=str(root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_reward_code_swapped_mid_run(flow_config, tmp_path: Path) -> None:
    pkg = _copy_echo(tmp_path / "tasks")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    updates = 5  # two or more updates after the swap: the last ones train the new code's steps
    cfg = flow_config("task.name=hs_tasks.echo", "task.group_size=4", "runner=process", "runner.processes=0",
                      f"gateway.port={port}", f"train.updates={updates}", "batching.min_groups=2",
                      "train.batch_timeout_s=60")
    result: dict[str, Any] = {}
    flow = threading.Thread(target=lambda: result.update(train_flow(cfg)), daemon=True)
    flow.start()
    procs: list[subprocess.Popen] = []
    try:
        wait_for(lambda: health(url), 60, "the gateway", flow)
        old = _worker(tmp_path / "tasks", url)
        procs.append(old)
        seen: list[int | None] = []  # the gateway's policy version at each poll from the first update on

        def versions() -> int:
            h = health(url)
            seen.append(None if h is None else h["versions"]["default"])
            return seen[-1] or 0

        wait_for(lambda: versions() >= 1, 90, "the first update", flow)
        # the swap: new reward code, a new worker on it, the old worker stopped; the gateway keeps running
        reward = pkg / "reward.py"
        reward.write_text(reward.read_text().replace(OLD, NEW))
        swapped_at = time.time()
        new = _worker(tmp_path / "tasks", url)
        procs.append(new)
        wait_for(lambda: new.poll() is None and versions() >= 2, 90, "an update after the swap", flow)
        end_process(old, 15)
        versions()
        # the same gateway (same URL, same process: it lives in the flow's thread) answered every poll
        # across the swap, and its policy versions only went up: never restarted
        assert None not in seen and seen == sorted(seen) and seen[-1] >= 2, seen
        flow.join(120)
        assert not flow.is_alive(), "the run did not finish"
        assert new.poll() is None, "the new worker died"
    finally:
        for p in procs:
            end_process(p, 15)
    assert result["status"] == "FINISHED" and result["updates"] == updates

    pool = Pool(cfg["pool"]["url"])
    try:
        episodes = pool.query_episodes(StepFilter(task="echo"), limit=100_000)  # with those left open by a stop
        by_version: dict[str, list] = {}
        for e in episodes:
            by_version.setdefault(e.metadata["code_version"], []).append(e)
        assert len(by_version) == 2, by_version.keys()
        new_client = f"worker-{new.pid}-"
        (v_new,) = {e.metadata["code_version"] for e in episodes if e.client_id.startswith(new_client)}
        (v_old,) = set(by_version) - {v_new}
        old_eps, new_eps = by_version[v_old], by_version[v_new]
        old_rewards = [e.reward for e in old_eps if e.reward is not None]
        new_rewards = [e.reward for e in new_eps if e.reward is not None]
        assert old_rewards and all(r <= 0.1 + 1e-9 for r in old_rewards)  # the old function's rewards
        assert new_rewards and all(r >= 0.9 - 1e-9 for r in new_rewards)  # the new function's
        assert min(e.created_at for e in new_eps) >= swapped_at
        assert all(not e.client_id.startswith(new_client) for e in old_eps)
        # the filter the trainer's lease uses selects exactly the new code's episodes and their steps
        f = StepFilter(metadata={"code_version": v_new})
        assert {e.episode_id for e in pool.query_episodes(f, limit=100_000)} == {e.episode_id for e in new_eps}
        steps = pool.query_steps(f, limit=100_000)
        assert steps and {s.episode_id for s in steps} <= {e.episode_id for e in new_eps}
        # and the run trained on the new code's steps
        assert pool.query_steps(StepFilter(metadata={"code_version": v_new}, consumed=True), limit=1)
        print(f"hot swap: {len(old_rewards)} rewarded episodes on {v_old} (mean reward "
              f"{sum(old_rewards) / len(old_rewards):.3f}), {len(new_rewards)} on {v_new} "
              f"(mean {sum(new_rewards) / len(new_rewards):.3f}); policy version {pool.latest_version('default')}")
    finally:
        pool.close()
