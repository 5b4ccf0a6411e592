"""The hf backend on the tiny model: exact logprobs, batching = singles, streaming, stops, context, LoRA swaps."""

from __future__ import annotations

import asyncio

import pytest
import torch

from swarm.errors import ConflictError, ContextLengthError, NotFoundError, ValidationError
from swarm.policy.base import GenerateRequest, Generation, PolicyBackend, SamplingParams, TokenDelta

MSGS = [{"role": "user", "content": "Say hello to the world."}]


def req(policy="default", max_tokens=24, seed=1, **kw) -> GenerateRequest:
    return GenerateRequest(policy, messages=MSGS, sampling=SamplingParams(max_tokens=max_tokens, seed=seed, **kw))


def run(coro):
    return asyncio.run(coro)


def rescore(model, gen: Generation, temperature: float) -> torch.Tensor:
    """Logprobs of the response tokens from one forward pass over prompt + response."""
    ids = torch.tensor([gen.prompt_ids + gen.response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(gen.prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
    return logp.gather(-1, torch.tensor(gen.response_ids).unsqueeze(-1)).squeeze(-1)


def test_implements_protocol_and_basics(hf_backend):
    b = hf_backend
    assert isinstance(b, PolicyBackend)
    assert b.policies() == ["default"] and b.version("default") == 0 and b.max_context("default") == 2048
    text = b.render_chat("default", MSGS, None, True)
    assert b.decode("default", b.encode("default", text)) == text
    assert b.encode("default", "<|im_end|>") == [2]
    with pytest.raises(NotFoundError):
        b.version("nope")


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (0.0, 1.0), (1.3, 0.8)])
def test_logprobs_match_a_forward_pass(hf_backend, temperature, top_p):
    gens = run(hf_backend.generate(req(max_tokens=32, temperature=temperature, top_p=top_p, n=2)))
    assert len(gens) == 2
    for g in gens:
        assert len(g.response_ids) == len(g.logprobs) > 0
        ref = rescore(hf_backend.base_model, g, temperature)
        lp = torch.tensor(g.logprobs)
        if top_p < 1.0:  # the nucleus renormalises: recorded >= full-softmax logprob, never below
            assert (lp >= ref - 1e-5).all()
            from swarm.policy.sampling import processed_logprobs

            ids = torch.tensor([g.prompt_ids + g.response_ids])
            with torch.no_grad():
                logits = hf_backend.base_model(ids).logits[0, len(g.prompt_ids) - 1 : -1]
            ref = processed_logprobs(logits, temperature, top_p).gather(-1, torch.tensor(g.response_ids)[:, None])[:, 0]
        assert (lp - ref).abs().max().item() < 1e-4
        if temperature == 0:  # greedy
            ids = torch.tensor([g.prompt_ids + g.response_ids])
            with torch.no_grad():
                logits = hf_backend.base_model(ids).logits[0, len(g.prompt_ids) - 1 : -1]
            assert logits.argmax(-1).tolist() == g.response_ids
    if temperature == 0:
        assert gens[0].response_ids == gens[1].response_ids


def test_seeds_reproduce_and_concurrent_batch_equals_singles(hf_backend):
    b = hf_backend
    prompts = [MSGS, [{"role": "user", "content": "A much longer question about the weather in the city today?"}]]
    reqs = [
        GenerateRequest("default", messages=prompts[i % 2], sampling=SamplingParams(max_tokens=16 + 4 * i, seed=10 + i))
        for i in range(4)
    ]
    singles = [run(b.generate(r))[0] for r in reqs]
    assert b.stats["batches"] == 4

    async def together():
        return await asyncio.gather(*(b.generate(r) for r in reqs))

    batched = [g[0] for g in run(together())]
    assert b.stats["batches"] < 8  # they shared at least one batch
    for s, t in zip(singles, batched, strict=True):
        assert s.prompt_ids == t.prompt_ids and s.response_ids == t.response_ids and s.text == t.text
        assert max(abs(x - y) for x, y in zip(s.logprobs, t.logprobs, strict=True)) < 1e-4
    assert singles[0].response_ids != singles[2].response_ids  # different seeds, different samples


def test_streaming_increments_add_up(hf_backend):
    async def collect():
        return [item async for item in hf_backend.stream(req(max_tokens=40, seed=3, n=2))]

    items = run(collect())
    deltas = [i for i in items if isinstance(i, TokenDelta)]
    finals = [i for i in items if isinstance(i, Generation)]
    assert len(finals) == 2 and all(isinstance(i, Generation) for i in items[len(deltas) :])
    for idx, g in enumerate(finals):
        mine = [d for d in deltas if d.index == idx]
        assert "".join(d.text for d in mine) == g.text
        assert [t for d in mine for t in d.token_ids] == g.response_ids
        assert [x for d in mine for x in d.logprobs] == g.logprobs
    assert finals == run(hf_backend.generate(req(max_tokens=40, seed=3, n=2)))


def test_stop_strings_and_length(hf_backend):
    base = run(hf_backend.generate(req(max_tokens=40, seed=5)))[0]
    assert base.finish_reason == "length" and len(base.response_ids) == 40
    stop = next(base.text[i : i + 2] for i in range(4, len(base.text)) if base.text[i : i + 2].isalpha())
    cut = base.text.index(stop)
    stopped = run(hf_backend.generate(req(max_tokens=40, seed=5, stop=(stop, "never-seen-XYZ"))))[0]
    assert stopped.finish_reason == "stop" and stopped.text == base.text[:cut]
    assert stopped.response_ids == base.response_ids[: len(stopped.response_ids)]

    async def collect():
        return [i async for i in hf_backend.stream(req(max_tokens=40, seed=5, stop=(stop,)))]

    deltas = [i for i in run(collect()) if isinstance(i, TokenDelta)]
    assert "".join(d.text for d in deltas) == stopped.text


def test_eos_ends_with_its_logprob(hf_backend):
    eos = 2  # <|im_end|>
    # make eos near-certain by pushing its logit: a real stop, recorded and trained like any token
    with hf_backend.paused():
        bias = torch.zeros(hf_backend.base_model.config.vocab_size)
        bias[eos] = 50.0
        handle = hf_backend.base_model.lm_head.register_forward_hook(lambda m, i, o: o + bias)
    try:
        g = run(hf_backend.generate(req(max_tokens=10)))[0]
    finally:
        handle.remove()
    assert g.response_ids == [eos] and g.finish_reason == "stop" and g.text == ""
    assert g.logprobs[0] > -1e-3


def test_bad_requests(hf_backend):
    b = hf_backend
    with pytest.raises(ContextLengthError):
        run(b.generate(GenerateRequest("default", prompt_ids=[5] * 2040, sampling=SamplingParams(max_tokens=16))))
    ok = run(b.generate(GenerateRequest("default", prompt_ids=[5] * 2040, sampling=SamplingParams(max_tokens=8))))
    assert len(ok[0].response_ids) <= 8
    for bad in [
        GenerateRequest("default", prompt_ids=[]),
        GenerateRequest("default", prompt_ids=[10**6]),
        GenerateRequest("default"),
        GenerateRequest("default", prompt_ids=[5], sampling=SamplingParams(max_tokens=0)),
        GenerateRequest("default", prompt_ids=[5], sampling=SamplingParams(temperature=-1)),
    ]:
        with pytest.raises(ValidationError):
            run(b.generate(bad))
    with pytest.raises(NotFoundError):
        run(b.generate(GenerateRequest("other", prompt_ids=[5])))


def test_abandoned_stream_does_not_break_the_backend(hf_backend):
    async def first_only():
        async for item in hf_backend.stream(req(max_tokens=200)):
            return item

    assert isinstance(run(first_only()), TokenDelta)
    assert len(run(hf_backend.generate(req(max_tokens=4)))[0].response_ids) == 4


def _perturbed(state: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.5 * torch.randn(v.shape, generator=g) if "lora_B" in k else v for k, v in state.items()}


def test_load_weights_swaps_versions_per_policy(lora_backend):
    b = lora_backend
    greedy = dict(max_tokens=12, temperature=0.0)
    before = {p: run(b.generate(req(p, **greedy)))[0] for p in ("a", "b", "base")}
    assert before["a"].logprobs == pytest.approx(before["base"].logprobs, abs=1e-5)  # fresh adapter = base

    b.load_weights("a", _perturbed(b.adapter_state("a"), 1), version=1)
    b.load_weights("b", _perturbed(b.adapter_state("b"), 2), version=1)
    assert (b.version("a"), b.version("b"), b.version("base")) == (1, 1, 0)
    after = {p: run(b.generate(req(p, **greedy)))[0] for p in ("a", "b", "base")}
    assert after["a"].policy_version == 1 and after["base"].policy_version == 0
    assert after["a"].logprobs[0] != pytest.approx(before["a"].logprobs[0], abs=1e-3)
    assert after["a"].logprobs[:1] != pytest.approx(after["b"].logprobs[:1], abs=1e-3)
    assert after["base"].response_ids == before["base"].response_ids
    assert after["base"].logprobs == pytest.approx(before["base"].logprobs, abs=1e-5)
    with pytest.raises(ConflictError):
        b.load_weights("a", None, version=1)


def test_generation_in_flight_keeps_its_version(lora_backend):
    b = lora_backend
    new_state = _perturbed(b.adapter_state("a"), 3)

    async def scenario():
        stream = b.stream(req("a", max_tokens=60, temperature=0.0))
        first = await stream.__anext__()
        swap = asyncio.create_task(asyncio.to_thread(b.load_weights, "a", new_state, 7))
        rest = [i async for i in stream]
        await swap
        later = await b.generate(req("a", max_tokens=5, temperature=0.0))
        return first, rest, later

    first, rest, later = run(scenario())
    final = [i for i in rest if isinstance(i, Generation)][0]
    assert isinstance(first, TokenDelta)
    assert final.policy_version == 0 and later[0].policy_version == 7 and b.version("a") == 7


def test_base_policy_takes_a_plain_state_dict(lora_backend):
    b = lora_backend
    greedy = dict(max_tokens=6, temperature=0.0)
    before = run(b.generate(req("base", **greedy)))[0]
    w = b.base_model.get_submodule("model.layers.0.self_attn.q_proj").base_layer.weight
    b.load_weights("base", {"model.layers.0.self_attn.q_proj.weight": w * 3.0}, version=1)
    after = run(b.generate(req("base", **greedy)))[0]
    assert b.version("base") == 1 and after.policy_version == 1
    assert after.logprobs[0] != pytest.approx(before.logprobs[0], abs=1e-4)
    with pytest.raises(ValidationError):
        b.load_weights("base", {"no.such.weight": w}, version=2)
    with pytest.raises(ValidationError):
        b.load_weights("a", {"base_model.model.bogus.lora_A.weight": torch.zeros(1)}, version=2)


def test_a_request_arriving_mid_batch_joins_it_and_finishes_first(hf_backend, monkeypatch):
    b = hf_backend
    monkeypatch.setattr(b, "eos_ids", set())  # fixed lengths: the long reply cannot end early (restored after:
    # the backend is shared by the session, and a grammar compiled without stop tokens is refused)
    short = req(max_tokens=6, seed=2, temperature=0.9)
    [alone] = run(b.generate(short))
    batches = b.stats["batches"]

    async def scenario():
        started, order = asyncio.Event(), []

        async def long_call():
            n = 0
            async for item in b.stream(req(max_tokens=300, seed=1)):
                n += isinstance(item, TokenDelta)
                if n == 20:
                    started.set()
            order.append("long")

        async def short_call():
            await started.wait()
            gens = await b.generate(short)
            order.append("short")
            return gens[0]

        _, joined = await asyncio.gather(long_call(), short_call())
        return order, joined

    order, joined = run(scenario())
    assert order == ["short", "long"] and b.stats["batches"] == batches + 1  # joined the running batch, left first
    assert joined.response_ids == alone.response_ids and joined.text == alone.text
    assert max(abs(x - y) for x, y in zip(joined.logprobs, alone.logprobs, strict=True)) < 1e-4


def test_policies_share_a_batch_each_with_its_own_adapter(lora_backend):
    b = lora_backend
    b.load_weights("a", _perturbed(b.adapter_state("a"), 1), version=1)
    b.load_weights("b", _perturbed(b.adapter_state("b"), 2), version=1)
    reqs = [req(p, max_tokens=10, seed=i, temperature=0.9) for i, p in enumerate(("a", "b", "base", "a"))]
    alone = [run(b.generate(r))[0] for r in reqs]
    assert alone[0].logprobs[:1] != pytest.approx(alone[2].logprobs[:1], abs=1e-3)  # the adapters do something
    batches = b.stats["batches"]

    async def together():
        return await asyncio.gather(*(b.generate(r) for r in reqs))

    mixed = [g[0] for g in run(together())]
    assert b.stats["batches"] == batches + 1  # one batch: a's rows first, b's and base's joined at the next step
    for one, m in zip(alone, mixed, strict=True):
        assert m.response_ids == one.response_ids and m.policy_version == one.policy_version
        assert max(abs(x - y) for x, y in zip(m.logprobs, one.logprobs, strict=True)) < 1e-4
