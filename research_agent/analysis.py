"""Campaign analysis without an LLM: rank configurations, plot, write a markdown report.

Input is plain :class:`MemberResult` records (read from MLflow by :func:`collect`): each member's
swept values, seed, status and reward curve. :func:`rank` groups members by configuration and
scores final and best reward as mean ± std over seeds; :func:`write_report` draws reward curves
and reward against each swept value (matplotlib, Agg) and writes ``report.md`` + ``analysis.json``.

It does not decide what to run next (the planner in :mod:`research_agent.campaign` does).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["MemberResult", "ConfigRow", "collect", "rank", "write_report", "parse_param"]


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

    @property
    def final(self) -> float | None:
        return self.curve[-1][1] if self.curve else None

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


def parse_param(text: str | None) -> Any:
    """An MLflow param string back to a number / bool / string."""
    if text is None:
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def collect(tracking_uri: str, parent_run_id: str, metric: str, swept: list[str]) -> list[MemberResult]:
    """Every child run of the campaign's parent run, with its curve of ``metric`` (step = policy version)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    parent = client.get_run(parent_run_id)
    runs = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'",
                              max_results=5000)
    out = []
    for r in runs:
        p = r.data.params
        values = {k: parse_param(p.get(k)) for k in swept}
        hist = sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, metric))
        out.append(MemberResult(r.info.run_id, p.get("campaign_member.key", r.info.run_name or ""),
                                p.get("campaign_member.config", ""), values, int(parse_param(p.get("seed")) or 0),
                                r.info.status, hist, r.data.tags.get("swarm.error", "")))
    return out


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
        done = [r for r in rs if r.status == "FINISHED" and r.curve]
        fm, fs = _ms([r.final for r in done if r.final is not None])
        bm, bs = _ms([r.best for r in done if r.best is not None])
        rows.append(ConfigRow(config, rs[0].values, len(done), sum(r.status == "FAILED" for r in rs), fm, fs, bm, bs))
    return sorted(rows, key=lambda row: (row.final_mean is None, -(row.final_mean or 0.0), -(row.best_mean or 0.0)))


def _fmt(m: float | None, s: float | None) -> str:
    return "–" if m is None else f"{m:.3f} ± {s:.3f}"


def _plots(results: list[MemberResult], rows: list[ConfigRow], swept: list[str], metric: str, folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4))
    colors = {row.config: f"C{i % 10}" for i, row in enumerate(rows)}
    for r in results:
        if r.curve:
            steps, vals = zip(*r.curve, strict=True)
            ax.plot(steps, vals, color=colors.get(r.config), alpha=0.8,
                    label=f"{r.config} (seed {r.seed})", marker="o" if len(steps) < 3 else None)
    ax.set_xlabel("update (policy version)")
    ax.set_ylabel(metric)
    ax.set_title("reward curves")
    if any(r.curve for r in results):
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(folder / "curves.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    for key in swept:
        pts = [(row.values.get(key), row) for row in rows if row.final_mean is not None]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v, _ in pts)
        pts.sort(key=lambda p: p[0] if numeric else str(p[0]))
        xs = [v if numeric else str(v) for v, _ in pts]
        for attr, label in (("final", "final"), ("best", "best")):
            ax.errorbar(xs, [getattr(r, f"{attr}_mean") for _, r in pts], yerr=[getattr(r, f"{attr}_std") for _, r in pts],
                        marker="o", capsize=3, label=label)
        if numeric and pts and min(xs) > 0 and max(xs) / min(xs) >= 10:
            ax.set_xscale("log")
        ax.set_xlabel(key)
        ax.set_ylabel(metric)
        ax.legend()
        fig.tight_layout()
        paths.append(folder / f"vs_{key.replace('/', '_')}.png")
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths


def write_report(name: str, results: list[MemberResult], swept: list[str], metric: str, folder: Path,
                 notes: str = "") -> tuple[Path, list[Path], list[ConfigRow]]:
    """``report.md``, ``analysis.json`` and ``plots/*.png`` under ``folder``; returns their paths and the ranking."""
    rows = rank(results)
    plots = _plots(results, rows, swept, metric, folder / "plots")
    lines = [f"# Campaign {name}", "", notes, "",
             f"{len(results)} member runs ({sum(r.status == 'FINISHED' for r in results)} finished, "
             f"{sum(r.status == 'FAILED' for r in results)} failed). Metric: `{metric}`, "
             "mean ± std over seeds.", "",
             "| rank | configuration | seeds | final | best | failed |", "|---|---|---|---|---|---|"]
    for i, row in enumerate(rows, 1):
        lines.append(f"| {i} | `{row.config}` | {row.seeds} | {_fmt(row.final_mean, row.final_std)} | "
                     f"{_fmt(row.best_mean, row.best_std)} | {row.failed} |")
    if rows and rows[0].final_mean is not None:
        lines += ["", f"**Best configuration**: `{rows[0].config}` (final {rows[0].final_mean:.3f})."]
    failed = [r for r in results if r.status == "FAILED"]
    if failed:
        lines += ["", "## Failed members", ""] + [f"- `{r.config}` seed {r.seed}: {r.error[:300]}" for r in failed]
    lines += ["", "## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots]
    report = folder / "report.md"
    report.write_text("\n".join(lines) + "\n")
    (folder / "analysis.json").write_text(json.dumps({
        "campaign": name, "metric": metric, "swept": swept, "ranking": [asdict(r) for r in rows],
        "members": [asdict(r) | {"final": r.final, "best": r.best} for r in results]}, indent=1, default=str))
    return report, plots, rows
