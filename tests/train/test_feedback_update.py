"""run_update with feedback on a real pool and trainer: fill makes unrewarded rated steps trainable, weighted and
replace change the leased rewards, corrections join the batch and are recorded once the update published."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from tiny_llama import make_tiny_llama

from swarm.pool import Pool
from swarm.pool.feedback import CORRECTION_KEY
from swarm.records import Episode, Event, Source, Step
from swarm.train import Ledger, LoraSpec, TrainConfig, Trainer
from swarm.train.feedback import RatingRule
from swarm.update import UpdateSettings, run_update


def _group(pool: Pool, gid: str, rewards: list[float | None]) -> list[Step]:
    out = []
    for i, r in enumerate(rewards):
        ep = pool.add_episode(Episode(task="t", group_id=gid))
        st = Step(episode_id=ep.episode_id, index=0, policy="default", prompt_ids=[1, 2, 3, 4],
                  response_ids=[5 + i, 6, 7], response_logprobs=[-1.0, -1.0, -1.0])
        pool.add_step(st)
        pool.end_episode(ep.episode_id, reward=r)
        out.append(st)
    return out


def _ledger(tmp_path: Path) -> Ledger:
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    trainer = Trainer(make_tiny_llama(seed=1), TrainConfig(lr=1e-3, lora=LoraSpec(rank=2)))
    return Ledger(trainer, pool)


def _settings(**kw) -> UpdateSettings:
    base = dict(strategy="groups", min_episodes=1, min_groups=1, group_size=2, timeout_s=10.0, max_staleness=None)
    return UpdateSettings(**{**base, **kw})


def test_fill_turns_ratings_into_rewards_where_none_exist(tmp_path: Path) -> None:
    led = _ledger(tmp_path)
    pool = led.pool
    a, b = _group(pool, "g", [None, None])
    pool.add_event(Event(kind="feedback", episode_id=a.episode_id, rating=5))
    pool.add_event(Event(kind="feedback", step_id=b.step_id, rating=2, source=Source.blackbox))
    pool.add_event(Event(kind="feedback", step_id=b.step_id, rating=4, source=Source.blackbox))
    rule = RatingRule(mode="fill", rating_min=1, rating_max=5)
    got = run_update(led, _settings(rating_rule=rule), threading.Event())
    assert got is not None
    metrics, steps = got
    assert {s.step_id: s.reward for s in steps} == {a.step_id: 1.0, b.step_id: 0.5}
    assert metrics["feedback/rated_steps"] == 2.0 and metrics["reward/mean"] == 0.75
    hist = pool.reward_history(b.episode_id)
    assert [(h["source"], h["value"], h["applied"]) for h in hist] == [("agent", 0.5, True)]
    assert pool.reward_history(a.episode_id)[0]["source"] == "judge"  # a token's rating
    # ignore (the default): the same unrewarded steps stay out of training
    c, _ = _group(pool, "h", [None, None])
    pool.add_event(Event(kind="feedback", step_id=c.step_id, rating=5))
    with pytest.raises(TimeoutError):
        run_update(led, _settings(timeout_s=0.5), threading.Event())


@pytest.mark.parametrize("mode, expected", [("weighted", [0.25 * 0.0 + 0.75 * 1.0, 1.0]), ("replace", [1.0, 1.0]),
                                            ("ignore", [0.0, 1.0])])
def test_rating_rule_changes_the_leased_rewards(tmp_path: Path, mode: str, expected: list[float]) -> None:
    led = _ledger(tmp_path)
    a, b = _group(led.pool, "g", [0.0, 1.0])
    led.pool.add_event(Event(kind="feedback", step_id=a.step_id, rating=1.0))
    metrics, steps = run_update(led, _settings(rating_rule=RatingRule(mode=mode, weight=0.75)), threading.Event())
    assert [s.reward for s in steps] == pytest.approx(expected)
    assert metrics.get("feedback/rated_steps", 0.0) == (0.0 if mode == "ignore" else 1.0)
    assert led.pool.get_step(a.step_id, with_tokens=False).reward == 0.0  # the pool keeps the task's reward


def test_corrections_train_and_are_recorded_up_to_their_bound(tmp_path: Path) -> None:
    led = _ledger(tmp_path)
    pool = led.pool
    a, _ = _group(pool, "g1", [0.0, 1.0])
    ev = pool.add_event(Event(kind="feedback", step_id=a.step_id, correction="x",
                              payload={CORRECTION_KEY: {"step_id": a.step_id, "policy": "default", "ids": [9, 9, 2]}}))
    s = _settings(correction_weight=2.0, correction_updates=2)
    m1, _ = run_update(led, s, threading.Event())
    assert m1["feedback/corrections"] == 1.0 and m1["train/tokens"] == 3 * 2 + 3  # two steps + the correction
    assert pool.feedback_uses([ev]) == {ev: [1]}
    for gid in ("g2", "g3"):
        _group(pool, gid, [0.0, 1.0])
        m, _ = run_update(led, s, threading.Event())
    assert m["feedback/corrections"] == 0.0 and pool.feedback_uses([ev]) == {ev: [1, 2]}
    _group(pool, "g4", [0.0, 1.0])
    assert "feedback/corrections" not in run_update(led, _settings(correction_weight=0.0), threading.Event())[0]
