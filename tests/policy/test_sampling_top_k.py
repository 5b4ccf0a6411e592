"""top_k end to end: the gateway's ``top_k`` field -> ``SamplingParams.top_k`` -> the hf backend's batched sampler,
whose recorded logprobs are those of the top-k-masked, temperature-scaled distribution it sampled from."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from swarm.app import GatewaySettings, create_app
from swarm.policy.base import GenerateRequest, Generation, SamplingParams
from swarm.policy.echo import EchoBackend
from swarm.policy.sampling import BatchParams, batch_logprobs, processed_logprobs, sample, uniforms
from swarm.pool import Pool
from swarm.stack import ServerThread


def _reference(logits: torch.Tensor, temperature: float, k: int) -> torch.Tensor:
    """log_softmax of the temperature-scaled logits with all but each row's k largest set to -inf."""
    scaled = logits.double() / temperature
    kth = scaled.topk(k, dim=-1).values[..., -1:]
    return torch.log_softmax(scaled.masked_fill(scaled < kth, float("-inf")), dim=-1)


def test_processed_logprobs_are_the_top_k_masked_tempered_softmax() -> None:
    torch.manual_seed(3)
    logits = torch.randn(6, 1000) * 4
    for t, k in ((1.0, 1), (0.7, 5), (1.3, 40), (1.0, 600)):  # 600: beyond the 512-token candidate head
        got, ref = processed_logprobs(logits, t, 1.0, k), _reference(logits, t, k)
        kept = ref > float("-inf")
        assert torch.equal(kept, got > float("-inf")) and int(kept.sum(-1).max()) == k
        assert (got[kept].double() - ref[kept]).abs().max() < 1e-5
    # top_k at or above the vocabulary is a no-op
    for k in (1000, 5000):
        assert (processed_logprobs(logits, 0.8, 1.0, k) - processed_logprobs(logits, 0.8, 1.0, 0)).abs().max() < 1e-5


def test_top_k_one_samples_the_argmax() -> None:
    torch.manual_seed(4)
    logits = torch.randn(64, 300) * 2
    params = BatchParams.of([1.5] * 64, [1.0] * 64, [1] * 64)
    logp = batch_logprobs(logits, params)
    ids = sample(logp, uniforms(range(64), [0] * 64, 1)[:, 0], params)
    assert torch.equal(ids, logits.argmax(-1)) and logp.gather(-1, ids[:, None]).abs().max() == 0


def _req(**kw: Any) -> GenerateRequest:
    return GenerateRequest("default", messages=[{"role": "user", "content": "Tell me about the sea."}],
                           sampling=SamplingParams(max_tokens=10, **kw))


def _scored(hf_backend: Any, g: Generation) -> torch.Tensor:
    ids = torch.tensor([g.prompt_ids + g.response_ids])
    with torch.no_grad():
        return hf_backend.base_model(ids).logits[0, len(g.prompt_ids) - 1 : -1]


def test_hf_backend_samples_and_records_the_top_k_distribution(hf_backend: Any) -> None:
    [greedy] = asyncio.run(hf_backend.generate(_req(temperature=0.0)))
    [top1] = asyncio.run(hf_backend.generate(_req(temperature=1.0, top_k=1, seed=11)))
    assert top1.response_ids == greedy.response_ids and all(lp == 0.0 for lp in top1.logprobs)

    [g] = asyncio.run(hf_backend.generate(_req(temperature=0.8, top_k=5, seed=3)))
    ref = _reference(_scored(hf_backend, g), 0.8, 5).gather(-1, torch.tensor(g.response_ids)[:, None])[:, 0]
    assert (torch.tensor(g.logprobs, dtype=torch.float64) - ref).abs().max() < 1e-5

    vocab = max(len(hf_backend.tokenizer), hf_backend.base_model.config.vocab_size)
    [off] = asyncio.run(hf_backend.generate(_req(temperature=0.9, seed=5)))
    [huge] = asyncio.run(hf_backend.generate(_req(temperature=0.9, seed=5, top_k=vocab + 1000)))
    assert huge.response_ids == off.response_ids
    assert max(abs(a - b) for a, b in zip(huge.logprobs, off.logprobs, strict=True)) < 1e-5


class _Recording(EchoBackend):
    """The echo backend, keeping the sampling parameters of every request."""

    def __init__(self) -> None:
        super().__init__()
        self.sampling: list[SamplingParams] = []

    async def generate(self, request: GenerateRequest) -> list[Generation]:
        self.sampling.append(request.sampling)
        return await super().generate(request)


@pytest.mark.parametrize("sent, top_k", [({"top_k": 7}, 7), ({}, 0), ({"top_k": 0}, 0), ({"top_k": -1}, 0)])
def test_the_gateway_passes_top_k_to_the_sampling_params(tmp_path: Path, sent: dict[str, Any], top_k: int) -> None:
    backend = _Recording()
    server = ServerThread(create_app(Pool(f"sqlite:///{tmp_path / 'pool.db'}"), backend, GatewaySettings())).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            key = http.post("/v1/episodes", json={"task": "t"}).json()["api_key"]
            auth = {"Authorization": f"Bearer {key}"}
            r = http.post("/v1/chat/completions", headers=auth, json={
                "model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **sent})
            assert r.status_code == 200, r.text
            r = http.post("/v1/completions", headers=auth, json={"model": "default", "prompt": "hi", **sent})
            assert r.status_code == 200, r.text
            bad = http.post("/v1/chat/completions", headers=auth, json={
                "model": "default", "messages": [{"role": "user", "content": "hi"}], "top_k": -2})
            assert bad.status_code == 400
    finally:
        server.stop()
    assert [s.top_k for s in backend.sampling] == [top_k, top_k]
