"""The feedback: config section: defaults agree with the library's, bad values name the key, it reaches UpdateSettings."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from flows.config import ConfigError, FeedbackSection, validate
from flows.run import update_settings
from swarm.train.feedback import RatingRule
from swarm.update import UpdateSettings

CONF = Path(__file__).resolve().parents[2] / "conf"


def _cfg(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return OmegaConf.to_container(compose(config_name="train", overrides=["train.out_dir=/tmp/x", *overrides]),
                                      resolve=True)


def test_defaults_live_once() -> None:
    section = FeedbackSection()
    assert section.rule() == RatingRule()  # ignore: today's behaviour
    base = UpdateSettings(strategy="groups", min_episodes=1, min_groups=1, group_size=2, timeout_s=1, max_staleness=1)
    assert (base.correction_weight, base.correction_updates, base.max_corrections) == (
        section.correction_weight, section.correction_updates, section.max_corrections)
    assert validate(_cfg()).feedback == section  # conf/train.yaml writes the same defaults


def test_keys_reach_the_update() -> None:
    cfg = validate(_cfg("feedback.rating=weighted", "feedback.rating_weight=0.25", "feedback.rating_scale=[1,5]",
                        "feedback.reward_scale=[-1,1]", "feedback.correction_weight=2", "feedback.correction_updates=3",
                        "feedback.max_corrections=4"))
    s = update_settings(cfg)
    assert s.rating_rule == RatingRule(mode="weighted", weight=0.25, rating_min=1, rating_max=5, reward_min=-1,
                                       reward_max=1)
    assert (s.correction_weight, s.correction_updates, s.max_corrections) == (2.0, 3, 4)


@pytest.mark.parametrize("override, message", [
    ("feedback.rating=sometimes", "feedback.rating"),
    ("feedback.rating_weight=2", "feedback.rating_weight"),
    ("feedback.rating_scale=[5,1]", "feedback.rating_scale"),
    ("feedback.correction_updates=0", "feedback.correction_updates"),
    ("+feedback.ratings=fill", "feedback.ratings"),
])
def test_bad_values_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(_cfg(override))


def test_fill_with_a_judge_is_refused() -> None:
    with pytest.raises(ConfigError, match="feedback.rating=fill with task.reward.kind=judge"):
        validate(_cfg("feedback.rating=fill", "+reward=judge"))
