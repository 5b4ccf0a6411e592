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
