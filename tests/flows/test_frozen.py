"""Frozen policies in a real flow run: Werewolves wolves played by a frozen, 2x wider tiny model."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
import sqlalchemy as sa

from flows.config import ConfigError, validate
from flows.train import train_flow
from swarm.policy.hf import HFSettings
from swarm.pool import Pool, StepFilter


def test_frozen_policy_config_is_checked(flow_config) -> None:
    cfg = flow_config("+model@frozen_policies.wolfbot=tiny_wide")
    assert validate(cfg).frozen_policies["wolfbot"].tiny_spec == {"hidden_size": 256, "intermediate_size": 1024}
    with pytest.raises(ConfigError, match=r"^frozen_policies.default: 'default' is also in policies"):
        validate(flow_config("+frozen_policies.default.backend=echo"))
    with pytest.raises(ConfigError, match=r"^frozen_policies.judge.backend: missing; use one of echo, fleet, hf, (.*, )?upstream, vllm$"):
        validate(flow_config("+frozen_policies.judge.seed=1"))
    assert HFSettings(backend="hf").spec() is None  # the default tiny model, byte for byte (same cache key)
    with pytest.raises(ConfigError, match=r"model.tiny_spec.hidden_sise is unknown"):
        HFSettings(backend="hf", tiny_spec={"hidden_sise": 256}).spec()


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_werewolves_against_a_frozen_wider_policy(flow_config) -> None:
    """Two updates of the village; the wolves' policy is served (steps recorded) but never leased or trained."""
    cfg = flow_config("+task=werewolves", "task.options.opponents=policy:wolfbot",
                      "+model@frozen_policies.wolfbot=tiny_wide", "train.updates=2", "task.group_size=2",
                      "batching.min_groups=1", "runner.workers=2",
                      "model.warmup=word_chain")  # plumbing, not learning
    summary = train_flow(cfg)
    assert summary["status"] == "FINISHED" and summary["updates"] == 2
    metrics = mlflow.tracking.MlflowClient(tracking_uri=cfg["mlflow"]["tracking_uri"]).get_run(summary["run_id"]).data
    assert "train/loss" in metrics.metrics and not any("wolfbot" in k for k in metrics.metrics)  # one trainer only
    pool = Pool(cfg["pool"]["url"])
    try:
        assert pool.latest_version("default") == 2 and pool.latest_version("wolfbot") == 0
        wolf = pool.query_steps(StepFilter(policy="wolfbot"), limit=100_000, with_tokens=True)
        assert wolf and all(s.policy_version == 0 for s in wolf)
        assert all(s.response_ids and len(s.response_logprobs or []) == len(s.response_ids) for s in wolf)  # exact
        eps = [pool.get_episode(e) for e in {s.episode_id for s in wolf}]
        assert {(ep.metadata["role"], ep.type.value) for ep in eps} == {("werewolf", "eval")}
        assert pool.query_steps(StepFilter(policy="default", consumed=True), limit=1)  # the village was trained
        engine = sa.create_engine(cfg["pool"]["url"])
        with engine.connect() as c:
            touched = c.execute(sa.text("SELECT count(*) FROM steps WHERE policy = 'wolfbot' AND "
                                        "(lease_id IS NOT NULL OR consumed_version IS NOT NULL)")).scalar()
            filters = [str(f) for (f,) in c.execute(sa.text("SELECT filter FROM leases"))]
        engine.dispose()
        assert touched == 0  # never leased, never consumed
        assert filters and not any("wolfbot" in f for f in filters)
    finally:
        pool.close()
    out = Path(cfg["train"]["out_dir"])
    assert (out / "checkpoints" / "default").is_dir()
    assert not (out / "checkpoints" / "wolfbot").exists() and not (out / "adapters" / "wolfbot").exists()
