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
