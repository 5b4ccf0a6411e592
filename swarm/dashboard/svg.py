"""Server-side SVG charts for the dashboard: line charts over time or versions, and bar charts.

Each function takes plain numbers and returns one self-contained ``<svg>`` string (no script,
no external assets, every label XML-escaped), so the page needs no chart library and no CDN.

Axes use "nice" ticks (1, 2, 2.5, 5 x 10^k; whole numbers only on integer axes such as policy
versions and counts; round clock times on time axes), labelled with as many decimals as the
tick step needs. Tick labels near an edge are anchored inwards so none is clipped. Line
series differ by colour, dash pattern and marker shape, and earlier series are drawn wider,
so two lines that coincide (steps leased and steps acked) still show as two; the legend
repeats each series' line and marker. Hovering a point or bar shows its value through an SVG
``<title>``. It does not query anything.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from xml.sax.saxutils import escape

__all__ = ["line_chart", "bar_chart", "empty_chart", "nice_ticks", "tick_labels", "PALETTE", "DASHES", "MARKERS"]

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
DASHES = ("", "6 3", "2 2", "9 3 2 3")  # per series, cycling: solid, dashed, dotted, dash-dot
MARKERS = ("circle", "square", "triangle", "diamond")
_W, _H = 560, 200
_M = {"l": 50, "r": 14, "t": 16, "b": 32}
_CHAR_W = 5.6  # approximate width of one 10px sans-serif character, for layout
_LEGEND_ROW = 14
# clock-time tick steps (seconds), smallest first
_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
               172800, 604800)


def _esc(s: object) -> str:
    return escape(str(s), {'"': "&quot;"})


def _nice_step(span: float, n: int, integer: bool) -> float:
    """A step of 1, 2, 2.5 or 5 x 10^k giving about ``n`` intervals over ``span`` (whole if ``integer``)."""
    raw = span / max(1, n)
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        step = m * mag
        if step >= raw * 0.999 and not (integer and step != int(step)):
            return max(1.0, step) if integer else step
    return max(1.0, 10 * mag) if integer else 10 * mag


def nice_ticks(lo: float, hi: float, n: int = 4, integer: bool = False) -> tuple[float, float, list[float]]:
    """Axis bounds widened to whole steps, and the tick values (``integer``: whole numbers only)."""
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = 1.0 if integer or lo == 0 else abs(lo) * 0.1
        lo, hi = (lo, lo + pad) if lo == 0 else (lo - pad, hi + pad)
    step = _nice_step(hi - lo, n, integer)
    a, b = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    ticks = [round(k * step, 10) for k in range(a, b + 1)]
    return ticks[0], ticks[-1], ticks


def _decimals(step: float) -> int:
    """Decimals needed to tell ticks ``step`` apart (2.5 needs one, 0.25 two)."""
    if step >= 1 and step == int(step):
        return 0
    d = max(0, -math.floor(math.log10(step)))
    return d + (0 if abs(round(step * 10 ** d) - step * 10 ** d) < 1e-9 else 1)


def tick_labels(ticks: Sequence[float]) -> list[str]:
    """Tick values at the precision of their step, with one k / M scale for the whole axis."""
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    top = max((abs(v) for v in ticks), default=0.0)
    div, suffix = next(((d, x) for d, x in ((1e6, "M"), (1e3, "k")) if top >= 10 * d and step >= d / 10), (1.0, ""))
    dec = _decimals(step / div)
    return [f"{v / div:.{dec}f}{suffix}" if v != 0 else "0" for v in ticks]


def _value(v: float) -> str:
    """A value for a tooltip: whole numbers as such, others to 3 significant decimals."""
    return str(int(v)) if v == int(v) else f"{v:.3f}"


def _time_ticks(lo: float, hi: float, n: int = 5) -> tuple[list[float], str]:
    """Round clock times in ``[lo, hi]`` and their strftime format."""
    span = max(hi - lo, 1.0)
    step = next((s for s in _TIME_STEPS if span / s <= n), _TIME_STEPS[-1])
    offset = -time.localtime(lo).tm_gmtoff  # align to local, not UTC, midnights and hours
    first = math.ceil((lo - offset) / step) * step + offset
    ticks = [first + k * step for k in range(int((hi - first) // step) + 1)]
    fmt = "%H:%M:%S" if step < 60 else ("%H:%M" if step < 86400 else "%m-%d")
    if step < 86400 and time.strftime("%d", time.localtime(lo)) != time.strftime("%d", time.localtime(hi)):
        fmt = "%m-%d " + fmt
    return ticks, fmt


def _text_at(x: float, y: float, label: str, width: int, cls: str = "") -> str:
    """A tick label centred on ``x``, anchored inwards where centring would cut it off."""
    half = len(label) * _CHAR_W / 2
    anchor, tx = "middle", x
    if x - half < 2:
        anchor, tx = "start", max(2.0, x - 3)
    elif x + half > width - 2:
        anchor, tx = "end", min(width - 2.0, x + 3)
    c = f' class="{cls}"' if cls else ""
    return f'<text x="{tx:.1f}" y="{y:.1f}" text-anchor="{anchor}"{c}>{_esc(label)}</text>'


def _marker(kind: str, x: float, y: float, col: str, r: float, title: str = "") -> str:
    t = f"<title>{_esc(title)}</title>" if title else ""
    if kind == "square":
        s = r * 0.9
        return f'<rect x="{x - s:.1f}" y="{y - s:.1f}" width="{2 * s:.1f}" height="{2 * s:.1f}" fill="{col}">{t}</rect>'
    if kind == "triangle":
        pts = f"{x:.1f},{y - r * 1.2:.1f} {x - r:.1f},{y + r * 0.7:.1f} {x + r:.1f},{y + r * 0.7:.1f}"
        return f'<polygon points="{pts}" fill="{col}">{t}</polygon>'
    if kind == "diamond":
        pts = f"{x:.1f},{y - r * 1.2:.1f} {x + r:.1f},{y:.1f} {x:.1f},{y + r * 1.2:.1f} {x - r:.1f},{y:.1f}"
        return f'<polygon points="{pts}" fill="{col}">{t}</polygon>'
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{col}">{t}</circle>'


def _style(i: int) -> tuple[str, str, str, float]:
    """(colour, dash pattern, marker, stroke width) of series ``i``; earlier series are wider."""
    return (PALETTE[i % len(PALETTE)], DASHES[i % len(DASHES)], MARKERS[i % len(MARKERS)], 3.2 if i == 0 else 1.8)


def _legend(names: Sequence[str], width: int, top: float, lines: bool) -> tuple[list[str], int]:
    """Legend entries wrapped into rows below the plot; returns the elements and the row count."""
    out: list[str] = []
    x, row = float(_M["l"]), 0
    for i, name in enumerate(names):
        col, dash, marker, sw = _style(i)
        w = 26 + len(str(name)) * _CHAR_W + 12
        if x + w > width and x > _M["l"]:
            x, row = float(_M["l"]), row + 1
        y = top + row * _LEGEND_ROW + 9
        if lines:
            da = f' stroke-dasharray="{dash}"' if dash else ""
            out.append(f'<g class="legend-item" data-series="{_esc(name)}">'
                       f'<line x1="{x:.1f}" y1="{y - 3:.1f}" x2="{x + 20:.1f}" y2="{y - 3:.1f}" stroke="{col}" '
                       f'stroke-width="{min(sw, 2.4)}"{da}/>' + _marker(marker, x + 10, y - 3, col, 2.6)
                       + f'<text x="{x + 24:.1f}" y="{y:.1f}" class="lg">{_esc(name)}</text></g>')
        else:
            out.append(f'<g class="legend-item" data-series="{_esc(name)}"><rect x="{x:.1f}" y="{y - 8:.1f}" '
                       f'width="9" height="9" fill="{col}"/><text x="{x + 12:.1f}" y="{y:.1f}" class="lg">'
                       f'{_esc(name)}</text></g>')
        x += w
    return out, (row + 1) if names else 0


def _frame(title: str, body: list[str], legend: Sequence[str], width: int, height: int, lines: bool = False) -> str:
    leg, rows = _legend(legend, width, height, lines)
    h = height + rows * _LEGEND_ROW + (4 if rows else 0)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {h}" width="100%" '
            f'role="img" aria-label="{_esc(title)}" class="chart">'
            f'<style>text{{font:10px sans-serif;fill:#555}} .lg{{fill:#333}} .ax{{stroke:#bbb}} '
            f'.gr{{stroke:#eee}} .ttl{{fill:#333}}</style>' + "".join(body) + "".join(leg) + "</svg>")


def empty_chart(title: str, message: str = "no data yet", width: int = _W, height: int = _H) -> str:
    """A frame with ``message`` in the middle."""
    body = [f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle">{_esc(message)}</text>']
    return _frame(title, body, [], width, height)


def _y_axis(lo: float, hi: float, ticks: list[float], width: int, height: int, y_label: str) -> list[str]:
    x0, x1, y0, y1 = _M["l"], width - _M["r"], height - _M["b"], _M["t"]
    out = [f'<line class="ax" x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}"/>',
           f'<line class="ax" x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}"/>']
    for v, lab in zip(ticks, tick_labels(ticks), strict=True):
        y = y0 - (y0 - y1) * (v - lo) / ((hi - lo) or 1.0)
        out.append(f'<line class="gr" x1="{x0 + 1}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}"/>'
                   f'<text x="{x0 - 5}" y="{y + 3:.1f}" text-anchor="end" class="yt">{lab}</text>')
    if y_label:
        out.append(f'<text x="{x0 + 4}" y="{y1 - 5}">{_esc(y_label)}</text>')
    return out


def _x_label(x_label: str, width: int, height: int) -> list[str]:
    if not x_label:
        return []
    x0, x1 = _M["l"], width - _M["r"]
    return [f'<text x="{(x0 + x1) / 2:.1f}" y="{height - 3}" text-anchor="middle" class="ttl">{_esc(x_label)}</text>']


def line_chart(series: dict[str, Sequence[tuple[float, ...]]], title: str, *, time_axis: bool = True,
               y_label: str = "", y_min: float | None = 0.0, width: int = _W, height: int = _H,
               x_label: str = "", x_integer: bool = False, y_integer: bool = False,
               empty: str = "no data yet") -> str:
    """One line per series of ``(x, y)`` or ``(x, y, note)`` points (x = epoch seconds when ``time_axis``).

    ``y_min``: the lowest y shown (None: fit the data). ``x_integer`` / ``y_integer``: ticks on
    whole numbers only (versions, counts). A point's ``note`` is added to its tooltip.
    """
    pts = [p for s in series.values() for p in s]
    if not pts:
        return empty_chart(title, empty, width=width, height=height)
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts]
    xlo, xhi = min(xs), max(xs)
    if xhi == xlo:
        xlo, xhi = xlo - (0.5 if x_integer else 1), xhi + (0.5 if x_integer else 1)
    ylo = min(ys) if y_min is None else min(y_min, min(ys))
    lo, hi, yticks = nice_ticks(ylo, max(ys), 5, y_integer)
    x0, x1, y0, y1 = _M["l"], width - _M["r"], height - _M["b"], _M["t"]

    def sx(v: float) -> float:
        return x0 + (x1 - x0) * (v - xlo) / (xhi - xlo)

    def sy(v: float) -> float:
        return y0 - (y0 - y1) * (v - lo) / ((hi - lo) or 1.0)

    body = _y_axis(lo, hi, yticks, width, height, y_label)
    if time_axis:
        xticks, tfmt = _time_ticks(xlo, xhi)
        labels = [time.strftime(tfmt, time.localtime(v)) for v in xticks]
    else:
        _, _, xticks = nice_ticks(xlo, xhi, 5, x_integer)
        xticks = [v for v in xticks if xlo - 1e-9 <= v <= xhi + 1e-9]
        labels = tick_labels(xticks)
    for v, lab in zip(xticks, labels, strict=True):
        body.append(f'<line class="ax" x1="{sx(v):.1f}" y1="{y0}" x2="{sx(v):.1f}" y2="{y0 + 3}"/>')
        body.append(_text_at(sx(v), y0 + 14, lab, width, "xt"))
    body += _x_label(x_label, width, height)
    for i, (name, s) in enumerate(series.items()):
        col, dash, marker, sw = _style(i)
        s = sorted(s, key=lambda p: p[0])
        if len(s) > 1:
            d = " ".join(f"{sx(p[0]):.1f},{sy(p[1]):.1f}" for p in s)
            da = f' stroke-dasharray="{dash}"' if dash else ""
            body.append(f'<polyline class="series" data-series="{_esc(name)}" fill="none" stroke="{col}" '
                        f'stroke-width="{sw}"{da} stroke-linejoin="round" points="{d}"/>')
        if len(s) <= 120:
            r = 3.8 if i == 0 else 2.6
            for p in s:
                at = time.strftime("%H:%M:%S", time.localtime(p[0])) if time_axis else _value(p[0])
                note = f" ({p[2]})" if len(p) > 2 and p[2] else ""
                body.append(_marker(marker, sx(p[0]), sy(p[1]), col, r, f"{name}: {_value(p[1])} @ {at}{note}"))
    return _frame(title, body, list(series) if len(series) > 1 or time_axis else [], width, height, lines=True)


def bar_chart(categories: Sequence[str], series: dict[str, Sequence[float]], title: str, *, y_label: str = "",
              width: int = _W, height: int = _H, x_label: str = "", y_integer: bool = True) -> str:
    """Stacked bars: one bar per category, one stacked segment per series (counts: whole-number ticks)."""
    if not categories or not series:
        return empty_chart(title, width=width, height=height)
    totals = [sum(s[i] for s in series.values()) for i in range(len(categories))]
    _, ymax, yticks = nice_ticks(0.0, max(totals) if totals else 1.0, 5, y_integer)
    x0, x1, y0, y1 = _M["l"], width - _M["r"], height - _M["b"], _M["t"]
    n = len(categories)
    slot = (x1 - x0) / n
    bw = max(1.0, slot * 0.75)
    body = _y_axis(0.0, ymax, yticks, width, height, y_label)
    longest = max(len(str(c)) for c in categories) * _CHAR_W + 6
    every = max(1, math.ceil(longest / slot))
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
                        f'fill="{PALETTE[j % len(PALETTE)]}"><title>{_esc(cat)} · {_esc(name)}: {_value(v)}'
                        f'</title></rect>')
        if i % every == 0:
            body.append(_text_at(x + bw / 2, y0 + 14, str(cat), width, "xt"))
    body += _x_label(x_label, width, height)
    return _frame(title, body, list(series) if len(series) > 1 else [], width, height)
