"""Benchmark: which vote shaping teaches a village to agree fastest (tabular policy gradient, no model).

Why it exists: a model that cannot read a player number out of its prompt (the tiny model with
only the word-chain warm-up, ``model.warmup=word_chain``; see ``experiments/werewolves/README.md``,
"Learning") can only learn a preference over player numbers, and what wins games then is that the six
villagers agree on one player (scattered votes let the three coordinated wolves decide every
day). This bench isolates that: one shared logit per player number (masked to the legal
targets, like the gateway's JSON enum), trained with the GRPO recipe of the task (2 seeds x 4
games per update, advantages normalised per seed, one step per vote) against the heuristic
wolves, under three per-vote rewards:

- ``none``: the team result only (1 win / 0 loss);
- ``hit``: + 0.5 if the vote named an opponent (the task's ``vote_shaping_pays=named``, the CPU
  default since the reading warm-up: a model that reads learns from it);
- ``kill``: + 0.5 if the vote eliminated an opponent (named the player the day put out, an
  opponent): ``vote_shaping_pays=eliminated``.

Printed: the eval win rate (held-out seeds) of each after ``--updates`` updates, per training
seed and mean, next to the all-random and always-lowest-number baselines. Pure Python, ~1-2 min
per run on one core.

    .venv/bin/python benchmarks/werewolves_shaping.py [--updates 230] [--seeds 3] [--lr 5]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.werewolves import Game, HeuristicPlayer, deal_roles  # noqa: E402
from experiments.werewolves.game import Action, Decision, side_of  # noqa: E402

EVAL_SEED_BASE = 900_000_000
VARIANTS = ("none", "hit", "kill")


def play(logits: list[float] | None, seed: int, rng: random.Random) -> tuple[Any, list[str], list[tuple[int, int, tuple[int, ...]]]]:
    """One game, the village's votes sampled from ``logits`` (None: uniform); (result, roles, votes)."""
    roles = deal_roles(seed)
    votes: list[tuple[int, int, tuple[int, ...]]] = []  # (round, target, legal targets)

    class Voter(HeuristicPlayer):
        def act(self, d: Decision) -> Action:
            if d.kind != "vote":
                return super().act(d)
            weights = [math.exp(logits[t]) if logits else 1.0 for t in d.targets]
            target = rng.choices(d.targets, weights)[0]
            votes.append((d.round, target, tuple(d.targets)))
            return Action("vote", target)

    agents = [Voter(p, seed) if side_of(r) == "village" else HeuristicPlayer(p, seed) for p, r in enumerate(roles)]
    return Game(roles, seed).play(agents), roles, votes


def vote_reward(variant: str, result: Any, roles: list[str], rnd: int, target: int) -> float:
    """The per-vote reward of ``variant`` (see the module docstring)."""
    won = float(result.winner == "village")
    hit = side_of(roles[target]) == "wolves"
    out = {e.round: e.target for e in result.events if e.kind == "vote"}.get(rnd)
    return won + {"none": 0.0, "hit": 0.5 * hit, "kill": 0.5 * (hit and out == target)}[variant]


def train(variant: str, updates: int, lr: float, seed: int) -> list[float]:
    """Policy-gradient training of the shared logits; returns them."""
    rng, logits, k = random.Random(seed), [0.0] * 9, 0
    for _ in range(updates):
        grads = [0.0] * 9
        for _ in range(2):  # two GRPO groups (seeds) per update
            game_seed, k = seed * 1_000_000 + k, k + 1
            samples = []
            for _ in range(4):  # four games per seed
                result, roles, votes = play(logits, game_seed, rng)
                samples += [(legal, t, vote_reward(variant, result, roles, r, t)) for r, t, legal in votes]
            rewards = [r for _, _, r in samples]
            mean, std = statistics.fmean(rewards), statistics.pstdev(rewards) or 1.0
            for legal, t, r in samples:
                adv = (r - mean) / std
                z = sum(math.exp(logits[x]) for x in legal)
                for x in legal:
                    grads[x] -= adv * math.exp(logits[x]) / z
                grads[t] += adv
        logits = [v + lr * g / 100 for v, g in zip(logits, grads, strict=True)]
    return logits


def win_rate(logits: list[float] | None, games: int, rng: random.Random) -> float:
    return sum(play(logits, EVAL_SEED_BASE + i, rng)[0].winner == "village" for i in range(games)) / games


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=230, help="updates per training run (the bench's 22 min gave 230)")
    ap.add_argument("--seeds", type=int, default=3, help="training runs per variant")
    ap.add_argument("--lr", type=float, default=5.0)
    ap.add_argument("--eval-games", type=int, default=500)
    args = ap.parse_args()
    rng = random.Random(0)
    lowest = [-float(p) * 10 for p in range(9)]
    print(f"baselines ({args.eval_games} eval games): random votes {100 * win_rate(None, args.eval_games, rng):.1f}%, "
          f"always the lowest-numbered living player {100 * win_rate(lowest, args.eval_games, rng):.1f}%", flush=True)
    means = {}
    for variant in VARIANTS:
        rates = [win_rate(train(variant, args.updates, args.lr, s), args.eval_games, rng) for s in range(args.seeds)]
        means[variant] = statistics.fmean(rates)
        print(f"{variant}: eval win rate {', '.join(f'{100 * r:.1f}%' for r in rates)} (mean {100 * means[variant]:.1f}%)",
              flush=True)
    print(f"shaping: eval win rate after {args.updates} tabular updates, mean of {args.seeds} runs: "
          + ", ".join(f"{v} {100 * m:.1f}%" for v, m in means.items()))


if __name__ == "__main__":
    main()
