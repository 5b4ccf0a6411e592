"""benchmarks/werewolves_bench.py at its default: the CPU-default village must learn to name the wolves.

The CPU default (README, "Learning, werewolves") is the tiny model with the reading warm-up
(generic label copying, no werewolves words) trained with vote shaping on votes that name a wolf.
It runs exactly the bench's default (the flow's 100 updates, 128 held-out eval seeds) and
asserts what held in every run of this session: the village's votes naming a wolf rise, paired
by eval seed, with a 95% interval above zero (lower ends 2.1 to 5.8 points over five runs). It
prints but does not assert the win rate and the votes that eliminated a wolf: two runs of this
very setting gave win rates 6.2% -> 18.8% (CI 5.3..19.7) and 7.8% -> 10.2% (CI -4.3..9.0), so
at 100 updates they are not a test that can hold (experiments/werewolves/README.md, "Learning").
When learning breaks (no gradient, wrong advantages, a policy that is not updated or not served,
a warm-up that no longer copies) the votes stay at the untrained ~26%.
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
    assert vlo > 0, f"votes naming a wolf: {r['vote_accuracy']} (95% CI of the gain {vlo:.1f}..{vhi:.1f} points)"
