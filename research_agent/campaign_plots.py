"""Campaign plots (matplotlib, Agg): differences from the baseline with their intervals, reward curves, reward
against each swept value. Plain functions of :mod:`research_agent.analysis`' records returning figures;
:func:`save_plots` writes them. It computes no statistics (:mod:`research_agent.campaign_stats` does).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from research_agent.analysis import ConfigRow, MemberResult, Study

__all__ = ["curves_figure", "param_figure", "comparison_figure", "save_plots", "is_learning_rate"]


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


def comparison_figure(st: Study) -> Any:
    """Each configuration's difference from the baseline with its interval over seeds (a dot without one:
    fewer than two seeds), a line at 0 and one at the decision's required gain."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in st.rows if r.config != st.baseline]
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.5 * max(len(rows), 1)))
    for i, r in enumerate(rows):
        color = {"better": "C2", "worse": "C3"}.get(r.verdict, "C7")
        if r.interval is not None:
            iv = r.interval
            ax.errorbar([iv.diff], [i], xerr=[[iv.diff - iv.lo], [iv.hi - iv.diff]], fmt="o", color=color, capsize=4)
        elif r.mean is not None and st.rows[0].mean is not None:
            ax.plot([r.mean - st.rows[0].mean], [i], "o", mfc="none", color=color)
    ax.axvline(0.0, color="k", linewidth=0.8)
    if st.min_gain:
        ax.axvline(st.min_gain, color="C1", linestyle="--", linewidth=0.8, label=f"required gain {st.min_gain:g}")
        ax.legend(fontsize=7)
    ax.set_yticks(range(len(rows)), [f"{r.config} ({r.verdict}, n={r.seeds})" for r in rows], fontsize=7)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlabel(f"difference from the baseline {st.baseline}")
    ax.set_title(f"{st.metric}: {st.level:.0%} interval over seeds (open dot: one seed, no interval)", fontsize=8)
    fig.tight_layout()
    return fig


def save_plots(results: list[MemberResult], rows: list[ConfigRow], swept: list[str], metric: str, folder: Path,
              st: Study | None = None) -> list[Path]:
    """``comparison.png`` (with ``st``), ``curves.png`` and ``vs_<key>.png`` per swept key under ``folder``."""
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    figures = [("curves.png", curves_figure(results, rows, metric))]
    figures += [(f"vs_{key.replace('/', '_')}.png", param_figure(key, rows, metric)) for key in swept]
    if st is not None:
        figures.insert(0, ("comparison.png", comparison_figure(st)))
    paths = []
    for name, fig in figures:
        paths.append(folder / name)
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths
