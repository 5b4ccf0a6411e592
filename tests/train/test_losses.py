"""PPO-clip values and clip fraction on hand cases, TIS truncation, k3 KL and loss aggregation weights."""

from __future__ import annotations

import math

import pytest
import torch

from swarm.train import item_token_weights, k3_kl, ppo_clip_loss


def _t(*xs):
    return torch.tensor(xs, dtype=torch.float32)


def test_ppo_clip_hand_cases():
    beh = _t(0.0, 0.0, 0.0, 0.0, 0.0)
    logp = torch.log(_t(1.0, 1.5, 1.5, 0.5, 0.5)).requires_grad_()
    adv = _t(1.0, 1.0, -1.0, -1.0, 1.0)
    loss, info = ppo_clip_loss(logp, beh, adv, clip_low=0.2, clip_high=0.2)
    assert loss.tolist() == pytest.approx([-1.0, -1.2, 1.5, 0.8, -0.5])
    assert info["clipped"].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]
    loss.sum().backward()
    # Clipped tokens carry no gradient; unclipped ones d(-r*A)/dlogp = -r*A.
    assert logp.grad.tolist() == pytest.approx([-1.0, 0.0, 1.5, 0.0, -0.5])
    assert info["ratio"].tolist() == pytest.approx([1.0, 1.5, 1.5, 0.5, 0.5])


def test_asymmetric_clip():
    logp = torch.log(_t(1.25, 1.25))
    loss, info = ppo_clip_loss(logp, _t(0.0, 0.0), _t(1.0, 1.0), clip_low=0.2, clip_high=0.28)
    assert info["clipped"].tolist() == [0.0, 0.0] and loss.tolist() == pytest.approx([-1.25, -1.25])


def test_tis_truncates_the_behaviour_weight():
    logp = _t(-1.0, -1.0).requires_grad_()
    beh = _t(-1.0 - math.log(5.0), -1.0 - math.log(1.5))  # pi/mu = 5 and 1.5
    loss, info = ppo_clip_loss(logp, beh, _t(1.0, 1.0), proximal_logp=logp.detach(), tis_cap=2.0)
    assert info["tis_weight"].tolist() == pytest.approx([2.0, 1.5])
    assert loss.tolist() == pytest.approx([-2.0, -1.5])
    loss.sum().backward()
    assert logp.grad.tolist() == pytest.approx([-2.0, -1.5])
    assert info["clipped"].tolist() == [0.0, 0.0]  # ratio vs the proximal policy is 1


def test_missing_behaviour_logprobs_are_on_policy():
    logp = _t(-0.7, -2.0)
    loss, info = ppo_clip_loss(logp, _t(float("nan"), -2.0), _t(1.0, -1.0))
    assert info["ratio"].tolist() == [1.0, 1.0] and loss.tolist() == pytest.approx([-1.0, 1.0])


def test_k3_kl():
    assert k3_kl(_t(-1.0, -3.0), _t(-1.0, -3.0)).tolist() == [0.0, 0.0]
    assert k3_kl(_t(-1.0), _t(-1.0 + math.log(2.0))).item() == pytest.approx(1.0 - math.log(2.0))
    assert (k3_kl(torch.randn(50), torch.randn(50)) >= 0).all()


def test_aggregation_weights():
    assert item_token_weights([2, 3, 0], "token").tolist() == pytest.approx([0.2, 0.2, 0.0])
    assert item_token_weights([2, 3, 0], "sequence").tolist() == pytest.approx([0.25, 1 / 6, 0.0])
