"""Campaign analysis without an LLM: compare with the baseline over seeds, rank, plot, write a markdown report.

Input is plain :class:`MemberResult` records (read from MLflow by :func:`measure`): each member's
swept values, seed, status, config hash, its curve of the campaign's metric and its score (the value
compared); :func:`current` keeps the run that stands for each member of the campaign's current configs.
:func:`metric_keys` resolves ``metric: auto`` to the held-out eval metric where members ran eval groups.
:func:`study` compares each configuration with the baseline (:mod:`research_agent.campaign_stats`:
t-intervals over seeds, paired by seed) and answers the campaign's decision rule; :func:`rank` groups
members by configuration and scores final and best reward (mean, and std / min-max over seeds when there
are several); :func:`write_report` draws the differences with their intervals (:func:`comparison_figure`),
reward curves (:func:`curves_figure`: a min-max band only for several seeds, integer update ticks) and
reward against each swept value (:func:`param_figure`: log axis for learning rates) with matplotlib
(Agg) and writes ``report.md`` + ``analysis.json``.

It does not decide what to run next (the planner in :mod:`research_agent.campaign` does).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from research_agent.campaign_plots import comparison_figure, curves_figure, is_learning_rate, param_figure, save_plots
from research_agent.campaign_stats import Answer, ConfigComparison, answer, compare_to_baseline, summary_answer

__all__ = ["MemberResult", "ConfigRow", "Measured", "Study", "collect", "measure", "metric_keys", "current", "rank",
           "study", "write_report", "parse_param", "curves_figure", "param_figure", "comparison_figure",
           "is_learning_rate", "score_meaning", "windowed", "EVAL_WINDOW", "comparison_lines"]


@dataclass
class MemberResult:
    run_id: str
    key: str
    config: str                     # label of the configuration (swept values, no seed)
    values: dict[str, Any]
    seed: int
    status: str                     # FINISHED | FAILED | KILLED | RUNNING
    curve: list[tuple[int, float]] = field(default_factory=list)   # (step, metric)
    error: str = ""
    member_hash: str = ""           # tag swarm.member_hash: the member's effective-config hash
    start_time: int = 0             # ms since the epoch
    scores: list[tuple[int, float]] = field(default_factory=list)  # (step, value compared), see :func:`metric_keys`
    state: str = ""                 # tag swarm.member_state: complete | stopped | partial ("" = before early stops)
    stopped: str = ""               # tag swarm.stopped: why and where it stopped early

    @property
    def complete(self) -> bool:
        """Ran to its end (not stopped early, not paused at a checkpoint)."""
        return self.status == "FINISHED" and self.state in ("", "complete")

    @property
    def final(self) -> float | None:
        return self.curve[-1][1] if self.curve else None

    @property
    def score(self) -> float | None:
        """The value compared across seeds: the last score, else the curve's last value."""
        return self.scores[-1][1] if self.scores else self.final

    def score_at(self, step: int) -> float | None:
        """The value compared as it stood at update ``step`` (an early-stop checkpoint)."""
        for series in (self.scores, self.curve):
            before = [v for s, v in series if s <= step]
            if before:
                return before[-1]
        return None

    @property
    def best(self) -> float | None:
        return max(v for _, v in self.curve) if self.curve else None


@dataclass
class ConfigRow:
    config: str
    values: dict[str, Any]
    seeds: int
    failed: int
    final_mean: float | None
    final_std: float | None
    best_mean: float | None
    best_std: float | None
    final_min: float | None = None
    final_max: float | None = None
    stopped: int = 0                # members stopped early (not in the means)


@dataclass
class Measured:
    """The members' results, the per-update metric plotted and the per-member value compared."""

    results: list[MemberResult]
    metric: str
    score: str


@dataclass
class Study:
    """Every configuration against the baseline, and the answer to the campaign's question."""

    baseline: str
    metric: str                     # the value compared (see :func:`metric_keys`)
    level: float
    rows: list[ConfigComparison]
    answer: Answer
    question: str = ""
    rule: str = ""
    min_gain: float | None = None
    stopped: list[str] = field(default_factory=list)   # one line per member stopped early


def parse_param(text: str | None) -> Any:
    """An MLflow param string back to a number / bool / string."""
    if text is None:
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


EVAL_WINDOW = 64  # held-out eval episodes a member's value averages (as the run's summary/eval_*_last games)


def metric_keys(metric: str, available: set[str]) -> tuple[str, str]:
    """(curve, score): the per-update metric plotted and the name of the per-member value compared.

    ``auto`` is the held-out eval metric where the members ran eval groups (``eval/win``, else
    ``eval/reward``), else the training reward ``reward/mean``. An ``eval/<key>`` metric is compared on its
    mean over the run's last :data:`EVAL_WINDOW` eval episodes (one update's eval groups are a handful of
    episodes: far too noisy alone), weighted by ``eval/n`` per update, across every segment of a member
    that paused or resumed; any other metric on its last value.
    """
    if metric == "auto":
        metric = next((f"eval/{k}" for k in ("win", "reward") if f"eval/{k}" in available), "reward/mean")
    windowed = metric.startswith("eval/") and "eval/n" in available
    return metric, (f"{metric} (last {EVAL_WINDOW} eval episodes)" if windowed else metric)


def score_meaning(score: str) -> str:
    """What a compared value is, for the report."""
    if score.endswith(" eval episodes)"):
        return f"held-out eval groups, never trained: each run's mean over its last {EVAL_WINDOW} eval episodes"
    return "each run's last logged value"


def windowed(curve: list[tuple[int, float]], counts: list[tuple[int, float]],
             window: int = EVAL_WINDOW) -> list[tuple[int, float]]:
    """At each step, the mean of ``curve`` over the latest steps holding ``window`` episodes (``counts``)."""
    n_at = dict(counts)
    out = []
    for i, (step, _) in enumerate(curve):
        total = weight = 0.0
        for s, v in reversed(curve[: i + 1]):
            n = n_at.get(s, 1.0)
            total, weight = total + v * n, weight + n
            if weight >= window:
                break
        out.append((step, total / weight if weight else 0.0))
    return out


def _history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    """A metric's history, one value per step (the latest logged: a resumed member may log a step again)."""
    by_step: dict[int, float] = {}
    for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp)):
        by_step[m.step] = m.value
    return sorted(by_step.items())


def measure(tracking_uri: str, parent_run_id: str, metric: str, swept: list[str]) -> Measured:
    """Every child run of the campaign's parent run, with its curve and scores (step = policy version)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    parent = client.get_run(parent_run_id)
    runs = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'",
                              max_results=5000)
    curve_key, score_key = metric_keys(metric, {k for r in runs for k in r.data.metrics})
    out = []
    for r in runs:
        p, tags = r.data.params, r.data.tags
        values = {k: parse_param(p.get(k)) for k in swept}
        curve = _history(client, r.info.run_id, curve_key)
        scores = curve if score_key == curve_key else windowed(curve, _history(client, r.info.run_id, "eval/n"))
        out.append(MemberResult(r.info.run_id, p.get("campaign_member.key", r.info.run_name or ""),
                                p.get("campaign_member.config", ""), values, int(parse_param(p.get("seed")) or 0),
                                r.info.status, curve, tags.get("swarm.error", ""), tags.get("swarm.member_hash", ""),
                                int(r.info.start_time or 0), scores, tags.get("swarm.member_state", ""),
                                tags.get("swarm.stopped", "")))
    return Measured(out, curve_key, score_key)


def collect(tracking_uri: str, parent_run_id: str, metric: str, swept: list[str]) -> list[MemberResult]:
    """Every child run of the campaign's parent run (:func:`measure`'s results)."""
    return measure(tracking_uri, parent_run_id, metric, swept).results


def current(results: list[MemberResult], hashes: set[str]) -> tuple[list[MemberResult], int]:
    """The run standing for each current member config hash (a FINISHED one first, then the latest),
    and how many other runs were left out (earlier configurations, retried members)."""
    best: dict[str, MemberResult] = {}
    for r in results:
        if r.member_hash not in hashes:
            continue
        cur = best.get(r.member_hash)
        if cur is None or (r.status == "FINISHED", r.start_time) > (cur.status == "FINISHED", cur.start_time):
            best[r.member_hash] = r
    kept = sorted(best.values(), key=lambda r: (r.config, r.seed))
    return kept, len(results) - len(kept)


def _ms(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def rank(results: list[MemberResult]) -> list[ConfigRow]:
    """One row per configuration, best final reward first (configurations with no result last)."""
    by: dict[str, list[MemberResult]] = {}
    for r in results:
        by.setdefault(r.config, []).append(r)
    rows = []
    for config, rs in by.items():
        done = [r for r in rs if r.complete and r.curve]
        finals = [r.final for r in done if r.final is not None]
        fm, fs = _ms(finals)
        bm, bs = _ms([r.best for r in done if r.best is not None])
        rows.append(ConfigRow(config, rs[0].values, len(done), sum(r.status == "FAILED" for r in rs), fm, fs, bm, bs,
                              min(finals) if finals else None, max(finals) if finals else None,
                              sum(r.state == "stopped" for r in rs)))
    return sorted(rows, key=lambda row: (row.final_mean is None, -(row.final_mean or 0.0), -(row.best_mean or 0.0)))


def study(results: list[MemberResult], baseline: str, metric: str, level: float = 0.95, question: str = "",
          rule: str = "", candidate: str | None = None, min_gain: float = 0.0) -> Study:
    """Each configuration's finished members against ``baseline`` on their scores (seed -> value), and the
    answer to "adopt ``candidate`` if the gain is >= ``min_gain`` with the interval above 0" (or, with no
    candidate, each configuration's verdict)."""
    values: dict[str, dict[int, float]] = {}
    stopped: dict[tuple[str, str], list[int]] = {}
    for r in sorted(results, key=lambda r: (r.config, r.seed)):
        if r.complete and r.score is not None:
            values.setdefault(r.config, {})[r.seed] = r.score
        elif r.state == "stopped":
            stopped.setdefault((r.config, r.stopped), []).append(r.seed)
    lines = [f"`{c}` seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}: {why}"
             for (c, why), seeds in stopped.items()]
    why_stopped: dict[str, str] = {}
    for (c, why), seeds in stopped.items():  # a configuration with finished members says which seeds it lacks
        text = (f"stopped early: {why}" if c not in values else f"seed{'s' if len(seeds) > 1 else ''} "
                f"{', '.join(map(str, seeds))} stopped early, not counted (see below)")
        why_stopped[c] = f"{why_stopped[c]}; {text}" if c in why_stopped else text
    rows = compare_to_baseline(values, baseline, level, why_stopped, [r.config for r in results])
    ans = (answer(rows, candidate, baseline, min_gain, metric) if candidate
           else summary_answer(rows, baseline, metric))
    return Study(baseline, metric, level, rows, ans, question, rule, min_gain if candidate else None, lines)


def _fmt(m: float | None, s: float | None, seeds: int) -> str:
    """A value; ``mean ± std`` only when there are several seeds (one seed has no spread)."""
    if m is None:
        return "–"
    return f"{m:.3f} ± {s:.3f}" if seeds > 1 and s is not None else f"{m:.3f}"


def comparison_lines(st: Study) -> list[str]:
    """The report's question, rule, one-line answer and the table of differences from the baseline (markdown)."""
    lines = ([f"**Question**: {st.question}"] if st.question else [])
    lines += ([f"**Decision rule** (written before the runs): {st.rule}"] if st.rule else [])
    lines += [f"**Answer**: {st.answer.line}", "", f"## Against the baseline `{st.baseline}`", "",
              f"`{st.metric}` per member ({score_meaning(st.metric)}); the difference from the baseline with its "
              f"{st.level:.0%} t-interval over seeds, paired by seed where members share seeds; \"not resolved\" "
              "where the interval crosses 0 or a side has one seed.", "",
              f"| configuration | seeds | mean | Δ vs baseline | {st.level:.0%} interval | verdict |",
              "|---|---|---|---|---|---|"]
    for r in st.rows:
        iv = r.interval
        mean = "–" if r.mean is None else f"{r.mean:.3f}"
        diff = f"{iv.diff:+.3f}" if iv else "–"
        band = f"[{iv.lo:+.3f}, {iv.hi:+.3f}]" + (" paired" if iv.paired else " unpaired") if iv else "–"
        note = "see below" if r.verdict == "stopped early" else r.note
        verdict = r.verdict + (f" ({note})" if note else "")
        lines.append(f"| `{r.config}` | {r.seeds} | {mean} | {diff} | {band} | {verdict} |")
    if st.stopped:
        lines += ["", "## Stopped early", ""] + [f"- {line}" for line in st.stopped]
    return lines + [""]


def write_report(name: str, results: list[MemberResult], swept: list[str], metric: str, folder: Path,
                 notes: str = "", older: int = 0, st: Study | None = None) -> tuple[Path, list[Path], list[ConfigRow]]:
    """``report.md``, ``analysis.json`` and ``plots/*.png`` under ``folder``; returns their paths and the ranking.

    ``older``: runs of the campaign left out (earlier configurations), mentioned in the report; ``st``: the
    comparison with the baseline and the answer (:func:`study`), first in the report.
    """
    rows = rank(results)
    plots = save_plots(results, rows, swept, metric, folder / "plots", st)
    several = any(row.seeds > 1 for row in rows)
    spread = "mean ± std over seeds (min–max in the last column)" if several else "one seed per configuration"
    lines = [f"# Campaign {name}", "", notes, ""] + (comparison_lines(st) + ["## All configurations", ""] if st else [])
    lines += [f"{len(results)} member runs ({sum(r.status == 'FINISHED' for r in results)} finished, "
              f"{sum(r.status == 'FAILED' for r in results)} failed"
              + (f", {sum(r.state == 'stopped' for r in results)} stopped early" if st and st.stopped else "")
              + f"). Metric: `{metric}`, {spread}."]
    if older:
        lines.append(f"{older} older member run(s) (earlier configurations or retried members) are in MLflow "
                     "under the campaign's parent run but not in this report.")
    lines += ["", "| rank | configuration | seeds | final | best | failed |" + (" final min–max |" if several else ""),
              "|---|---|---|---|---|---|" + ("---|" if several else "")]
    for i, row in enumerate(rows, 1):
        band = (f" {row.final_min:.3f}–{row.final_max:.3f} |" if row.seeds > 1 and row.final_min is not None
                else " – |") if several else ""
        lines.append(f"| {i} | `{row.config}` | {row.seeds} | {_fmt(row.final_mean, row.final_std, row.seeds)} | "
                     f"{_fmt(row.best_mean, row.best_std, row.seeds)} | {row.failed} |{band}")
    if rows and rows[0].final_mean is not None:
        lines += ["", f"**Best configuration**: `{rows[0].config}` (final {rows[0].final_mean:.3f})."]
    failed = [r for r in results if r.status == "FAILED"]
    if failed:
        lines += ["", "## Failed members", ""] + [f"- `{r.config}` seed {r.seed}: {r.error[:300]}" for r in failed]
    lines += ["", "## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots]
    report = folder / "report.md"
    report.write_text("\n".join(lines) + "\n")
    comparison = None if st is None else {
        "question": st.question, "rule": st.rule, "baseline": st.baseline, "metric": st.metric, "level": st.level,
        "min_gain": st.min_gain, "answer": asdict(st.answer), "rows": [r.as_dict() for r in st.rows],
        "stopped": st.stopped}
    (folder / "analysis.json").write_text(json.dumps({
        "campaign": name, "metric": metric, "swept": swept, "comparison": comparison,
        "ranking": [asdict(r) for r in rows],
        "members": [asdict(r) | {"final": r.final, "best": r.best, "score": r.score} for r in results]},
        indent=1, default=str))
    return report, plots, rows
