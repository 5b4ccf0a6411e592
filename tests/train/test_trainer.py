"""The update loop: KL to the base is zero at init, updates change the right weights and lower the loss."""

from __future__ import annotations

import pytest
import torch
from tiny_llama import make_tiny_llama

from swarm.errors import ValidationError
from swarm.merge import TrainSeq, collate, merge_items
from swarm.merge.synthetic import multiturn_items
from swarm.train import LoraSpec, TrainConfig, Trainer, target_logprobs


def _on_policy(model, items, temperature=1.0):
    """Items whose behaviour logprobs are the model's own (what a matched backend records)."""
    batch = merge_items(items, "none", 10_000)
    lps = {}
    with torch.no_grad():
        col = collate(batch.rows)
        lp, _ = target_logprobs(model, col, temperature)
    for t, (i, k) in enumerate(zip(col.target_item.tolist(), col.target_offset.tolist(), strict=False)):
        lps[(i, k)] = lp[t].item()
    out = []
    for i, it in enumerate(items):
        beh = tuple(lps.get((i, k), 0.0) for k in range(len(it.response_ids)))
        out.append(TrainSeq(it.step_id, it.prompt_ids, it.response_ids, beh, it.advantage, it.episode_id))
    return out


def test_kl_to_reference_is_zero_with_zero_init_lora():
    model = make_tiny_llama()
    trainer = Trainer(model, TrainConfig(kl_coef=0.5, lr=1e-2, lora=LoraSpec(rank=4)))
    items = multiturn_items(0)
    m1 = trainer.update(items)
    assert m1["train/kl_ref"] == 0.0  # lora_B starts at zero: the adapter is the identity
    m2 = trainer.update(items)
    assert m2["train/kl_ref"] > 0.0


@pytest.mark.parametrize("lora", [LoraSpec(rank=4, alpha=8), None], ids=["lora", "full"])
def test_update_changes_weights_and_lowers_loss(lora):
    model = make_tiny_llama(seed=4)
    items = _on_policy(model, multiturn_items(1, groups=2, group_size=2, turns=2))
    trainer = Trainer(model, TrainConfig(lr=3e-2 if lora else 3e-3, lora=lora, merge="tree"))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    first = trainer.update(items)
    assert first["train/clip_frac"] == 0.0 and first["train/approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert first["train/grad_norm"] > 0 and first["merge/token_ratio"] > 1.0
    losses = [first["train/loss"]] + [trainer.update(items)["train/loss"] for _ in range(3)]
    assert losses[-1] < losses[0]
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    if lora:
        assert changed and all("lora_" in n for n in changed)
    else:
        assert "model.embed_tokens.weight" in changed and "model.layers.0.mlp.up_proj.weight" in changed
    for key in ("train/entropy", "time/forward_s", "time/backward_s", "merge/tokens_before", "adv/mean", "train/tokens"):
        assert key in first


def test_logprobs_use_the_sampling_temperature():
    model = make_tiny_llama()
    items = multiturn_items(2, groups=1, group_size=2, turns=2)
    col = collate(merge_items(items, "tree", 4096).rows)
    lp, _ = target_logprobs(model, col, temperature=0.7)
    it = items[0]
    logits = model(torch.tensor([it.tokens])).logits[0] / 0.7
    ref = torch.log_softmax(logits, -1)[len(it.prompt_ids) - 1, it.response_ids[0]]
    sel = (col.target_item == 0) & (col.target_offset == 0)
    assert lp[sel].item() == pytest.approx(ref.item(), rel=1e-5)


def test_empty_batch_does_not_step():
    trainer = Trainer(make_tiny_llama(), TrainConfig(lora=LoraSpec(rank=2)))
    m = trainer.update([TrainSeq("s", (), (5,))])  # a lone first token has nothing predicting it
    assert m["train/tokens"] == 0.0


def test_config_errors_name_the_field():
    with pytest.raises(ValidationError, match="train.tis_cap"):
        TrainConfig(tis_cap=2.0)
    with pytest.raises(ValidationError, match="train.merge"):
        TrainConfig(merge="zip")
    with pytest.raises(ValidationError, match="train.temperature"):
        TrainConfig(temperature=0)
    with pytest.raises(ValidationError, match="ref_model"):
        Trainer(make_tiny_llama(), TrainConfig(lora=None, kl_coef=0.1))
    with pytest.raises(ValidationError, match="lora.rank"):
        LoraSpec(rank=0)


def test_decoupled_tis_and_sequence_aggregation_run():
    model = make_tiny_llama()
    trainer = Trainer(model, TrainConfig(ratio="decoupled", tis_cap=2.0, loss_agg="sequence", lr=1e-2))
    m = trainer.update(multiturn_items(0))
    assert m["train/clip_frac"] == 0.0 and m["train/ratio_mean"] == pytest.approx(1.0)
    assert 0 < m["train/tis_weight_mean"] <= 2.0
