"""Crash semantics of `python -m flows.train` as a real subprocess: Ctrl-C / SIGTERM stop within 10 s
with exit 128+signal, no traceback and no process left, published = checkpoint = MLflow, nothing
written outside the run folder and the MLflow store, and a quiet console; a SIGKILL at every update
boundary, restarted at once or after the lease TTL, never trains a step twice."""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from pathlib import Path

import mlflow
import pytest
import sqlalchemy as sa

from flows.drill import boundary_plan, crash_drill, train_process
from swarm.pool import Pool, StepFilter
from swarm.train import load_latest_checkpoint
from swarm.train.journal import audit

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")]


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
    cwd = tmp_path / "cwd"  # the run must write nothing here: everything goes to train.out_dir and the MLflow store
    cwd.mkdir()
    proc = train_process(tmp_path, marker, "train.updates=1000", "train.checkpoint_every=5", cwd=cwd,
                         env={"COLUMNS": "200"})  # the console's lines unwrapped, as a wide terminal shows them
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
    assert list(cwd.iterdir()) == [] and (out / ".hydra").is_dir() and (tmp_path / "mlartifacts").is_dir()
    head = re.split(r"(?m)^updates\b", log, maxsplit=1)[0]  # what the terminal shows before the progress bar
    from swarm.policy.shipped import manifest

    (weights,) = [e["files"]["model.safetensors"] for e in manifest().values() if e["warmup"] == "word_chain"]
    for line in ("gateway    http://127.0.0.1:", "dashboard  http://127.0.0.1:", f"run folder {out}",
                 f"mlflow     sqlite:///{tmp_path / 'mlruns.db'}", "mlflow run 'echo ",
                 f"(model.safetensors sha256 {weights[:16]})"):  # the shipped default model, checked
        assert line in head, log[:3000]
    for noise in ("prefect", "Warning", "Loading", "alembic", "Creating initial"):  # quiet by default
        assert noise not in head, log[:3000]
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
    with own_prefect_server() as api:  # one Prefect server for the five attempts (its own start-up is slow)
        drill = crash_drill(tmp_path, uuid.uuid4().hex, boundary_plan(), env={"PREFECT_API_URL": api} if api else {})
    for a in drill.attempts:
        if a.point is None:
            assert a.rc == 0, a.log[-4000:]
        else:
            assert a.rc == -signal.SIGKILL, (a.point, a.rc, a.log[-4000:])
        assert "Traceback" not in a.log, a.log[-3000:]
    result = drill.audit
    assert drill.updates == 6 and result["trained_twice"] == [] and result["lost_updates"] > 0 and result["updates"] == 6
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
