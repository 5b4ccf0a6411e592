"""Policy-test fixtures: one torch thread (much faster on a shared CPU), a tiny-model HF backend, a vLLM
client against the fake server of ``test_vllm.py``."""

from __future__ import annotations

import pytest
import torch

from swarm.train import LoraSpec

torch.set_num_threads(1)


@pytest.fixture
def hf_backend(tiny_model_path):
    from swarm.policy.hf import HFBackend

    backend = HFBackend(str(tiny_model_path), policies=["default"], batch_wait_ms=20)
    yield backend
    backend.close()


@pytest.fixture
def lora_backend(tiny_model_path):
    """Policies a and b with their own LoRA adapters, and base on the base weights."""
    from swarm.policy.hf import HFBackend

    backend = HFBackend(str(tiny_model_path), policies={"a": LoraSpec(rank=4), "b": LoraSpec(rank=4), "base": None}, batch_wait_ms=20)
    yield backend
    backend.close()


@pytest.fixture
def fake_vllm(tiny_model_path):
    """A fake ``vllm serve`` (``test_vllm.FakeVLLM``) with the tiny model's tokenizer; it records requests."""
    from test_vllm import FakeVLLM
    from transformers import AutoTokenizer

    return FakeVLLM(AutoTokenizer.from_pretrained(tiny_model_path))


@pytest.fixture
def vllm_backend(fake_vllm, tiny_model_path, tmp_path):
    """A VLLMBackend (policy ``default``) talking to ``fake_vllm`` through an httpx MockTransport."""
    import httpx
    from test_vllm import BASE

    from swarm.policy.vllm import VLLMBackend

    return VLLMBackend("http://gpu.test:8000", BASE, policies=["default"], tokenizer_path=str(tiny_model_path),
                       transport=httpx.MockTransport(fake_vllm), adapter_dir=str(tmp_path / "adapters"))
