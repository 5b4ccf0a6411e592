"""experiments/werewolves/probe.py: the vote probe reads the constrained vote's distribution, and moves with training."""

from __future__ import annotations

import pytest
import torch

from experiments.werewolves.game import WEREWOLF
from experiments.werewolves.probe import target_logprobs, vote_items, wolf_shares


@pytest.fixture(scope="module")
def reading_model():
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from swarm.policy.hf import HFSettings

    path = HFSettings(backend="hf", warmup="reading").weights()  # shipped: the same bytes everywhere
    tok = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path), LoraConfig(r=8, lora_alpha=16,
                                                                                   target_modules=["q_proj", "v_proj"]))
    return tok, model


def test_shares_are_the_wolf_mass_of_the_legal_targets(reading_model) -> None:
    tok, model = reading_model
    items = vote_items(tok, 3, 10_000)
    assert items and all(len(cand) == len(d.targets) for (_, cand), d, _ in items)
    shares = wolf_shares(model, tok.pad_token_id or 0, items)
    with torch.no_grad():
        lps = target_logprobs(model, tok.pad_token_id or 0, items)
    for share, lp, (_, d, roles) in zip(shares, lps, items, strict=True):
        assert lp.exp().sum().item() == pytest.approx(1.0, abs=1e-5)  # renormalised over the legal targets only
        wolves = [k for k, t in enumerate(d.targets) if roles[t] == WEREWOLF]
        assert share == pytest.approx(lp.exp()[wolves].sum().item(), abs=1e-6)
    assert model.training  # the mode it was in comes back


def test_an_unchanged_policy_reads_exactly_the_same_and_a_trained_one_moves(reading_model) -> None:
    tok, model = reading_model
    pad = tok.pad_token_id or 0
    items = vote_items(tok, 3, 10_000)
    before = wolf_shares(model, pad, items)
    assert wolf_shares(model, pad, items) == before  # no change, no gain: the bench's "learning broke" case
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):  # reward votes that name a wolf directly (what the vote shaping pays)
        lps = target_logprobs(model, pad, items)
        loss = -sum(torch.logsumexp(lp[[k for k, t in enumerate(d.targets) if roles[t] == WEREWOLF]], 0)
                    for lp, (_, d, roles) in zip(lps, items, strict=True)) / len(items)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = wolf_shares(model, pad, items)
    assert sum(after) > sum(before) + 0.05 * len(items)
