"""One shared frozen base for several policies' adapters: isolation, bf16 base vs fp32, checkpointing, chunked logits."""

from __future__ import annotations

import pytest
import torch
from tiny_llama import make_tiny_llama

from swarm.merge import collate, merge_items
from swarm.merge.synthetic import multiturn_items
from swarm.train import LoraSpec, TrainConfig, Trainer, target_logprobs
from swarm.train.base_model import SharedBase, load_base_model, policy_models

LORA = LoraSpec(rank=4, alpha=8, target_modules=("q_proj", "v_proj", "down_proj"))


@pytest.fixture(scope="module")
def base_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("base")
    make_tiny_llama(seed=3, vocab=300, hidden=64).save_pretrained(path)
    return path


def _items():
    return multiturn_items(5, groups=2, group_size=2, turns=2, vocab=300)


def _cfg(**kw):
    return TrainConfig(lr=5e-2, lora=LORA, merge="tree", **kw)


def _states(model):
    return {k: v.clone() for k, v in model.adapter_state().items()}


def test_policies_share_one_base_and_train_only_their_adapter(base_path):
    models = policy_models(base_path, LORA, ["wolf", "seer", "witch"])
    shared = models["wolf"].shared
    assert all(m.shared is shared for m in models.values())  # one copy of the base weights
    base_before = {n: p.clone() for n, p in shared.model.named_parameters() if not p.requires_grad}
    others_before = {p: _states(models[p]) for p in ("seer", "witch")}
    trainer = Trainer(models["wolf"], _cfg(), policy="wolf")
    trainer.update(_items())
    for p in ("seer", "witch"):  # another policy's adapter is untouched
        assert all(torch.equal(v, _states(models[p])[k]) for k, v in others_before[p].items())
    base_after = {n: p for n, p in shared.model.named_parameters() if not p.requires_grad}
    assert base_before.keys() == base_after.keys() and all(torch.equal(base_before[n], base_after[n]) for n in base_after)

    # the same update on a base holding only this policy: identical adapter (no cross-talk)
    alone = policy_models(base_path, LORA, ["wolf"])["wolf"]
    Trainer(alone, _cfg(), policy="wolf").update(_items())
    got, want = _states(models["wolf"]), _states(alone)
    assert got.keys() == want.keys()
    assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)
    assert any(v.abs().sum() > 0 for k, v in got.items() if "lora_B" in k)


def test_interleaved_trainers_match_separate_ones(base_path):
    shared = policy_models(base_path, LORA, ["a", "b"])
    ta, tb = (Trainer(shared[p], _cfg(), policy=p) for p in ("a", "b"))
    sep = {p: policy_models(base_path, LORA, ["a", "b"])[p] for p in ("a", "b")}  # two bases
    sa, sb = Trainer(sep["a"], _cfg(), policy="a"), Trainer(sep["b"], _cfg(), policy="b")
    items_a, items_b = _items(), multiturn_items(6, groups=2, group_size=2, turns=2, vocab=300)
    for _ in range(2):
        ta.update(items_a), tb.update(items_b)
        sa.update(items_a), sb.update(items_b)
    for mine, ref in ((ta.model, sa.model), (tb.model, sb.model)):
        got, want = _states(mine), _states(ref)
        assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)


def test_bf16_base_keeps_fp32_adapters_and_matches_the_fp32_update(base_path):
    fp32 = policy_models(base_path, LORA, ["p"], dtype="float32")["p"]
    bf16 = policy_models(base_path, LORA, ["p"], dtype="bfloat16")["p"]
    assert {p.dtype for p in bf16.parameters()} == {torch.float32}
    frozen = {p.dtype for p in bf16.shared.model.parameters() if not p.requires_grad}
    assert frozen == {torch.bfloat16}
    col = collate(merge_items(_items(), "tree", 4096).rows)
    grads, lps = [], []
    for m in (fp32, bf16):  # the policy-gradient direction: d/dtheta of sum(A * logp)
        lp, _ = target_logprobs(m, col, 1.0)
        adv = torch.linspace(-1, 1, lp.numel())
        g = torch.autograd.grad((adv * lp).sum(), list(m.parameters()))
        grads.append(torch.cat([x.flatten() for x in g]).float())
        lps.append(lp.detach())
    assert torch.allclose(lps[0], lps[1], atol=0.05)
    rel = (grads[0] - grads[1]).norm() / grads[0].norm()
    cos = torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0)
    assert rel < 0.05 and cos > 0.999, (rel, cos)
    t16 = Trainer(bf16, _cfg(), policy="p")
    t16.update(_items())
    assert {s["exp_avg"].dtype for s in t16.optimizer.state.values()} == {torch.float32}


def test_gradient_checkpointing_gives_the_same_update(base_path):
    plain = policy_models(base_path, LORA, ["p"])["p"]
    ckpt = policy_models(base_path, LORA, ["p"], gradient_checkpointing=True)["p"]
    assert ckpt.shared.model.get_base_model().is_activation_checkpointing
    Trainer(plain, _cfg(), policy="p").update(_items())
    Trainer(ckpt, _cfg(), policy="p").update(_items())
    a, b = _states(plain), _states(ckpt)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_chunked_logits_equal_the_one_shot_logits():
    model = make_tiny_llama(seed=1, vocab=300)
    col = collate(merge_items(_items(), "tree", 4096).rows)
    lp, ent = target_logprobs(model, col, 0.8, with_entropy=True)
    (g_full,) = torch.autograd.grad(lp.sum(), [model.lm_head.weight])
    lp2, ent2 = target_logprobs(model, col, 0.8, with_entropy=True, logit_chunk_elems=300 * 7)  # 7 rows a chunk
    (g_chunk,) = torch.autograd.grad(lp2.sum(), [model.lm_head.weight])
    assert torch.allclose(lp, lp2, atol=1e-6) and torch.allclose(ent, ent2, atol=1e-6)
    assert torch.allclose(g_full, g_chunk, atol=1e-5)


def test_saved_adapter_loads_into_peft(base_path, tmp_path):
    from peft import PeftModel

    models = policy_models(base_path, LORA, ["x", "y"])
    Trainer(models["y"], _cfg(), policy="y").update(_items())
    models["y"].save_pretrained(tmp_path / "y")
    loaded = PeftModel.from_pretrained(load_base_model(base_path), str(tmp_path / "y"))
    from peft import get_peft_model_state_dict

    want, got = _states(models["y"]), get_peft_model_state_dict(loaded)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_unknown_policy_and_dtype_are_named(base_path):
    from swarm.errors import ValidationError

    shared = SharedBase(load_base_model(base_path), LORA, ["a"])
    with pytest.raises(ValidationError, match="unknown policy 'b'"):
        shared.view("b")
    with pytest.raises(ValidationError, match="model.dtype"):
        load_base_model(base_path, dtype="int8")
