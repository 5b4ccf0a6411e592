"""Campaign statistics and the report's comparison: t quantiles, intervals over seeds (paired by seed, Welch
otherwise, none for one seed or no spread), verdicts against the baseline, the one-line answer to a decision rule, the
early-stop rules, the held-out eval window, and the report's table, plot and analysis.json."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from research_agent.analysis import MemberResult, comparison_lines, metric_keys, study, windowed, write_report
from research_agent.campaign_stats import (
    answer,
    behind,
    compare_to_baseline,
    halving,
    seed_interval,
    stopped_behind,
    summary_answer,
    t_quantile,
)
from research_agent.errors import CampaignError
from research_agent.sweep import baseline_label, match_config, parse_campaign, rule_text


@pytest.mark.parametrize(("df", "q975"), [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042)])
def test_t_quantiles_match_the_table(df: int, q975: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(q975, abs=1e-3)
    assert t_quantile(0.025, df) == pytest.approx(-q975, abs=1e-3)
    assert t_quantile(0.975, 1e6) == pytest.approx(1.960, abs=1e-3)


def test_paired_by_seed_where_seeds_are_shared_welch_otherwise_none_for_one_seed() -> None:
    base = {0: 0.10, 1: 0.50, 2: 0.90}  # seeds differ a lot; the gain is the same on each
    other = {0: 0.20, 1: 0.62, 2: 0.98}
    iv = seed_interval(base, other)
    assert iv is not None and iv.paired and iv.n == 3
    diffs = [0.10, 0.12, 0.08]
    half = 4.3027 * math.sqrt(sum((d - 0.1) ** 2 for d in diffs) / 2) / math.sqrt(3)
    assert iv.diff == pytest.approx(0.1) and iv.lo == pytest.approx(0.1 - half, abs=1e-4) and iv.lo > 0
    unpaired = seed_interval({5: 0.10, 6: 0.50, 7: 0.90}, other)  # no shared seed: Welch, seed spread stays
    # by hand: variances 0.16 and 0.1524 over 3 seeds each, se^2 = (0.16 + 0.1524) / 3 = 0.10413;
    # Welch-Satterthwaite df = se^4 / ((0.16/3)^2/2 + (0.1524/3)^2/2) = 3.998; t(0.975, 3.998) = 2.777
    half = 2.777 * math.sqrt((0.16 + 0.1524) / 3)
    assert unpaired is not None and not unpaired.paired and unpaired.n == 3
    assert unpaired.diff == pytest.approx(0.1) and half == pytest.approx(0.896, abs=1e-3)
    assert (unpaired.lo, unpaired.hi) == (pytest.approx(0.1 - half, abs=1e-3), pytest.approx(0.1 + half, abs=1e-3))
    assert seed_interval({0: 0.1}, {0: 0.9}) is None  # one seed: no spread, no interval
    # no spread is no evidence (early checkpoints with few eval episodes give 0, 0.5, 1): no interval at all
    assert seed_interval({0: 0.1, 1: 0.2}, {0: 0.3, 1: 0.4}) is None  # identical paired gains
    assert seed_interval({0: 0.15, 1: 0.25, 2: 0.35}, {0: 0.2, 1: 0.3, 2: 0.4}) is None  # equal up to float noise
    assert seed_interval({5: 0.5, 6: 0.5}, {0: 0.25, 1: 0.25}) is None  # constant on both sides: Welch has none
    one_flat = seed_interval({5: 0.5, 6: 0.5, 7: 0.5}, {0: 0.2, 1: 0.3, 2: 0.4})  # spread on one side is enough
    assert one_flat is not None and one_flat.hi == pytest.approx(-0.2 + 4.303 * 0.1 / math.sqrt(3), abs=1e-3)  # df 2


def test_verdicts_against_the_baseline() -> None:
    values = {"b": {0: 0.1, 1: 0.2, 2: 0.3}, "up": {0: 0.3, 1: 0.41, 2: 0.5}, "down": {0: 0.0, 1: 0.1, 2: 0.21},
              "noisy": {0: 0.5, 1: 0.0, 2: 0.4}, "one": {0: 0.9}}
    rows = {r.config: r for r in compare_to_baseline(values, "b", stopped={"gone": "stopped early: halving"})}
    assert [rows[c].verdict for c in ("b", "up", "down", "noisy", "one", "gone")] == [
        "baseline", "better", "worse", "not resolved", "not resolved", "stopped early"]
    assert rows["noisy"].note == "the interval crosses 0" and "needs 2 or more" in rows["one"].note
    assert list(rows)[0] == "b"  # the baseline first
    line = summary_answer(list(rows.values()), "b", "eval/reward").line
    assert line.startswith("not resolved (no decision rule stated): vs b on eval/reward: up better (+0.203")


def test_zero_spread_is_not_resolved_and_stops_nothing() -> None:
    flat = {"b": {0: 0.5, 1: 0.5}, "c": {0: 0.25, 1: 0.25}}  # two seeds of an early checkpoint, all alike
    assert behind(flat, "b") == {}
    rows = compare_to_baseline(flat, "b")
    assert (rows[1].verdict, rows[1].interval, rows[1].mean) == ("not resolved", None, 0.25)
    assert rows[1].note == "no spread over seeds (every difference the same): an interval needs spread"
    a = answer(rows, "c", "b", 0.0, "eval/win")
    assert a.verdict == "not resolved" and a.line.endswith("an interval needs spread; add seeds")
    assert summary_answer(rows, "b", "eval/win").verdict == "not resolved"


def test_the_decision_rule_is_answered_in_one_line() -> None:
    def ans(cand: dict[int, float] | None, min_gain: float = 0.0, stopped: dict[str, str] | None = None,
            base: dict[int, float] | None = None) -> tuple[str, str]:
        values = {"b": base if base is not None else {0: 0.1, 1: 0.2, 2: 0.3}, "c": cand or {}}
        rows = compare_to_baseline({k: v for k, v in values.items() if v}, "b", stopped=stopped, configs=["c"])
        a = answer(rows, "c", "b", min_gain, "eval/win")
        assert "\n" not in a.line
        return a.verdict, a.line

    verdict, line = ans({0: 0.3, 1: 0.41, 2: 0.5}, min_gain=0.03)
    assert verdict == "adopt" and line.startswith("adopt c: c vs b on eval/win 95% interval +0.203 [")
    assert "over 3 seeds (paired); meets the rule (gain >= 0.03, interval above 0)" in line
    assert ans({0: 0.0, 1: 0.1, 2: 0.21})[0] == "do not adopt"  # worse
    verdict, line = ans({0: 0.15, 1: 0.26, 2: 0.35}, min_gain=0.5)  # a real gain, far below the required one
    assert verdict == "do not adopt" and "below the required gain 0.5" in line
    verdict, line = ans({0: 0.3, 1: 0.41, 2: 0.5}, min_gain=0.21)  # [+0.189, +0.218]: above 0, mean below 0.21
    assert verdict == "not resolved" and "the interval is above 0 but the mean gain is below 0.21; add seeds" in line
    verdict, line = ans({0: 0.5, 1: 0.0, 2: 0.4})
    assert verdict == "not resolved" and "crosses 0; add seeds" in line
    verdict, line = ans({0: 0.9})
    assert verdict == "not resolved" and "1 seed(s): an interval needs 2 or more; add seeds" in line
    assert ans(None) == ("not resolved", "not resolved: c has no finished member yet; run it")  # the no-result row
    assert ans({0: 0.3, 1: 0.4}, base={}) == (
        "not resolved", "not resolved: the baseline b has no finished member yet; run it")
    behind_b = "stopped early: behind at update 2 of 4 on eval/win: behind the baseline: -0.300 [-0.350, -0.250]"
    assert ans(None, stopped={"c": behind_b}) == ("do not adopt", f"do not adopt c: {behind_b}")
    verdict, line = ans(None, stopped={"c": "stopped early: halving at update 2 of 4: ranked 3 of 4"})
    assert verdict == "not resolved" and "a stop on rank shows no difference from b" in line  # a rank is no loss


def test_early_stop_rules() -> None:
    at = {"b": [0.2, 0.3], "x": [0.5, 0.6], "y": [0.4, 0.4], "z": [0.1, 0.1]}
    stops = halving(at, 0.5, "b")
    assert set(stops) == {"z"} and "ranked 4 of 4 (0.100)" in stops["z"]  # best 2 (x, y) go on, and the baseline
    assert set(halving(at, 0.25, "x")) == {"y", "z", "b"}
    # the decision's candidate goes on like the baseline, even when it ranks low: a rank is no interval
    ahead = {"x": [0.6], "y": [0.5], "c": [0.4], "b": [0.1]}
    assert set(halving(ahead, 0.5, "b")) == {"c"} and halving(ahead, 0.5, "b", candidate="c") == {}
    by_seed = {"b": {0: 0.3, 1: 0.4, 2: 0.5}, "lost": {0: 0.0, 1: 0.12, 2: 0.19}, "maybe": {0: 0.6, 1: 0.1, 2: 0.5},
               "one": {0: 0.0}}
    stops = behind(by_seed, "b")  # lost: differences -0.30, -0.28, -0.31, interval [-0.335, -0.259]
    assert set(stops) == {"lost"} and stopped_behind(stops["lost"])  # one seed is never "clearly" behind
    assert stops["lost"].startswith("behind the baseline: -0.297 [-0.335, -0.259]")
    assert not stopped_behind(halving(at, 0.5, "b")["z"])


def test_held_out_eval_is_the_default_metric_averaged_over_the_last_episodes() -> None:
    assert metric_keys("auto", {"reward/mean", "eval/reward", "eval/n"}) == (
        "eval/reward", "eval/reward (last 64 eval episodes)")
    assert metric_keys("auto", {"reward/mean", "eval/win", "eval/reward", "eval/n"})[0] == "eval/win"
    assert metric_keys("auto", {"reward/mean"}) == ("reward/mean", "reward/mean")
    assert metric_keys("reward/mean", {"eval/reward", "eval/n"}) == ("reward/mean", "reward/mean")
    # the latest updates holding 64 episodes, weighted by episodes (a resumed member's segments included)
    scores = windowed([(1, 0.5), (2, 0.1), (3, 0.3)], [(1, 40), (2, 30), (3, 10)])
    assert scores[0] == (1, 0.5) and scores[2][1] == pytest.approx((0.3 * 10 + 0.1 * 30 + 0.5 * 40) / 80)
    assert windowed([(1, 0.5), (2, 0.1)], [(1, 40), (2, 70)])[1] == (2, 0.1)


def _m(config: str, seed: int, score: float, **kw: object) -> MemberResult:
    return MemberResult(f"r-{config}-{seed}", f"k-{config}-{seed}", f"model.warmup={config}",
                        {"model.warmup": config}, seed, "FINISHED", [(1, score / 2), (2, score)], **kw)  # type: ignore[arg-type]


def test_report_has_the_question_rule_answer_table_plot_and_json(tmp_path: Path) -> None:
    results = [_m("wc", s, v) for s, v in enumerate([0.40, 0.44, 0.39])]
    results += [_m("rd", s, v) for s, v in enumerate([0.20, 0.25, 0.18])]
    results += [_m("none", s, 0.15, state="stopped", stopped="halving at update 1 of 2: ranked 3 of 3")
                for s in range(3)]
    st = study(results, "model.warmup=wc", "eval/reward (last 64 eval episodes)", question="is rd better?",
               rule="adopt rd if eval reward gains >= 0.05", candidate="model.warmup=rd", min_gain=0.05)
    report, plots, rows = write_report("c", results, ["model.warmup"], "eval/reward", tmp_path, st=st)
    text = report.read_text()
    assert "**Question**: is rd better?" in text and "**Decision rule** (written before the runs): adopt rd" in text
    assert f"**Answer**: {st.answer.line}" in text and st.answer.verdict == "do not adopt"
    assert "| `model.warmup=wc` | 3 | 0.410 | – | – | baseline |" in text
    assert "| `model.warmup=rd` | 3 | 0.210 | -0.200 | [-0.225, -0.175] paired | worse |" in text
    assert "| `model.warmup=none` | 0 | – | – | – | stopped early (see below) |" in text
    assert "- `model.warmup=none` seeds 0, 1, 2: halving at update 1 of 2: ranked 3 of 3" in text
    assert "3 stopped early" in text and [p.name for p in plots][0] == "comparison.png"
    assert plots[0].stat().st_size > 1000 and text.index("## Against the baseline") < text.index("| rank |")
    comp = json.loads((tmp_path / "analysis.json").read_text())["comparison"]
    assert comp["answer"]["verdict"] == "do not adopt" and comp["baseline"] == "model.warmup=wc"
    assert [r["verdict"] for r in comp["rows"]] == ["baseline", "worse", "stopped early"]
    assert next(r for r in rows if r.config == "model.warmup=none").stopped == 3  # not in the means


def test_campaign_names_its_baseline_and_candidate_among_the_swept_configurations() -> None:
    data = {"name": "c", "sweep": {"params": {"algo.lr": [0.001, 0.004], "algo.lora.rank": [8, 32]}},
            "decision": {"adopt": {"algo.lr": 0.004, "algo.lora.rank": 32}, "min_gain": 0.03}}
    spec = parse_campaign(data)
    assert baseline_label(spec) == "algo.lr=0.001,algo.lora.rank=8"  # the first configuration
    assert rule_text(spec, "eval/win") == ("adopt algo.lr=0.004,algo.lora.rank=32 if eval/win gains >= 0.03 over "
                                           "algo.lr=0.001,algo.lora.rank=8 with the 95% interval above 0")
    with pytest.raises(CampaignError, match="matches 2 configurations"):
        match_config(spec, {"algo.lr": 0.004})
    with pytest.raises(CampaignError, match=r"baseline.algo.lr=0.002: not among the swept values \[0.001, 0.004\]"):
        parse_campaign(data | {"baseline": {"algo.lr": 0.002}})
    with pytest.raises(CampaignError, match="decision.adopt.algo.lr_: not a swept key"):
        parse_campaign(data | {"decision": {"adopt": {"algo.lr_": 0.004}}})
    with pytest.raises(CampaignError, match="early_stop.at"):
        parse_campaign(data | {"early_stop": {"at": [0]}})


def test_stopped_seeds_stay_visible_and_only_a_behind_stop_counts_as_resolved() -> None:
    results = [_m("wc", s, v) for s, v in enumerate([0.40, 0.44, 0.39])]
    results += [_m("rd", s, v) for s, v in enumerate([0.20, 0.25, 0.18])]
    results.append(_m("rd", 3, 0.05, state="stopped", stopped="behind at update 1 of 2: behind the baseline: -0.3"))
    halved = [_m("none", s, 0.15, state="stopped", stopped="halving at update 1 of 2: ranked 3 of 3") for s in range(2)]
    st = study(results + halved, "model.warmup=wc", "eval/reward")
    rows = {r.config: r for r in st.rows}
    rd = rows["model.warmup=rd"]  # its verdict is on the survivors; the stopped seed is said, not dropped
    assert (rd.verdict, rd.seeds, rd.note) == ("worse", 3, "seed 3 stopped early, not counted (see below)")
    assert ("| `model.warmup=rd` | 3 | 0.210 | -0.200 | [-0.225, -0.175] paired | worse (seed 3 stopped early, "
            "not counted (see below)) |") in comparison_lines(st)
    assert "`model.warmup=rd` seed 3: behind at update 1 of 2: behind the baseline: -0.3" in st.stopped
    assert st.answer.verdict == "not resolved"  # none stopped on rank: not shown worse
    assert st.answer.line.startswith("not resolved (no decision rule stated)")
    behind_only = [_m("none", s, 0.15, state="stopped", stopped="behind at update 1 of 2: behind the baseline: -0.2")
                   for s in range(2)]
    assert study(results + behind_only, "model.warmup=wc", "eval/reward").answer.verdict == "resolved"
