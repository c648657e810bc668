"""What the dashboard's charts show, taken from the documents that already hold it.

Each function turns one recorded document into HTML sections of :mod:`service.charts`
(pure: a dict in, HTML out, so the tests compare plotted values with the document):

* snapshot.json: the drop funnel (candidates → each drop reason → clips → samples),
  realized vs target stream shares per phase, the bucket histogram;
* quality.json (SHAPES: ``materializer/quality.py``): share vs target over steps per
  phase, autocorrelation by lag with the batch lag and the threshold, epochs;
* the drift report (:func:`service.drift.drift_report`): both versions' histograms
  overlaid, kill rate per source over ingest time;
* catalog ingest history (:meth:`catalog.catalog.VidlakeCatalog.ingest_history`): rows
  committed per table per time bin.

Documents written before a field existed lack it: its chart says "no data", never fails.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from manifests.format import QUALITY_NAME
from service.charts import PALETTE, HLine, VLine, bar_chart, funnel_chart, histogram_overlay
from service.charts import line_chart as line

__all__ = [
    "drift_sections",
    "funnel_stages",
    "ingest_bins",
    "ingest_section",
    "quality_sections",
    "snapshot_sections",
]

_BIN_WIDTHS_S = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400)
_MAX_BINS = 48


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _dict(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _section(title: str, body: str, *, sid: str = "") -> str:
    ident = f' id="{_e(sid)}"' if sid else ""
    return f'<section class="charts"{ident}><h2>{_e(title)}</h2>{body}</section>'


# -- snapshot.json ------------------------------------------------------------------------
def funnel_stages(snapshot: Mapping[str, Any]) -> list[tuple[str, int]]:
    """Candidates, then each drop reason (largest first, its count of dropped clips),
    then the clips kept and the samples drawn from them (epochs may make it larger)."""
    counts, drops = _dict(snapshot.get("counts")), _dict(snapshot.get("drops"))
    stages: list[tuple[str, int]] = []
    if isinstance(counts.get("candidates"), int):
        stages.append(("candidates", counts["candidates"]))
    ordered = sorted(((str(k), v) for k, v in drops.items() if isinstance(v, int)), key=_by_count)
    stages += [(f"drop: {k}", v) for k, v in ordered]
    for key in ("clips", "samples"):
        if isinstance(counts.get(key), int):
            stages.append((key, counts[key]))
    return stages


def _by_count(item: tuple[str, int]) -> tuple[int, str]:
    return -item[1], item[0]


def snapshot_sections(version: int, snapshot: Mapping[str, Any]) -> str:
    """The funnel, the stream shares per phase and the bucket histogram."""
    stages = funnel_stages(snapshot)
    drops = {k for k, _ in stages if k.startswith("drop: ")}
    funnel = funnel_chart(f"funnel-v{version}", f"v{version}: drop funnel", stages, drops=drops)
    phases = [p for p in _list(snapshot.get("phases")) if isinstance(p, Mapping)]
    shares = [
        bar_chart(
            f"shares-v{version}-{i}",
            f"phase {p.get('name', i)}: realized stream share vs target",
            [(str(k), v) for k, v in _dict(p.get("realized")).items()],
            x_label="stream",
            y_label="share",
            marks=_dict(p.get("targets")),
        )
        for i, p in enumerate(phases)
        if p.get("realized")
    ]
    if not shares:  # snapshots before per-phase shares: the overall ones
        overall = _dict(snapshot.get("stream_shares"))
        shares = [
            bar_chart(
                f"shares-v{version}-all",
                "all phases: realized stream share",
                list(overall.items()),
                x_label="stream",
                y_label="share",
            )
        ]
    buckets = bar_chart(
        f"buckets-v{version}",
        f"v{version}: samples per bucket",
        _bucket_items(_dict(snapshot.get("bucket_histogram"))),
        x_label="bucket (frames x aspect)",
        y_label="samples",
    )
    return (
        _section("Drop funnel", funnel, sid="funnel")
        + _section("Stream shares per phase", "".join(shares), sid="shares")
        + _section("Bucket histogram", buckets, sid="buckets")
    )


def _bucket_items(histogram: Mapping[str, Any]) -> list[tuple[str, int]]:
    """``{key: {"samples", "steps"}}`` (or, in the first format, ``{key: samples}``)."""
    out = []
    for key, value in histogram.items():
        n = value.get("samples") if isinstance(value, Mapping) else value
        if isinstance(n, int):
            out.append((str(key), n))
    return out


def read_quality(snapshot: Mapping[str, Any], load: Any) -> dict[str, Any] | None:
    """quality.json through ``load(name) -> bytes``, or None for a cut made before it."""
    if QUALITY_NAME not in _dict(snapshot.get("artifacts")):
        return None
    doc = json.loads(load(QUALITY_NAME))
    return doc if isinstance(doc, dict) else None


# -- quality.json -------------------------------------------------------------------------
def _headline(quality: Mapping[str, Any]) -> str:
    thresholds = _dict(quality.get("thresholds"))
    rows = [
        ("passed", quality.get("passed"), None),
        ("repeated_in_step", quality.get("repeated_in_step"), 0),
        ("max_share_deviation", quality.get("max_share_deviation"), None),
        ("max_autocorr_beyond_batch", quality.get("max_autocorr_beyond_batch"), None),
        ("batch_lag", quality.get("batch_lag"), None),
        ("window_steps", quality.get("window_steps"), None),
        ("global_batch", quality.get("global_batch"), None),
    ]
    body = "".join(
        f'<tr><th>{_e(k)}</th><td class="num" data-key="{_e(k)}" data-value="{_e(v)}">'
        f"{_e(_short(v))}</td><td>{_e(_limit(k, thresholds, must))}</td></tr>"
        for k, v, must in rows
    )
    return (
        '<table class="headline"><thead><tr><th>figure</th><th>value</th><th>limit</th></tr>'
        f"</thead><tbody>{body}</tbody></table>"
    )


def _short(value: object) -> str:
    """A figure as people read it (the exact one stays in ``data-value``)."""
    if value is None:
        return "—"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _limit(key: str, thresholds: Mapping[str, Any], must: object) -> str:
    if must is not None:
        return f"must be {must}"
    value = thresholds.get(key)
    return f"<= {value}" if value is not None else ""


def quality_sections(version: int, quality: Mapping[str, Any] | None) -> str:
    """The quality report's charts, or a line saying this cut has none."""
    if quality is None:
        return _section(
            "Plan quality",
            '<p class="empty">no quality.json: this snapshot was cut before plan quality '
            "reports existed</p>",
            sid="quality",
        )
    charts = [_share_chart(version, i, p) for i, p in enumerate(_list(quality.get("phases")))]
    autocorr = _dict(quality.get("autocorr"))
    threshold = _dict(quality.get("thresholds")).get("max_autocorr_beyond_batch")
    acf = line(
        f"autocorr-v{version}",
        "autocorrelation of the realized sample stream by lag",
        _list(autocorr.get("lags")),
        {str(k): _list(v) for k, v in _dict(autocorr.get("series")).items()},
        x_label="lag (samples)",
        y_label="autocorrelation",
        vlines=[VLine(float(quality["batch_lag"]), "batch lag")]
        if isinstance(quality.get("batch_lag"), int | float)
        else [],
        hlines=[HLine(float(threshold), "threshold", "#c0504d")]
        if isinstance(threshold, int | float)
        else [],
    )
    epochs = bar_chart(
        f"epochs-v{version}",
        "epochs per (stream, bucket)",
        [
            (f"{e.get('stream')} {e.get('bucket')}", e["epochs"])
            for e in _list(quality.get("epochs"))
            if isinstance(e, Mapping) and isinstance(e.get("epochs"), int | float)
        ],
        x_label="stream bucket",
        y_label="epochs",
    )
    body = _headline(quality) + "".join(charts) + acf + epochs
    return _section("Plan quality", body, sid="quality")


def _share_chart(version: int, i: int, phase: Any) -> str:
    phase = _dict(phase)
    windows = _dict(phase.get("windows"))
    streams = _dict(windows.get("streams"))
    series = {str(k): _list(_dict(v).get("realized")) for k, v in streams.items()}
    targets = [
        HLine(float(t), f"{k} target", PALETTE[j % len(PALETTE)])
        for j, (k, v) in enumerate(streams.items())
        if isinstance(t := _dict(v).get("target"), int | float)
    ]
    dev = phase.get("max_abs_deviation")
    return line(
        f"share-v{version}-{i}",
        f"phase {phase.get('name', i)}: stream share over {phase.get('steps', '?')} steps "
        f"(max |dev| {_short(dev)})",
        _list(windows.get("start_step")),
        series,
        x_label="window start step",
        y_label="share",
        hlines=targets,
    )


# -- drift report -------------------------------------------------------------------------
def drift_sections(report: Mapping[str, Any]) -> str:
    """Histograms overlaid, the headline figures, quantiles, kill rate over time."""
    a, b = str(report.get("version_a")), str(report.get("version_b"))
    hist = _dict(report.get("histogram"))
    overlay = histogram_overlay(
        "drift-histogram",
        f"{report.get('filter')}: score distribution on the reference slice, {a} vs {b}",
        _list(hist.get("edges")),
        {f"a: {a}": _list(hist.get("a")), f"b: {b}": _list(hist.get("b"))},
        x_label="score",
    )
    over_time = _kill_rate_chart(_list(report.get("kill_rate_over_time")))
    return _section("Score drift", _drift_headline(report) + overlay, sid="drift") + _section(
        "Kill rate over ingest time", over_time, sid="kill-rate"
    )


def _drift_headline(report: Mapping[str, Any]) -> str:
    cover, kill = _dict(report.get("coverage")), _dict(report.get("kill_rate"))
    sl = _dict(report.get("slice"))
    rows = [
        ("ks", report.get("ks")),
        ("slice assets", sl.get("assets")),
        ("slice clips", sl.get("clips")),
        ("coverage a", cover.get("a")),
        ("coverage b", cover.get("b")),
        ("kill threshold", kill.get("threshold")),
        ("kill rate a", kill.get("a")),
        ("kill rate b", kill.get("b")),
    ]
    body = "".join(
        f'<tr><th>{_e(k)}</th><td class="num" data-key="{_e(k)}" data-value="{_e(v)}">'
        f"{_e(_short(v))}</td></tr>"
        for k, v in rows
    )
    if not sl.get("clips"):
        body += '<tr><td colspan="2" class="empty">the reference slice holds no clips yet</td></tr>'

    q = _dict(report.get("quantiles"))
    qrows = "".join(
        f"<tr><td>{_e(p)}</td><td class='num'>{_e(_short(x))}</td>"
        f"<td class='num'>{_e(_short(y))}</td></tr>"
        for p, x, y in zip(_list(q.get("q")), _list(q.get("a")), _list(q.get("b")), strict=False)
    )
    return (
        f'<div class="tables"><table class="headline"><tbody>{body}</tbody></table>'
        '<table class="quantiles"><caption>quantiles</caption><thead><tr><th>q</th><th>a</th>'
        f"<th>b</th></tr></thead><tbody>{qrows}</tbody></table></div>"
    )


def _kill_rate_chart(points: Sequence[Any]) -> str:
    rows = [_dict(p) for p in points]
    days = sorted({str(r.get("day")) for r in rows if r.get("day")})
    x = [_day_ts(d) for d in days]
    series: dict[str, list[float | None]] = {}
    for r in rows:
        key = f"{r.get('source')} · {r.get('version')}"
        ys = series.setdefault(key, [None] * len(days))
        if str(r.get("day")) in days and isinstance(r.get("kill_rate"), int | float):
            ys[days.index(str(r.get("day")))] = float(r["kill_rate"])
    usable = [(xv, i) for i, xv in enumerate(x) if xv is not None]
    return line(
        "kill-rate",
        "kill rate per source over ingest day",
        [xv for xv, _ in usable],
        {k: [ys[i] for _, i in usable] for k, ys in series.items()},
        x_label="ingest day (UTC)",
        y_label="kill rate",
        x_format=_date,
    )


def _day_ts(day: str) -> float | None:
    try:
        return datetime.fromisoformat(day).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _date(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")


def _time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%m-%d %H:%M")


# -- ingest history -----------------------------------------------------------------------
def ingest_bins(
    history: Mapping[str, Sequence[tuple[int, int]]],
) -> tuple[int, list[float], dict[str, list[int]]]:
    """Rows added per table per time bin, from ``{table: [(timestamp_ms, rows)]}``: the
    bin width (the smallest of minute … week giving at most 48 bins), bin starts
    (epoch seconds) and counts per table."""
    stamps = [ts / 1000 for pts in history.values() for ts, _ in pts]
    if not stamps:
        return 0, [], {}
    lo, hi = min(stamps), max(stamps)
    width = next((w for w in _BIN_WIDTHS_S if (hi - lo) / w < _MAX_BINS), _BIN_WIDTHS_S[-1])
    first = lo // width * width
    n = int((hi - first) // width) + 1
    starts = [first + i * width for i in range(n)]
    counts = {}
    for table, pts in history.items():
        row = [0] * n
        for ts, added in pts:
            row[int((ts / 1000 - first) // width)] += added
        counts[table] = row
    return width, starts, counts


def ingest_section(history: Mapping[str, Sequence[tuple[int, int]]]) -> str:
    """Rows committed per table per time bin (from snapshot summaries)."""
    width, starts, counts = ingest_bins(history)
    unit = _unit(width)
    chart = line(
        "ingest-rates",
        f"rows ingested per table per {unit}",
        starts,
        {k: v for k, v in counts.items() if any(v)},
        x_label=f"time (UTC, {unit} bins)",
        y_label=f"rows per {unit}",
        x_format=_time,
    )
    note = (
        '<p class="meta">from the Iceberg snapshot summaries still in each table\'s '
        "metadata (snapshot expiry drops older commits)</p>"
    )
    return chart + note


def _unit(width: int) -> str:
    names = {60: "minute", 300: "5 min", 900: "15 min", 3600: "hour", 21600: "6 h"}
    return names.get(width, "day" if width == 86400 else "week" if width else "bin")
