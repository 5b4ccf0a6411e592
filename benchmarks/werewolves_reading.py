"""Benchmark (a probe): can the tiny model learn to read the seer's accusation out of its prompt?

The heuristic village wins half its games mostly by voting for the player a seer claim accused.
For the model that means copying a player number from the compact observation into its JSON
answer. This probe takes village vote decisions from heuristic games (seeds 0-299 to train,
10000-10099 to test), renders them exactly as the LLM seat does (system prompt, compact
observation, chat template, the answer's forced prefix ``{"target":``), puts LoRA r16 on the
tiny model as the task builds it (``--warmup reading``, the default: word-chain then label
copying; ``--warmup word_chain``: the model without the copy skill; ``--wide``: the 4.2M
tiny_wide architecture) and trains only the one free position, the target digit, masked
to the legal targets like the JSON enum:

- ``--mode rl``: REINFORCE, batch 64, reward 1 when the vote names a wolf, mean baseline;
- ``--mode supervised``: cross-entropy on the accused player, decisions with a living accused only.

Printed every 20 steps: the test decisions' expected share of votes naming a wolf (uniform
votes: ~0.35; always the accused where there is one: far higher).

    python benchmarks/werewolves_reading.py --mode rl --steps 20
    python benchmarks/werewolves_reading.py --mode rl --steps 160 --warmup word_chain
    python benchmarks/werewolves_reading.py --mode supervised --steps 100 --warmup word_chain
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.werewolves.game import WEREWOLF  # noqa: E402
from experiments.werewolves.probe import accused, target_logprobs, vote_items  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("rl", "supervised"), default="rl")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--wide", action="store_true", help="hidden 256 / intermediate 1024 (conf/model/tiny_wide.yaml)")
    ap.add_argument("--warmup", default="reading", help="the tiny model's model.warmup: reading | word_chain | none")
    ap.add_argument("--model-seed", type=int, default=0, help="the tiny model's model.seed (another build of it)")
    ap.add_argument("--path", default=None, help="probe this checkpoint folder instead of building the tiny model")
    args = ap.parse_args()
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from swarm.policy.hf import HFSettings

    torch.manual_seed(0)
    rng = random.Random(0)
    wide = {"hidden_size": 256, "intermediate_size": 1024} if args.wide else {}
    path = args.path or HFSettings(backend="hf", warmup=args.warmup, seed=args.model_seed, tiny_spec=wide).weights()
    tok = AutoTokenizer.from_pretrained(path)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path), LoraConfig(
        r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))

    train = vote_items(tok, 300, 0)
    test = vote_items(tok, 100, 10_000)
    if args.mode == "supervised":
        train = [x for x in train if accused(x[1]) is not None]
    print(f"{len(train)} training decisions, {len(test)} test decisions", flush=True)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    pad = tok.pad_token_id or 0

    def test_shares() -> tuple[float, float, float, int]:
        """Mean probability of the test votes on a wolf, on the voter's own number (the ``you N`` line)
        and, over the decisions with a living accused player, on that player (and how many those are)."""
        wolf = own = acc = 0.0
        n_acc = 0
        with torch.no_grad():
            for j in range(0, len(test), 64):
                items = test[j:j + 64]
                for lp, (_, d, roles) in zip(target_logprobs(model, pad, items), items, strict=True):
                    p = dict(zip(d.targets, lp.exp().tolist(), strict=True))
                    wolf += sum(v for t, v in p.items() if roles[t] == WEREWOLF)
                    own += p.get(d.player, 0.0)
                    if (a := accused(d)) is not None:
                        acc, n_acc = acc + p[a], n_acc + 1
        return wolf / len(test), own / len(test), acc / max(n_acc, 1), n_acc

    def wolf_share() -> float:
        return test_shares()[0]

    t0 = time.time()
    wolf, own, acc, n_acc = test_shares()
    print(f"step 0: test votes naming a wolf {wolf:.3f}; probability on its own number {own:.2f}, "
          f"the accused player {acc:.2f} (of {n_acc} with one)", flush=True)
    for step in range(1, args.steps + 1):
        items = rng.sample(train, 64)
        lps = target_logprobs(model, pad, items)
        if args.mode == "supervised":
            loss = -sum(lp[list(d.targets).index(accused(d))] for lp, (_, d, _) in zip(lps, items, strict=True)) / 64
        else:
            picks = [int(torch.distributions.Categorical(logits=lp.detach()).sample()) for lp in lps]
            rewards = [float(roles[d.targets[a]] == WEREWOLF) for a, (_, d, roles) in zip(picks, items, strict=True)]
            base = sum(rewards) / len(rewards)
            loss = -sum((r - base) * lp[a] for lp, a, r in zip(lps, picks, rewards, strict=True)) / 64
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            print(f"step {step}: test votes naming a wolf {wolf_share():.3f} ({time.time() - t0:.0f} s)", flush=True)
    print(f"reading ({args.mode}, lr {args.lr:g}, warm-up {args.warmup}{', wide' if args.wide else ''}): test votes naming a wolf after {args.steps} steps {wolf_share():.3f}")


if __name__ == "__main__":
    main()
