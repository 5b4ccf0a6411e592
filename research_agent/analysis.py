"""Campaign analysis without an LLM: rank configurations, plot, write a markdown report.

Input is plain :class:`MemberResult` records (read from MLflow by :func:`collect`): each member's
swept values, seed, status, config hash and reward curve; :func:`current` keeps the run that stands
for each member of the campaign's current configs. :func:`rank` groups members by configuration and
scores final and best reward (mean, and std / min-max over seeds when there are several);
:func:`write_report` draws reward curves (:func:`curves_figure`: a min-max band only for several
seeds, integer update ticks) and reward against each swept value (:func:`param_figure`: log axis for
learning rates) with matplotlib (Agg) and writes ``report.md`` + ``analysis.json``.

It does not decide what to run next (the planner in :mod:`research_agent.campaign` does).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["MemberResult", "ConfigRow", "collect", "current", "rank", "write_report", "parse_param", "curves_figure",
           "param_figure", "is_learning_rate"]


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
    final_min: float | None = None
    final_max: float | None = None


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
                                r.info.status, hist, r.data.tags.get("swarm.error", ""),
                                r.data.tags.get("swarm.member_hash", ""), int(r.info.start_time or 0)))
    return out


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
        done = [r for r in rs if r.status == "FINISHED" and r.curve]
        finals = [r.final for r in done if r.final is not None]
        fm, fs = _ms(finals)
        bm, bs = _ms([r.best for r in done if r.best is not None])
        rows.append(ConfigRow(config, rs[0].values, len(done), sum(r.status == "FAILED" for r in rs), fm, fs, bm, bs,
                              min(finals) if finals else None, max(finals) if finals else None))
    return sorted(rows, key=lambda row: (row.final_mean is None, -(row.final_mean or 0.0), -(row.best_mean or 0.0)))


def _fmt(m: float | None, s: float | None, seeds: int) -> str:
    """A value; ``mean ± std`` only when there are several seeds (one seed has no spread)."""
    if m is None:
        return "–"
    return f"{m:.3f} ± {s:.3f}" if seeds > 1 and s is not None else f"{m:.3f}"


def is_learning_rate(key: str) -> bool:
    """Whether a swept key is a learning rate (plotted on a log axis)."""
    last = key.rsplit(".", 1)[-1].lower()
    return last in ("lr", "learning_rate") or last.endswith(("_lr", "_learning_rate"))


def _numeric(xs: list[Any]) -> bool:
    return bool(xs) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in xs)


def curves_figure(results: list[MemberResult], rows: list[ConfigRow], metric: str) -> Any:
    """Metric against update, one line per configuration: several seeds give their mean with a min-max
    band, one seed gives its curve alone. Updates get integer ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4))
    by: dict[str, list[MemberResult]] = {}
    for r in results:
        if r.curve:
            by.setdefault(r.config, []).append(r)
    order = [row.config for row in rows if row.config in by] + [c for c in by if c not in {row.config for row in rows}]
    for i, config in enumerate(order):
        rs, color = by[config], f"C{i % 10}"
        if len(rs) == 1:
            steps, vals = zip(*rs[0].curve, strict=True)
            ax.plot(steps, vals, color=color, label=f"{config} (seed {rs[0].seed})", marker="o" if len(steps) < 3 else None)
            continue
        at: dict[int, list[float]] = {}
        for r in rs:
            for step, v in r.curve:
                at.setdefault(step, []).append(v)
        steps = sorted(at)
        ax.plot(steps, [statistics.fmean(at[s]) for s in steps], color=color, label=f"{config} (mean of {len(rs)} seeds)",
                marker="o" if len(steps) < 3 else None)
        ax.fill_between(steps, [min(at[s]) for s in steps], [max(at[s]) for s in steps], color=color, alpha=0.2,
                        linewidth=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("update (policy version)")
    ax.set_ylabel(metric)
    ax.set_title("reward curves" + (" (band: min-max over seeds)" if any(len(v) > 1 for v in by.values()) else ""))
    if by:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def param_figure(key: str, rows: list[ConfigRow], metric: str) -> Any:
    """Final and best metric against one swept value: a log axis for learning rates (and values spanning
    10x or more), ticks at the swept values (integers stay integers), error bars only for several seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator

    fig, ax = plt.subplots(figsize=(5, 3.5))
    pts = [(row.values.get(key), row) for row in rows if row.final_mean is not None]
    numeric = _numeric([v for v, _ in pts])
    pts.sort(key=lambda p: p[0] if numeric else str(p[0]))
    xs = [v if numeric else str(v) for v, _ in pts]
    for attr in ("final", "best"):
        line, = ax.plot(xs, [getattr(r, f"{attr}_mean") for _, r in pts], marker="o", label=attr)
        multi = [(x, r) for x, (_, r) in zip(xs, pts, strict=True) if r.seeds > 1]
        if multi:
            ax.errorbar([x for x, _ in multi], [getattr(r, f"{attr}_mean") for _, r in multi],
                        yerr=[getattr(r, f"{attr}_std") for _, r in multi], fmt="none", capsize=3,
                        ecolor=line.get_color())
    if numeric and xs and min(xs) > 0 and (is_learning_rate(key) or max(xs) / min(xs) >= 10):
        ax.set_xscale("log")
    if numeric and xs:
        values = sorted(set(xs))
        if len(values) <= 8:
            ax.xaxis.set_major_locator(FixedLocator(values))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([f"{v:g}" for v in values])
        elif all(isinstance(v, int) for v in values):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(key + (" (log)" if ax.get_xscale() == "log" else ""))
    ax.set_ylabel(metric)
    ax.legend()
    fig.tight_layout()
    return fig


def _plots(results: list[MemberResult], rows: list[ConfigRow], swept: list[str], metric: str, folder: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    figures = [("curves.png", curves_figure(results, rows, metric))]
    figures += [(f"vs_{key.replace('/', '_')}.png", param_figure(key, rows, metric)) for key in swept]
    paths = []
    for name, fig in figures:
        paths.append(folder / name)
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths


def write_report(name: str, results: list[MemberResult], swept: list[str], metric: str, folder: Path,
                 notes: str = "", older: int = 0) -> tuple[Path, list[Path], list[ConfigRow]]:
    """``report.md``, ``analysis.json`` and ``plots/*.png`` under ``folder``; returns their paths and the ranking.

    ``older``: runs of the campaign left out (earlier configurations), mentioned in the report.
    """
    rows = rank(results)
    plots = _plots(results, rows, swept, metric, folder / "plots")
    several = any(row.seeds > 1 for row in rows)
    spread = "mean ± std over seeds (min–max in the last column)" if several else "one seed per configuration"
    lines = [f"# Campaign {name}", "", notes, "",
             f"{len(results)} member runs ({sum(r.status == 'FINISHED' for r in results)} finished, "
             f"{sum(r.status == 'FAILED' for r in results)} failed). Metric: `{metric}`, {spread}."]
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
    (folder / "analysis.json").write_text(json.dumps({
        "campaign": name, "metric": metric, "swept": swept, "ranking": [asdict(r) for r in rows],
        "members": [asdict(r) | {"final": r.final, "best": r.best} for r in results]}, indent=1, default=str))
    return report, plots, rows
