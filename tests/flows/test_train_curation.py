"""Training on a curated set: the real flow (tiny model, real gateway and pool) leases only what its curation selects."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import mlflow
import pytest

from flows.session import StartError
from flows.train import train_flow
from swarm.pool import Pool, StepFilter


def _label_even_seeds(pool: Pool, stop: threading.Event) -> None:
    """A curator at work: every finished train episode of an even seed (whole groups share a seed) gets "gold"."""
    seen: set[str] = set()
    while not stop.wait(0.2):
        for ep in pool.query_episodes(StepFilter(episode_status="finished", episode_type="train"), limit=100_000):
            if ep.episode_id not in seen:
                seen.add(ep.episode_id)
                if ep.metadata.get("seed", 1) % 2 == 0:
                    pool.label("episode", ep.episode_id, "gold", note="even seed")


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_the_run_consumes_exactly_its_curation_and_publishes_its_plan(flow_config) -> None:
    cfg = flow_config("train.updates=2", "batching.min_groups=1", "train.curation=gold")
    Path(cfg["train"]["out_dir"]).mkdir(parents=True)
    pool = Pool(cfg["pool"]["url"])  # the run's own pool, opened first to save the curation in it
    stop = threading.Event()
    labeller = threading.Thread(target=_label_even_seeds, args=(pool, stop), daemon=True)
    try:
        pool.save_curation("gold", StepFilter(label="gold"), note="even seeds")
        labeller.start()
        summary = train_flow(cfg)
        stop.set()
        labeller.join(30)
        assert summary["status"] == "FINISHED" and summary["updates"] == 2
        consumed = pool.count_steps(StepFilter(consumed=True))
        assert consumed > 0 and pool.count_steps(StepFilter(consumed=True, label="gold")) == consumed
        finished = StepFilter(episode_type="train", episode_status="finished")
        outside = pool.count_steps(finished) - pool.count_steps(finished.model_copy(update={"label": "gold"}))
        assert outside > 0  # the run made steps outside the curation, and consumed none of them
        (plan,) = pool.lease_plans()
        assert plan["policy"] == "default" and plan["curation"] == "gold@1" and plan["version"] == 1
        last = pool.overview.recent_leases(1)[0]  # the second update's lease, leased with the plan's filter
        leased = StepFilter.model_validate(last["filter"]).model_copy(update={"group_ids": None})
        assert leased == StepFilter.model_validate(plan["filter"])
        assert leased.label == "gold" and leased.consumed is False and leased.current_version == 1
        params = mlflow.tracking.MlflowClient(tracking_uri=cfg["mlflow"]["tracking_uri"]).get_run(
            summary["run_id"]).data.params
        assert params["curation.ref"] == "gold@1" and json.loads(params["curation.filter"]) == {"label": "gold"}
    finally:
        stop.set()
        pool.close()


@pytest.mark.usefixtures("prefect_harness")
def test_an_unknown_curation_stops_the_run_naming_it(flow_config) -> None:
    cfg = flow_config("train.updates=1", "train.curation=nope@2")
    with pytest.raises(StartError, match="starting the curation nope@2 failed: no curation named 'nope'"):
        train_flow(cfg)


def test_the_inline_filter_is_checked_at_config_time(flow_config) -> None:
    from flows.config import ConfigError, validate

    ok = validate(flow_config("train.filter={task: echo, metadata: {d: 2}, label: gold, min_length: 10}"))
    assert ok.train.step_filter() == StepFilter(task="echo", metadata={"d": 2}, label="gold", min_length=10)
    for override, message in (("train.filter={tsk: echo}", "train.filter.tsk: unknown key (did you mean train.filter.task?)"),
                              ("train.filter={min_length: -1}", "train.filter.min_length=-1: Input should be"),
                              ("train.filter={episode_type: eval}", "train.filter: curation field episode_type=\"eval\""),
                              ("train.filter={policy: other}", "curation field policy='other' contradicts"),
                              ("train.curation=gold@x", "train.curation=gold@x: curation 'gold@x': the version")):
        with pytest.raises(ConfigError) as exc:
            validate(flow_config(override))
        assert message in str(exc.value), str(exc.value)


def test_resolve_curation_inline_saved_and_contradicting(flow_config, tmp_path) -> None:
    from flows.config import validate
    from flows.session import resolve_curation
    from swarm.errors import ValidationError

    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    try:
        assert resolve_curation(validate(flow_config()), pool) == (None, None)
        inline = validate(flow_config("train.filter={task: echo, min_length: 1}"))
        assert resolve_curation(inline, pool) == (None, StepFilter(task="echo", min_length=1))
        pool.save_curation("gold", StepFilter(label="gold"))
        pool.save_curation("gold", StepFilter(label="gold", task="echo"))
        assert resolve_curation(validate(flow_config("train.curation=gold@1")), pool) == (
            "gold@1", StepFilter(label="gold"))
        assert resolve_curation(validate(flow_config("train.curation=gold")), pool)[0] == "gold@2"
        pool.save_curation("evals", StepFilter(episode_type="eval"))  # fine to save and export, not to train on
        with pytest.raises(ValidationError, match="curation field episode_type"):
            resolve_curation(validate(flow_config("train.curation=evals")), pool)
    finally:
        pool.close()
