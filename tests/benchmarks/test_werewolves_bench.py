"""benchmarks/werewolves_bench.py at its default: the CPU-default village must learn to name the wolves.

The CPU default (README, "Learning, werewolves") is the tiny model with the reading warm-up
(generic label copying, no werewolves words) trained with vote shaping on votes that name a wolf.
It runs exactly the bench's default (the flow's 100 updates, 128 held-out eval seeds). At 100
updates no single signal is significant in every run: over three runs of this setting the
95% intervals' lower ends were 2.4, 3.6 and -2.7 points for votes naming a wolf, 11.9, -2.1 and
7.2 for votes that eliminated a wolf, 5.3, -4.3 and -0.9 for the win rate, while every gain was
positive (votes naming a wolf +9.9, +9.2, +5.9; eliminating +19.3, +2.1, +13.8). So this test
asserts the direction of the two vote gains, not their significance, and prints the intervals;
issue 11's significance goal is open (experiments/werewolves/README.md, "Learning"). When
learning breaks (no gradient, wrong advantages, a policy that is not updated or not served) the
votes stay where they started (~26% naming a wolf) and each gain is a coin flip.
"""

from __future__ import annotations

import pytest


@pytest.mark.slow  # ~5 min on 2 cores once the reading model is cached (its one-time build adds 95-300 s)
@pytest.mark.timeout(2400)
def test_the_village_learns_to_follow_the_accusation(tmp_path, load_bench):
    r = load_bench("werewolves_bench").run(minutes=None, updates=None, eval_games=128, workers=8, overrides=["seed=0"],
                                           out_dir=tmp_path)
    assert r["updates"] == 100, r["updates"]
    vb, va = r["vote_accuracy"]
    vlo, vhi = r["vote_ci"]
    lo, hi = r["ci"]
    print(f"votes naming a wolf {100 * vb:.1f}% -> {100 * va:.1f}% (95% CI of the gain {vlo:.1f}..{vhi:.1f}); "
          f"win rate {100 * r['before']:.1f}% -> {100 * r['after']:.1f}% (95% CI of the gain {lo:.1f}..{hi:.1f}) "
          f"after {r['updates']} updates")
    klo, khi = r["kill_ci"]
    print(f"votes eliminating a wolf: {r['vote_kill_rate']} (95% CI of the gain {klo:.1f}..{khi:.1f} points)")
    assert va > vb, f"votes naming a wolf: {r['vote_accuracy']} (95% CI of the gain {vlo:.1f}..{vhi:.1f} points)"
    kb, ka = r["vote_kill_rate"]
    assert ka > kb, f"votes eliminating a wolf: {r['vote_kill_rate']} (95% CI of the gain {klo:.1f}..{khi:.1f} points)"
