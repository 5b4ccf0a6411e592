"""``python -m flows.export``: a trained tiny-model version (the flow's shared-base LoRA, saved as training saves it)
exported from a run folder, an adapter folder or a checkpoint; the merged folder loads with transformers alone
(tokenizer and chat template included) and gives the trainer's logprobs; the adapter is copied as it is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flows.export import locate, main
from swarm.merge import TrainSeq, collate, merge_items
from swarm.train import LoraSpec, TrainConfig, Trainer, target_logprobs
from swarm.train.base_model import policy_models

SPEC = LoraSpec(rank=4, alpha=8, target_modules=("q_proj", "v_proj", "up_proj"))
TOL = 1e-4  # max |merged - peft| logprob per token, fp32 (measured ~1e-6)


def _logprobs(model: torch.nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    col = collate(merge_items([TrainSeq("s", tuple(prompt), tuple(response))], "none", 10_000).rows)
    with torch.no_grad():
        return target_logprobs(model, col, 1.0)[0]


@pytest.fixture(scope="module")
def run(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Trainer]:
    """A run folder with v1 (published, kept: a checkpoint) and v2 (published, not kept), as flows.train leaves it."""
    out = tmp_path_factory.mktemp("run")
    model = policy_models(tiny_model_path, SPEC, ["default"])["default"]
    trainer = Trainer(model, TrainConfig(lr=1e-2, lora=SPEC), out_dir=out, tokenizer=str(tiny_model_path))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # lora_B starts at zero (the base): make the adapter matter
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    trainer.publish()  # adapters/default/v000001
    trainer.save_checkpoint()  # checkpoints/default/ckpt-00000000 -> version 1
    trainer.publish(save=False)  # v2: published between checkpoints, no adapter kept
    trainer.version = 1  # the weights the test compares are v1's (unchanged: no update ran)
    return out, trainer


def test_the_merged_export_loads_with_transformers_and_gives_the_trainers_logprobs(run, tiny_model_path: Path,
                                                                                     tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, trainer = run
    out = tmp_path / "exp"
    assert main([str(folder), "--version", "1", "--out", str(out)]) == 0
    merged, adapter = out / "merged", out / "adapter"
    assert {"config.json", "model.safetensors", "tokenizer_config.json", "generation_config.json"} <= \
        {p.name for p in merged.iterdir()}
    model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    tok, base_tok = AutoTokenizer.from_pretrained(merged), AutoTokenizer.from_pretrained(tiny_model_path)
    msgs = [{"role": "user", "content": "say cat"}]
    prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert prompt == base_tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    response = tok.encode("cat dog cat", add_special_tokens=False) + [tok.eos_token_id]
    trainer.model.eval()
    want = _logprobs(trainer.model, prompt, response)
    got = _logprobs(model, prompt, response)
    base = _logprobs(AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval(), prompt, response)
    err = (got - want).abs()
    print(f"merged export vs the trainer's peft model: max {err.max():.2e}; vs the base: {(base - want).abs().max():.2e}")
    assert err.max() < TOL and (base - want).abs().max() > 100 * TOL  # the adapter is in it, and it matters
    src = folder / "adapters" / "default" / "v000001"
    assert sorted(p.name for p in adapter.iterdir()) == sorted(p.name for p in src.iterdir())
    assert (adapter / "adapter_model.safetensors").read_bytes() == (src / "adapter_model.safetensors").read_bytes()
    info = json.loads((out / "export.json").read_text())
    assert info["policy"] == "default" and info["version"] == 1 and info["base"] == str(tiny_model_path)


def test_a_run_folder_an_adapter_folder_and_a_checkpoint_name_the_same_version(run) -> None:
    folder, _ = run
    adapter = folder / "adapters" / "default" / "v000001"
    assert locate(folder) == ("default", 1, adapter)  # newest kept
    assert locate(adapter) == ("default", 1, adapter)
    assert locate(folder / "checkpoints" / "default") == ("default", 1, adapter)  # LATEST -> its version's adapter
    from swarm.errors import ConfigError

    with pytest.raises(ConfigError, match=r"version 2 of 'default' kept no adapter.*with an adapter: \[1\]"):
        locate(folder, version=2)
    with pytest.raises(ConfigError, match="holds version 1, not --version 3"):
        locate(adapter, version=3)


def test_the_command_line_says_what_is_missing_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "flows.export", str(tmp_path / "nope")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == f"export error: {tmp_path / 'nope'}: no such folder"
