"""PolicyRouter: each policy goes to its own backend (two tiny hf bases of different sizes, hf + echo)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarm.errors import BackendError, NotFoundError, ValidationError
from swarm.policy.base import GenerateRequest, Generation, SamplingParams, vocab_size
from swarm.policy.constraint import request_constraint
from swarm.policy.echo import EchoBackend
from swarm.policy.router import PolicyRouter
from swarm.policy.tiny import TinySpec, ensure_tiny_model
from swarm.train import LoraSpec

MSGS = [{"role": "user", "content": "say hello to the wolf"}]
WIDE = TinySpec(hidden_size=256, intermediate_size=1024)


def run(coro):
    return asyncio.run(coro)


def req(policy: str, **kw) -> GenerateRequest:
    return GenerateRequest(policy, messages=MSGS, sampling=SamplingParams(max_tokens=kw.pop("max_tokens", 8), **kw))


@pytest.fixture(scope="module")
def wide_model_path(tiny_model_path: Path) -> Path:
    return ensure_tiny_model(cache_dir=tiny_model_path.parent, seed=1, spec=WIDE)


@pytest.fixture
def two_bases(tiny_model_path: Path, wide_model_path: Path) -> Iterator[tuple[PolicyRouter, object, object]]:
    from swarm.policy.hf import HFBackend

    trained = HFBackend(str(tiny_model_path), policies=["village"], lora=LoraSpec(rank=4), batch_wait_ms=5)
    frozen = HFBackend(str(wide_model_path), policies=["wolfbot"], batch_wait_ms=5)
    router = PolicyRouter([trained, frozen], frozen=["wolfbot"])
    yield router, trained, frozen
    router.close()


def test_two_hf_bases_of_different_sizes(two_bases) -> None:
    router, trained, frozen = two_bases
    assert router.policies() == ["village", "wolfbot"] and router.trainable() == ["village"]
    assert trained.base_model.config.hidden_size == 128 and frozen.base_model.config.hidden_size == 256
    # same tokenizer (ids and template), so one tokenizer answers for the run
    assert router.encode("wolfbot", "hello wolf") == router.encode("village", "hello wolf")
    assert router.tokenizer is trained.tokenizer and vocab_size(router, "wolfbot") == len(frozen.tokenizer)
    # a seeded sample through the router is the serving backend's own sample
    for policy, backend in (("village", trained), ("wolfbot", frozen)):
        via = run(router.generate(req(policy, seed=7)))[0]
        direct = run(backend.generate(req(policy, seed=7)))[0]
        assert via.response_ids == direct.response_ids and via.logprobs == direct.logprobs

    async def streamed() -> list:
        return [i async for i in router.stream(req("wolfbot", seed=7))]

    final = [i for i in run(streamed()) if isinstance(i, Generation)]
    assert final[0].response_ids == run(frozen.generate(req("wolfbot", seed=7)))[0].response_ids
    # publishing reaches the trained policy only; the frozen one refuses and stays at version 0
    router.load_weights("village", trained.adapter_state("village"), 1)
    assert router.version("village") == 1 and run(router.generate(req("village")))[0].policy_version == 1
    with pytest.raises(ValueError, match="wolfbot.*frozen"):
        router.load_weights("wolfbot", {}, 1)
    assert router.version("wolfbot") == 0 and run(router.generate(req("wolfbot")))[0].policy_version == 0
    with pytest.raises(NotFoundError, match="served: \\['village', 'wolfbot'\\]"):
        router.version("nobody")


def test_hf_beside_echo_routes_and_refuses_what_the_echo_cannot(tiny_model_path: Path) -> None:
    from swarm.policy.hf import HFBackend

    hf = HFBackend(str(tiny_model_path), policies=["default"], batch_wait_ms=5)
    router = PolicyRouter([hf, EchoBackend(("judge",))], frozen=["judge"])
    try:
        assert set(router.policies()) == {"default", "judge"}
        assert run(router.generate(req("judge", max_tokens=64)))[0].text == "say hello to the wolf"  # the echo
        assert run(router.generate(req("default")))[0].response_ids  # the tiny model
        # the gateway sees what some policy can do; the policy whose backend cannot is refused, naming the param
        assert router.supports_constraints and router.max_top_logprobs == 20
        c = request_constraint({"type": "json_schema", "json_schema": {"name": "v", "schema": {"type": "object"}}})
        router.compile_constraint("default", c)
        with pytest.raises(ValidationError, match="response_format") as err:
            router.compile_constraint("judge", c)
        assert err.value.context["param"] == "response_format"
        with pytest.raises(ValidationError, match="top_logprobs"):
            run(router.generate(req("judge", top_logprobs=2)))
        # different tokenizers: the trained policy's tokenizer is still the one answer (the echo is frozen) ...
        assert router.tokenizer is hf.tokenizer
        # ... but with both trainable there is none
        with pytest.raises(BackendError, match="different tokenizers"):
            _ = PolicyRouter([hf, EchoBackend(("other",))]).tokenizer
        with pytest.raises(ValidationError, match="served by two backends"):
            PolicyRouter([hf, EchoBackend(("default",))])
        with pytest.raises(ValidationError, match="frozen policies \\['ghost'\\]"):
            PolicyRouter([hf], frozen=["ghost"])
    finally:
        router.close()
