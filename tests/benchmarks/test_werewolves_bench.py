"""benchmarks/werewolves_bench.py at its default: the CPU-default village must learn to name the wolves.

The CPU default (README, "Learning, werewolves") is the tiny model with the reading warm-up
(generic label copying, no werewolves words) trained with vote shaping on votes that name a wolf.
It runs exactly the bench's default (the flow's 100 updates, 128 held-out eval seeds). At 100
updates no signal is significant in every run. Over five runs of this setting, votes naming a
wolf (what the shaping pays) gained +9.9, +9.2, +5.9, +11.2 and +6.8 points (95% intervals' lower
ends 2.4, 3.6, -2.7, 6.9, -1.4); votes that eliminated a wolf +19.3, +2.1, +13.8 and -1.3 in the
first four; the win rate +12.6, +2.4, +6.3, +2.3 and 0.0. So this test asserts the one direction
that held in every run, that the share of votes naming a wolf rose, and prints the intervals; issue 11's significance goal is
open (experiments/werewolves/README.md, "Learning"). When learning breaks (no gradient, wrong
advantages, a policy that is not updated or not served) the votes stay where they started (~26%
naming a wolf) and the test is a coin flip, so it catches such a break only about half the time.
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
