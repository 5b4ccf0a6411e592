"""Mismatch, loud, through the real flow (tiny model, echo task): every update logs the train-inference mismatch and
the served version per replica; a mismatch past ``algo.max_mismatch`` stops the run FAILED with the reason."""

from __future__ import annotations

import mlflow
import pytest

from flows.train import train_flow

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _history(uri: str, run_id: str, key: str) -> list[float]:
    return [m.value for m in mlflow.tracking.MlflowClient(tracking_uri=uri).get_metric_history(run_id, key)]


def test_a_healthy_run_logs_a_small_mismatch_and_the_served_version(flow_config, capsys) -> None:
    cfg = flow_config("train.updates=2", "batching.min_groups=2", "mlflow.sample_trajectories=0")
    summary = train_flow(cfg)
    assert summary["status"] == "FINISHED" and summary["updates"] == 2
    uri = cfg["mlflow"]["tracking_uri"]
    run = mlflow.tracking.MlflowClient(tracking_uri=uri).get_run(summary["run_id"])
    means = _history(uri, summary["run_id"], "mismatch/logprob_abs_mean")
    maxes = _history(uri, summary["run_id"], "mismatch/logprob_abs_max")
    print(f"hf sampling vs the trainer's recompute: mean {means}, max {maxes}, "
          f"tokens {_history(uri, summary['run_id'], 'mismatch/tokens')}")
    assert len(means) >= 1 and max(means) < 1e-3 and max(maxes) < 1e-2  # the same weights in fp32
    assert _history(uri, summary["run_id"], "policy/served_version/hf") == [1.0, 2.0]
    assert "swarm.warning" not in run.data.tags


def test_a_mismatch_past_the_limit_stops_the_run_with_the_reason(flow_config, capsys) -> None:
    cfg = flow_config("train.updates=3", "batching.min_groups=2", "mlflow.sample_trajectories=0",
                      "algo.max_mismatch=1e-12")  # absurdly low: fp32 rounding alone passes it
    summary = train_flow(cfg)
    assert summary["status"] == "FAILED" and summary["updates"] == 1  # stopped after the first update
    run = mlflow.tracking.MlflowClient(tracking_uri=cfg["mlflow"]["tracking_uri"]).get_run(summary["run_id"])
    reason = run.data.tags["swarm.failure"]
    assert reason.startswith("train-inference mismatch too large: policy 'default'") and "algo.max_mismatch=1e-12" in reason
    assert reason.endswith("the run stopped at update 1"), reason
    assert "mismatch/logprob_abs_mean" in run.data.tags["swarm.warning"]  # warned first
    assert run.info.status == "FAILED" and run.data.metrics["policy/version"] == 1
    out = capsys.readouterr().out
    assert "warning" in out and "run FAILED" in out and "train-inference mismatch too large" in out
