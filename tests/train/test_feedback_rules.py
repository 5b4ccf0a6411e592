"""Feedback rules: rating -> reward mapping and modes, per-step ratings, fill targets, and a correction's SFT gradient."""

from __future__ import annotations

import pytest
import torch
from tiny_llama import make_tiny_llama

from swarm.errors import ValidationError
from swarm.merge import TrainSeq, collate, merge_items
from swarm.pool.feedback import Correction, Rating
from swarm.records import Step
from swarm.train import TrainConfig, Trainer, target_logprobs
from swarm.train.feedback import RatingRule, correction_items, fill_rewards, rated_rewards, rating_reward, step_ratings


def _rating(step_id, episode_id, value, source="judge", t=0.0):
    return Rating(event_id=f"ev{t}", episode_id=episode_id, step_id=step_id, rating=value, source=source, created_at=t)


def test_rating_maps_linearly_and_clamps():
    rule = RatingRule(mode="replace", rating_min=1, rating_max=5, reward_min=-1, reward_max=1)
    assert [rating_reward(x, rule) for x in (1, 3, 5, 0, 9)] == [-1.0, 0.0, 1.0, -1.0, 1.0]


@pytest.mark.parametrize("mode, expected", [
    ("ignore", [0.2, None, 1.0]),
    ("replace", [0.8, 0.4, 1.0]),
    ("weighted", [0.25 * 0.2 + 0.75 * 0.8, 0.4, 1.0]),
    ("fill", [0.2, 0.4, 1.0]),
])
def test_modes(mode, expected):
    rule = RatingRule(mode=mode, weight=0.75)
    got = rated_rewards([0.2, None, 1.0], [0.8, 0.4, None], rule)
    assert got == pytest.approx(expected) if None not in expected else got == expected


def test_step_rating_is_own_else_episode_mean():
    steps = [Step(step_id=f"s{i}", episode_id="e1" if i < 2 else "e2", index=i, prompt_ids=[1], response_ids=[2])
             for i in range(3)]
    ratings = [_rating("s0", "e1", 1.0), _rating("s0", "e1", 0.0), _rating(None, "e1", 0.25), _rating(None, "e1", 0.75)]
    assert step_ratings(steps, ratings) == [0.5, 0.5, None]


def test_fill_targets_only_under_fill():
    ratings = [_rating("s0", "e1", 4, "agent"), _rating("s0", "e1", 2, "judge"), _rating(None, "e2", 5, "agent")]
    rule = RatingRule(mode="fill", rating_min=1, rating_max=5)
    assert sorted(fill_rewards(ratings, rule)) == [("episode", "e2", 1.0, "agent"), ("step", "s0", 0.5, "judge")]
    assert fill_rewards(ratings, RatingRule(mode="weighted")) == []


def test_bad_rules_name_the_key():
    with pytest.raises(ValidationError, match="feedback.rating"):
        RatingRule(mode="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="rating_weight"):
        RatingRule(mode="weighted", weight=1.5)
    with pytest.raises(ValidationError, match="rating_scale"):
        RatingRule(rating_min=5, rating_max=1)
    with pytest.raises(ValidationError, match="correction_weight"):
        correction_items([], -1.0)


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


@pytest.mark.parametrize("agg", ["token", "sequence"])
def test_correction_gradient_is_weighted_sft_gradient(agg):
    """PPO-clip at ratio 1 with advantage w == w * grad of the summed logprob of the correction, same token weights."""
    w = 0.7
    corr = Correction(event_id="ev1", episode_id="e", step_id="s", prompt_ids=(5, 6, 7, 8), response_ids=(9, 10, 11),
                      uses=0)
    item = correction_items([corr], w)[0]
    assert item.behaviour_logprobs is None and item.advantage == w and item.response_ids == (9, 10, 11)
    # a second item with advantage 0 adds no policy gradient but counts in the batch's token weights
    other = TrainSeq("o", (5, 6, 7, 8), (12, 13, 14, 15, 16), None, 0.0)
    trainer = Trainer(make_tiny_llama(seed=3), TrainConfig(lr=1e-3, lora=None, loss_agg=agg, merge="tree"))
    trainer.accumulate_gradients([item, other])
    got = _grads(trainer.model)

    model = trainer.model
    model.zero_grad(set_to_none=True)
    col = collate(merge_items([item], "none", 10_000).rows)
    lp, _ = target_logprobs(model, col, 1.0)
    token_w = 1.0 / (3 + 5) if agg == "token" else 1.0 / (2 * 3)
    (-(w * token_w) * lp.sum()).backward()
    want = _grads(model)
    assert got.keys() == want.keys()
    for n in want:
        assert torch.allclose(got[n], want[n], atol=1e-6, rtol=1e-4), n
    assert any(g.abs().sum() > 0 for g in want.values())
