"""Merged training equals training every step alone: per-token logprobs and gradients (fp32, rel < 1e-5)."""

from __future__ import annotations

import pytest
import torch
from tiny_llama import make_tiny_llama

from swarm.merge import MODES, collate, merge_items, micro_batches
from swarm.merge.synthetic import multiturn_items, random_tree_items
from swarm.train import TrainConfig, Trainer, item_token_weights, ppo_clip_loss, target_logprobs

TOL = 1e-5
TEMP = 0.8


def _alone_logprobs(model, items):
    out = {}
    for i, it in enumerate(items):
        logits = model(torch.tensor([it.tokens])).logits[0].float() / TEMP
        lp = torch.log_softmax(logits, -1)
        p = len(it.prompt_ids)
        for k, tok in enumerate(it.response_ids):
            if p + k > 0:
                out[(i, k)] = lp[p + k - 1, tok]
    return out


def _alone_grads(model, items, agg):
    """The reference: each step its own forward, the same PPO loss and batch weights."""
    model.zero_grad(set_to_none=True)
    lps = _alone_logprobs(model, items)
    w_item = item_token_weights([it.n_targets for it in items], agg).float()
    keys = sorted(lps)
    logp = torch.stack([lps[k] for k in keys])
    beh = torch.tensor([items[i].behaviour_logprobs[k] for i, k in keys])
    adv = torch.tensor([items[i].advantage for i, _ in keys])
    w = torch.stack([w_item[i] for i, _ in keys])
    loss, _ = ppo_clip_loss(logp, beh, adv)
    (w * loss).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item()


def _cases():
    for seed in range(4):
        yield f"random{seed}", random_tree_items(seed, n_items=14, vocab=8 if seed % 2 else 60)
    yield "multiturn", multiturn_items(0, groups=2, group_size=3, turns=3)


CASES = dict(_cases())


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("budget", [16, 4096])
def test_per_token_logprobs_match_alone(case, mode, budget):
    items = CASES[case]
    model = make_tiny_llama(seed=1)
    with torch.no_grad():
        ref = _alone_logprobs(model, items)
        batch = merge_items(items, mode, budget)
        got = {}
        for group in micro_batches(batch.rows, budget):
            col = collate([batch.rows[i] for i in group])
            lp, _ = target_logprobs(model, col, TEMP)
            for t, key in enumerate(zip(col.target_item.tolist(), col.target_offset.tolist(), strict=False)):
                assert key not in got
                got[key] = lp[t]
    assert got.keys() == ref.keys()
    err = max(abs((got[k] - ref[k]) / ref[k]).item() for k in ref)
    assert err < TOL


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("agg", ["token", "sequence"])
def test_gradients_match_alone(case, mode, agg):
    items = CASES[case]
    model = make_tiny_llama(seed=2)
    ref = _alone_grads(model, items, agg)
    model.zero_grad(set_to_none=True)
    trainer = Trainer(model, TrainConfig(lora=None, merge=mode, token_budget=24, temperature=TEMP, loss_agg=agg))
    metrics = trainer.accumulate_gradients(items)
    assert metrics["train/tokens"] == sum(it.n_targets for it in items)
    for name, p in model.named_parameters():
        assert _rel(p.grad, ref[name]) < TOL, name


def test_tree_is_one_masked_row_and_still_exact():
    items = multiturn_items(3, groups=1, group_size=4, turns=3)
    batch = merge_items(items, "tree", 4096)
    assert batch.stats.rows == 1 and not batch.rows[0].is_chain
    model = make_tiny_llama(seed=3)
    ref = _alone_grads(model, items, "token")
    model.zero_grad(set_to_none=True)
    Trainer(model, TrainConfig(lora=None, merge="tree", token_budget=4096, temperature=TEMP)).accumulate_gradients(items)
    assert max(_rel(p.grad, ref[n]) for n, p in model.named_parameters()) < TOL
