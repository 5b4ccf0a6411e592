"""Crash semantics of `python -m flows.train` as a real subprocess: Ctrl-C / SIGTERM stop within 10 s
with exit 128+signal, no traceback and no process left, published = checkpoint = MLflow; a SIGKILL at
every update boundary, restarted at once or after the lease TTL, never trains a step twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import mlflow
import pytest
import sqlalchemy as sa

from swarm.pool import Pool, StepFilter
from swarm.train import load_latest_checkpoint
from swarm.train.journal import audit

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")]


def _train(tmp: Path, marker: str, *overrides: str, env: dict[str, str] | None = None,
           log: str = "train.log") -> subprocess.Popen:
    """``python -m flows.train`` in its own process group (as a terminal runs it), output to ``log``."""
    out, uri = tmp / "run", f"sqlite:///{tmp / 'mlruns.db'}"
    full = {k: v for k, v in os.environ.items() if k not in ("SWARM_CRASH_AT", "PREFECT_API_URL")}
    full.update({"PREFECT_HOME": str(tmp / "prefect"), "PYTHONPATH": str(REPO), "SWARM_TEST_RUN": marker,
                 **(env or {})})
    with (tmp / log).open("w") as f:
        return subprocess.Popen([sys.executable, "-m", "flows.train", f"train.out_dir={out}",
                                 f"mlflow.tracking_uri={uri}", "batching.min_groups=1", *overrides],
                                cwd=REPO, env=full, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _survivors(marker: str) -> list[int]:
    """Processes still running with our marker in their environment."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if f"SWARM_TEST_RUN={marker}".encode() in (p / "environ").read_bytes():
                    pids.append(int(p.name))
            except OSError:
                continue
    return pids


def _published(out: Path) -> int:
    pool = Pool(f"sqlite:///{out / 'pool.db'}")
    try:
        return pool.latest_version("default")
    finally:
        pool.close()


def _mlflow_runs(tmp: Path) -> list:
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlruns.db'}")
    exp = client.get_experiment_by_name("swarmpool")
    return client.search_runs([exp.experiment_id]) if exp else []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_cleanly_within_10s(tmp_path: Path, sig: signal.Signals) -> None:
    marker = uuid.uuid4().hex
    out = tmp_path / "run"
    proc = _train(tmp_path, marker, "train.updates=1000", "train.checkpoint_every=5")
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "pool.db").exists() and _published(out) >= 2:
                break
            time.sleep(0.5)
        assert proc.poll() is None and _published(out) >= 2, (tmp_path / "train.log").read_text()[-3000:]
        t0 = time.monotonic()
        # like a terminal: Ctrl-C reaches the whole foreground process group; SIGTERM only the process
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        rc = proc.wait(30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "train.log").read_text()
    assert rc == 128 + sig and took < 10, (rc, took, log[-3000:])
    assert "Traceback" not in log, log[-5000:]
    deadline = time.monotonic() + 10
    while _survivors(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _survivors(marker) == []  # the Prefect server and the workers included
    published = _published(out)
    ckpt = load_latest_checkpoint(out / "checkpoints" / "default")
    runs = _mlflow_runs(tmp_path)
    assert [r.info.status for r in runs] == ["KILLED"]
    history = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}").get_metric_history(
        runs[0].info.run_id, "train/loss")
    assert ckpt is not None and ckpt["version"] == published == max(m.step for m in history)
    pool = Pool(f"sqlite:///{out / 'pool.db'}")
    try:  # every trained step is settled, none is left leased
        trained = audit(out / "checkpoints" / "default" / "journal.jsonl")["step_ids"]
        consumed = {s.step_id for s in pool.query_steps(StepFilter(consumed=True), limit=100_000)}
        assert trained == consumed and trained
        with pool.engine.connect() as c:
            assert c.execute(sa.text("SELECT count(*) FROM leases WHERE state = 'active'")).scalar() == 0
    finally:
        pool.close()


def test_sigkill_at_every_boundary_never_trains_a_step_twice(tmp_path: Path) -> None:
    """One run directory, killed at each boundary in turn; restarts alternate immediate / after the TTL."""
    from flows.shutdown import own_prefect_server

    out = tmp_path / "run"
    marker = uuid.uuid4().hex
    common = ("train.updates=6", "train.checkpoint_every=2", "train.lease_ttl_s=2")
    plan = [("after_update:2", 0.0), ("after_checkpoint:1", 3.0), ("after_publish:1", 0.0),
            ("after_settle:1", 3.0), (None, 0.0)]
    with own_prefect_server() as api:  # one Prefect server for the five attempts (its own start-up is slow)
        env = {"PREFECT_API_URL": api} if api else {}
        for i, (point, delay) in enumerate(plan):
            proc = _train(tmp_path, marker, *common, env={**env, **({"SWARM_CRASH_AT": point} if point else {})},
                          log=f"attempt{i}.log")
            rc = proc.wait(400)
            log = (tmp_path / f"attempt{i}.log").read_text()
            if point is None:
                assert rc == 0, log[-4000:]
            else:
                assert rc == -signal.SIGKILL, (point, rc, log[-4000:])
            assert "Traceback" not in log, log[-3000:]
            time.sleep(delay)  # 3 s > the 2 s lease TTL: the leases of the killed run have expired
    result = audit(out / "checkpoints" / "default" / "journal.jsonl")
    assert result["trained_twice"] == [] and result["lost_updates"] > 0 and result["updates"] == 6
    pool = Pool(f"sqlite:///{out / 'pool.db'}")
    try:
        consumed = {s.step_id for s in pool.query_steps(StepFilter(consumed=True), limit=100_000)}
        assert consumed == result["step_ids"]  # every trained step settled once, nothing settled untrained
        ckpt = load_latest_checkpoint(out / "checkpoints" / "default")
        assert ckpt["updates"] == 6 and ckpt["version"] == pool.latest_version("default")
    finally:
        pool.close()
    runs = _mlflow_runs(tmp_path)
    assert [r.info.status for r in runs] == ["FINISHED"]  # one history, continued across the restarts
