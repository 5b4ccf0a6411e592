"""Hydra config: every task file composes with +task=<name>, every group has a tiny CPU option."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[2] / "conf"
TASKS = sorted(p.stem for p in (CONF / "task").glob("*.yaml"))


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose(config_name="train", overrides=list(overrides), return_hydra_config=True)


def test_default_config_is_the_tiny_cpu_run() -> None:
    cfg = _compose()
    assert cfg.task.name == "echo"
    assert cfg.model.backend == "hf" and cfg.model.path is None and cfg.model.device == "cpu"
    assert cfg.runner.kind == "thread" and cfg.batching.strategy == "groups"


@pytest.mark.parametrize("task", TASKS)
def test_every_task_composes(task: str) -> None:
    from flows.config import TaskSection, check_task

    cfg = _compose(f"+task={task}")
    check_task(TaskSection.model_validate(OmegaConf.to_container(cfg.task, resolve=True)))  # a real package, valid options
    assert set(cfg.task.options.get("role_policies", {}).values()) <= set(cfg.policies) | {"default"}
    OmegaConf.to_container(cfg, resolve=False)


@pytest.mark.parametrize("group", ["model", "pool", "algo", "batching", "runner"])
def test_every_group_option_composes(group: str) -> None:
    for option in sorted(p.stem for p in (CONF / group).glob("*.yaml")):
        cfg = _compose(f"{group}={option}")
        assert cfg[group] is not None
    assert (CONF / group).is_dir()


def test_every_group_has_a_cpu_default() -> None:
    cfg = _compose()
    for group in ("model", "pool", "algo", "batching", "runner"):
        assert group in cfg, group


def test_gateway_trust_settings_reach_gateway_settings() -> None:
    """allowed_hosts, reward_authority and max_connections_per_client compose into GatewaySettings, from
    the train and the serve config alike; a misspelt gateway key is refused by composition, as before."""
    from hydra.errors import ConfigCompositionException

    from flows.components import ConfigError, gateway_settings
    from swarm.gateway import GatewaySettings

    default = gateway_settings(OmegaConf.to_container(_compose().gateway, resolve=True))
    base = GatewaySettings()
    assert (default.allowed_hosts, default.reward_authority, default.max_connections_per_client) == (
        base.allowed_hosts, base.reward_authority, base.max_connections_per_client)
    overrides = ["gateway.allowed_hosts=[example.org,gw.lan]", "gateway.reward_authority={math: judge}",
                 "gateway.max_connections_per_client=7"]
    for name in ("train", "serve"):
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            cfg = compose(config_name=name, overrides=overrides)
        for gw in (OmegaConf.to_container(cfg.gateway, resolve=True), cfg.gateway):  # plain dict or DictConfig
            s = gateway_settings(gw)
            assert s.allowed_hosts == ("example.org", "gw.lan") and s.reward_authority == {"math": "judge"}
            assert s.max_connections_per_client == 7 and type(s.reward_authority) is dict
    for typo in ("gateway.allowed_host=[example.org]", "gateway.reward_authorty={math: judge}",
                 "gateway.max_connection_per_client=7"):
        with pytest.raises(ConfigCompositionException):
            _compose(typo)
    with pytest.raises(ConfigError, match="gateway.reward_authority"):
        gateway_settings({"reward_authority": {"math": "referee"}})
    with pytest.raises(ConfigError, match="gateway.allowed_hosts"):
        gateway_settings({"allowed_hosts": "example.org"})
