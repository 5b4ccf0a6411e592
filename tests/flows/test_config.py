"""Hydra config: every task file composes with +task=<name>, every group has a tiny CPU option."""

import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[2] / "conf"
TASKS = sorted(p.stem for p in (CONF / "task").glob("*.yaml"))


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose(config_name="train", overrides=list(overrides), return_hydra_config=True)


def _resolved(*overrides: str, name: str = "train") -> dict:
    """A composed config as a resolved plain tree (no Hydra node; a training run writes under /tmp/x)."""
    extra = ["train.out_dir=/tmp/x"] if name == "train" else []
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return OmegaConf.to_container(compose(config_name=name, overrides=[*extra, *overrides]), resolve=True)


def test_default_config_is_the_tiny_cpu_run() -> None:
    cfg = _compose()
    assert cfg.task.name == "echo"
    assert cfg.model.backend == "hf" and cfg.model.path is None and cfg.model.device == "cpu"
    assert cfg.runner.kind == "process" and cfg.batching.strategy == "groups"


@pytest.mark.parametrize("task", TASKS)
def test_every_task_composes_into_a_valid_run_config(task: str) -> None:
    """The WHOLE run config of each task file validates (every section), not only its task section."""
    from flows.config import RunConfig, check_task, validate

    cfg = _resolved(f"+task={task}")
    run = validate(cfg)
    assert isinstance(run, RunConfig) and run.task.name == cfg["task"]["name"]
    check_task(run.task, run.runner)  # a real package, valid options
    assert set(run.task.options.get("role_policies", {}).values()) <= set(run.policies) | {"default"}


@pytest.mark.parametrize("name", ["train", "serve"])
def test_every_model_option_validates_in_train_and_serve(name: str) -> None:
    """Each conf/model/*.yaml is a valid model section, in a training run and in flows.serve alike."""
    from flows.config import RunConfig, ServeConfig, validate

    for option in sorted(p.stem for p in (CONF / "model").glob("*.yaml")):
        cfg = _resolved(f"model={option}", name=name)
        run = validate(cfg, schema=ServeConfig if name == "serve" else RunConfig)
        assert run.model.backend == cfg["model"]["backend"], option


def test_section_defaults_are_the_constructors_defaults() -> None:
    """A setting lives once: each backend's section is derived from its constructor (same names and defaults),
    algo is TrainConfig's, gateway is GatewaySettings' fields plus where it listens."""
    import inspect

    from flows.config import AlgoSection, GatewaySection
    from swarm.policy.settings import BACKENDS
    from swarm.train import TrainConfig
    from swarm.web.settings import GatewaySettings

    builtins = BACKENDS.builtins()
    assert set(builtins) >= {"hf", "vllm", "upstream", "echo", "fleet"}
    for kind in builtins:
        section = BACKENDS.get(kind)
        params = {}
        for cls in vars(__import__(section.__module__, fromlist=["_"])).values():
            if isinstance(cls, type) and cls.__module__ == section.__module__ and cls.__name__.endswith("Backend"):
                params = dict(inspect.signature(cls).parameters)
        assert section.derived and set(section.derived) <= set(params), (kind, section.derived)
        for field in section.derived:
            default = params[field].default
            if default is not inspect.Parameter.empty:
                assert section.model_fields[field].default == default, (kind, field)
    train = TrainConfig()
    for field, info in AlgoSection.model_fields.items():
        if hasattr(train, field):
            assert (info.default if info.default_factory is None else info.default_factory()) == getattr(train, field)
    own = {"host", "port", "log_level", "follow_versions_s"}
    secrets = {"secret", "client_token", "admin_token", "tool_call_markers"}
    assert set(GatewaySection.model_fields) - own == {f.name for f in dataclasses.fields(GatewaySettings)} - secrets
    made = GatewaySection().settings()
    assert made == GatewaySettings(secret=made.secret)


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

    from flows.components import ConfigError
    from flows.config import GatewaySection, RunConfig, ServeConfig, validate
    from swarm.gateway import GatewaySettings

    default = validate(_resolved()).gateway.settings()
    base = GatewaySettings()
    assert (default.allowed_hosts, default.reward_authority, default.max_connections_per_client) == (
        base.allowed_hosts, base.reward_authority, base.max_connections_per_client)
    overrides = ["gateway.allowed_hosts=[example.org,gw.lan]", "gateway.reward_authority={math: judge}",
                 "gateway.max_connections_per_client=7"]
    for name, schema in (("train", RunConfig), ("serve", ServeConfig)):
        s = validate(_resolved(*overrides, name=name), schema=schema).gateway.settings()
        assert s.allowed_hosts == ("example.org", "gw.lan") and s.reward_authority == {"math": "judge"}
        assert s.max_connections_per_client == 7 and type(s.reward_authority) is dict
    for typo in ("gateway.allowed_host=[example.org]", "gateway.reward_authorty={math: judge}",
                 "gateway.max_connection_per_client=7"):
        with pytest.raises(ConfigCompositionException):
            _compose(typo)
    with pytest.raises(ConfigError, match=r"gateway.reward_authority.math=referee: Input should be 'agent'"):
        validate({"model": {"backend": "echo"}, "pool": {"url": "sqlite://"}, "gateway": {"reward_authority":
                 {"math": "referee"}}}, schema=ServeConfig)
    with pytest.raises(ValueError, match="allowed_hosts"):
        GatewaySection(allowed_hosts="")
