"""GPU check (not a test): generation, one tree-merged update dense vs flex, merge speedup, peak memory.

Needs only torch, transformers and peft (no vLLM, no downloads). The model is a randomly
initialised Llama-architecture causal LM built here (default hidden 1024, 8 layers, 16 heads /
4 KV heads, vocabulary 32,000, ~0.15 B parameters) with the tiny model's locally trained tokenizer
(``swarm.policy.tiny.build_tokenizer``; sampled ids past its 1,024 tokens decode to nothing),
saved to a temporary folder. Data: the Werewolves-shaped batch of ``benchmarks/merge_bench.py``
(``swarm.merge.synthetic.werewolves_items``: 9 players x 20 calls, a shared 300-token system
prompt). On CUDA everything runs in bfloat16 (LoRA weights and optimizer state in float32).

Stages, each with its own ``torch.cuda.max_memory_allocated``:

- ``generate``: the ``hf`` backend (``HFBackend``, one LoRA policy) samples ``--calls-gen``
  chat calls of ``--max-tokens`` tokens in one batch.
- ``update dense`` / ``update flex``: a LoRA ``Trainer`` with ``merge=tree``, its lora_B weights
  randomised (at init they are zero, which zeroes lora_A's gradient); the batch's loss and LoRA
  gradients with ``attention=dense`` (boolean tree mask, block-sparse SDPA) and ``attention=flex``
  (flex attention with the tree ``BlockMask``) must agree: relative loss difference, largest
  per-tensor ``max|g_flex - g_dense| / max|g_dense|`` and the cosine of the flattened gradients,
  against the tolerances in ``TOLERANCE``. Then the median wall time of ``--reps`` full updates
  each (the first flex call, which compiles the kernels, is reported apart).
- ``update none`` / ``update tree``: median update time with ``merge=none`` (plain causal rows)
  and ``merge=tree`` (dense attention): the merge speedup at this model size.

Without CUDA (and without ``--device cpu``) it prints ``no CUDA GPU: gpu_check skipped`` and exits
0. ``--device cpu --small`` is a smoke test of the script (tiny sizes, float32): flex attention has
no backward pass on CPU, so there the flex check compares one micro-batch's logprobs without
gradients and flex updates are not timed. Exit status 1 when a check fails.

    python benchmarks/gpu_check.py                 # one CUDA GPU, ~0.15 B model
    python benchmarks/gpu_check.py --device cpu --small

Prints a markdown table and a last line ``gpu_check: ...`` with the key numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from swarm.merge import collate, merge_items, micro_batches  # noqa: E402
from swarm.merge.synthetic import werewolves_items  # noqa: E402  (merge_bench.py's batch builder)
from swarm.train import LoraSpec, TrainConfig, Trainer, target_logprobs  # noqa: E402
from swarm.train.flex_mask import use_flex_attention  # noqa: E402
from swarm.train.forward import base_causal_lm  # noqa: E402

# (loss relative difference, gradient max relative error, minimum gradient cosine) per dtype
TOLERANCE = {torch.bfloat16: (2e-2, 1e-1, 0.99), torch.float32: (1e-4, 1e-3, 0.9999)}
GiB = 1 << 30


def build_model_dir(root: Path, hidden: int, layers: int, heads: int, kv_heads: int, vocab: int,
                    dtype: torch.dtype) -> Path:
    """A random Llama-architecture checkpoint with the tiny model's tokenizer, saved under ``root``."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from swarm.policy.tiny import build_tokenizer

    tok = build_tokenizer()
    eos, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = LlamaConfig(vocab_size=max(vocab, len(tok)), hidden_size=hidden, intermediate_size=int(hidden * 8 / 3) // 64 * 64,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=8192, initializer_range=0.02, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=eos, pad_token_id=pad)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(dtype)
    model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad, bos_token_id=None)
    path = root / "model"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


class Meter:
    """Peak device memory and wall time of one stage (CUDA: synchronised)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def run(self, fn: Callable[[], Any]) -> tuple[Any, float, float]:
        """``fn()``'s result, its wall seconds and the peak GiB allocated while it ran (0 on CPU)."""
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        wall = time.perf_counter() - t0
        return out, wall, (torch.cuda.max_memory_allocated() / GiB if self.cuda else 0.0)


def generate(path: Path, device: str, dtype: str, calls: int, max_tokens: int) -> int:
    """``calls`` chat calls through the hf backend at once; returns the tokens sampled."""
    from swarm.policy.base import GenerateRequest, SamplingParams
    from swarm.policy.hf import HFBackend

    backend = HFBackend(str(path), policies=["default"], device=device, dtype=dtype, lora=LoraSpec(rank=8),
                        max_batch_size=calls, batch_wait_ms=50)

    async def run() -> list[Any]:
        reqs = [GenerateRequest(policy="default", messages=[{"role": "user", "content": f"player {i}: who is the wolf?"}],
                                sampling=SamplingParams(max_tokens=max_tokens, seed=i)) for i in range(calls)]
        return await asyncio.gather(*(backend.generate(r) for r in reqs))

    try:
        outs = asyncio.run(run())
    finally:
        backend.close()
    return sum(len(g.response_ids) for gens in outs for g in gens)


def lora_grads(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().float().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, float]:
    """Largest per-tensor ``max|b - a| / max|a|`` and the cosine of the flattened gradients."""
    err = max(float((b[n] - g).abs().max() / g.abs().max().clamp(min=1e-30)) for n, g in a.items())
    fa, fb = torch.cat([g.flatten() for g in a.values()]), torch.cat([b[n].flatten() for n in a])
    return err, float(torch.nn.functional.cosine_similarity(fa, fb, dim=0))


def median_update(meter: Meter, trainer: Trainer, items: list, reps: int) -> tuple[float, float]:
    """Median wall seconds of ``reps`` updates and the peak GiB over them."""
    times, peak = [], 0.0
    for _ in range(reps):
        _, wall, mem = meter.run(lambda: trainer.update(items))
        times.append(wall)
        peak = max(peak, mem)
    return statistics.median(times), peak


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke test)")
    ap.add_argument("--small", action="store_true", help="tiny sizes for a CPU smoke test")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--players", type=int, default=9)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--system", type=int, default=300)
    ap.add_argument("--budget", type=int, default=4096, help="token budget per row and per micro-batch")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--calls-gen", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    if args.small:
        args.hidden, args.layers, args.heads, args.kv_heads, args.vocab = 64, 2, 4, 2, 1024
        args.players, args.calls, args.system, args.budget, args.reps = 3, 4, 60, 1024, 1
        args.calls_gen, args.max_tokens = 2, 4
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: gpu_check skipped")
        return 0
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    dtype_name = "bfloat16" if cuda else "float32"
    if not cuda:
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    t_start = time.perf_counter()
    meter = Meter(device)
    rows: list[tuple[str, str, float, float]] = []  # (stage, result, seconds, peak GiB)
    failures: list[str] = []
    gpu = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"device {gpu}; torch {torch.__version__}; dtype {dtype_name}", flush=True)

    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        path = build_model_dir(Path(tmp), args.hidden, args.layers, args.heads, args.kv_heads, args.vocab, dtype)
        from transformers import AutoModelForCausalLM

        # (a) the hf backend generating
        n_tok, wall, mem = meter.run(lambda: generate(path, str(device), dtype_name, args.calls_gen, args.max_tokens))
        rows.append(("generate (hf backend)", f"{args.calls_gen} calls, {n_tok} tokens, {n_tok / wall:.0f} tok/s", wall, mem))
        print(f"generate: {n_tok} tokens in {wall:.1f}s", flush=True)

        items = werewolves_items(0, players=args.players, calls=args.calls, system_len=args.system)
        stats = {m: merge_items(items, m, args.budget).stats for m in ("none", "tree")}
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"model: {n_params / 1e6:.1f} M parameters, hidden {args.hidden}, {args.layers} layers, vocab "
              f"{model.config.vocab_size}; batch {len(items)} steps, {stats['none'].tokens_before} tokens "
              f"(tree {stats['tree'].tokens_after})", flush=True)

        def config(merge: str, attention: str = "dense") -> TrainConfig:
            return TrainConfig(lr=1e-5, merge=merge, token_budget=args.budget, attention=attention,
                               lora=LoraSpec(rank=8, alpha=16))

        # (b) one update, dense vs flex attention
        torch.manual_seed(1)
        dense = Trainer(model, config("tree"))
        gen = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for n, p in dense.model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        dense.optimizer.zero_grad(set_to_none=True)
        m_dense, wall, mem = meter.run(lambda: dense.accumulate_gradients(items))
        g_dense = lora_grads(dense)
        rows.append(("grads dense (tree)", f"loss {m_dense['train/loss']:.5f}", wall, mem))
        loss_tol, grad_tol, cos_tol = TOLERANCE[dtype]
        flex: Trainer | None = None
        try:  # flex is compiled (torch.compile / Triton): report a failure, keep the other stages
            if cuda:
                flex = Trainer(dense.model, config("tree", "flex"))
                flex.optimizer.zero_grad(set_to_none=True)
                m_flex, wall, mem = meter.run(lambda: flex.accumulate_gradients(items))
                loss_diff = abs(m_flex["train/loss"] - m_dense["train/loss"]) / max(abs(m_dense["train/loss"]), 1e-6)
                grad_err, cos = compare(g_dense, lora_grads(flex))
                rows.append(("grads flex (tree, incl. compile)", f"loss {m_flex['train/loss']:.5f}", wall, mem))
                check = f"loss rel diff {loss_diff:.1e}, grad max rel err {grad_err:.1e}, cos {cos:.5f}"
                ok = loss_diff <= loss_tol and grad_err <= grad_tol and cos >= cos_tol
            else:  # no flex backward on CPU: one micro-batch's logprobs without gradients
                batch = merge_items(items, "tree", args.budget)
                group = micro_batches(batch.rows, args.budget)[0]
                col = collate([batch.rows[i] for i in group], force_mask=True)
                with torch.no_grad():
                    lp_dense = target_logprobs(dense.model, col)[0]
                    use_flex_attention(base_causal_lm(dense.model))
                    lp_flex, wall, mem = meter.run(lambda: target_logprobs(dense.model, col)[0])
                base_causal_lm(dense.model).set_attn_implementation("sdpa")
                loss_diff = float((lp_flex - lp_dense).abs().max())
                check = f"logprob max abs diff {loss_diff:.1e} (CPU: forward only, no flex backward)"
                rows.append(("logprobs flex (CPU, incl. compile)", "", wall, mem))
                ok = loss_diff <= loss_tol
        except Exception as exc:  # noqa: BLE001 - any compile/runtime failure is this check's result
            flex, ok, check = None, False, f"flex failed: {type(exc).__name__}: {str(exc)[:300]}"
            base_causal_lm(dense.model).set_attn_implementation("sdpa")
        tol = f"tolerance: loss {loss_tol:g}, grad {grad_tol:g}, cos {cos_tol:g}"
        rows.append(("flex == dense", f"{'ok' if ok else 'FAIL'}: {check} ({tol})", 0.0, 0.0))
        if not ok:
            failures.append(f"flex vs dense: {check}")
        print(f"flex vs dense: {check}", flush=True)

        # update times: tree dense / tree flex, then none vs tree (the merge speedup)
        times: dict[str, float] = {}
        if flex is not None:
            times["tree flex"], mem = median_update(meter, flex, items, args.reps)
            rows.append(("update tree, flex", f"median of {args.reps}", times["tree flex"], mem))
            base_causal_lm(dense.model).set_attn_implementation("sdpa")
        for mode in ("tree", "none"):
            t = Trainer(dense.model, config(mode))
            times[mode], mem = median_update(meter, t, items, args.reps)
            rows.append((f"update {mode}, dense", f"median of {args.reps}; {stats[mode].tokens_after} tokens forward",
                         times[mode], mem))
            print(f"update {mode}: {times[mode]:.2f}s", flush=True)

    speedup = times["none"] / times["tree"]
    flex_speedup = times["none"] / times["tree flex"] if "tree flex" in times else float("nan")
    print()
    print("| stage | result | wall s | peak GiB allocated |")
    print("|---|---|---:|---:|")
    for stage, result, wall, mem in rows:
        print(f"| {stage} | {result} | {wall:.2f} | {f'{mem:.2f}' if cuda else 'n/a (CPU)'} |")
    print()
    peak = f"{max(r[3] for r in rows):.2f} GiB" if cuda else "n/a (CPU)"
    total = time.perf_counter() - t_start
    print(f"gpu_check: {gpu}, {n_params / 1e6:.1f} M params {dtype_name}; generate {n_tok} tok; "
          f"flex vs dense {'ok' if ok else 'FAIL'} ({check}); merge speedup {speedup:.2f}x tree vs none "
          f"(flex {flex_speedup:.2f}x), token ratio {stats['tree'].ratio:.2f}x; peak {peak}; total {total:.0f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
