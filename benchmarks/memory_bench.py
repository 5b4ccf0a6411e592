"""Benchmark (not a test): peak memory of the trainer with one shared base, 1 vs 4 policies, fp32 vs bf16.

Model: a randomly initialised Qwen2-architecture causal LM built locally (no downloads), ~100 M
parameters: vocabulary 151,936 (Qwen2's), hidden 512, 8 layers, 8 heads / 2 KV heads, tied
embeddings. It is saved once under ``$SWARM_CACHE``/``~/.cache/swarmpool`` and reloaded.

Each configuration runs in a fresh process (so ``ru_maxrss`` is that configuration's own peak):
load the trainer models with :func:`swarm.train.base_model.policy_models` (``shared``: one base
with an adapter per policy; ``separate``: the old way, one float32 copy per policy), then one
``Trainer.update`` per policy on the same synthetic Werewolves-shaped batch (``werewolves_items``:
a shared system prompt, a role card and a growing history per player; random token ids). Rows:

- ``load``: peak RSS after loading the models (weights + adapters), every weight touched once
  (a checkpoint loaded by memory-mapping only becomes resident when read).
- ``peak``: peak RSS of the whole process after the updates.
- ``update``: ``peak - load``, what the updates added on top of the weights.

Ablations on one policy show where the update's memory goes: the LM head over the whole target
list in one piece (``chunk=off``: the ``(targets x vocab)`` float logits, their softmax and their
gradient at once) and gradient checkpointing (``ckpt``). The update check compares the LoRA
gradient of one micro-batch on a bf16 base with the fp32 one (relative L2 error, cosine).

    .venv/bin/python benchmarks/memory_bench.py [--players 4] [--calls 12] [--budget 4096] [--threads 2]
    .venv/bin/python benchmarks/memory_bench.py --model smollm2   # the real model (model=smollm2), 1-policy rows

``--model smollm2`` runs the one-policy float32 rows (chunked vs unchunked LM head, gradient
checkpointing) on SmolLM2-135M-Instruct (vocabulary 49,152) instead of the random Qwen2 model.

Prints one markdown table (the one in docs/policy.md) and a last line
``memory: 4 policies / 1 policy = <X>x (bf16 <Y>x), bf16 / fp32 = <Z>x``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VOCAB = 151_936


def model_dir(name: str = "qwen2-random") -> Path:
    """Build (once) and return the random ~100 M Qwen2-architecture checkpoint, or the converted SmolLM2."""
    if name == "smollm2":
        from swarm.policy.gguf import ensure_gguf_model

        return ensure_gguf_model("smollm2")
    from swarm.policy.tiny import default_cache_dir

    path = default_cache_dir() / "qwen2-random-100m-v1"
    if (path / "config.json").exists():
        return path
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=8192,
                      tie_word_embeddings=True, initializer_range=0.02)
    model = Qwen2ForCausalLM(cfg)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    os.replace(tmp, path) if not path.exists() else None
    return path


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child(args: argparse.Namespace) -> None:
    """One configuration in this (fresh) process; prints a JSON line."""
    import torch

    torch.set_num_threads(args.threads)
    from swarm.merge.synthetic import werewolves_items
    from swarm.train import LoraSpec, TrainConfig, Trainer, forward
    from swarm.train.base_model import policy_models

    if args.chunk == "off":
        forward.LOGIT_CHUNK_ELEMS = 1 << 62
    lora = LoraSpec(rank=8, alpha=16, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))
    policies = [f"role{i}" for i in range(args.policies)]
    path = model_dir(args.model)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    if args.layout == "shared":
        models = policy_models(path, lora, policies, dtype=args.dtype, gradient_checkpointing=args.ckpt)
    else:  # before: one float32 base per policy's trainer
        models = {p: policy_models(path, lora, [p], dtype=args.dtype, gradient_checkpointing=args.ckpt)[p]
                  for p in policies}
    cfg = TrainConfig(lr=1e-4, lora=lora, merge="tree", token_budget=args.budget)
    trainers = [Trainer(models[p], cfg, policy=p) for p in policies]
    with torch.no_grad():  # weights may be lazily mmapped from the checkpoint: make them resident
        for m in {id(getattr(v, "shared", v)): getattr(v, "shared", v) for v in models.values()}.values():
            for q in getattr(m, "model", m).parameters():
                q.sum()
    load = _rss_mb()
    items = werewolves_items(0, players=args.players, calls=args.calls, vocab=vocab)
    t0 = time.perf_counter()
    metrics = {}
    for tr in trainers:
        metrics = tr.update(items)
    wall = time.perf_counter() - t0
    n_params = sum(p.numel() for p in next(iter(models.values())).shared.model.parameters())
    print(json.dumps({"load_mb": load, "peak_mb": _rss_mb(), "wall_s": wall, "params": n_params,
                      "tokens_forward": metrics.get("train/tokens_forward"), "targets": metrics.get("train/tokens")}))


def grad_check(args: argparse.Namespace) -> dict[str, float]:
    """LoRA gradient of sum(A * logp) on a bf16 base vs the fp32 base (same adapter init)."""
    import torch

    torch.set_num_threads(args.threads)
    from swarm.merge import collate, merge_items
    from swarm.merge.synthetic import werewolves_items
    from swarm.train import LoraSpec, target_logprobs
    from swarm.train.base_model import policy_models

    lora = LoraSpec(rank=8, alpha=16, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))
    items = werewolves_items(0, players=2, calls=6, vocab=VOCAB)
    col = collate(merge_items(items, "tree", args.budget).rows)
    grads = []
    for dtype in ("float32", "bfloat16"):
        m = policy_models(model_dir(), lora, ["p"], dtype=dtype)["p"]
        with torch.no_grad():  # a non-zero lora_B so lora_A gets a gradient too
            for n, p in m.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.01)
        lp, _ = target_logprobs(m, col, 1.0)
        adv = torch.linspace(-1, 1, lp.numel())
        g = torch.autograd.grad((adv * lp).sum(), list(m.parameters()))
        grads.append(torch.cat([x.flatten() for x in g]).float())
    rel = float((grads[0] - grads[1]).norm() / grads[0].norm())
    cos = float(torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0))
    return {"rel": rel, "cos": cos}


def run(args: argparse.Namespace, **cfg: object) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", "--players", str(args.players), "--calls", str(args.calls),
           "--budget", str(args.budget), "--threads", str(args.threads), "--model", args.model]
    for k, v in cfg.items():
        if v is True:
            cmd.append(f"--{k}")
        elif v is not False:
            cmd += [f"--{k}", str(v)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--grad-check", action="store_true")
    ap.add_argument("--policies", type=int, default=1)
    ap.add_argument("--layout", default="shared", choices=["shared", "separate"])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--chunk", default="on", choices=["on", "off"])
    ap.add_argument("--ckpt", action="store_true")
    ap.add_argument("--players", type=int, default=4)
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--budget", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="qwen2-random", choices=["qwen2-random", "smollm2"])
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if args.grad_check:
        print(json.dumps(grad_check(args)))
        return
    model_dir(args.model)
    rows = [
        ("1 policy, fp32", dict(policies=1)),
        ("4 policies, shared fp32 base", dict(policies=4)),
        ("4 policies, one fp32 base each (before)", dict(policies=4, layout="separate")),
        ("1 policy, bf16", dict(policies=1, dtype="bfloat16")),
        ("4 policies, shared bf16 base", dict(policies=4, dtype="bfloat16")),
        ("1 policy, fp32, LM head unchunked (before)", dict(policies=1, chunk="off")),
        ("1 policy, fp32, gradient checkpointing", dict(policies=1, ckpt=True)),
    ]
    if args.model == "smollm2":  # the LM head's rows (bf16 only where the CPU has it natively: flows.components)
        rows = [r for r in rows if r[1].get("policies") == 1 and r[1].get("dtype") != "bfloat16"]
    res = {}
    print("| configuration | load MB | peak MB | update MB | update s |")
    print("|---|---:|---:|---:|---:|")
    for name, cfg in rows:
        r = run(args, **cfg)
        res[name] = r
        print(f"| {name} | {r['load_mb']:.0f} | {r['peak_mb']:.0f} | {r['peak_mb'] - r['load_mb']:.0f} | "
              f"{r['wall_s']:.1f} |", flush=True)
    first = next(iter(res.values()))
    print(f"\nmodel: {first['params'] / 1e6:.1f} M parameters; batch: {first['tokens_forward']:.0f} tokens forward "
          f"(tree-packed), {first['targets']:.0f} targets; token budget {args.budget}")
    if args.model == "smollm2":
        on, off = res["1 policy, fp32"], res["1 policy, fp32, LM head unchunked (before)"]
        print(f"smollm2 memory: update {off['peak_mb'] - off['load_mb']:.0f} MB unchunked -> "
              f"{on['peak_mb'] - on['load_mb']:.0f} MB chunked (peak {off['peak_mb']:.0f} -> {on['peak_mb']:.0f} MB)")
        return
    gc = json.loads(subprocess.run([sys.executable, __file__, "--grad-check", "--budget", str(args.budget),
                                    "--threads", str(args.threads)], check=True, capture_output=True,
                                   text=True).stdout.strip().splitlines()[-1])
    print(f"bf16 vs fp32 LoRA gradient: relative L2 error {gc['rel']:.4f}, cosine {gc['cos']:.5f}")
    one, four = res["1 policy, fp32"]["peak_mb"], res["4 policies, shared fp32 base"]["peak_mb"]
    one16, four16 = res["1 policy, bf16"]["peak_mb"], res["4 policies, shared bf16 base"]["peak_mb"]
    print(f"memory: 4 policies / 1 policy = {four / one:.2f}x (bf16 {four16 / one16:.2f}x), "
          f"bf16 / fp32 = {one16 / one:.2f}x")


if __name__ == "__main__":
    main()
