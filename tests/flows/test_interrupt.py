"""Ctrl-C stops `python -m flows.train` cleanly: the MLflow run ends KILLED, the pool stays readable
and the last committed checkpoint matches the published policy version."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest

from swarm.pool import Pool, StepFilter
from swarm.train import load_latest_checkpoint

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_sigint_leaves_pool_and_mlflow_run_consistent(tmp_path: Path) -> None:
    out, uri = tmp_path / "run", f"sqlite:///{tmp_path / 'mlruns.db'}"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    cwd = tmp_path / "cwd"  # the run must write nothing here: everything goes to train.out_dir and the MLflow store
    cwd.mkdir()
    log = (tmp_path / "train.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "flows.train", "train.updates=1000", f"train.out_dir={out}",
                             f"mlflow.tracking_uri={uri}", "batching.min_groups=1"],
                            cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        versions = 0
        while versions < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            if (out / "pool.db").exists():
                pool = Pool(f"sqlite:///{out / 'pool.db'}")
                versions = pool.latest_version("default")
                pool.close()
        assert versions >= 2, (tmp_path / "train.log").read_text()[-3000:]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) in (0, 1, 130)  # it stops by itself, promptly
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert list(cwd.iterdir()) == [] and (out / ".hydra").is_dir() and (tmp_path / "mlartifacts").is_dir()
    text = (tmp_path / "train.log").read_text()
    head = re.split(r"(?m)^updates\b", text, maxsplit=1)[0]  # what the terminal shows before the progress bar
    from swarm.policy.shipped import manifest

    (weights,) = [e["files"]["model.safetensors"] for e in manifest().values() if e["warmup"] == "word_chain"]
    for line in ("gateway    http://127.0.0.1:", "dashboard  http://127.0.0.1:", f"run folder {out}",
                 f"mlflow     {uri}", "mlflow run 'echo updates=1000 min_groups=1'",
                 f"(model.safetensors sha256 {weights[:16]})"):  # the shipped default model, checked
        assert line in head, text[:3000]
    for noise in ("prefect", "Warning", "Loading", "alembic", "Creating initial"):  # quiet by default
        assert noise not in head, text[:3000]
    runs = mlflow.tracking.MlflowClient(tracking_uri=uri).search_runs(
        [mlflow.tracking.MlflowClient(tracking_uri=uri).get_experiment_by_name("swarmpool").experiment_id])
    assert [r.info.status for r in runs] == ["KILLED"]
    pool = Pool(f"sqlite:///{out / 'pool.db'}")
    try:
        published = pool.latest_version("default")
        assert published >= 2 and pool.count_steps(StepFilter(consumed=True)) > 0
    finally:
        pool.close()
    # the last committed update is the published one (or the one before, if the signal fell between
    # publishing and committing); a rerun resumes from it
    ckpt = load_latest_checkpoint(out / "checkpoints" / "default")
    assert ckpt is not None and ckpt["version"] in (published, published - 1)
