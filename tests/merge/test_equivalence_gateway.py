"""Merging is exact on real multi-turn episodes recorded through the gateway (tiny model, fp32)."""

from __future__ import annotations

import pytest
import torch
from test_equivalence import TEMP, TOL, _alone_grads, _alone_logprobs, _rel

from swarm.client import SwarmClient
from swarm.merge import MODES, collate, merge_items, micro_batches
from swarm.policy.hf import HFBackend
from swarm.pool import Pool, StepFilter
from swarm.stack import start_stack
from swarm.train import TrainConfig, Trainer, items_from_steps, target_logprobs


@pytest.fixture(scope="module")
def recorded(tiny_model_path, tmp_path_factory):
    """2 groups x 3 episodes x 3 turns through the real gateway; returns (items, model path)."""
    pool = Pool(f"sqlite:///{tmp_path_factory.mktemp('eq') / 'pool.db'}")
    backend = HFBackend(str(tiny_model_path), torch_threads=1)
    stack = start_stack(pool, backend)
    try:
        with SwarmClient(stack.url) as client:
            for g in range(2):
                for e in range(3):
                    with client.episode(task="eq", group_id=f"g{g}") as ep:
                        llm = ep.openai(max_retries=0)
                        messages = [{"role": "system", "content": "you are a player in a word game"},
                                    {"role": "user", "content": f"round {g} start"}]
                        for turn in range(3):
                            r = llm.chat.completions.create(model="default", messages=messages, max_tokens=6,
                                                            temperature=TEMP, seed=100 * g + 10 * e + turn)
                            messages += [{"role": "assistant", "content": r.choices[0].message.content},
                                         {"role": "user", "content": f"next {turn}"}]
                        ep.end(reward=float(e))
        steps = pool.lease(StepFilter.trainable(), max_groups=10).steps
    finally:
        stack.stop()
        backend.close()
        pool.close()
    assert len(steps) == 18 and sum(bool(s.prefix_consistent) for s in steps) == 12
    return items_from_steps(steps), tiny_model_path


def _model(path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


@pytest.mark.parametrize("mode", MODES)
def test_recorded_episodes_logprobs_and_gradients_match_alone(recorded, mode):
    items, path = recorded
    model = _model(path)
    batch = merge_items(items, mode, 4096)
    if mode != "none":
        assert batch.stats.ratio > 2.0  # turns repeat the context; the group shares the prompt
    with torch.no_grad():
        ref = _alone_logprobs(model, items)
        got = {}
        for group in micro_batches(batch.rows, 4096):
            col = collate([batch.rows[i] for i in group])
            lp, _ = target_logprobs(model, col, TEMP)
            for t, key in enumerate(zip(col.target_item.tolist(), col.target_offset.tolist(), strict=False)):
                got[key] = lp[t]
    assert got.keys() == ref.keys()
    assert max(abs((got[k] - ref[k]) / ref[k]).item() for k in ref) < TOL
    ref_grads = _alone_grads(model, items, "token")
    model.zero_grad(set_to_none=True)
    Trainer(model, TrainConfig(lora=None, merge=mode, token_budget=4096, temperature=TEMP)).accumulate_gradients(items)
    assert max(_rel(p.grad, ref_grads[n]) for n, p in model.named_parameters()) < TOL
