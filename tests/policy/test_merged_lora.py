"""The hf backend's merged-LoRA sampling copy against the peft model it stands in for (the eager reference)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from swarm.policy.base import GenerateRequest, SamplingParams
from swarm.policy.sampling import processed_logprobs
from swarm.train import LoraSpec

MSGS = [{"role": "user", "content": "Say hello to the world."}]
POLICIES = {"a": LoraSpec(rank=4), "b": LoraSpec(rank=4), "base": None}


def _req(policy: str, seed: int, **kw) -> GenerateRequest:
    return GenerateRequest(policy, messages=MSGS, sampling=SamplingParams(max_tokens=kw.pop("max_tokens", 12),
                                                                          seed=seed, **kw))


def _perturb(backend, policy: str, seed: int, version: int) -> None:
    g = torch.Generator().manual_seed(seed)
    state = {k: v + 0.5 * torch.randn(v.shape, generator=g) if "lora_B" in k else v
             for k, v in backend.adapter_state(policy).items()}
    backend.load_weights(policy, state, version)


@pytest.fixture
def pair(tiny_model_path):
    """(merged, eager): two backends on the same tiny model with the same perturbed adapters a and b."""
    from swarm.policy.hf import HFBackend

    backends = [HFBackend(str(tiny_model_path), policies=POLICIES, batch_wait_ms=20, merge_lora=m) for m in (True, False)]
    for b in backends:
        _perturb(b, "a", 1, 1)
        _perturb(b, "b", 2, 1)
    yield backends
    for b in backends:
        b.close()


def _gather(backend, reqs):
    async def go():
        return await asyncio.gather(*(backend.generate(r) for r in reqs))

    return [g[0] for g in asyncio.run(go())]


def _recompute_err(model, gen, temperature: float, top_p: float) -> float:
    ids = torch.tensor([gen.prompt_ids + gen.response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(gen.prompt_ids) - 1 : -1]
    ref = processed_logprobs(logits, temperature, top_p).gather(-1, torch.tensor(gen.response_ids)[:, None])[:, 0]
    return (torch.tensor(gen.logprobs) - ref).abs().max().item()


def test_merged_sampling_equals_the_peft_model(pair):
    """Per policy, seeded calls give the eager path's tokens; recorded logprobs equal a peft recompute (float32)."""
    merged, eager = pair
    assert merged.merge_lora and not eager.merge_lora
    for policy in ("a", "b", "base"):
        reqs = [_req(policy, seed, temperature=t, top_p=p) for seed, (t, p) in enumerate([(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])]
        got, ref = _gather(merged, reqs), _gather(eager, reqs)
        for r, m, e in zip(reqs, got, ref, strict=True):
            assert m.response_ids == e.response_ids and m.policy_version == e.policy_version
            assert max(abs(x - y) for x, y in zip(m.logprobs, e.logprobs, strict=True)) < 1e-4
            # the trainer's view: the unmerged peft model, under paused() as a trainer reads it (the worker thread
            # may still be leaving the batch's adapter state after the callers got their replies)
            with eager.paused(), eager._adapter_context(policy):
                err = _recompute_err(eager.model, m, r.sampling.temperature or 1.0, r.sampling.top_p)
            assert err < 1e-4, (policy, err)
    assert merged._merged is not None and eager._merged is None  # the copy was used; the reference never built one


def test_new_weights_are_merged_before_the_next_batch(pair):
    """A published adapter, a base-weights load and an in-place change under ``paused()`` all reach the copy."""
    merged, eager = pair
    greedy = dict(temperature=0.0, max_tokens=8)
    first = _gather(merged, [_req("a", 0, **greedy)])[0]
    for b in pair:
        _perturb(b, "a", 3, 2)
    after = _gather(merged, [_req("a", 0, **greedy)])[0]
    assert after.policy_version == 2 and after.logprobs[0] != pytest.approx(first.logprobs[0], abs=1e-3)
    assert after.logprobs == pytest.approx(_gather(eager, [_req("a", 0, **greedy)])[0].logprobs, abs=1e-4)

    for b in pair:  # the shared base changes under every policy
        w = b.base_model.get_submodule("model.layers.0.self_attn.q_proj").base_layer.weight
        b.load_weights("base", {"model.layers.0.self_attn.q_proj.weight": w * 3.0}, version=1)
        with b.paused():  # a trainer's in-place edit of an adapter
            b.model.get_submodule("base_model.model.model.layers.1.self_attn.v_proj").lora_B["policy1"].weight.mul_(2.0)
        b.load_weights("b", None, version=2)
    for policy in ("a", "b", "base"):
        m, e = _gather(merged, [_req(policy, 0, **greedy)])[0], _gather(eager, [_req(policy, 0, **greedy)])[0]
        assert m.response_ids == e.response_ids and m.logprobs == pytest.approx(e.logprobs, abs=1e-4), policy


def test_a_batch_that_mixes_policies_runs_the_peft_model(pair):
    """Rows of a, b and base in one batch (merged copy first, per-row adapters once they mix) equal their singles."""
    merged, _ = pair
    reqs = [_req(p, i, temperature=0.9, max_tokens=10) for i, p in enumerate(("a", "b", "base", "a"))]
    alone = [_gather(merged, [r])[0] for r in reqs]
    batches = merged.stats["batches"]
    together = _gather(merged, reqs)
    assert merged.stats["batches"] == batches + 1
    for one, m in zip(alone, together, strict=True):
        assert m.response_ids == one.response_ids
        assert max(abs(x - y) for x, y in zip(m.logprobs, one.logprobs, strict=True)) < 1e-4
