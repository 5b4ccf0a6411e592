"""benchmarks/werewolves_bench.py, shortened: the CPU-default village must learn to read within minutes.

The CPU default (README, "Learning, werewolves") is the tiny model with the reading warm-up
(generic label copying, no werewolves words) trained with vote shaping on votes that name a wolf.
What it learns is to vote for the player a seer claim accused: its votes naming a wolf rise, and
with them the village's win rate. The test asserts both, paired by eval seed, with 95% intervals
that exclude zero (measured alone, 40 updates, 6.6 min with the model cached: votes naming a wolf
35.7% -> 56.5%, CI 10.3..24.3; win rate 10.9% -> 28.1%, CI 6.9..27.5). When learning breaks (no gradient, wrong advantages, a policy that is not
updated or not served, a warm-up that no longer copies) the votes stay at the untrained ~37%.
"""

from __future__ import annotations

import pytest


@pytest.mark.slow  # ~7 min on 2 cores once the reading model is cached (its one-time build adds ~4 min)
@pytest.mark.timeout(1800)
def test_the_village_learns_to_follow_the_accusation(tmp_path, load_bench):
    r = load_bench("werewolves_bench").run(minutes=8, updates=40, eval_games=64, workers=8, overrides=["seed=0"], out_dir=tmp_path)
    assert r["updates"] >= 25, r["updates"]
    vb, va = r["vote_accuracy"]
    vlo, vhi = r["vote_ci"]
    lo, hi = r["ci"]
    print(f"votes naming a wolf {100 * vb:.1f}% -> {100 * va:.1f}% (95% CI of the gain {vlo:.1f}..{vhi:.1f}); "
          f"win rate {100 * r['before']:.1f}% -> {100 * r['after']:.1f}% (95% CI of the gain {lo:.1f}..{hi:.1f}) "
          f"after {r['updates']} updates")
    assert vlo > 0, f"votes naming a wolf: {r['vote_accuracy']} (95% CI of the gain {vlo:.1f}..{vhi:.1f} points)"
    assert lo > 0, f"win rate: {r['before']} -> {r['after']} (95% CI of the gain {lo:.1f}..{hi:.1f} points)"
