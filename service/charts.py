"""Server-side SVG charts for the dashboard: bar, line, histogram overlay, funnel.

No JavaScript and nothing fetched at run time: each function returns one HTML
``<figure>`` holding an inline SVG and, beside it, a table of the same values (the
accessible reading of the chart, and what a screen reader or a copy-paste gets).

* Every SVG has ``role="img"``, a ``<title>`` and a ``<desc>``, and axis labels.
* Every plotted element (bar, point, funnel stage) carries ``data-label`` and
  ``data-value``; ``data-value`` is the number exactly as given (``repr`` of a float,
  ``str`` of an int), so a test can read the DOM and compare with the report it came from.
* Every label is HTML-escaped, in text and in attributes (stream and source names come
  from users). Non-finite values are left out of the plot and shown as "—" in the table.
* No data gives a figure that says so, never an empty or broken SVG.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "PALETTE",
    "HLine",
    "VLine",
    "bar_chart",
    "funnel_chart",
    "histogram_overlay",
    "line_chart",
]

PALETTE = ("#2f6fde", "#e8833a", "#1a9c7a", "#b8467d", "#7a5cd6", "#c9a227", "#4aa3c7", "#8a93a3")
_W, _H = 520, 240
_LEFT, _RIGHT, _TOP, _BOTTOM = 60, 14, 14, 42
_STAGE, _DROP = PALETTE[0], "#c0504d"
_TABLE_ROWS = 400  # a values table longer than this is cut (the SVG keeps every point)


@dataclass(frozen=True)
class HLine:
    """A horizontal reference line (a target, a threshold) at ``y``."""

    y: float
    label: str
    color: str = "#555"


@dataclass(frozen=True)
class VLine:
    """A vertical reference line (a lag, a step) at ``x``."""

    x: float
    label: str


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float | int) -> str:
    """The exact value for ``data-value`` (a test compares it with the report)."""
    return str(value) if isinstance(value, int) else repr(float(value))


def _fmt(value: float | int | None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, int):
        return f"{value:,}"
    if value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:,.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.3e}"


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first + i * step, 12) for i in range(int((hi - first) / step + 1e-9) + 1)]


def _spread(lo: float, hi: float, n: int = 4) -> list[float]:
    """``n`` evenly spaced ticks from lo to hi (for formatted axes: times)."""
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)] if hi > lo else [lo]


class _Frame:
    """Maps data coordinates onto the plot area and draws axes and labels."""

    def __init__(self, x: tuple[float, float], y: tuple[float, float]) -> None:
        self.x0, self.x1 = x if x[1] > x[0] else (x[0], x[0] + 1.0)
        self.y0, self.y1 = y if y[1] > y[0] else (y[0], y[0] + 1.0)
        self.pw, self.ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def px(self, x: float) -> float:
        return _LEFT + (x - self.x0) / (self.x1 - self.x0) * self.pw

    def py(self, y: float) -> float:
        return _TOP + self.ph - (y - self.y0) / (self.y1 - self.y0) * self.ph

    def axes(
        self,
        x_label: str,
        y_label: str,
        *,
        x_ticks: bool = True,
        x_format: Callable[[float], str] | None = None,
    ) -> str:
        parts = [
            f'<line class="axis" x1="{_LEFT}" y1="{_TOP + self.ph}" x2="{_LEFT + self.pw}" '
            f'y2="{_TOP + self.ph}"/>',
            f'<line class="axis" x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + self.ph}"/>',
        ]
        for t in _ticks(self.y0, self.y1):
            y = self.py(t)
            parts.append(
                f'<line class="grid" x1="{_LEFT}" y1="{y:.1f}" x2="{_LEFT + self.pw}" '
                f'y2="{y:.1f}"/>'
                f'<text class="tick" x="{_LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">'
                f"{_e(_fmt(t))}</text>"
            )
        if x_ticks:
            ticks = _ticks(self.x0, self.x1, 6) if x_format is None else _spread(self.x0, self.x1)
            for t in ticks:
                x = self.px(t)
                text = x_format(t) if x_format is not None else _fmt(t)
                anchor = "end" if x > _LEFT + self.pw - 30 else "middle"
                parts.append(
                    f'<text class="tick" x="{x:.1f}" y="{_TOP + self.ph + 14}" '
                    f'text-anchor="{anchor}">{_e(text)}</text>'
                )
        parts.append(
            f'<text class="axis-label" x="{_LEFT + self.pw / 2:.0f}" y="{_H - 6}" '
            f'text-anchor="middle">{_e(x_label)}</text>'
            f'<text class="axis-label" transform="translate(13 {_TOP + self.ph / 2:.0f}) '
            f'rotate(-90)" text-anchor="middle">{_e(y_label)}</text>'
        )
        return "".join(parts)

    def hline(self, line: HLine) -> str:
        if not (_finite(line.y) and self.y0 <= line.y <= self.y1):
            return ""
        y = self.py(line.y)
        return (
            f'<line class="ref" x1="{_LEFT}" y1="{y:.1f}" x2="{_LEFT + self.pw}" y2="{y:.1f}" '
            f'stroke="{_e(line.color)}" data-label="{_e(line.label)}" data-value="{_num(line.y)}">'
            f"<title>{_e(line.label)}: {_e(_fmt(line.y))}</title></line>"
        )

    def vline(self, line: VLine) -> str:
        if not (_finite(line.x) and self.x0 <= line.x <= self.x1):
            return ""
        x = self.px(line.x)
        return (
            f'<line class="ref" x1="{x:.1f}" y1="{_TOP}" x2="{x:.1f}" y2="{_TOP + self.ph}" '
            f'stroke="#555" data-label="{_e(line.label)}" data-value="{_num(line.x)}">'
            f"<title>{_e(line.label)}: {_e(_fmt(line.x))}</title></line>"
        )


def _figure(
    chart_id: str, title: str, desc: str, svg_body: str, table: str, *, height: int = _H
) -> str:
    cid = _e(chart_id)
    svg = (
        f'<svg class="chart" viewBox="0 0 {_W} {height}" width="{_W}" height="{height}" '
        'role="img" '
        f'aria-labelledby="{cid}-title {cid}-desc" data-chart="{cid}">'
        f'<title id="{cid}-title">{_e(title)}</title><desc id="{cid}-desc">{_e(desc)}</desc>'
        f"{svg_body}</svg>"
    )
    return (
        f'<figure class="chart" id="{cid}"><figcaption>{_e(title)}</figcaption>'
        f'<div class="chart-body">{svg}<div class="values">{table}</div></div></figure>'
    )


def _empty(chart_id: str, title: str, why: str = "no data") -> str:
    cid = _e(chart_id)
    return (
        f'<figure class="chart empty" id="{cid}" data-chart="{cid}"><figcaption>{_e(title)}'
        f'</figcaption><p class="empty">{_e(why)}</p></figure>'
    )


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], caption: str) -> str:
    shown = rows[:_TABLE_ROWS]
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{_e(_fmt(c))}</td>'
            if c is None or isinstance(c, int | float)
            else f"<td>{_e(c)}</td>"
            for c in row
        )
        + "</tr>"
        for row in shown
    )
    more = (
        f'<tr><td colspan="{len(headers)}" class="meta">… {len(rows) - len(shown)} more rows'
        "</td></tr>"
        if len(rows) > len(shown)
        else ""
    )
    return (
        f'<table class="values"><caption>{_e(caption)}</caption><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}{more}</tbody></table>"
    )


def _legend(names: Sequence[str]) -> str:
    items = "".join(
        f'<span><i style="background:{PALETTE[i % len(PALETTE)]}"></i>{_e(n)}</span>'
        for i, n in enumerate(names)
    )
    return f'<div class="legend">{items}</div>'


def bar_chart(
    chart_id: str,
    title: str,
    items: Sequence[tuple[str, float | int]],
    *,
    x_label: str,
    y_label: str,
    marks: Mapping[str, float] | None = None,
    mark_name: str = "target",
) -> str:
    """Vertical bars, one per ``(label, value)``, in the given order; ``marks`` draws a
    reference tick (``data-target``) across the bars it names (a target share)."""
    marks = {k: float(v) for k, v in (marks or {}).items() if _finite(v)}
    bars = [(str(k), v) for k, v in items if _finite(v)]
    if not bars:
        return _empty(chart_id, title)
    top = max(max(v for _, v in bars), *marks.values(), 0)
    bottom = min(min(v for _, v in bars), 0)
    frame = _Frame((0.0, float(len(bars))), (float(bottom), float(top) or 1.0))
    slot = frame.pw / len(bars)
    parts = [frame.axes(x_label, y_label, x_ticks=False)]
    for i, (label, value) in enumerate(bars):
        y_a, y_b = frame.py(max(value, 0)), frame.py(min(value, 0))
        x = _LEFT + i * slot + slot * 0.1
        parts.append(
            f'<rect class="plot-bar" x="{x:.1f}" y="{y_a:.1f}" width="{slot * 0.8:.1f}" '
            f'height="{max(y_b - y_a, 0.5):.1f}" fill="{PALETTE[i % len(PALETTE)]}" '
            f'data-label="{_e(label)}" data-value="{_num(value)}">'
            f"<title>{_e(label)}: {_e(_fmt(value))}</title></rect>"
        )
        if label in marks:
            y_m = frame.py(marks[label])
            parts.append(
                f'<line class="mark" x1="{x - 2:.1f}" y1="{y_m:.1f}" x2="{x + slot * 0.8 + 2:.1f}" '
                f'y2="{y_m:.1f}" data-label="{_e(label)}" data-target="{_num(marks[label])}">'
                f"<title>{_e(label)} {_e(mark_name)}: {_e(_fmt(marks[label]))}</title></line>"
            )
        if len(bars) <= 16:
            parts.append(
                f'<text class="tick" x="{x + slot * 0.4:.1f}" y="{_TOP + frame.ph + 14}" '
                f'text-anchor="middle">{_e(label[:14])}</text>'
            )
    desc = f"{len(bars)} bars: " + ", ".join(f"{k} {_fmt(v)}" for k, v in bars[:20])
    if marks:
        rows = [[k, v, marks.get(k)] for k, v in bars]
        table = _table([x_label, y_label, mark_name], rows, title)
    else:
        table = _table([x_label, y_label], bars, title)
    return _figure(chart_id, title, desc, "".join(parts), table)


def line_chart(
    chart_id: str,
    title: str,
    x: Sequence[float | int],
    series: Mapping[str, Sequence[float | int | None]],
    *,
    x_label: str,
    y_label: str,
    hlines: Sequence[HLine] = (),
    vlines: Sequence[VLine] = (),
    x_format: Callable[[float], str] | None = None,
) -> str:
    """One polyline (and a point per value) per series over the shared ``x``;
    ``x_format`` writes the x ticks and the table's first column (times, dates)."""
    names = [n for n, ys in series.items() if any(_finite(v) for v in ys)]
    if not x or not names:
        return _empty(chart_id, title)
    ys_all = [p[1] for n in names for p in _points(x, series[n])]
    ys_all += [h.y for h in hlines if _finite(h.y)]
    lo, hi = min(min(ys_all), 0.0), max(ys_all)
    frame = _Frame((float(min(x)), float(max(x))), (lo, hi + (hi - lo) * 0.05))
    parts = [frame.axes(x_label, y_label, x_format=x_format)]
    parts += [frame.hline(h) for h in hlines] + [frame.vline(v) for v in vlines]
    for i, name in enumerate(names):
        color = PALETTE[i % len(PALETTE)]
        pts = _points(x, series[name])
        radius = 3.0 if len(x) <= 30 else 1.6  # few points: each must be seen on its own
        path = " ".join(f"{frame.px(xv):.1f},{frame.py(yv):.1f}" for xv, yv, _ in pts)
        dots = "".join(
            f'<circle class="point" cx="{frame.px(xv):.1f}" cy="{frame.py(yv):.1f}" r="{radius}" '
            f'fill="{color}" data-series="{_e(name)}" data-label="{_e(_num(x_raw))}" '
            f'data-value="{_num(y_raw)}"><title>{_e(name)} @ {_e(_fmt(x_raw))}: '
            f"{_e(_fmt(y_raw))}</title></circle>"
            for (xv, yv, (x_raw, y_raw)) in pts
        )
        parts.append(
            f'<g class="series" data-series="{_e(name)}"><polyline fill="none" stroke="{color}" '
            f'stroke-width="1.5" points="{path}"/>{dots}</g>'
        )
    desc = f"{len(names)} series over {len(x)} points of {x_label}"
    rows = [
        [x_format(xv) if x_format else xv, *(_at(series[n], i) for n in names)]
        for i, xv in enumerate(x)
    ]
    table = _legend(names) + _table([x_label, *names], rows, title)
    return _figure(chart_id, title, desc, "".join(parts), table)


def _points(
    x: Sequence[float | int], ys: Sequence[float | int | None]
) -> list[tuple[float, float, tuple[float | int, float | int]]]:
    """The finite points of one series: plot coordinates and the raw values."""
    return [
        (float(xv), float(yv), (xv, yv))
        for xv, yv in zip(x, ys, strict=False)
        if yv is not None and _finite(yv) and _finite(xv)
    ]


def _at(values: Sequence[float | int | None], i: int) -> float | int | None:
    return values[i] if i < len(values) and _finite(values[i]) else None


def histogram_overlay(
    chart_id: str,
    title: str,
    edges: Sequence[float],
    series: Mapping[str, Sequence[int | float]],
    *,
    x_label: str,
    y_label: str = "clips",
) -> str:
    """Several histograms on the same bins (``len(edges) - 1`` counts each), overlaid
    as translucent bars."""
    nbins = len(edges) - 1
    names = [n for n, c in series.items() if len(c) == nbins and any(_finite(v) for v in c)]
    if nbins < 1 or not names:
        return _empty(chart_id, title)
    top = max(float(v) for n in names for v in series[n] if _finite(v))
    frame = _Frame((float(edges[0]), float(edges[-1])), (0.0, top or 1.0))
    parts = [frame.axes(x_label, y_label)]
    for i, name in enumerate(names):
        color = PALETTE[i % len(PALETTE)]
        for b in range(nbins):
            v = series[name][b]
            if not _finite(v):
                continue
            x_a, x_b, y = frame.px(edges[b]), frame.px(edges[b + 1]), frame.py(float(v))
            label = f"[{_fmt(edges[b])}, {_fmt(edges[b + 1])})"
            parts.append(
                f'<rect class="plot-bar" x="{x_a:.1f}" y="{y:.1f}" '
                f'width="{max(x_b - x_a, 0.5):.1f}" '
                f'height="{_TOP + frame.ph - y:.1f}" fill="{color}" fill-opacity="0.45" '
                f'stroke="{color}" data-series="{_e(name)}" data-label="{_e(label)}" '
                f'data-value="{_num(v)}"><title>{_e(name)} {_e(label)}: {_e(_fmt(v))}'
                "</title></rect>"
            )
    rows = [
        [f"[{_fmt(edges[b])}, {_fmt(edges[b + 1])})", *(series[n][b] for n in names)]
        for b in range(nbins)
    ]
    desc = f"{len(names)} histograms over {nbins} bins of {x_label}"
    table = _legend(names) + _table([x_label, *names], rows, title)
    return _figure(chart_id, title, desc, "".join(parts), table)


def funnel_chart(
    chart_id: str,
    title: str,
    stages: Sequence[tuple[str, int]],
    *,
    drops: Collection[str] = (),
) -> str:
    """Horizontal bars from the first stage (all candidates) down, each as wide as its
    count relative to the largest stage. Stages named in ``drops`` are drawn as losses.
    The table adds each stage's share of the first."""
    stages = [(str(k), v) for k, v in stages if _finite(v)]
    if not stages or stages[0][1] <= 0:
        return _empty(chart_id, title)
    first, top = stages[0][1], max(v for _, v in stages)
    row_h = 18.0
    height = int(_TOP + row_h * len(stages) + 28)
    label_w, plot_w = 170, _W - 170 - _RIGHT - 60
    parts = []
    for i, (label, value) in enumerate(stages):
        y = _TOP + i * row_h
        w = max(plot_w * max(value, 0) / top, 0.5)
        parts.append(
            f'<text class="tick" x="{label_w - 6}" y="{y + row_h * 0.62:.1f}" text-anchor="end">'
            f"{_e(label[:28])}</text>"
            f'<rect class="plot-bar" x="{label_w}" y="{y + 2:.1f}" width="{w:.1f}" '
            f'height="{row_h - 4:.1f}" fill="{_DROP if label in drops else _STAGE}" '
            f'data-label="{_e(label)}" data-value="{_num(value)}">'
            f"<title>{_e(label)}: {_e(_fmt(value))}</title></rect>"
            f'<text class="tick" x="{label_w + w + 4:.1f}" y="{y + row_h * 0.62:.1f}">'
            f"{_e(_fmt(value))}</text>"
        )
    parts.append(
        f'<text class="axis-label" x="{label_w + plot_w / 2:.0f}" y="{height - 6}" '
        f'text-anchor="middle">count</text>'
    )
    rows = [[k, v, f"{v / first:.1%}"] for k, v in stages]
    desc = " → ".join(f"{k} {_fmt(v)}" for k, v in stages)
    table = _table(["stage", "count", "of first"], rows, title)
    return _figure(chart_id, title, desc, "".join(parts), table, height=height)
