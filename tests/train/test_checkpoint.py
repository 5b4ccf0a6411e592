"""Checkpoint/resume: the next update after a restart equals the uninterrupted one; commits are atomic."""

from __future__ import annotations

import torch
from tiny_llama import make_tiny_llama

from swarm.merge.synthetic import multiturn_items
from swarm.train import LoraSpec, TrainConfig, Trainer, commit_checkpoint, load_latest_checkpoint

CFG = TrainConfig(lr=1e-2, lora=LoraSpec(rank=4), merge="tree")


def test_resume_gives_the_same_next_update(tmp_path):
    b1, b2 = multiturn_items(1), multiturn_items(2)
    a = Trainer(make_tiny_llama(seed=7), CFG, out_dir=tmp_path / "a")
    a.update(b1)
    a.publish()
    a.save_checkpoint(extra={"lease": "lease-42", "acked": ["lease-41"]})
    m_a = a.update(b2)

    b = Trainer(make_tiny_llama(seed=7), CFG, out_dir=tmp_path / "a")
    extra = b.resume()
    assert extra == {"lease": "lease-42", "acked": ["lease-41"]}
    assert b.version == 1 and b.updates == 1
    m_b = b.update(b2)
    assert m_a["train/loss"] == m_b["train/loss"]
    pa, pb = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    for n in pa:
        assert torch.equal(pa[n], pb[n]), n


def test_nothing_to_resume(tmp_path):
    t = Trainer(make_tiny_llama(), CFG, out_dir=tmp_path)
    assert t.resume() is None and t.version == 0


def test_commit_is_atomic_and_keeps_the_last_two(tmp_path):
    for u in range(1, 5):
        commit_checkpoint(tmp_path, u, {"update": u})
    (tmp_path / ".ckpt-00000005.crashed").mkdir()  # a half-written checkpoint from a crash
    assert load_latest_checkpoint(tmp_path) == {"update": 4}
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == ["ckpt-00000003", "ckpt-00000004"]
