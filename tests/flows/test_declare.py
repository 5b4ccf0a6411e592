"""Adding is declaring: a backend and a reward kind registered from test modules (no project file edited) are
validated, named in messages and built; unknown keys are refused everywhere, the top level included."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from flows.components import make_backend, make_gateway_backend
from flows.config import ConfigError, RunConfig, validate
from swarm.policy.base import GenerateRequest, SamplingParams
from swarm.policy.settings import BACKENDS

CONF = Path(__file__).resolve().parents[2] / "conf"


def resolved(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="train", overrides=["train.out_dir=/tmp/x", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def toy(**settings: object) -> dict:
    """The default run with ``model`` = the toy backend's section."""
    return {**resolved(), "model": {"backend": "tests.flows.toy_backend", **settings}}


def test_a_backend_declared_in_a_test_module_validates_and_builds() -> None:
    run = validate(toy(times=2))
    assert isinstance(run, RunConfig) and run.model.backend == "tests.flows.toy_backend" and run.model.times == 2
    backend = make_gateway_backend(run)
    assert type(backend).__name__ == "ShoutBackend" and backend.times == 2
    [gen] = asyncio.run(backend.generate(GenerateRequest(policy="default", prompt_ids=backend.encode("default", "hi"),
                                                         sampling=SamplingParams(max_tokens=8))))
    assert gen.text.startswith("HEY HEY")
    assert "tests.flows.toy_backend" in BACKENDS.kinds() and "tests.flows.toy_backend" not in BACKENDS.builtins()


def test_a_declared_backends_settings_are_checked_with_the_close_key() -> None:
    with pytest.raises(ConfigError, match=r"^model.tims: unknown key \(did you mean model.times\?\)"):
        validate(toy(tims=2))
    with pytest.raises(ConfigError, match=r"^model.times=0: Input should be greater than or equal to 1"):
        validate(toy(times=0))
    with pytest.raises(ConfigError, match=r"^model.backend=tests.flows.no_such: unknown; use one of echo, fleet, hf, upstream, vllm"):
        validate({**resolved(), "model": {"backend": "tests.flows.no_such"}})


def test_a_fleet_takes_a_declared_backend_as_a_replica() -> None:
    run = validate(resolved("model=fleet_echo"))
    data = run.model.model_dump()
    data["replicas"] = [{"backend": "tests.flows.toy_backend", "name": "loud", "times": 3}, data["replicas"][0]]
    fleet = make_backend(validate({**resolved(), "model": data}).model, ["default"], None)
    assert [(r.name, type(r.backend).__name__) for r in fleet.replicas] == [("loud", "ShoutBackend"),
                                                                              ("a", "EchoBackend")]


def test_a_reward_kind_declared_in_a_test_module_reaches_the_gateway_settings() -> None:
    run = validate(resolved("+task.reward={kind: tests.flows.toy_reward, level: judge}"))
    assert run.task.reward.authority(run.task.name) == {"echo": "judge"}
    settings = run.gateway.settings(run.task.reward.authority(run.task.name))
    assert settings.reward_authority == {"echo": "judge"}
    with pytest.raises(ConfigError, match=r"task.reward.levl: unknown key \(did you mean task.reward.level\?\)"):
        validate(resolved("+task.reward={kind: tests.flows.toy_reward, levl: judge}"))
    with pytest.raises(ConfigError, match=r"^task.reward.kind=jduge: unknown; use one of judge"):
        validate(resolved("+task.reward={kind: jduge}"))


@pytest.mark.parametrize(("override", "message"), [
    ("+seeed=3", r"^seeed: unknown key \(did you mean seed\?\)$"),
    ("+polices=[a]", r"^polices: unknown key \(did you mean policies\?\)$"),
    ("+task.options.typo=1", r"^task.options.typo: unknown key$"),
])
def test_unknown_keys_are_refused_at_every_level(override: str, message: str) -> None:
    from flows.config import check_task

    if override.startswith("+task.options"):
        run = validate(resolved("+task=math", override))
        with pytest.raises(ConfigError, match=message):
            check_task(run.task, run.runner)
        return
    with pytest.raises(ConfigError, match=message):
        validate(resolved(override))
