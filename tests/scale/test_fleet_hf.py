"""A fleet of tiny-model HF replicas behind a real gateway: real weights reach every replica, steps record versions."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from flows.components import ConfigError, make_backend
from flows.config import model_section
from swarm.gateway import GatewaySettings
from swarm.policy.base import GenerateRequest, SamplingParams
from swarm.policy.fleet import FleetBackend
from swarm.policy.hf import HFBackend
from swarm.pool import Pool, StepFilter
from swarm.stack import start_stack
from swarm.train import LoraSpec

CONF = Path(__file__).resolve().parents[2] / "conf"
MSG = [{"role": "user", "content": "say hello"}]


@pytest.fixture
def hf_fleet(tiny_model_path: Path):
    torch.set_num_threads(1)
    reps = {n: HFBackend(str(tiny_model_path), policies=["default"], lora=LoraSpec(rank=4), batch_wait_ms=1) for n in "ab"}
    fleet = FleetBackend(reps)
    yield fleet, reps
    fleet.close()


def greedy(backend, max_tokens: int = 12) -> list[int]:
    req = GenerateRequest("default", messages=MSG, sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0))
    [gen] = asyncio.run(backend.generate(req))
    return gen.response_ids


def test_published_weights_reach_every_hf_replica(hf_fleet, tmp_path: Path) -> None:
    fleet, reps = hf_fleet
    before = greedy(reps["a"])
    state = reps["a"].adapter_state("default")
    gen = torch.Generator().manual_seed(0)
    new = {k: v + 0.5 * torch.randn(v.shape, generator=gen) for k, v in state.items()}
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    stack = start_stack(pool, fleet, GatewaySettings())
    try:
        with httpx.Client(base_url=stack.url, timeout=60) as http:
            ep = http.post("/v1/episodes", json={"task": "t"}).json()
            auth = {"Authorization": f"Bearer {ep['api_key']}"}
            body = {"model": "default", "messages": MSG, "max_tokens": 8, "temperature": 0}
            r0 = http.post("/v1/chat/completions", json=body, headers=auth)
            assert r0.status_code == 200 and r0.json()["swarm"]["policy_version"] == 0
            fleet.load_weights("default", new, 1)
            assert http.get("/health").json()["versions"] == {"default": 1}
            ep2 = http.post("/v1/episodes", json={"task": "t"}).json()
            for _ in range(4):
                r = http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {ep2['api_key']}"})
                assert r.status_code == 200 and r.json()["swarm"]["policy_version"] == 1
        versions = sorted(s.policy_version for s in pool.query_steps(StepFilter(), limit=100))
        assert versions == [0, 1, 1, 1, 1]
    finally:
        stack.stop()
        pool.close()
    after_a, after_b = greedy(reps["a"]), greedy(reps["b"])
    assert after_a == after_b != before  # both replicas run the new adapter
    for rep in reps.values():
        got = rep.adapter_state("default")
        assert all(torch.equal(got[k], new[k]) for k in new)


def test_in_flight_request_records_the_version_it_really_got(hf_fleet) -> None:
    fleet, reps = hf_fleet
    state = reps["a"].adapter_state("default")

    async def run() -> tuple[int, int]:
        long = GenerateRequest("default", messages=MSG, sampling=SamplingParams(max_tokens=256, temperature=1.0,
                                                                                    seed=3))
        stream = fleet.stream(long)
        await stream.__anext__()  # decoding has started on the old weights
        pub = threading.Thread(target=fleet.load_weights, args=("default", state, 1))
        pub.start()
        final = [item async for item in stream][-1]
        await asyncio.to_thread(pub.join, 30)
        [after] = await fleet.generate(GenerateRequest("default", messages=MSG, sampling=SamplingParams(max_tokens=4)))
        return final.policy_version, after.policy_version

    old, new = asyncio.run(run())
    assert (old, new) == (0, 1)  # the swap waited for the batch in flight; that batch reports v0


def test_fleet_from_config() -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="serve", overrides=["model=fleet_echo"])
    model = OmegaConf.to_container(cfg.model, resolve=True)
    fleet = make_backend(model_section(model), ["default", "judge"], None)
    assert isinstance(fleet, FleetBackend)
    assert [r.name for r in fleet.replicas] == ["a", "b"] and fleet.policies() == ["default", "judge"]
    with pytest.raises(ConfigError, match=r"model.replicas=\[\]: List should have at least 1 item"):
        model_section({"backend": "fleet", "replicas": []})
    with pytest.raises(ConfigError, match=r"model.replicas.0.backend=fleet: unknown; use one of echo, hf\b"):
        model_section({"backend": "fleet", "replicas": [{"backend": "fleet", "replicas": []}]})


def test_version_follower_loads_published_adapters(tiny_model_path: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from swarm.policy.echo import EchoBackend
    from swarm.policy.fleet import VersionFollower
    from swarm.records import PolicyVersion

    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    trainer_side = HFBackend(str(tiny_model_path), policies=["default"], lora=LoraSpec(rank=4), batch_wait_ms=1)
    other_gateway = HFBackend(str(tiny_model_path), policies=["default"], lora=LoraSpec(rank=4), batch_wait_ms=1)
    try:
        state = trainer_side.adapter_state("default")
        new = {k: v + 0.25 for k, v in state.items()}
        folder = tmp_path / "adapters" / "default" / "v000001"
        folder.mkdir(parents=True)
        save_file(new, str(folder / "adapter_model.safetensors"))
        follower = VersionFollower(pool, other_gateway)
        assert follower.poll_once() == {}  # nothing published yet
        pool.add_policy_version(PolicyVersion(policy="default", version=1, adapter_path=str(folder)))
        assert follower.poll_once() == {"default": 1}
        assert other_gateway.version("default") == 1
        got = other_gateway.adapter_state("default")
        assert all(torch.equal(got[k], new[k]) for k in new)
        assert follower.poll_once() == {}  # already there

        pool.add_policy_version(PolicyVersion(policy="default", version=2, adapter_path=str(tmp_path / "missing")))
        assert follower.poll_once() == {} and other_gateway.version("default") == 1  # kept serving v1

        echo = EchoBackend()
        pool.add_policy_version(PolicyVersion(policy="default", version=3))
        running = VersionFollower(pool, echo, interval_s=0.05).start()
        deadline = time.monotonic() + 10
        while echo.version("default") != 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        running.stop()
        assert echo.version("default") == 3
    finally:
        trainer_side.close()
        other_gateway.close()
        pool.close()


def test_vllm_replicas_describe_the_trainers_adapter(tiny_model_path: Path) -> None:
    from swarm.train import LoraSpec

    model = {"backend": "fleet", "replicas": [
        {"name": f"gpu{i}", "backend": "vllm", "base_url": f"http://127.0.0.1:{9 + i}/v1", "model": "served",
         "tokenizer_path": str(tiny_model_path), "adapter_dir": f"/tmp/adapters/gpu{i}"} for i in range(2)]}
    fleet = make_backend(model_section(model), ["default"], LoraSpec(rank=16, alpha=32, target_modules=("q_proj", "v_proj")))
    for rep in fleet.replicas:  # no server is contacted to build them
        assert rep.backend._lora["default"] == LoraSpec(rank=16, alpha=32, target_modules=("q_proj", "v_proj"))
