"""A client's start overrides checked against the typed config (flows.control.start_checker): what passes, what
needs a restart, unknown keys and bad values, each a 400 naming the key."""

from __future__ import annotations

import pytest

from flows.config import validate
from flows.control import knobs_of, start_checker
from swarm.errors import ValidationError


@pytest.fixture
def check(flow_config):
    return start_checker(validate(flow_config("train.wait_for_client=true")))


def test_overrides_make_the_run_config_and_its_knobs(check) -> None:
    cfg, knobs = check({"algo.lr": 0.01, "train.updates": 3, "batching.strategy": "episodes", "task.eval_every": 2,
                        "task.group_size": 4, "run_name": "from-a-laptop", "mlflow.tags": {"who": "client"}})
    assert (cfg.algo.lr, cfg.train.updates, cfg.batching.strategy, cfg.task.eval_every) == (0.01, 3, "episodes", 2)
    assert cfg.run_name == "from-a-laptop" and cfg.mlflow.tags == {"who": "client"}
    assert knobs == knobs_of(cfg) and knobs["lr"] == 0.01 and knobs["updates"] == 3
    assert "algo.lr=0.01" in cfg.overrides


@pytest.mark.parametrize("key", ["model.path", "pool.url", "gateway.port", "policies", "train.out_dir",
                                 "algo.lora.r", "train.wait_for_client"])
def test_keys_that_need_a_restart_are_refused(check, key: str) -> None:
    with pytest.raises(ValidationError, match=rf"^{key}: .*restart python -m flows.train") as exc:
        check({key: 1})
    assert exc.value.context["param"] == key


@pytest.mark.parametrize(("overrides", "match"), [
    ({"train.updates": 0}, r"train.updates=0"),
    ({"batching.strategy": "huge"}, r"batching.strategy"),
    ({"algo.lrr": 1}, r"algo.lrr: unknown key \(did you mean algo.lr\?\)"),
    ({"task.name": "no_such_task"}, r"task.name='no_such_task'"),
    ({"hydra.run.dir": "x"}, r"hydra.run.dir: not a start override"),
])
def test_bad_overrides_name_the_key(check, overrides, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        check(overrides)


def test_applied_changes_reach_the_settings_and_workers_and_are_logged_at_their_version(flow_config,
                                                                                        tmp_path) -> None:
    import json

    import mlflow

    from flows.control import apply_changes
    from flows.run import update_settings
    from flows.workers import worker_config
    from swarm.control import Control

    cfg = validate(flow_config())
    control = Control(knobs_of(cfg))
    control.retune({"strategy": "episodes", "min_episodes": 6, "max_staleness": None, "eval_every": 3,
                    "updates": 7})
    worker = worker_config("http://127.0.0.1:1", cfg.task, 2, 0)
    lines: list[str] = []
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'ml.db'}")
    experiment = mlflow.create_experiment("control", artifact_location=(tmp_path / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment) as run:
        settings = apply_changes(control.take_changes(), {}, update_settings(cfg), [worker], 4, control, lines)
    assert (settings.strategy, settings.min_episodes, settings.max_staleness) == ("episodes", 6, None)
    assert worker.eval_every == 3 and control.knobs["updates"] == 7
    mc = mlflow.tracking.MlflowClient()
    assert [(m.step, m.value) for m in mc.get_metric_history(run.info.run_id, "control/min_episodes")] == [(4, 6.0)]
    assert mc.get_run(run.info.run_id).data.tags["control.strategy"] == "episodes"
    events = [json.loads(line) for line in lines]
    assert [(e["knob"], e["value"], e["version"]) for e in events] == [
        ("strategy", "episodes", 4), ("min_episodes", 6, 4), ("max_staleness", None, 4), ("eval_every", 3, 4),
        ("updates", 7, 4)]
