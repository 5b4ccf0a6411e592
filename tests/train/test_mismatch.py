"""Train-inference mismatch: the pure stats over tensors, the trainer's metrics from its own forward, the run's
health policy (warn once, then stop) and the served version per backend replica."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_llama import make_tiny_llama

from swarm.errors import ValidationError
from swarm.merge import TrainSeq, collate, merge_items
from swarm.merge.synthetic import multiturn_items
from swarm.train import LoraSpec, TrainConfig, Trainer, target_logprobs
from swarm.train.health import RunHealth, served_version_metrics, served_versions
from swarm.train.mismatch import MismatchSums, mismatch_stats, mismatch_terms

NAN = float("nan")


def test_stats_are_per_token_over_on_policy_recorded_tokens() -> None:
    pi = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.0, -0.1])
    mu = torch.tensor([-1.1, -2.0, NAN, -1.0, -1.3, -0.1])  # token 2 unrecorded
    on = torch.tensor([True, True, True, False, True, True])  # token 3 from a stale step
    m = mismatch_stats(pi, mu, on)
    assert m["mismatch/tokens"] == 4 and m["mismatch/stale_tokens"] == 1
    assert m["mismatch/logprob_abs_mean"] == pytest.approx((0.1 + 0.0 + 0.3 + 0.0) / 4)
    assert m["mismatch/logprob_abs_max"] == pytest.approx(0.3)
    k3 = [math.exp(d) - d - 1 for d in (0.1, 0.0, 0.3, 0.0)]  # d = pi - mu: KL(mu || pi), samples from mu
    assert m["mismatch/kl_k3"] == pytest.approx(sum(k3) / 4)
    assert m["mismatch/stale_logprob_abs_mean"] == pytest.approx(2.0)
    assert m["mismatch/stale_logprob_abs_max"] == pytest.approx(2.0)
    assert all(math.isfinite(v) for v in m.values())


def test_equal_logprobs_have_no_mismatch_and_nothing_on_policy_reports_no_mean() -> None:
    pi = torch.randn(10)
    m = mismatch_stats(pi, pi.clone())
    assert m["mismatch/logprob_abs_mean"] == 0.0 and m["mismatch/kl_k3"] == 0.0 and m["mismatch/stale_tokens"] == 0
    none = mismatch_stats(pi, torch.full((10,), NAN))
    assert none == {"mismatch/tokens": 0.0, "mismatch/stale_tokens": 0.0}  # no mean of nothing
    assert mismatch_stats(torch.zeros(0), torch.zeros(0))["mismatch/tokens"] == 0.0


def test_sums_add_up_over_micro_batches_with_max_for_the_maxima() -> None:
    pi, mu = torch.tensor([-1.0, -2.0, -3.0, -4.0]), torch.tensor([-1.5, -2.0, -3.25, -4.0])
    whole = mismatch_stats(pi, mu)
    sums = MismatchSums()
    sums.add(mismatch_terms(pi[:2], mu[:2]))
    sums.add(mismatch_terms(pi[2:], mu[2:]))
    assert sums.metrics() == pytest.approx(whole)
    assert MismatchSums.from_dict({**sums.sums(), **sums.maxes()}) == sums


def _own_logprobs(model, items: list[TrainSeq]) -> list[TrainSeq]:
    """Items with behaviour logprobs the model's own (a matched backend), at version 0."""
    batch = merge_items(items, "none", 10_000)
    with torch.no_grad():
        col = collate(batch.rows)
        lp, _ = target_logprobs(model, col, 1.0)
    lps = {(i, k): lp[t].item() for t, (i, k) in enumerate(zip(col.target_item.tolist(), col.target_offset.tolist(),
                                                                 strict=True))}
    return [TrainSeq(it.step_id, it.prompt_ids, it.response_ids,
                     tuple(lps[(i, k)] for k in range(len(it.response_ids))), it.advantage, it.episode_id, 0)
            for i, it in enumerate(items)]


def test_the_trainer_reports_the_mismatch_of_on_policy_steps_and_the_stale_ones_apart() -> None:
    model = make_tiny_llama(seed=3)
    items = _own_logprobs(model, multiturn_items(2, groups=2, group_size=2, turns=2))
    trainer = Trainer(model, TrainConfig(lr=1e-2, lora=LoraSpec(rank=4), merge="tree"))
    m = trainer.update(items)  # version 0: every item on-policy, behaviour = the recompute
    assert m["mismatch/tokens"] == m["train/tokens"] and m["mismatch/stale_tokens"] == 0
    assert m["mismatch/logprob_abs_mean"] < 1e-5 and m["mismatch/logprob_abs_max"] < 1e-4
    trainer.version = 1  # as after a publish: the same items are one version stale now
    shifted = [TrainSeq(it.step_id, it.prompt_ids, it.response_ids, tuple(x - 0.25 for x in it.behaviour_logprobs),
                        it.advantage, it.episode_id, 1 if i % 2 else 0) for i, it in enumerate(items)]
    m2 = trainer.update(shifted)
    assert m2["mismatch/tokens"] > 0 and m2["mismatch/stale_tokens"] > 0
    assert m2["mismatch/tokens"] + m2["mismatch/stale_tokens"] == m2["train/tokens"]
    # one small step after the behaviour was recorded: the on-policy mismatch is the 0.25 shift, nearly
    assert m2["mismatch/logprob_abs_mean"] == pytest.approx(0.25, abs=0.05)
    assert "mismatch/stale_logprob_abs_mean" in m2


def test_the_limits_are_typed_with_a_message_naming_the_field() -> None:
    assert TrainConfig().max_mismatch == 0.5 and TrainConfig().max_stale_serving_s == 300.0
    assert TrainConfig(max_mismatch=None, max_stale_serving_s=None).max_mismatch is None
    with pytest.raises(ValidationError, match="train.max_mismatch"):
        TrainConfig(max_mismatch=0.0)
    with pytest.raises(ValidationError, match="train.max_stale_serving_s"):
        TrainConfig(max_stale_serving_s=-1.0)


def test_health_warns_once_at_half_the_limit_then_stops_past_it() -> None:
    h = RunHealth(max_mismatch=0.5)
    ok = h.check("default", 1, {"mismatch/logprob_abs_mean": 0.01, "mismatch/tokens": 10})
    assert ok.warnings == [] and ok.stop is None
    first = h.check("default", 2, {"mismatch/logprob_abs_mean": 0.3, "mismatch/tokens": 10})
    assert len(first.warnings) == 1 and "algo.max_mismatch=0.5" in first.warnings[0] and first.stop is None
    again = h.check("default", 3, {"mismatch/logprob_abs_mean": 0.3})
    assert again.warnings == [] and again.stop is None  # once per run
    stop = h.check("default", 4, {"mismatch/logprob_abs_mean": 0.7, "mismatch/logprob_abs_max": 3.0})
    assert stop.stop is not None and "train-inference mismatch too large" in stop.stop
    assert "0.7 nats/token" in stop.stop and "> algo.max_mismatch=0.5" in stop.stop
    assert RunHealth(max_mismatch=None).check("p", 1, {"mismatch/logprob_abs_mean": 9.0}).stop is None
    assert RunHealth().check("p", 1, {"mismatch/tokens": 0}).stop is None  # nothing on-policy: nothing to judge


def test_health_stops_on_a_replica_still_behind_after_the_limit() -> None:
    now = [0.0]
    h = RunHealth(max_stale_serving_s=60, clock=lambda: now[0])
    key = "policy/served_version/"
    assert h.check("p", 3, {key + "a": 3, key + "b": 3}).warnings == []
    first = h.check("p", 4, {key + "a": 4, key + "b": 3})
    assert len(first.warnings) == 1 and "replica 'b'" in first.warnings[0] and first.stop is None
    now[0] = 30.0
    assert h.check("p", 5, {key + "a": 5, key + "b": 3}) == type(first)()  # behind, warned, not yet stopped
    now[0] = 61.0
    stop = h.check("p", 6, {key + "a": 6, key + "b": 3}).stop
    assert stop is not None and "replica 'b' serves policy 'p' v3" in stop and "algo.max_stale_serving_s=60" in stop
    # caught up: the clock starts over
    h2 = RunHealth(max_stale_serving_s=60, clock=lambda: now[0])
    h2.check("p", 2, {key + "b": 1})
    now[0] = 200.0
    assert h2.check("p", 3, {key + "b": 3}).stop is None and h2.check("p", 4, {key + "b": 3}).stop is None


class _Vllm:
    model_name = "base"

    def __init__(self, served: str) -> None:
        self.served = served

    def served_model(self, policy: str) -> str:
        return self.served


def test_served_versions_per_backend_kind() -> None:
    from swarm.policy.echo import EchoBackend
    from swarm.policy.fleet import FleetBackend
    from swarm.policy.router import PolicyRouter

    echo = EchoBackend(policies=["p"])
    echo.load_weights("p", None, 2)
    assert served_versions(echo, "p") == {"echo": 2}
    assert served_versions(PolicyRouter([echo]), "p") == {"echo": 2}
    assert served_versions(_Vllm("p-v7"), "p") == {"_vllm": 7} and served_versions(_Vllm("base"), "p") == {"_vllm": 0}
    fleet = FleetBackend({"a": EchoBackend(policies=["p"]), "b": EchoBackend(policies=["p"])}, check_tokenizers=False)
    fleet.replicas[1].backend.load_weights = _refuse  # type: ignore[method-assign]
    fleet.load_weights("p", None, 1)  # b's push fails: it keeps serving v0
    assert served_version_metrics(fleet, "p") == {"policy/served_version/a": 1.0, "policy/served_version/b": 0.0}
    assert served_version_metrics(None, "p") == {} and served_versions(object(), "p") == {}


def _refuse(policy: str, state: object, version: int) -> None:
    raise RuntimeError("replica down")
