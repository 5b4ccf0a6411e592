"""The tiny offline model: builds offline, reloads with identical ids and logits, is deterministic and cached."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarm.policy.tiny import SPECIAL_TOKENS, build_model, build_tokenizer, ensure_tiny_model

TEXT = 'Hello world 42! {"name": "get_weather", "arguments": {"city": "Paris"}} <tool_call> ünïcode'


def test_reload_gives_identical_ids_and_logits(tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    fresh_tok = build_tokenizer()
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert ids == fresh_tok.encode(TEXT, add_special_tokens=False)
    assert tok.decode(ids) == TEXT
    assert tok.padding_side == "left"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert model.config.model_type == "llama"
    meta = json.loads((tiny_model_path / "swarm_tiny.json").read_text())
    fresh = build_model(ensure_spec(), fresh_tok, meta["seed"])
    x = torch.tensor([ids])
    with torch.no_grad():
        assert torch.equal(model(x).logits, fresh(x).logits)


def ensure_spec():
    from swarm.policy.tiny import TinySpec

    return TinySpec()


def test_same_seed_same_checkpoint_and_cache_reuse(tmp_path):
    a = ensure_tiny_model(cache_dir=tmp_path / "a", seed=3)
    b = ensure_tiny_model(cache_dir=tmp_path / "b", seed=3)
    assert a.name == b.name
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    mtime = (a / "config.json").stat().st_mtime_ns
    assert ensure_tiny_model(cache_dir=tmp_path / "a", seed=3) == a
    assert (a / "config.json").stat().st_mtime_ns == mtime
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".build-")]
    c = ensure_tiny_model(cache_dir=tmp_path / "a", seed=4)
    assert c != a and (c / "tokenizer.json").read_bytes() == (a / "tokenizer.json").read_bytes()
    assert (c / "model.safetensors").read_bytes() != (a / "model.safetensors").read_bytes()


def test_a_build_sweeps_folders_left_by_killed_builds(tmp_path):
    """A killed build leaves its .build-* folder; the next build removes it unless it may still be running."""
    import os
    import time

    from swarm.policy.tiny import STALE_BUILD_S

    old, fresh = tmp_path / ".build-killed", tmp_path / ".build-running"
    for p in (old, fresh):
        p.mkdir(parents=True)
        (p / "config.json").write_text("{}")
    past = time.time() - STALE_BUILD_S - 60
    os.utime(old, (past, past))
    path = ensure_tiny_model(cache_dir=tmp_path, seed=5)
    assert not old.exists() and fresh.exists() and (path / "config.json").exists()


def test_size_and_warmup_hook(tmp_path):
    calls = []

    def warm(model, tokenizer):
        calls.append(sum(p.numel() for p in model.parameters()))

    p = ensure_tiny_model(cache_dir=tmp_path, seed=0, warmup=warm, warmup_key="test-warmup-v1")
    assert 500_000 < calls[0] < 3_000_000
    assert "test-warmup-v1" in (p / "swarm_tiny.json").read_text()
    assert len(AutoTokenizer.from_pretrained(p)) == 1024
