"""benchmarks/werewolves_bench.py at its default: the CPU-default village must win significantly more.

The CPU default (README, "Learning, werewolves") is the tiny model with the reading warm-up
(generic label copying, no werewolves words) trained with vote shaping on votes that name a wolf.
This test trains exactly as the bench's default (the flow's 100 updates) and asserts issue 11's
significance: the 95% interval of the eval win-rate gain lies above zero. It evaluates 256
held-out seeds instead of the bench's 128 (+~70 s): on a machine whose reading-model build learns
late, a real gain of ~9 points had an interval 1.1..16.1 at 128 games (experiments/werewolves/
README.md, "Learning"), and twice the games narrow it by ~30%. When learning breaks (no gradient,
wrong advantages, a policy that is not updated or not served) the policy after is the policy
before, and the interval straddles zero however many games are played.
"""

from __future__ import annotations

import pytest


@pytest.mark.slow  # 6-11 min on 2 cores once the reading model is cached (its one-time build adds 94-300 s)
@pytest.mark.timeout(2400)
def test_the_village_learns_to_win(tmp_path, load_bench):
    r = load_bench("werewolves_bench").run(minutes=None, updates=None, eval_games=256, workers=8, overrides=["seed=0"],
                                           out_dir=tmp_path)
    assert r["updates"] == 100, r["updates"]
    vb, va = r["vote_accuracy"]
    vlo, vhi = r["vote_ci"]
    lo, hi = r["ci"]
    klo, khi = r["kill_ci"]
    print(f"win rate {100 * r['before']:.1f}% -> {100 * r['after']:.1f}% (95% CI of the gain {lo:.1f}..{hi:.1f}) "
          f"after {r['updates']} updates; votes naming a wolf {100 * vb:.1f}% -> {100 * va:.1f}% "
          f"(CI {vlo:.1f}..{vhi:.1f}); "
          f"votes eliminating a wolf {100 * r['vote_kill_rate'][0]:.1f}% -> {100 * r['vote_kill_rate'][1]:.1f}% "
          f"(CI {klo:.1f}..{khi:.1f})")
    assert lo > 0, f"win rate {r['before']:.3f} -> {r['after']:.3f}: 95% CI of the gain {lo:.1f}..{hi:.1f} points"
