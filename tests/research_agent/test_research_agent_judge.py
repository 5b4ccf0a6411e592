"""The research agent's judge reward: a spec without a checker names a rubric; its task config selects the judge."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from ra_scripted import SPEC

from flows.config import validate
from research_agent.errors import SpecError
from research_agent.generate import REPO, target_for, write_task_config
from research_agent.spec import SPEC_SYSTEM, parse_spec

RUBRIC = 'A better reply is polite, says "sorry" once and offers a refund; ${oc.env:HOME} is text.'


def test_a_judge_reward_needs_a_rubric() -> None:
    assert 'kind: "judge"' in SPEC_SYSTEM and "rubric" in SPEC_SYSTEM
    assert parse_spec(SPEC).reward.kind == "function"
    with pytest.raises(SpecError, match="reward.rubric"):
        parse_spec({**SPEC, "reward": {**SPEC["reward"], "kind": "judge"}})
    spec = parse_spec({**SPEC, "reward": {**SPEC["reward"], "kind": "judge", "rubric": RUBRIC}})
    assert spec.reward.rubric == RUBRIC


def test_a_judge_task_config_composes_into_the_judge_reward(tmp_path: Path) -> None:
    spec = parse_spec({**SPEC, "reward": {**SPEC["reward"], "kind": "judge", "rubric": RUBRIC}})
    target = target_for(spec, tmp_path / "gentasks", tmp_path / "conf")
    write_task_config(target, spec)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose(config_name="train", overrides=[f"+task={spec.name}",
                                                      f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
                                                      f"train.out_dir={tmp_path / 'run'}"])
    run = validate(OmegaConf.to_container(cfg, resolve=True))
    assert run.task.name == "gentasks.game24" and run.task.reward is not None
    assert run.task.reward.kind == "judge" and run.task.reward.rubric == RUBRIC.replace("${", "$ {")
    assert "judge" in run.frozen_policies and run.gateway.settings(run.task.reward.authority(run.task.name)).reward_authority == {
        "gentasks.game24": "judge", "game24": "judge"}
