"""benchmarks/werewolves_bench.py, shortened: the CPU-default village must learn within a few minutes.

What the tiny model learns first (README, "Learning, werewolves") is to agree: the six villagers'
votes concentrate, so the day's vote puts out the player they chose, a wolf 3 times in 8. The
test asserts that, paired by eval seed, with a 95% interval that excludes zero (it measures ~15
votes per game, so 64 games give a wide margin; measured: 6.5% -> 28.5% of the votes, interval
13.6..26.5 points). The win rate follows later (the full bench: 9.4% -> 23.4% after 27 min); after
3 minutes it has not risen reliably (measured 7.8% -> 12.5% on 64 games), so it is not asserted
here. When learning breaks (no gradient, wrong advantages, a policy that is not updated or not
served) the votes stay scattered and the interval straddles zero.
"""

from __future__ import annotations

import pytest


@pytest.mark.slow  # ~5 min on 2 cores: 64 eval games before and after, 40 updates
def test_the_village_learns_to_agree_on_a_wolf(tmp_path, load_bench):
    r = load_bench("werewolves_bench").run(minutes=6, updates=40, eval_games=64, workers=8, overrides=["seed=0"], out_dir=tmp_path)
    assert r["updates"] >= 20, r["updates"]
    lo, hi = r["kill_ci"]
    kb, ka = r["vote_kill_rate"]
    print(f"votes that eliminated a wolf {100 * kb:.1f}% -> {100 * ka:.1f}% (95% CI of the gain {lo:.1f}..{hi:.1f}); "
          f"win rate {100 * r['before']:.1f}% -> {100 * r['after']:.1f}% after {r['updates']} updates")
    assert lo > 0, f"votes that eliminated a wolf: {r['vote_kill_rate']} (95% CI of the gain {lo:.1f}..{hi:.1f} points)"
