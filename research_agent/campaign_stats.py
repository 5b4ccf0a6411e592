"""Is a configuration's difference from the baseline real? Intervals over seeds, decisions, early stops.

Plain functions over numbers keyed by configuration label and seed (one value per member):

- :func:`seed_interval`: the difference ``other - baseline`` with a Student-t interval over seeds, paired
  by seed where at least two seeds are shared (the seed fixes the task instances a member sees, so
  pairing removes their difficulty from the noise), Welch's otherwise; none with one seed, and none with
  zero spread (identical paired differences, or constant values on both sides: early checkpoints with a
  few eval episodes give values like 0, 0.5, 1, and a zero-width interval would "prove" a difference).
- :func:`compare_to_baseline`: one :class:`ConfigComparison` per configuration: its mean, its interval
  against the baseline and a verdict, ``better`` / ``worse`` when the interval excludes 0, else
  ``not resolved``.
- :func:`answer`: the one-line answer to a decision rule stated before the runs ("adopt X if the metric
  gains >= g with the interval above 0"); :func:`summary_answer` when no rule was stated.
- :func:`halving` / :func:`behind`: which configurations stop at an early-stop checkpoint. Only a ``behind``
  stop (:func:`stopped_behind`) shows a configuration worse; a halving stop is on rank, so not resolved.

It reads no MLflow and draws nothing (:mod:`research_agent.analysis` does); no scipy: the t quantile
is computed here (:func:`t_quantile`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["t_quantile", "Interval", "seed_interval", "ConfigComparison", "compare_to_baseline", "Answer", "answer",
           "summary_answer", "halving", "behind", "stopped_behind", "signed", "BEHIND"]

BEHIND = "behind the baseline"   # what a ``behind`` stop says (:func:`behind`); :func:`stopped_behind` looks for it
_FLAT = 1e-12                    # a spread this small (relative) is float noise on identical values: no spread


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``t_quantile(0.975, 2)`` = 4.303)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if _t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class Interval:
    """``diff`` = other - baseline with its ``level`` interval [lo, hi] over ``n`` seeds (pairs when ``paired``)."""

    diff: float
    lo: float
    hi: float
    n: int
    paired: bool
    level: float = 0.95

    @property
    def resolved(self) -> bool:
        """Whether the interval excludes 0 (the sign of the difference is settled)."""
        return self.lo > 0 or self.hi < 0

    def text(self) -> str:
        """``+0.120 [+0.030, +0.210]``."""
        return f"{signed(self.diff)} [{signed(self.lo)}, {signed(self.hi)}]"


def signed(x: float) -> str:
    """A difference with its sign, three decimals."""
    return f"{x:+.3f}"


def seed_interval(baseline: Mapping[int, float], other: Mapping[int, float], level: float = 0.95) -> Interval | None:
    """``other - baseline`` with its t-interval over seeds: paired on the shared seeds when there are at least two,
    else Welch's over all values; None when a side has fewer than two values (one seed has no spread) or the
    values have no spread (identical paired differences, or constant values on both sides): a zero-width
    interval would settle a difference that the seeds cannot show."""
    shared = sorted(set(baseline) & set(other))
    q = 0.5 + level / 2.0
    if len(shared) >= 2:
        diffs = [other[s] - baseline[s] for s in shared]
        mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
        if sd <= _FLAT * max(1.0, abs(mean)):
            return None
        half = t_quantile(q, len(diffs) - 1) * sd / math.sqrt(len(diffs))
        return Interval(mean, mean - half, mean + half, len(diffs), True, level)
    a, b = list(baseline.values()), list(other.values())
    if len(a) < 2 or len(b) < 2:
        return None
    mean = statistics.fmean(b) - statistics.fmean(a)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se <= _FLAT * max(1.0, abs(mean)):
        return None
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))  # Welch-Satterthwaite
    half = t_quantile(q, df) * se
    return Interval(mean, mean - half, mean + half, min(len(a), len(b)), False, level)


@dataclass
class ConfigComparison:
    """One configuration against the baseline: its seeds, mean, interval and verdict."""

    config: str
    seeds: int
    mean: float | None
    interval: Interval | None
    verdict: str            # baseline | better | worse | not resolved | stopped early | no result
    note: str = ""          # why not resolved / why stopped

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able row (analysis.json, the MLflow table)."""
        return {"config": self.config, "seeds": self.seeds, "mean": self.mean, "verdict": self.verdict,
                "note": self.note, **({f"interval_{k}": v for k, v in asdict(self.interval).items()}
                                      if self.interval else {})}


def compare_to_baseline(values: Mapping[str, Mapping[int, float]], baseline: str, level: float = 0.95,
                        stopped: Mapping[str, str] | None = None,
                        configs: Iterable[str] = ()) -> list[ConfigComparison]:
    """Every configuration of ``values`` (config -> seed -> value of finished members) against ``baseline``,
    the baseline first; ``stopped``: configurations with members stopped early (config -> why): the verdict of
    one with no finished member, a note on one with some (its verdict is on the survivors only);
    ``configs``: more to list (members that ran but have no value yet show as "no result")."""
    stopped = dict(stopped or {})
    base = values.get(baseline, {})
    rows = [ConfigComparison(baseline, len(base), statistics.fmean(base.values()) if base else None, None,
                             "baseline" if base else "no result", "" if base else "no finished member yet")]
    for config in [*values, *stopped, *configs]:
        if config == baseline or any(r.config == config for r in rows):
            continue
        vals = values.get(config, {})
        if not vals:
            reason = stopped.get(config)
            rows.append(ConfigComparison(config, 0, None, None, "stopped early" if reason else "no result",
                                         reason or "no finished member yet"))
            continue
        also = f"; {stopped[config]}" if config in stopped else ""
        iv = seed_interval(base, vals, level) if base else None
        if iv is None:
            rows.append(ConfigComparison(config, len(vals), statistics.fmean(vals.values()), None, "not resolved",
                                         _no_interval(base, vals) + also))
            continue
        verdict = "better" if iv.lo > 0 else "worse" if iv.hi < 0 else "not resolved"
        rows.append(ConfigComparison(config, len(vals), statistics.fmean(vals.values()), iv, verdict,
                                     (("" if iv.resolved else "the interval crosses 0") + also).lstrip("; ")))
    return rows


def _no_interval(base: Mapping[int, float], vals: Mapping[int, float]) -> str:
    """Why :func:`seed_interval` gave none: no baseline, one seed, or no spread."""
    if not base:
        return "the baseline has no finished member yet"
    if len(set(base) & set(vals)) < 2 and min(len(base), len(vals)) < 2:
        return f"{min(len(base), len(vals))} seed(s): an interval needs 2 or more"
    return "no spread over seeds (every difference the same): an interval needs spread"


def stopped_behind(note: str) -> bool:
    """Whether a stop (its reason, or a row's note) was :func:`behind`'s: the interval lay below 0. A halving
    stop is on rank alone and shows nothing about the difference."""
    return f"{BEHIND}:" in note


@dataclass(frozen=True)
class Answer:
    """The answer to the campaign's decision rule: ``adopt`` / ``do not adopt`` / ``not resolved``, and one line."""

    verdict: str
    line: str


def answer(rows: list[ConfigComparison], candidate: str, baseline: str, min_gain: float, metric: str) -> Answer:
    """Apply "adopt ``candidate`` if ``metric`` gains >= ``min_gain`` over ``baseline`` with the interval above 0"."""
    row = next((r for r in rows if r.config == candidate), None)
    base = next((r for r in rows if r.config == baseline), None)
    vs = f"{candidate} vs {baseline} on {metric}"
    if row is None or row.verdict == "no result":
        return Answer("not resolved", f"not resolved: {candidate} has no finished member yet; run it")
    if row.verdict == "stopped early":
        if stopped_behind(row.note):  # its interval lay below 0 at the checkpoint
            return Answer("do not adopt", f"do not adopt {candidate}: {row.note}")
        return Answer("not resolved", f"not resolved: {candidate} {row.note}; a stop on rank shows no difference "
                                      f"from {baseline}; run it without halving")
    if base is None or base.verdict == "no result":
        return Answer("not resolved", f"not resolved: the baseline {baseline} has no finished member yet; run it")
    iv = row.interval
    if iv is None:
        return Answer("not resolved", f"not resolved: {vs}: mean {row.mean:.3f}, {row.note}; add seeds")
    pct = f"{iv.level:.0%} interval {iv.text()} over {iv.n} seeds{' (paired)' if iv.paired else ''}"
    if iv.lo > 0 and iv.diff >= min_gain:
        return Answer("adopt", f"adopt {candidate}: {vs} {pct}; meets the rule (gain >= {min_gain:g}, interval above 0)")
    if iv.hi < min_gain or iv.hi < 0:
        why = "the candidate is worse" if iv.hi < 0 else f"the whole interval is below the required gain {min_gain:g}"
        return Answer("do not adopt", f"do not adopt {candidate}: {vs} {pct}; {why}")
    why = "crosses 0" if iv.lo <= 0 else f"is above 0 but the mean gain is below {min_gain:g}"
    return Answer("not resolved", f"not resolved: {vs} {pct}; the interval {why}; add seeds")


def summary_answer(rows: list[ConfigComparison], baseline: str, metric: str) -> Answer:
    """No rule stated: each configuration's verdict against the baseline, in one line."""
    others = [r for r in rows if r.config != baseline]
    if not others:
        return Answer("not resolved", f"nothing to compare: only the baseline {baseline} ran")
    parts = [f"{r.config} {r.verdict}" + (f" ({r.interval.text()})" if r.interval else "") for r in others]
    verdict = "not resolved" if any(r.verdict in ("not resolved", "no result") or
                                    (r.verdict == "stopped early" and not stopped_behind(r.note))
                                    for r in others) else "resolved"
    return Answer(verdict, f"{verdict} (no decision rule stated): vs {baseline} on {metric}: " + "; ".join(parts))


def halving(at_rung: Mapping[str, list[float]], keep: float, baseline: str,
            candidate: str | None = None) -> dict[str, str]:
    """Successive halving: the configurations outside the best ``ceil(keep * n)`` by mean value at the
    checkpoint stop (config -> why); the baseline and the decision's ``candidate`` always go on (the
    decision needs both, and a rank is no interval: a stop on it would answer nothing)."""
    means = {c: statistics.fmean(v) for c, v in at_rung.items() if v}
    order = sorted(means, key=lambda c: -means[c])
    kept = max(1, math.ceil(keep * len(order)))
    kept_too = "the baseline and the candidate" if candidate else "the baseline"
    return {c: f"ranked {i} of {len(order)} ({means[c]:.3f}); halving keeps the best {kept}, {kept_too}"
            for i, c in enumerate(order, 1) if i > kept and c not in (baseline, candidate)}


def behind(at_rung: Mapping[str, Mapping[int, float]], baseline: str, level: float = 0.95) -> dict[str, str]:
    """The configurations clearly behind the baseline at the checkpoint: their interval lies below 0."""
    base = at_rung.get(baseline, {})
    out = {}
    for c, vals in at_rung.items():
        iv = seed_interval(base, vals, level) if c != baseline else None
        if iv is not None and iv.hi < 0:
            out[c] = f"{BEHIND}: {iv.text()} ({iv.level:.0%} interval over {iv.n} seeds)"
    return out
