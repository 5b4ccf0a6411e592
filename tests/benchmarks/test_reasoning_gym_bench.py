"""benchmarks/reasoning_gym_bench.py, shortened: SmolLM2's held-out score on one-digit sums must rise.

The bench's documented run (README, "Learning, a reasoning-gym generator") trains 60 updates and
scores 128 held-out entries: 0.004 -> 0.060 (95% CI of the gain +0.037..+0.075). This test trains
UPDATES and scores ENTRIES. The held-out replies are seeded per entry, so the same weights give the
same replies: when learning breaks (no gradient, wrong advantages, a policy that is not updated or
not served) every paired difference is exactly 0 and the interval is 0..0.
"""

from __future__ import annotations

import pytest

UPDATES, ENTRIES = 20, 32
OVERRIDES = ["model=smollm2", "algo.lr=5e-4", "task.max_tokens=8", "task.options.dataset=basic_arithmetic",
             "+task.options.config.basic_arithmetic={min_terms:2,max_terms:2,max_digits:1,operators:['+','-'],"
             "allow_parentheses:false,allow_negation:false}"]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_smollm2_learns_to_answer_one_digit_sums(load_bench) -> None:
    r = load_bench("reasoning_gym_bench").run(UPDATES, None, ENTRIES, 8, OVERRIDES)
    lo, hi = r["ci"]
    print(f"held-out score {r['before']:.3f} -> {r['after']:.3f} ({ENTRIES} entries, 95% CI of the gain "
          f"{lo:+.3f}..{hi:+.3f}), training reward {r['train_first10']:.3f} (first 10) -> {r['train_last10']:.3f}, "
          f"{r['minutes']:.1f} min")
    for before, after in r["examples"]:
        print(f"  {before!r} -> {after!r}")
    assert r["updates"] == UPDATES
    assert lo > 0, f"held-out score {r['before']:.3f} -> {r['after']:.3f}, CI {lo:+.3f}..{hi:+.3f}"
