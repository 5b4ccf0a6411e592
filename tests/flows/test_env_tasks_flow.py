"""The environment-library tasks (reasoning_gym, textarena) through the real training flow: one update each."""

from __future__ import annotations

import mlflow
import pytest

from flows.train import train_flow

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.slow]


def test_reasoning_gym_one_update(flow_config) -> None:
    """`python -m flows.train +task=reasoning_gym train.updates=1`, with a held-out eval group logged."""
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'swarmpool[envs]')")
    cfg = flow_config("+task=reasoning_gym", "train.updates=1", "task.eval_every=2")
    summary = train_flow(cfg)
    assert summary["status"] == "FINISHED" and summary["updates"] == 1
    metrics = mlflow.tracking.MlflowClient(tracking_uri=cfg["mlflow"]["tracking_uri"]).get_run(
        summary["run_id"]).data.metrics
    assert {"reward/mean", "train/loss", "episodes/score"} <= set(metrics)


def test_textarena_one_update_logs_the_win_rate(flow_config) -> None:
    """`python -m flows.train +task=textarena train.updates=1`: TicTacToe games trained, episodes/win logged."""
    pytest.importorskip("textarena", reason="textarena is not installed (pip install 'swarmpool[envs]')")
    cfg = flow_config("+task=textarena", "train.updates=1")
    summary = train_flow(cfg)
    assert summary["status"] == "FINISHED" and summary["updates"] == 1
    metrics = mlflow.tracking.MlflowClient(tracking_uri=cfg["mlflow"]["tracking_uri"]).get_run(
        summary["run_id"]).data.metrics
    assert {"reward/mean", "train/loss", "episodes/win", "episodes/draw"} <= set(metrics)
