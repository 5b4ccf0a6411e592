"""Publishing: peft-format adapter on disk, load_weights with a bumped version, served logits = trained logits."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_llama import make_tiny_llama

from swarm.merge.synthetic import multiturn_items
from swarm.train import LoraSpec, TrainConfig, Trainer


class RecordingBackend:
    """The two PolicyBackend methods the trainer uses, recording what it was given."""

    def __init__(self) -> None:
        self.loaded: list[tuple[str, dict, int]] = []
        self._version = 3

    def version(self, policy: str) -> int:
        return self._version

    def load_weights(self, policy: str, adapter_state: dict, version: int) -> None:
        self.loaded.append((policy, adapter_state, version))
        self._version = version


def test_publish_saves_peft_adapter_and_bumps_version(tmp_path):
    from peft import PeftModel, get_peft_model_state_dict

    backend = RecordingBackend()
    trainer = Trainer(make_tiny_llama(seed=5), TrainConfig(lr=1e-2, lora=LoraSpec(rank=4)), policy="wolf",
                      backend=backend, out_dir=tmp_path)
    assert trainer.version == 3  # starts from what the backend serves
    metrics = trainer.update(multiturn_items(0))
    metrics.update(trainer.publish()[1])
    assert metrics["policy/version"] == 4.0 and "time/publish_s" in metrics
    policy, state, version = backend.loaded[-1]
    assert (policy, version) == ("wolf", 4)
    expected = {k: v.clone() for k, v in get_peft_model_state_dict(trainer.model).items()}
    assert state.keys() == expected.keys() and all(torch.equal(state[k], expected[k]) for k in state)
    assert any("lora_B" in k and state[k].abs().sum() > 0 for k in state)

    path = tmp_path / "adapters" / "wolf" / "v000004"
    assert (path / "adapter_config.json").exists() and (path / "adapter_model.safetensors").exists()
    assert json.loads((path / "swarm_version.json").read_text()) == {"policy": "wolf", "version": 4}
    reloaded = PeftModel.from_pretrained(make_tiny_llama(seed=5), str(path)).eval()
    probe = torch.tensor([[1, 5, 9, 13, 2]])
    trainer.model.eval()
    with torch.no_grad():
        assert torch.equal(reloaded(probe).logits, trainer.model(probe).logits)
    # The published copy is frozen: training on does not change what the backend holds.
    trainer.update(multiturn_items(1))
    assert all(torch.equal(state[k], expected[k]) for k in state)


def test_full_finetune_publishes_the_state_dict(tmp_path):
    backend = RecordingBackend()
    trainer = Trainer(make_tiny_llama(), TrainConfig(lr=1e-3, lora=None), backend=backend, out_dir=tmp_path)
    trainer.update(multiturn_items(0))
    trainer.publish()
    _, state, version = backend.loaded[-1]
    assert version == 4 and "model.embed_tokens.weight" in state
    assert (tmp_path / "adapters" / "default" / "v000004" / "config.json").exists()


def test_served_policy_matches_trained_bit_for_bit(tiny_model_path, tmp_path):
    """Publish into the real in-process HF backend: same logits as the trainer, different from before."""
    hf = pytest.importorskip("swarm.policy.hf", reason="swarm/policy/hf.py (HFBackend) is not available")
    lora = LoraSpec(rank=4, alpha=8, target_modules="all-linear")
    backend = hf.HFBackend(str(tiny_model_path), policies=["default"], lora=lora, torch_threads=1)
    try:
        spec = LoraSpec(rank=4, alpha=8, target_modules="all-linear")
        trainer = Trainer.from_pretrained(tiny_model_path, TrainConfig(lr=5e-2, lora=spec), backend=backend,
                                          out_dir=tmp_path)
        probe = torch.tensor([backend.encode("default", "hello world, how are you?")])
        with torch.no_grad():
            served_before = backend.model(probe).logits.clone()
        trainer.update(multiturn_items(0, vocab=200))
        trainer.publish()
        assert backend.version("default") == trainer.version == 1
        trainer.model.eval()
        with torch.no_grad():
            served = backend.model(probe).logits
            trained = trainer.model(probe).logits
        assert torch.equal(served, trained)
        assert not torch.equal(served, served_before)
    finally:
        backend.close()
