"""Quarantine with a real tiny-model Trainer: steps stored straight into the pool (bypassing the gateway's
vocabulary check) with token ids the model cannot take are labelled excluded with the reason, never
leased again, and the update goes on with the rest of the batch."""

from __future__ import annotations

import copy
import math
import time

import pytest
import torch
from tiny_llama import make_tiny_llama

from swarm.pool import Pool, StepFilter
from swarm.records import Episode, Step
from swarm.train import LoraSpec, TrainConfig, Trainer, items_from_steps
from swarm.train.quarantine import LABEL, limits_of, problem, quarantine, usable

VOCAB = 100


def _episode_step(pool: Pool, group: str, reward: float, prompt: list[int], response: list[int]) -> Step:
    ep = pool.add_episode(Episode(task="t", group_id=group))
    step = Step(episode_id=ep.episode_id, index=0, group_id=group, prompt_ids=prompt, response_ids=response,
                response_logprobs=[-1.0] * len(response))
    pool.add_step(step)
    pool.end_episode(ep.episode_id, reward=reward)
    return step


def test_unusable_steps_are_quarantined_and_the_update_goes_on(pool_url: str) -> None:
    pool = Pool(pool_url)
    try:
        good = [_episode_step(pool, g, r, [1, 2, 3 + i, 4], [5 + i, 6, 7])
                for i, (g, r) in enumerate([("g1", 1.0), ("g1", 0.0), ("g2", 1.0), ("g2", 0.0)])]
        bad = {
            _episode_step(pool, "g1", 0.5, [1, 2, 3], [5, 1_000_000]).step_id: "response_ids holds token id 1000000",
            _episode_step(pool, "g2", 0.5, [VOCAB], [5, 6]).step_id: f"prompt_ids holds token id {VOCAB}",
        }
        trainer = Trainer(make_tiny_llama(vocab=VOCAB), TrainConfig(lr=1e-2, lora=LoraSpec(rank=4)))
        assert limits_of(trainer.model) == (VOCAB, 1024)

        lease = pool.lease(StepFilter(policy="default"), max_groups=10, ttl_s=1.0)
        assert len(lease.steps) == 6
        # unfiltered, one bad step takes the whole update down (what used to stop a run for good)
        naive = Trainer(copy.deepcopy(make_tiny_llama(vocab=VOCAB)), TrainConfig(lr=1e-2, lora=LoraSpec(rank=4)))
        with pytest.raises((IndexError, RuntimeError)):
            naive.update(items_from_steps(lease.steps))

        steps, reasons = usable(lease.steps, *limits_of(trainer.model))
        assert {s.step_id for s in steps} == {s.step_id for s in good}
        assert set(reasons) == set(bad)
        for sid, why in reasons.items():
            assert bad[sid] in why and "outside the model's vocabulary" in why
        assert quarantine(pool, reasons) == 2

        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        metrics = trainer.update(items_from_steps(steps))
        assert metrics["train/tokens"] > 0 and math.isfinite(metrics["train/loss"])
        assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters() if n in before)
        pool.settle(lease.lease_id, [s.step_id for s in steps], 1)

        for sid, why in reasons.items():  # labelled excluded, with the reason as the note
            labels = [(lb.label, lb.exclude, lb.note) for lb in pool.labels(sid)]
            assert labels == [(LABEL, True, why)]
        visible = {s.step_id for s in pool.query_steps(StepFilter(), limit=100)}
        assert not visible & set(bad)
        shown = {s.step_id for s in pool.query_steps(StepFilter(include_excluded=True), limit=100)}
        assert set(bad) <= shown
        time.sleep(1.2)  # the lease expired: the quarantined steps never come back, the trained ones are consumed
        assert pool.lease(StepFilter(policy="default"), max_groups=10).steps == []
    finally:
        pool.close()


def test_problem_names_each_kind_of_unusable_step() -> None:
    def s(**kw: object) -> Step:
        return Step(episode_id="e", index=0, **{"prompt_ids": [1], "response_ids": [2], **kw})

    assert problem(s(), VOCAB, 8) is None
    assert problem(s(prompt_ids=[]), VOCAB) == "empty prompt"
    assert "outside" in problem(s(response_ids=[VOCAB + 5]), VOCAB)
    assert "exceed the model's 8 positions" in problem(s(prompt_ids=[1] * 8), VOCAB, 8)
