"""Batched on-device sampling: per-row parameters, counter-based seeds, exact logprobs; the hf backend across batch compositions."""

from __future__ import annotations

import asyncio

import torch

from swarm.policy.base import GenerateRequest, SamplingParams
from swarm.policy.sampling import BatchParams, batch_logprobs, processed_logprobs, sample, uniforms

ROWS = [(1.0, 1.0, 0), (0.7, 0.9, 0), (0.0, 0.5, 3), (1.3, 1.0, 5), (1.0, 0.3, 4)]  # temperature, top_p, top_k


def test_batch_rows_equal_each_row_alone_and_truncation_is_exact() -> None:
    torch.manual_seed(0)
    logits = torch.randn(len(ROWS), 300) * 3
    params = BatchParams.of(*zip(*ROWS, strict=True))
    batch = batch_logprobs(logits, params)
    for b, (t, p, k) in enumerate(ROWS):
        alone = processed_logprobs(logits[b], t, p, k)
        kept = alone > float("-inf")
        assert torch.equal(kept, batch[b] > float("-inf")) and (alone[kept] - batch[b][kept]).abs().max() < 1e-6
        assert abs(alone.exp().sum().item() - 1) < 1e-5
        if t <= 0:  # greedy: the unscaled, untruncated softmax is recorded
            assert torch.allclose(alone, torch.log_softmax(logits[b], -1))
        elif k:
            assert kept.sum() <= k and set(alone.topk(int(kept.sum())).indices.tolist()) <= set(logits[b].topk(k).indices.tolist())


def _full_sort_reference(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The nucleus as the per-row loop computed it before: a full sort of the vocabulary."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    probs = sorted_logp.exp()
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, (probs.cumsum(-1) - probs) >= top_p)
    return torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)


def test_the_candidate_head_equals_a_full_sort_and_falls_back_when_too_flat() -> None:
    torch.manual_seed(1)
    peaked, flat = torch.randn(3, 5000) * 6, torch.randn(3, 5000) * 0.1  # nucleus inside / far beyond 512 tokens
    for logits in (peaked, flat):
        for t, p in ((1.0, 0.9), (0.7, 0.5), (1.2, 0.99)):
            ref, got = _full_sort_reference(logits, t, p), processed_logprobs(logits, t, p)
            kept = ref > float("-inf")
            assert torch.equal(kept, got > float("-inf")) and (ref[kept] - got[kept]).abs().max() < 1e-5
    assert (processed_logprobs(flat, 1.0, 0.9) > float("-inf")).sum(-1).min() > 512  # the fallback ran


def test_uniforms_depend_only_on_seed_index_and_step() -> None:
    a = uniforms([7, 11, 7], [0, 0, 1], 6)
    b = uniforms([3, 7], [2, 0], 9)
    assert torch.equal(a[0], b[1, :6]) and not torch.equal(a[0], a[2]) and not torch.equal(a[0], a[1])
    assert ((a >= 0) & (a < 1)).all()


def test_sampled_frequencies_follow_the_recorded_distribution() -> None:
    n = 40000
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0]).repeat(n, 1)
    params = BatchParams.of([1.0] * n, [0.9] * n, [4] * n)
    logp = batch_logprobs(logits, params)
    ids = sample(logp, uniforms(range(n), [0] * n, 1)[:, 0], params)
    freq = torch.bincount(ids, minlength=6).double() / n
    assert (freq - logp[0].exp().double()).abs().max() < 0.01 and freq[4:].sum() == 0  # never outside the support


def _req(content: str, seed: int | None, **kw: object) -> GenerateRequest:
    return GenerateRequest("default", messages=[{"role": "user", "content": content}],
                           sampling=SamplingParams(max_tokens=12, seed=seed, **kw))


def test_a_seed_gives_the_same_tokens_in_any_batch_with_mixed_parameters(hf_backend) -> None:
    mine = _req("Say hello to the world.", 5, temperature=0.8, top_p=0.9, top_logprobs=2)
    others = [_req("A much longer question about the weather today?", None, temperature=1.3, n=2),
              _req("hi", 9, temperature=0.0), _req("Count to three.", 123, top_p=0.5)]

    async def together(reqs: list[GenerateRequest]) -> list:
        return await asyncio.gather(*(hf_backend.generate(r) for r in reqs))

    [alone] = asyncio.run(hf_backend.generate(mine))
    batched = asyncio.run(together([others[0], mine, *others[1:]]))[1][0]
    assert hf_backend.stats["batches"] == 2  # alone, then all four requests in one batch
    assert batched.response_ids == alone.response_ids and batched.text == alone.text
    assert max(abs(x - y) for x, y in zip(batched.logprobs, alone.logprobs, strict=True)) < 1e-4
    assert [[i for i, _ in t] for t in batched.top_logprobs] == [[i for i, _ in t] for t in alone.top_logprobs]
    ids = torch.tensor([alone.prompt_ids + alone.response_ids])
    with torch.no_grad():
        logits = hf_backend.base_model(ids).logits[0, len(alone.prompt_ids) - 1 : -1]
    ref = processed_logprobs(logits, 0.8, 0.9).gather(-1, torch.tensor(alone.response_ids)[:, None])[:, 0]
    assert (torch.tensor(alone.logprobs) - ref).abs().max() < 1e-4  # the distribution sampled from
