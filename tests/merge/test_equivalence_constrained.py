"""Constrained steps through the gateway: the trainer's replayed-mask logprobs equal the behaviour logprobs.

PPO ratio exactly 1 (fp32 tolerance) at the policy version that sampled them, for every merge
mode (a group sharing its prompt is tree-merged), mixed with free-text steps; without the masks
the ratio is visibly off.
"""

from __future__ import annotations

import pytest
import torch

from swarm.client import SwarmClient
from swarm.merge import MODES, collate, merge_items, micro_batches
from swarm.policy.hf import HFBackend
from swarm.pool import Pool, StepFilter
from swarm.stack import start_stack
from swarm.train import TrainConfig, Trainer, items_from_steps, target_logprobs
from swarm.train.constraint import ConstraintReplay, target_allowed

TEMP = 0.8
TOL = 2e-5  # |logprob difference|: batched KV-cache decoding vs one packed forward, fp32
NAMES = ["alice", "bob", "carol"]
VOTE = {"type": "object", "properties": {"target": {"type": "string", "enum": NAMES}},
        "required": ["target"], "additionalProperties": False}
RF = {"type": "json_schema", "json_schema": {"name": "vote", "strict": True, "schema": VOTE}}
TOOLS = [{"type": "function", "function": {"name": "kill", "parameters": VOTE}}]


@pytest.fixture(scope="module")
def recorded(tiny_model_path, tmp_path_factory):
    """One group of 3 episodes sharing a prompt: a json_schema vote (n=2), a free reply, a named tool call."""
    pool = Pool(f"sqlite:///{tmp_path_factory.mktemp('eqc') / 'pool.db'}")
    backend = HFBackend(str(tiny_model_path), torch_threads=1)
    stack = start_stack(pool, backend)
    try:
        with SwarmClient(stack.url) as client:
            for e in range(3):
                with client.episode(task="eqc", group_id="g0") as ep:
                    llm = ep.openai(max_retries=0)
                    messages = [{"role": "system", "content": "you are a werewolf"},
                                {"role": "user", "content": "day 1: vote"}]
                    r = llm.chat.completions.create(model="default", messages=messages, max_tokens=40,
                                                    temperature=TEMP, seed=10 + e, response_format=RF, n=2)
                    messages += [{"role": "assistant", "content": r.choices[0].message.content},
                                 {"role": "user", "content": "say something"}]
                    r = llm.chat.completions.create(model="default", messages=messages, max_tokens=8,
                                                    temperature=TEMP, seed=20 + e)
                    messages += [{"role": "assistant", "content": r.choices[0].message.content},
                                 {"role": "user", "content": "night: kill"}]
                    llm.chat.completions.create(model="default", messages=messages, max_tokens=80, temperature=TEMP,
                                                seed=30 + e, tools=TOOLS,
                                                tool_choice={"type": "function", "function": {"name": "kill"}})
                    ep.end(reward=float(e))
        steps = pool.lease(StepFilter.trainable(), max_groups=10).steps
    finally:
        stack.stop()
        backend.close()
        pool.close()
    assert len(steps) == 12
    kinds = sorted((s.metadata.get("constraint") or {}).get("kind", "free") for s in steps)
    assert kinds == ["free"] * 3 + ["json_schema"] * 6 + ["tool_call"] * 3
    return items_from_steps(steps), tiny_model_path


def _model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


def _logprobs(model, items, mode, replay):
    """(trainer logprob, behaviour logprob) per target, with and without the replayed masks."""
    masks = replay.item_masks(items)
    out = {"masked": [], "unmasked": [], "behaviour": []}
    batch = merge_items(items, mode, 4096)
    with torch.no_grad():
        for group in micro_batches(batch.rows, 4096):
            col = collate([batch.rows[i] for i in group])
            lp, _ = target_logprobs(model, col, TEMP, allowed=target_allowed(masks, col))
            raw, _ = target_logprobs(model, col, TEMP)
            out["masked"] += lp.tolist()
            out["unmasked"] += raw.tolist()
            out["behaviour"] += [items[i].behaviour_logprobs[k]
                                 for i, k in zip(col.target_item.tolist(), col.target_offset.tolist(), strict=True)]
    return {k: torch.tensor(v) for k, v in out.items()}, batch


@pytest.mark.parametrize("mode", MODES)
def test_constrained_steps_have_ratio_one_under_the_replayed_mask(recorded, mode):
    items, path = recorded
    model = _model(path)
    lp, batch = _logprobs(model, items, mode, ConstraintReplay(str(path)))
    if mode == "tree":
        assert batch.stats.ratio > 1.5  # the group's shared prompt is packed once
    assert (lp["masked"] - lp["behaviour"]).abs().max() < TOL
    assert (lp["unmasked"] - lp["behaviour"]).abs().max() > 1e-2  # the mask matters: without it, ratio != 1

    metrics = Trainer(model, TrainConfig(lora=None, merge=mode, token_budget=4096, temperature=TEMP),
                      tokenizer=str(path)).accumulate_gradients(items)
    assert metrics["train/clip_frac"] == 0.0
    assert abs(metrics["train/ratio_mean"] - 1.0) < TOL
    assert metrics["train/approx_kl"] < 1e-9


def test_an_update_on_constrained_steps_is_finite_and_moves_the_weights(recorded):
    import math

    items, path = recorded
    model = _model(path)
    before = model.lm_head.weight.detach().clone()
    metrics = Trainer(model, TrainConfig(lora=None, temperature=TEMP, lr=1e-3), tokenizer=str(path)).update(items)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert not torch.equal(before, model.lm_head.weight)


def test_trainer_without_a_tokenizer_refuses_constrained_steps(recorded):
    items, path = recorded
    with pytest.raises(Exception, match="tokenizer"):
        Trainer(_model(path), TrainConfig(lora=None, temperature=TEMP)).accumulate_gradients(items)
