"""The training flow end to end on CPU: real gateway, real pool, real Prefect flow and MLflow run."""

from __future__ import annotations

import mlflow
import pytest

from flows.train import train_flow
from swarm.pool import Pool, StepFilter

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _run_metrics(uri: str, run_id: str) -> tuple[dict, list[str]]:
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    artifacts = [a.path for a in client.list_artifacts(run_id)]
    return run, artifacts


def test_default_echo_flow_two_updates(flow_config) -> None:
    cfg = flow_config("train.updates=2", "batching.min_groups=2")
    summary = train_flow(cfg)
    assert summary["status"] == "FINISHED" and summary["updates"] == 2
    run, artifacts = _run_metrics(cfg["mlflow"]["tracking_uri"], summary["run_id"])
    for key in ("reward/mean", "train/loss", "merge/token_ratio", "pool/staleness", "throughput/steps_per_s"):
        assert key in run.data.metrics, key
    assert run.data.metrics["merge/token_ratio"] > 1.0  # a group of 8 shares its prompt
    assert run.data.params["task.name"] == "echo"
    assert {"config.json", "trajectories", "adapters"} <= set(artifacts)
    pool = Pool(cfg["pool"]["url"])
    try:
        consumed = pool.query_steps(StepFilter(consumed=True), limit=1000)
        assert consumed and all(s.response_logprobs and len(s.response_logprobs) == len(s.response_ids)
                                for s in consumed)
        assert pool.latest_version("default") == 2
        # steps generated after the first publish carry a newer version
        assert max(s.policy_version for s in pool.query_steps(StepFilter(), limit=10_000)) >= 1
    finally:
        pool.close()
