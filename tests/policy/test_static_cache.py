"""The hf backend's static-slot decode (the CUDA-graph path's shapes, run eagerly on CPU) against the dynamic one."""

from __future__ import annotations

import asyncio

import pytest
import torch

from swarm.errors import ContextLengthError, ValidationError
from swarm.policy.base import GenerateRequest, SamplingParams, TokenDelta
from swarm.train import LoraSpec

WORDS = "wolf seer village night vote player accuse defend protect doctor hunter moon".split()


def _req(i: int, policy: str = "default", max_tokens: int = 12, **kw) -> GenerateRequest:
    msgs = [{"role": "user", "content": " ".join(WORDS[(i + k) % len(WORDS)] for k in range(1 + (i * 5) % 11))}]
    return GenerateRequest(policy, messages=msgs, sampling=SamplingParams(max_tokens=max_tokens, seed=100 + i, **kw))


def _gather(backend, reqs):
    async def go():
        return await asyncio.gather(*(backend.generate(r) for r in reqs))

    return [g[0] for g in asyncio.run(go())]


@pytest.fixture
def pair(tiny_model_path):
    """(static, dynamic) backends on the tiny model; the static one has 6 slots of 72 columns (compaction happens)."""
    from swarm.policy.hf import HFBackend

    made = [HFBackend(str(tiny_model_path), policies=["default"], batch_wait_ms=20, max_batch_size=6, **kw)
            for kw in ({"static_cache_len": 72}, {})]
    for b in made:
        b.eos_ids = set()  # fixed lengths: rows leave and join by their max_tokens only
    yield made
    for b in made:
        b.close()


def _same(a, b) -> None:
    assert a.response_ids == b.response_ids and a.text == b.text
    assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


def test_static_slots_give_the_dynamic_tokens(pair):
    """Ten calls of mixed lengths and sampling on 6 slots: rows leave, waiting calls join, the cache compacts."""
    static, dynamic = pair
    mixes = [dict(), dict(temperature=0.7, top_p=0.9), dict(temperature=0.0), dict(top_k=5, temperature=1.2)]
    reqs = [_req(i, max_tokens=6 + (i * 7) % 30, **mixes[i % 4]) for i in range(10)]
    got, ref = _gather(static, reqs), _gather(dynamic, reqs)
    for a, b in zip(got, ref, strict=True):
        _same(a, b)
    assert static._slots is not None and static._slots.compactions > 0


def test_calls_arriving_mid_batch_join_slots(pair):
    """Two identical seeded calls (equal rows, still two callers) join a running batch and finish first."""
    static, _ = pair
    short = _req(3, max_tokens=5, temperature=0.9)
    [alone] = _gather(static, [short])
    batches = static.stats["batches"]

    async def scenario():
        started, order = asyncio.Event(), []

        async def long_call():
            n = 0
            async for item in static.stream(_req(1, max_tokens=30)):
                n += isinstance(item, TokenDelta)
                if n == 8:
                    started.set()
            order.append("long")

        async def short_calls():
            await started.wait()
            twins = await asyncio.gather(static.generate(short), static.generate(short))
            order.append("short")
            return [g for [g] in twins]

        _, joined = await asyncio.gather(long_call(), short_calls())
        return order, joined

    order, joined = asyncio.run(scenario())
    assert order == ["short", "long"] and static.stats["batches"] == batches + 1
    for g in joined:
        _same(g, alone)


def test_grammar_and_lora_policies_on_slots(tiny_model_path):
    """A constrained call masks on slots too; two adapter policies share the slots (merged copy, then per-row)."""
    from swarm.policy.constraint import Constraint
    from swarm.policy.hf import HFBackend

    kw = dict(policies={"a": LoraSpec(rank=4), "b": LoraSpec(rank=4)}, batch_wait_ms=20, merge_lora=True)
    static = HFBackend(str(tiny_model_path), static_cache_len=64, **kw)
    dynamic = HFBackend(str(tiny_model_path), **kw)
    try:
        for b in (static, dynamic):
            state = {k: v + 0.3 if "lora_B" in k else v for k, v in b.adapter_state("b").items()}
            b.load_weights("b", state, version=1)
        schema = {"type": "object", "properties": {"vote": {"enum": ["wolf", "seer"]}}, "required": ["vote"]}
        reqs = [_req(0, "a"), _req(1, "b"), _req(2, "a", max_tokens=20)]
        reqs[2] = GenerateRequest("a", messages=reqs[2].messages, sampling=reqs[2].sampling,
                                  constraint=Constraint("json_schema", schema=schema))
        got, ref = _gather(static, reqs), _gather(dynamic, reqs)
        for a, b in zip(got, ref, strict=True):
            _same(a, b)
        assert got[2].text.startswith('{"vote"')
        with pytest.raises(ContextLengthError, match="static_cache_len"):
            _gather(static, [_req(0, "a", max_tokens=60)])
        with pytest.raises(ValidationError, match="slots"):
            _gather(static, [_req(0, "a", n=static.max_batch_size + 1)])
        with pytest.raises(ValidationError, match="sdpa or eager"):
            HFBackend(str(tiny_model_path), static_cache_len=64, attn_implementation="flex_attention", **kw)
    finally:
        static.close()
        dynamic.close()


@pytest.mark.slow  # ~25 s: torch.compile (inductor on the CPU) of the tiny model's step
def test_the_compiled_step_gives_the_eager_tokens(tiny_model_path):
    """compile_step (CUDA's default: reduce-overhead, a CUDA graph there) traces the slot cache and matches eager."""
    from swarm.policy.hf import HFBackend

    kw = dict(policies={"a": LoraSpec(rank=4)}, batch_wait_ms=20, merge_lora=True, max_batch_size=4)
    compiled = HFBackend(str(tiny_model_path), static_cache_len=96, compile_step=True, **kw)
    eager = HFBackend(str(tiny_model_path), **kw)
    try:
        reqs = [_req(i, "a", max_tokens=10 + 3 * i) for i in range(6)]  # 6 calls on 4 slots: two join later
        with torch._dynamo.config.patch(error_on_recompile=True):  # one graph for every step (no per-step guards)
            got = _gather(compiled, reqs)
        for a, b in zip(got, _gather(eager, reqs), strict=True):
            _same(a, b)
        assert len(compiled._compiled) == 1
    finally:
        compiled.close()
        eager.close()
