"""Server-side SVG charts for the dashboard: line charts over time or versions, and bar charts.

Each function takes plain numbers and returns one self-contained ``<svg>`` string (no script,
no external assets, every label XML-escaped), so the page needs no chart library and no CDN.
Colours come from one fixed palette keyed by series order. Hovering a point or bar shows its
value through an SVG ``<title>``. It does not query anything.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from xml.sax.saxutils import escape

__all__ = ["line_chart", "bar_chart", "PALETTE", "empty_chart"]

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac")
_W, _H = 560, 200
_M = {"l": 46, "r": 12, "t": 14, "b": 30}


def _esc(s: object) -> str:
    return escape(str(s), {'"': "&quot;"})


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * exp:
            return m * exp
    return 10 * exp


def _fmt(v: float) -> str:
    if abs(v) >= 1e6:
        return f"{v / 1e6:.1f}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.0f}k"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.1f}k"
    if v == int(v):
        return str(int(v))
    return f"{v:.2f}"


def _xlabel(v: float, time_axis: bool, span: float) -> str:
    if not time_axis:
        return _fmt(v)
    t = time.localtime(v)
    return time.strftime("%H:%M:%S" if span < 600 else ("%H:%M" if span < 86400 * 2 else "%m-%d"), t)


def _frame(title: str, body: list[str], legend: Sequence[str], width: int, height: int) -> str:
    leg = []
    x = _M["l"]
    for i, name in enumerate(legend):
        col = PALETTE[i % len(PALETTE)]
        leg.append(f'<rect x="{x}" y="{height - 10}" width="9" height="9" fill="{col}"/>'
                   f'<text x="{x + 12}" y="{height - 2}" class="lg">{_esc(name)}</text>')
        x += 18 + 7 * len(str(name))
    h = height + (14 if legend else 0)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {h}" width="100%" '
            f'role="img" aria-label="{_esc(title)}" class="chart">'
            f'<style>text{{font:10px sans-serif;fill:#555}} .lg{{fill:#333}} .ax{{stroke:#bbb}} '
            f'.gr{{stroke:#eee}}</style>' + "".join(body) + "".join(leg) + "</svg>")


def empty_chart(title: str, message: str = "no data yet", width: int = _W, height: int = _H) -> str:
    body = [f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle">{_esc(message)}</text>']
    return _frame(title, body, [], width, height)


def _axes(ymax: float, width: int, height: int, y_label: str) -> list[str]:
    x0, x1, y0, y1 = _M["l"], width - _M["r"], height - _M["b"], _M["t"]
    out = [f'<line class="ax" x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}"/>',
           f'<line class="ax" x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}"/>']
    for k in range(5):
        v = ymax * k / 4
        y = y0 - (y0 - y1) * k / 4
        out.append(f'<line class="gr" x1="{x0 + 1}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}"/>'
                   f'<text x="{x0 - 4}" y="{y + 3:.1f}" text-anchor="end">{_fmt(v)}</text>')
    if y_label:
        out.append(f'<text x="{x0 + 4}" y="{y1 - 3}">{_esc(y_label)}</text>')
    return out


def line_chart(series: dict[str, Sequence[tuple[float, float]]], title: str, *, time_axis: bool = True,
               y_label: str = "", y_min: float | None = 0.0, width: int = _W, height: int = _H,
               x_label: str = "") -> str:
    """One line per series of ``(x, y)`` points (x = epoch seconds when ``time_axis``)."""
    pts = [p for s in series.values() for p in s]
    if not pts:
        return empty_chart(title, width=width, height=height)
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts]
    xlo, xhi = min(xs), max(xs)
    if xhi == xlo:
        xlo, xhi = xlo - 1, xhi + 1
    lo = min(ys) if y_min is None else min(y_min, min(ys))
    hi = max(ys)
    if y_min is None:
        span = (hi - lo) or 1.0
        lo, hi = lo - 0.05 * span, hi + 0.05 * span
    else:
        hi = _nice_max(hi - lo) + lo
    x0, x1, y0, y1 = _M["l"], width - _M["r"], height - _M["b"], _M["t"]

    def sx(v: float) -> float:
        return x0 + (x1 - x0) * (v - xlo) / (xhi - xlo)

    def sy(v: float) -> float:
        return y0 - (y0 - y1) * (v - lo) / ((hi - lo) or 1.0)

    body = _axes(hi - lo, width, height, y_label) if lo == 0 else _axes_range(lo, hi, width, height, y_label)
    for k in range(5):
        v = xlo + (xhi - xlo) * k / 4
        body.append(f'<text x="{sx(v):.1f}" y="{y0 + 13}" text-anchor="middle">'
                    f'{_esc(_xlabel(v, time_axis, xhi - xlo))}</text>')
    if x_label:
        body.append(f'<text x="{x1}" y="{y0 - 4}" text-anchor="end">{_esc(x_label)}</text>')
    for i, (name, s) in enumerate(series.items()):
        col = PALETTE[i % len(PALETTE)]
        s = sorted(s)
        if len(s) > 1:
            d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
            body.append(f'<polyline fill="none" stroke="{col}" stroke-width="1.6" points="{d}"/>')
        if len(s) <= 120:
            for x, y in s:
                body.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.4" fill="{col}">'
                            f'<title>{_esc(name)}: {_fmt(y)} @ {_esc(_xlabel(x, time_axis, 0))}</title></circle>')
    return _frame(title, body, list(series) if len(series) > 1 or time_axis else [], width, height)


def _axes_range(lo: float, hi: float, width: int, height: int, y_label: str) -> list[str]:
    x0, x1, y0, y1 = _M["l"], width - _M["r"], height - _M["b"], _M["t"]
    out = [f'<line class="ax" x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}"/>',
           f'<line class="ax" x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}"/>']
    for k in range(5):
        v = lo + (hi - lo) * k / 4
        y = y0 - (y0 - y1) * k / 4
        out.append(f'<line class="gr" x1="{x0 + 1}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}"/>'
                   f'<text x="{x0 - 4}" y="{y + 3:.1f}" text-anchor="end">{_fmt(round(v, 3))}</text>')
    if y_label:
        out.append(f'<text x="{x0 + 4}" y="{y1 - 3}">{_esc(y_label)}</text>')
    return out


def bar_chart(categories: Sequence[str], series: dict[str, Sequence[float]], title: str, *, y_label: str = "",
              width: int = _W, height: int = _H) -> str:
    """Stacked bars: one bar per category, one stacked segment per series."""
    if not categories or not series:
        return empty_chart(title, width=width, height=height)
    totals = [sum(s[i] for s in series.values()) for i in range(len(categories))]
    ymax = _nice_max(max(totals) if totals else 1.0)
    x0, x1, y0, y1 = _M["l"], width - _M["r"], height - _M["b"], _M["t"]
    n = len(categories)
    slot = (x1 - x0) / n
    bw = max(1.0, slot * 0.75)
    body = _axes(ymax, width, height, y_label)
    every = max(1, math.ceil(n / 16))
    for i, cat in enumerate(categories):
        x = x0 + slot * i + (slot - bw) / 2
        base = y0
        for j, (name, s) in enumerate(series.items()):
            v = s[i]
            if v <= 0:
                continue
            h = (y0 - y1) * v / ymax
            base -= h
            body.append(f'<rect x="{x:.1f}" y="{base:.1f}" width="{bw:.1f}" height="{h:.1f}" '
                        f'fill="{PALETTE[j % len(PALETTE)]}"><title>{_esc(cat)} · {_esc(name)}: {_fmt(v)}'
                        f'</title></rect>')
        if i % every == 0:
            body.append(f'<text x="{x + bw / 2:.1f}" y="{y0 + 13}" text-anchor="middle">{_esc(cat)}</text>')
    return _frame(title, body, list(series) if len(series) > 1 else [], width, height)
