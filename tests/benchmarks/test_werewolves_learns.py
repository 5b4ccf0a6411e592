"""The learning proof, short: benchmarks/werewolves_bench.py's own ``run`` on the CPU default, fewer updates.

The full benchmark (22 min of training, 128 eval games) is what the README reports; this runs the
same code for 60 updates and the same 128 held-out games (~7 min on 2 cores) and fails when the trained
village's eval win rate does not rise significantly (the paired 95% interval of the gain must be
above zero), i.e. when learning breaks anywhere between the gateway, the constrained votes, the
step rewards and the trainer.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "werewolves_bench.py"


@pytest.mark.slow
def test_the_village_learns_to_win(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("werewolves_bench", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    r = bench.run(minutes=15, updates=60, eval_games=128, workers=8, overrides=["seed=0"],
                  json_path=tmp_path / "werewolves.json")
    print(f"eval win rate {100 * r['before']:.1f}% -> {100 * r['after']:.1f}% "
          f"(CI of the gain {r['ci'][0]:.1f}..{r['ci'][1]:.1f}), {r['updates']} updates, {r['minutes']:.1f} min")
    assert r["format_error_rate"] == 0.0  # constrained decisions cannot be malformed
    assert r["updates"] >= 40
    assert r["ci"][0] > 0, r
