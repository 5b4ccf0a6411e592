"""The training run's session: a stage that fails to start is named, and nothing started before it is left running."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import mlflow
import pytest

from flows import session, tracking
from flows.run import train_flow
from swarm.stack import free_port

pytestmark = pytest.mark.usefixtures("prefect_harness")

# the stage's name in the error -> (module, attribute) of what starts it
STAGES = {
    "the pool": (session, "make_pool"),
    "the policy backend": (session, "make_gateway_backend"),
    "the trainers": (session, "Trainer"),
    "the gateway": (session, "start_gateway"),
    "the MLflow run": (tracking, "open_run"),
    "the workers": (session, "start_workers"),
}

# tqdm's monitor (the first progress bar starts it, for good); Prefect's log and event senders
LIBRARY_SERVICES = {"tqdm_monitor", "APILogWorkerThread", "EventsWorkerThread"}


def _children() -> set[int]:
    """This process's live child processes (Linux /proc)."""
    out: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        out |= {int(p) for p in (task / "children").read_text().split()}
    return out


def _new_threads(before: set[threading.Thread]) -> set[threading.Thread]:
    """Threads started since ``before``, but process-wide library services that come and go on their own."""
    return {t for t in set(threading.enumerate()) - before if t.name not in LIBRARY_SERVICES}


def _refuses(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _fail_at(monkeypatch: pytest.MonkeyPatch, stage: str) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"{stage} is broken")

    monkeypatch.setattr(*STAGES[stage], boom)


@pytest.fixture(scope="module")
def mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One MLflow store for every case: creating its tables takes seconds."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlruns.db'}"


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_stage_that_fails_to_start_is_named_and_leaks_nothing(stage, flow_config, mlflow_db, monkeypatch) -> None:
    port = free_port()
    cfg = flow_config(f"gateway.port={port}")
    cfg["mlflow"]["tracking_uri"] = mlflow_db
    with monkeypatch.context() as mp:  # a failed start first: Prefect's own long-lived services join the baseline
        _fail_at(mp, "the pool")
        with pytest.raises(session.StartError):
            train_flow(cfg)
    threads, children = set(threading.enumerate()), _children()
    _fail_at(monkeypatch, stage)
    with pytest.raises(session.StartError, match=f"^starting {stage} failed: {stage} is broken"):
        train_flow(cfg)
    deadline = time.monotonic() + 10
    while _new_threads(threads) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _new_threads(threads) == set()
    assert _children() - children == set()
    assert _refuses(port)
    assert mlflow.active_run() is None
