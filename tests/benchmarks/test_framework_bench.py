"""benchmarks/framework_bench.py, shortened: two agent loops x 1 update record the same version-0 tokens, and the gap is computed."""

from __future__ import annotations

import math

import pytest


def test_gap_is_the_largest_pair_mean_difference_of_moving_averages(load_bench) -> None:
    fb = load_bench("framework_bench")
    g = fb.gaps({"a": [0.1, 0.5, 0.3], "b": [0.2, 0.5, 0.1], "c": [0.1, 0.5, 0.3]})
    # moving averages: a = c = [0.1, 0.3, 0.3], b = [0.2, 0.35, 0.2667] -> mean |diff| (0.1 + 0.05 + 0.0333) / 3
    assert g["gap"] == pytest.approx(0.55 / 9) and g["worst"] in {("a", "b"), ("b", "c")}
    assert g["raw_mean"] == pytest.approx(0.1) and g["raw_max"] == pytest.approx(0.2)
    assert fb.moving_average([1.0, 2.0, 3.0], k=2) == [1.0, 1.5, 2.5]


@pytest.mark.slow  # ~45 s on 2 cores: two flows.train runs of 1 update side by side (start-up is most of it)
@pytest.mark.timeout(600)
def test_two_loops_train_from_the_same_tokens(tmp_path, load_bench) -> None:
    r = load_bench("framework_bench").run(["openai", "httpx"], 1, tmp_path, [], jobs=2)
    assert [len(c) for c in r["curves"].values()] == [1, 1], r["curves"]
    prompts, same, common = r["identical"]["httpx"]
    print(f"version-0 groups: prompt ids {prompts}/{common}, all tokens {same}/{common}; gap {r['gap']:.4f}")
    assert common >= 1 and prompts == common, r["identical"]
    # seeded rows draw the same tokens whatever shares their batch; allow a rare float tie flipped by batch shape
    assert same >= max(1, common - 1), r["identical"]
    assert math.isfinite(r["gap"]) and r["gap"] == max(p["ma5"] for p in r["pairs"].values())
