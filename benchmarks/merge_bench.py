"""Benchmark (not a test): one training update with merge = none, timeline and tree.

Data: synthetic token sequences shaped like a 9-player Werewolves game (``werewolves_items``:
~20 calls per player, a shared ~300-token system prompt, a private role card, a growing
per-player history). Model: the tiny model's architecture (Llama, hidden 128, 4 layers, vocab
1024), random weights, fp32, full fine-tuning so every parameter's gradient is compared.

For each repetition the three modes run interleaved from the same initial weights (a machine
shared with other work drifts; interleaving spreads the drift evenly); the table reports the
median time of ``Trainer.update`` (merge + forward + backward + optimizer step). The speedups
use the process CPU time on one torch thread by default: on a 2-core machine shared with other
jobs, wall time with 2 threads measured mostly OpenMP threads waiting for a core (the same
update varied 3-10x between runs), while one-thread CPU time is stable to a few percent. Wall
medians are printed too; ``--clock wall`` uses them for the speedups. The
gradient check runs once per mode on the same weights and reports the largest per-tensor
relative difference (max |g_mode - g_none| / max |g_none|) against ``none``.

    .venv/bin/python benchmarks/merge_bench.py [--reps 3] [--budget 4096] [--threads 1] [--clock cpu]

The last line is ``merge: update speedup <X>x (tree vs none), token ratio <Y>x, timeline speedup
<Z>x, max grad rel err <E>``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from swarm.merge import MODES, merge_items  # noqa: E402
from swarm.merge.synthetic import werewolves_items  # noqa: E402
from swarm.train import TrainConfig, Trainer  # noqa: E402


def build_model(seed: int, hidden: int = 128):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=1024, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, initializer_range=0.08,
    )
    return LlamaForCausalLM(cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget", type=int, default=4096, help="token budget per row and per micro-batch")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    ap.add_argument("--players", type=int, default=9)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--system", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=128, help="model width (4 heads, 4 layers)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    items = werewolves_items(args.seed, players=args.players, calls=args.calls, system_len=args.system)
    model = build_model(args.seed, args.hidden)
    init = {k: v.clone() for k, v in model.state_dict().items()}

    def trainer(mode: str) -> Trainer:
        model.load_state_dict(init)
        return Trainer(model, TrainConfig(lora=None, lr=1e-4, merge=mode, token_budget=args.budget))

    stats = {m: merge_items(items, m, args.budget).stats for m in MODES}
    print(f"data: {len(items)} steps, {args.players} players x {args.calls} calls, system prompt {args.system} tokens; "
          f"hidden {args.hidden}; budget {args.budget}; threads {args.threads}; reps {args.reps}", flush=True)

    grads = {}
    for m in MODES:
        t = trainer(m)
        t.optimizer.zero_grad(set_to_none=True)
        t.accumulate_gradients(items)
        grads[m] = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    err = {m: max(((grads[m][n] - g).abs().max() / g.abs().max().clamp(min=1e-30)).item()
                  for n, g in grads["none"].items()) for m in MODES}

    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    wall: dict[str, list[float]] = {m: [] for m in MODES}
    for rep in range(args.reps):
        for m in MODES:
            t = trainer(m)
            c0, w0 = time.process_time(), time.perf_counter()
            t.update(items)
            cpu[m].append(time.process_time() - c0)
            wall[m].append(time.perf_counter() - w0)
        print(f"rep {rep + 1}: " + ", ".join(f"{m} cpu {cpu[m][-1]:.2f}s wall {wall[m][-1]:.2f}s" for m in MODES),
              flush=True)

    med_cpu = {m: statistics.median(cpu[m]) for m in MODES}
    med_wall = {m: statistics.median(wall[m]) for m in MODES}
    med = med_cpu if args.clock == "cpu" else med_wall
    print()
    print("| mode | tokens before | tokens after | token ratio | rows | update CPU s | update wall s | "
          f"speedup ({args.clock}) | grad rel err |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in MODES:
        s = stats[m]
        print(f"| {m} | {s.tokens_before} | {s.tokens_after} | {s.ratio:.2f}x | {s.rows} | {med_cpu[m]:.2f} | "
              f"{med_wall[m]:.2f} | {med['none'] / med[m]:.2f}x | {err[m]:.1e} |")
    print()
    print(f"merge: update speedup {med['none'] / med['tree']:.2f}x (tree vs none), token ratio "
          f"{stats['tree'].ratio:.2f}x, timeline speedup {med['none'] / med['timeline']:.2f}x, "
          f"max grad rel err {max(err.values()):.1e}")


if __name__ == "__main__":
    main()
