"""benchmarks/werewolves_bench.py, shortened: after 20 updates the CPU-default village must win more and vote out wolves significantly more.

The CPU default (README, "Learning, werewolves") is the shipped tiny reading model (generic label
copying, no werewolves words) trained with vote shaping on votes that name a wolf, 4 seeds x 4 games
per update. The bench's default trains the flow's 50 updates; this test trains 20 and evaluates the
same 128 held-out seeds. With the on-device sampler on a 2-core AVX2 machine
(`python benchmarks/werewolves_bench.py --updates N --eval-games 128`, other jobs running beside it):
20 updates gave 19.5% -> 24.2% (95% CI of the gain -4.8..14.1) and votes eliminating a wolf 19.4% -> 31.5%
(CI 4.6..16.4) in 3.8 min; 15 updates gave CI 2.2..12.4 for those votes; 25 updates gave 9.6..22.4 and 14.1..27.6.
The model is the same bytes on every machine and the held-out games replay exactly, so the eval
before training is the same everywhere (19.5%: `python benchmarks/werewolves_bench.py --updates 0`);
only training varies with thread timing. When learning breaks (no gradient, wrong advantages, a
policy that is not updated or not served) the policy after is the policy before, the replayed games
are the same games, and the interval of the gain is 0..0.
"""

from __future__ import annotations

import pytest


@pytest.mark.slow  # ~4-6 min on 2 cores
@pytest.mark.timeout(1800)
def test_the_village_learns_to_win(tmp_path, load_bench):
    r = load_bench("werewolves_bench").run(minutes=None, updates=20, eval_games=128, workers=8, overrides=["seed=0"],
                                           out_dir=tmp_path)
    assert r["updates"] == 20, r["updates"]
    vb, va = r["vote_accuracy"]
    vlo, vhi = r["vote_ci"]
    lo, hi = r["ci"]
    klo, khi = r["kill_ci"]
    print(f"win rate {100 * r['before']:.1f}% -> {100 * r['after']:.1f}% (95% CI of the gain {lo:.1f}..{hi:.1f}) "
          f"after {r['updates']} updates; votes naming a wolf {100 * vb:.1f}% -> {100 * va:.1f}% "
          f"(CI {vlo:.1f}..{vhi:.1f}); "
          f"votes eliminating a wolf {100 * r['vote_kill_rate'][0]:.1f}% -> {100 * r['vote_kill_rate'][1]:.1f}% "
          f"(CI {klo:.1f}..{khi:.1f})")
    # 19.5% since the hf backend samples on the device with counter-based per-row randomness (ed469c8): a seed
    # draws other tokens than torch's generator did (16.4% with every earlier sampler, on AVX-512 and AVX2 machines)
    assert r["before"] == pytest.approx(0.195, abs=0.01), "the untrained model's eval games no longer replay"
    # When learning breaks, the policy after is the policy before and every paired gain is exactly 0. The win
    # rate's interval at 20 updates is too wide to pin (gain +4.7, CI -4.8..14.1); votes eliminating a wolf
    # (CI 4.6..16.4) are the robust signal, and the win-rate gain must be positive.
    assert klo > 0, f"votes eliminating a wolf: 95% CI of the gain {klo:.1f}..{khi:.1f} points"
    assert r["after"] > r["before"], f"win rate {r['before']:.3f} -> {r['after']:.3f} (CI {lo:.1f}..{hi:.1f})"
