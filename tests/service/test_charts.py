"""Server-side SVG charts: plotted values equal the input, labels are escaped, no data
is said, and every chart is accessible (title, desc, axis labels, a values table)."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from service.charts import HLine, VLine, bar_chart, funnel_chart, histogram_overlay, line_chart

HOSTILE = "<script>alert(\"x\")</script> & 'web'"


class _Plotted(HTMLParser):
    """Collects the attributes of every element carrying ``data-value``."""

    def __init__(self) -> None:
        super().__init__()
        self.items: list[dict[str, str]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        found = {k: v or "" for k, v in attrs}
        if "data-value" in found:
            self.items.append({"tag": tag, **found})


def plotted(html: str) -> list[dict[str, str]]:
    parser = _Plotted()
    parser.feed(html)
    return parser.items


def well_formed(html: str) -> ET.Element:
    """The figure parses as XML: no label broke out of its text or attribute."""
    return ET.fromstring(html)


def test_bar_chart_plots_each_value_and_its_target() -> None:
    items = [("web", 0.25), ("licensed", 0.70), ("synthetic", 0.05)]
    html = bar_chart("s", "shares", items, x_label="stream", y_label="share", marks={"web": 0.3})
    bars = [p for p in plotted(html) if p["tag"] == "rect"]
    assert [(b["data-label"], float(b["data-value"])) for b in bars] == items
    well_formed(html)
    assert '<title id="s-title">shares</title>' in html
    assert 'data-target="0.3"' in html and "<desc" in html and 'role="img"' in html
    assert ">stream</text>" in html and ">share</text>" in html  # axis labels
    assert html.count("<tr>") == 1 + len(items)  # header + one row per bar in the table
    # taller bars are taller: the plot is to scale
    heights = {b["data-label"]: float(b["height"]) for b in bars}
    assert heights["licensed"] > heights["web"] > heights["synthetic"]


def test_line_chart_keeps_every_finite_point_and_drops_the_rest() -> None:
    x = [0, 16, 32, 48]
    series: dict[str, list[float | None]] = {
        "web": [0.7, 0.69, float("nan"), 0.71],
        "licensed": [0.3, None, 0.31, 0.29],
    }
    html = line_chart(
        "l",
        "share over steps",
        x,
        series,
        x_label="step",
        y_label="share",
        hlines=[HLine(0.7, "web target")],
        vlines=[VLine(32, "batch lag")],
    )
    well_formed(html)
    points = [p for p in plotted(html) if p["tag"] == "circle"]
    by_series: dict[str, list[tuple[float, float]]] = {}
    for p in points:
        by_series.setdefault(p["data-series"], []).append(
            (float(p["data-label"]), float(p["data-value"]))
        )
    assert by_series == {
        "web": [(0, 0.7), (16, 0.69), (48, 0.71)],
        "licensed": [(0, 0.3), (32, 0.31), (48, 0.29)],
    }
    refs = {p["data-label"]: float(p["data-value"]) for p in plotted(html) if p["tag"] == "line"}
    assert refs == {"web target": 0.7, "batch lag": 32.0}
    assert "—" in html  # the missing values are shown as missing in the table


def test_values_are_exact_not_rounded() -> None:
    value = 0.1 + 0.2  # 0.30000000000000004
    html = bar_chart("b", "t", [("a", value), ("n", 12345678901)], x_label="x", y_label="y")
    values = [p["data-value"] for p in plotted(html)]
    assert float(values[0]) == value and values[1] == "12345678901"


def test_histogram_overlay_plots_both_versions_on_shared_bins() -> None:
    edges = [0.0, 0.25, 0.5, 0.75, 1.0]
    a, b = [10, 20, 30, 40], [40, 30, 20, 10]
    html = histogram_overlay("h", "drift", edges, {"v1": a, "v2": b, "bad": [1]}, x_label="score")
    well_formed(html)
    rects = plotted(html)
    for name, counts in (("v1", a), ("v2", b)):
        assert [int(r["data-value"]) for r in rects if r["data-series"] == name] == counts
    assert not [r for r in rects if r["data-series"] == "bad"]  # wrong length: not drawn
    assert rects[0]["data-label"] == "[0, 0.25)"


def test_funnel_widths_follow_the_counts() -> None:
    stages = [("candidates", 1000), ("drop: no_latent", 400), ("drop: eval", 100), ("clips", 500)]
    html = funnel_chart("f", "funnel", stages, drops={"drop: no_latent", "drop: eval"})
    well_formed(html)
    bars = plotted(html)
    assert [(b["data-label"], int(b["data-value"])) for b in bars] == stages
    widths = [float(b["width"]) for b in bars]
    assert math.isclose(widths[1] / widths[0], 0.4, rel_tol=0.01)
    assert bars[1]["fill"] != bars[0]["fill"] == bars[3]["fill"]  # drops look like losses
    assert "40.0%" in html and "50.0%" in html  # share of the first, in the table


@pytest.mark.parametrize(
    "html",
    [
        bar_chart("e1", "t", [], x_label="x", y_label="y"),
        bar_chart("e2", "t", [("a", float("nan"))], x_label="x", y_label="y"),
        line_chart("e3", "t", [], {}, x_label="x", y_label="y"),
        line_chart("e4", "t", [1, 2], {"a": [None, float("inf")]}, x_label="x", y_label="y"),
        histogram_overlay("e5", "t", [0.0], {"a": []}, x_label="x"),
        funnel_chart("e6", "t", []),
        funnel_chart("e7", "t", [("candidates", 0)]),
    ],
)
def test_no_data_says_so(html: str) -> None:
    well_formed(html)
    assert "no data" in html and "<svg" not in html and not plotted(html)


def test_hostile_labels_are_escaped_everywhere() -> None:
    charts = [
        bar_chart(HOSTILE, HOSTILE, [(HOSTILE, 1)], x_label=HOSTILE, y_label=HOSTILE),
        line_chart(HOSTILE, HOSTILE, [1, 2], {HOSTILE: [1, 2]}, x_label=HOSTILE, y_label="y"),
        histogram_overlay("h", HOSTILE, [0, 1], {HOSTILE: [3]}, x_label=HOSTILE),
        funnel_chart("f", HOSTILE, [(HOSTILE, 5)]),
    ]
    for html in charts:
        assert "<script>" not in html
        root = well_formed(html)
        labelled = [p for p in plotted(html) if p.get("data-series") or p.get("data-label")]
        assert labelled  # the parser un-escapes attributes: the name arrives intact
        assert any(HOSTILE in (p.get("data-series", ""), p.get("data-label", "")) for p in labelled)
        assert root.tag == "figure"


def test_funnel_scales_to_its_largest_stage() -> None:
    """Samples can outnumber candidates (epochs > 1): no bar leaves the plot."""
    html = funnel_chart("f", "funnel", [("candidates", 100), ("samples", 250)])
    widths = [float(b["width"]) + float(b["x"]) for b in plotted(html)]
    assert max(widths) <= 520 and math.isclose(widths[0] - 170, (widths[1] - 170) * 0.4)
