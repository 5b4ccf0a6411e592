"""``python -m flows.train runner=ray train.updates=1`` end to end: the real CLI, Ray client tasks, one update."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from swarm.pool import Pool, StepFilter

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("prefect_ray")
pytestmark = pytest.mark.slow


def test_train_cli_with_ray_runner(tmp_path: Path) -> None:
    out, db = tmp_path / "run", tmp_path / "mlruns.db"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "SWARM_CACHE": str(REPO / ".cache"),
           "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    for k in ("PREFECT_API_URL", "SWARM_POOL_URL", "MLFLOW_TRACKING_URI"):
        env.pop(k, None)  # the CLI's own temporary Prefect server; Ray tasks must report to it
    cmd = [sys.executable, "-m", "flows.train", "runner=ray", "runner.tasks=2", "runner.workers=4",
           "runner.num_cpus=2", f"runner.home={tmp_path / 'ray_home'}", "train.updates=1", "batching.min_groups=2",
           "batching.min_episodes=16", f"train.out_dir={out}", f"mlflow.tracking_uri=sqlite:///{db}",
           "mlflow.sample_trajectories=1", "run_name=ray-e2e"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{db}")
    [run] = client.search_runs(client.get_experiment_by_name("swarmpool").experiment_id)
    assert run.info.status == "FINISHED" and run.data.params["runner.kind"] == "ray"
    assert "train/loss" in run.data.metrics and "reward/mean" in run.data.metrics
    pool = Pool(f"sqlite:///{out / 'pool.db'}")
    try:
        eps = pool.query_episodes(StepFilter(), limit=10_000)
        assert {e.client_id.split("-")[0] for e in eps} == {"ray"}  # every episode came from a Ray task
        # at most the 2 tasks asked for; on a loaded machine one task can fill the single batch before the other's
        # first call (seen in a parallel suite run), so both are not required here: test_ray_runner.py waits for both
        assert 1 <= len({e.client_id for e in eps}) <= 2
        assert pool.latest_version("default") == 1
        assert pool.count_steps(StepFilter(consumed=True)) >= 16
    finally:
        pool.close()
