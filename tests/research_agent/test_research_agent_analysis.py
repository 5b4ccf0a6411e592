"""Campaign analysis: the spread (report and plots) only with several seeds, log axes for learning rates,
integer ticks for updates and integer values, and which runs stand for the current members."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from research_agent.analysis import MemberResult, current, curves_figure, param_figure, rank, write_report


def _member(lr: float, seed: int, rewards: list[float], **kw: object) -> MemberResult:
    return MemberResult(f"run-{lr}-{seed}", f"m-{lr}-{seed}", f"algo.lr={lr}", {"algo.lr": lr, "algo.lora.rank": 8},
                        seed, "FINISHED", list(enumerate(rewards, 1)), **kw)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _close_figures() -> Iterator[None]:
    yield
    plt.close("all")


def test_one_seed_has_no_spread_and_learning_rates_get_a_log_axis(tmp_path: Path) -> None:
    results = [_member(0.001, 0, [0.1, 0.2, 0.4]), _member(0.004, 0, [0.1, 0.3, 0.5])]
    report, plots, rows = write_report("c", results, ["algo.lr", "algo.lora.rank"], "reward/mean", tmp_path)
    text = report.read_text()
    assert "±" not in text and "min–max" not in text and "one seed per configuration" in text
    assert "| 1 | `algo.lr=0.004` | 1 | 0.500 | 0.500 | 0 |" in text
    assert [p.name for p in plots] == ["curves.png", "vs_algo.lr.png", "vs_algo.lora.rank.png"]
    curves = curves_figure(results, rows, "reward/mean").axes[0]
    assert not curves.collections  # no band for a single seed
    curves.figure.canvas.draw()
    assert all(float(t).is_integer() for t in curves.get_xticks())  # updates are integers
    lr = param_figure("algo.lr", rows, "reward/mean").axes[0]
    assert lr.get_xscale() == "log" and not lr.collections  # log axis even for a 4x range; no error bars
    assert [t.get_text() for t in lr.get_xticklabels()] == ["0.001", "0.004"]


def test_several_seeds_show_mean_std_and_a_min_max_band(tmp_path: Path) -> None:
    results = [_member(0.001, s, [0.1 * s, 0.2 + 0.1 * s]) for s in (0, 1, 2)] + [_member(0.004, 0, [0.3, 0.6])]
    report, _, rows = write_report("c", results, ["algo.lr"], "reward/mean", tmp_path)
    text = report.read_text()
    assert "mean ± std over seeds" in text
    assert "| `algo.lr=0.001` | 3 | 0.300 ± 0.100 | 0.300 ± 0.100 | 0 | 0.200–0.400 |" in text
    assert "| `algo.lr=0.004` | 1 | 0.600 | 0.600 | 0 | – |" in text  # one seed in the same table: no spread
    curves = curves_figure(results, rows, "reward/mean").axes[0]
    assert len(curves.collections) == 1  # the band of the three-seed configuration only
    assert [t.get_text() for t in curves.get_legend().get_texts()] == ["algo.lr=0.004 (seed 0)",
                                                                       "algo.lr=0.001 (mean of 3 seeds)"]
    lr = param_figure("algo.lr", rows, "reward/mean").axes[0]
    assert len(lr.collections) == 2  # error bars (final, best) at the three-seed point only


def test_integer_values_keep_integer_ticks_on_a_linear_axis() -> None:
    results = [MemberResult(f"r{k}", f"m{k}", f"algo.lora.rank={k}", {"algo.lora.rank": k}, 0, "FINISHED", [(1, 0.1 * k)])
               for k in (8, 16, 32)]
    ax = param_figure("algo.lora.rank", rank(results), "reward/mean").axes[0]
    ax.figure.canvas.draw()
    assert ax.get_xscale() == "linear" and [t.get_text() for t in ax.get_xticklabels()] == ["8", "16", "32"]


def test_current_keeps_one_run_per_current_member_hash() -> None:
    old = _member(0.001, 0, [0.1], member_hash="h-old", start_time=1)
    failed = _member(0.001, 0, [], member_hash="h1", start_time=2)
    failed.status = "FAILED"
    done = _member(0.001, 0, [0.2], member_hash="h1", start_time=3)
    retried = _member(0.004, 0, [0.3], member_hash="h2", start_time=4)
    latest_fail = _member(0.004, 0, [], member_hash="h2", start_time=5)
    latest_fail.status = "FAILED"
    kept, older = current([old, failed, done, retried, latest_fail, _member(0.01, 0, [0.5])], {"h1", "h2"})
    assert [(r.member_hash, r.start_time) for r in kept] == [("h1", 3), ("h2", 4)] and older == 4
