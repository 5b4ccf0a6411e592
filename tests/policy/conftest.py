"""Policy-test fixtures: one torch thread (much faster on a shared CPU), a tiny-model HF backend."""

from __future__ import annotations

import pytest
import torch

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

    backend = HFBackend(str(tiny_model_path), policies={"a": {"r": 4}, "b": {"r": 4}, "base": None}, batch_wait_ms=20)
    yield backend
    backend.close()
