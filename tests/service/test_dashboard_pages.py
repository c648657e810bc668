"""The dashboard's chart pages: what each chart plots equals the document it came from
(snapshot.json of a real cut, quality.json and the drift report in their SHAPES form,
the catalog's snapshot summaries), in the served HTML and in headless Chromium's DOM."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.tables import TABLE_NAMES
from manifests.registry import Registry
from materializer.cut import cut_snapshot
from materializer.recipe import load_recipe
from service.app import create_app
from service.dashboard_data import drift_sections, ingest_bins, quality_sections
from service.demo.corpus import generate_corpus
from service.settings import Settings
from tests.fixtures.recipes import small_corpus_demo
from tests.service.support import TestClient, World, serve
from tests.service.test_dashboard import BROWSER_FLAGS, CHROMIUM

HOSTILE = "<b>web</b>\"'&"


class _Plotted(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.chart: list[str] = []
        self.items: list[dict[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        if tag == "svg" and "data-chart" in found:
            self.chart.append(found["data-chart"])
        if "data-value" in found and self.chart:
            self.items.append({"tag": tag, "chart": self.chart[-1], **found})

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg" and self.chart:
            self.chart.pop()


def plotted(html: str, chart: str) -> list[dict[str, str]]:
    """The plotted elements (``data-value``) of the SVG chart ``chart``."""
    parser = _Plotted()
    parser.feed(html)
    return [p for p in parser.items if p["chart"] == chart and p["tag"] in ("rect", "circle")]


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, VidlakeCatalog]]:
    """A 40-asset demo corpus with one real cut (funnel, phases, buckets filled in)."""
    root = tmp_path_factory.mktemp("pages")
    with VidlakeCatalog.open(CatalogConfig.embedded(root, eval_salt="00" * 16)) as catalog:
        generate_corpus(catalog, assets=40, seed=3)
        cut_snapshot(catalog, Registry(catalog.objects), load_recipe(small_corpus_demo()))
        yield Settings(home=root, storage_status_dir=root / "status"), catalog


@pytest.fixture(scope="module")
def client(lake: tuple[Settings, VidlakeCatalog]) -> Iterator[TestClient]:
    with TestClient(create_app(lake[0], catalog=lake[1])) as c:
        yield c


def _snapshot(catalog: VidlakeCatalog) -> dict[str, Any]:
    return dict(Registry(catalog.objects).get(1).snapshot)


def check_snapshot_charts(html: str, snap: dict[str, Any]) -> None:
    """Every chart of the snapshot page plots snapshot.json's numbers."""
    funnel = {p["data-label"]: int(p["data-value"]) for p in plotted(html, "funnel-v1")}
    counts = snap["counts"]
    assert funnel["candidates"] == counts["candidates"] and funnel["samples"] == counts["samples"]
    assert funnel["clips"] == counts["clips"]
    assert {k[len("drop: ") :]: v for k, v in funnel.items() if k.startswith("drop: ")} == snap[
        "drops"
    ]
    for i, phase in enumerate(snap["phases"]):
        bars = {p["data-label"]: float(p["data-value"]) for p in plotted(html, f"shares-v1-{i}")}
        assert bars == phase["realized"]
    buckets = {p["data-label"]: int(p["data-value"]) for p in plotted(html, "buckets-v1")}
    assert buckets == {k: v["samples"] for k, v in snap["bucket_histogram"].items()}


def test_snapshot_page_plots_the_snapshot(
    client: TestClient, lake: tuple[Settings, VidlakeCatalog]
) -> None:
    r = client.get("/dashboard/snapshots/1")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    snap = _snapshot(lake[1])
    assert len(snap["phases"]) == 2 and snap["drops"]
    check_snapshot_charts(r.text, snap)
    for i, phase in enumerate(snap["phases"]):  # the target marks too
        chart = r.text.split(f'data-chart="shares-v1-{i}"', 1)[1].split("</svg>", 1)[0]
        marks = dict(re.findall(r'data-label="([^"]+)" data-target="([^"]+)"', chart))
        assert {k: float(v) for k, v in marks.items()} == phase["targets"]
    assert "/dashboard/snapshots/1" in client.get("/").text  # linked from the dashboard


def test_snapshot_page_shows_quality_or_says_the_cut_has_none(
    client: TestClient, lake: tuple[Settings, VidlakeCatalog]
) -> None:
    """Once the cut writes quality.json (issue 19.1), the page draws it; a cut without
    one says so instead of failing."""
    snap, page = _snapshot(lake[1]), client.get("/dashboard/snapshots/1").text
    if "quality.json" not in snap["artifacts"]:
        assert "no quality.json" in page
        return
    import json

    quality = json.loads(Registry(lake[1].objects).read_artifact(1, "quality.json"))
    check_quality_charts(page, quality)


def test_unknown_snapshot_is_an_html_404(client: TestClient) -> None:
    r = client.get("/dashboard/snapshots/99")
    assert r.status_code == 404 and "snapshot version 99 does not exist" in r.text
    assert r.headers["content-type"].startswith("text/html")
    assert client.get("/dashboard/snapshots/x").status_code == 422


def test_ingest_rates_add_up_to_each_tables_commits(
    client: TestClient, lake: tuple[Settings, VidlakeCatalog]
) -> None:
    catalog = lake[1]
    page = client.get("/").text
    points = plotted(page, "ingest-rates")
    for table in TABLE_NAMES:
        history = catalog.ingest_history(table)
        added = sum(p.added_records for p in history)
        shown = sum(int(p["data-value"]) for p in points if p["data-series"] == table)
        assert shown == added, table
        if table != "asset_events":  # append-only tables: the summaries add up to the rows
            assert added == catalog.row_count(table) or table == "tombstones"


def test_ingest_bins_pick_a_width_and_keep_every_row() -> None:
    hour = 3_600_000
    history = {"clips": [(0, 5), (hour, 7), (30 * hour, 11)], "assets": [(2 * hour, 3)]}
    width, starts, counts = ingest_bins(history)
    assert width == 3600 and len(starts) == 31 and starts[0] == 0.0
    assert sum(counts["clips"]) == 23 and counts["clips"][30] == 11 and counts["assets"][2] == 3
    assert ingest_bins({}) == (0, [], {})
    week = ingest_bins({"t": [(0, 1), (400 * 86_400_000, 1)]})
    assert week[0] == 7 * 86400 and sum(week[2]["t"]) == 2


# -- quality.json and the drift report, in the shapes of SHAPES.md -----------------------
QUALITY: dict[str, Any] = {
    "format": 1,
    "global_batch": 4,
    "window_steps": 2,
    "repeated_in_step": 0,
    "max_share_deviation": 0.125,
    "max_autocorr_beyond_batch": 0.031,
    "batch_lag": 4,
    "thresholds": {"max_autocorr_beyond_batch": 0.1, "max_share_deviation": None},
    "passed": True,
    "phases": [
        {
            "name": "warmup",
            "steps": 8,
            "max_abs_deviation": 0.125,
            "p99_abs_deviation": 0.1,
            "windows": {
                "start_step": [0, 2, 4, 6],
                "streams": {
                    "web": {"target": 0.75, "realized": [0.75, 0.625, 0.875, 0.75]},
                    HOSTILE: {"target": 0.25, "realized": [0.25, 0.375, 0.125, 0.25]},
                },
            },
        }
    ],
    "epochs": [{"stream": "web", "bucket": "4x16:9", "samples": 10, "draws": 25, "epochs": 2.5}],
    "autocorr": {
        "lags": list(range(1, 17)),
        "series": {
            "source_id": [0.5 / lag for lag in range(1, 17)],
            "asset_id": [0.01 * (-1) ** lag for lag in range(1, 17)],
        },
    },
}

DRIFT: dict[str, Any] = {
    "filter": "aesthetic",
    "version_a": "v1",
    "version_b": "v2",
    "slice": {"assets": 120, "clips": 480},
    "coverage": {"a": 1.0, "b": 0.6},
    "histogram": {
        "edges": [0.0, 0.25, 0.5, 0.75, 1.0],
        "a": [10, 50, 30, 10],
        "b": [40, 30, 20, 6],
    },
    "quantiles": {"q": [0.01, 0.5, 0.99], "a": [0.05, 0.4, 0.95], "b": [0.01, 0.3, 0.9]},
    "ks": 0.42,
    "kill_rate": {"threshold": 0.5, "a": 0.6, "b": 0.729},
    "kill_rate_over_time": [
        {"source": "web", "day": "2026-11-29", "version": "v2", "clips": 100, "kill_rate": 0.12},
        {"source": "web", "day": "2026-11-30", "version": "v2", "clips": 90, "kill_rate": 0.3},
        {"source": HOSTILE, "day": "2026-11-30", "version": "v1", "clips": 9, "kill_rate": 0.05},
    ],
}


def check_quality_charts(html: str, quality: dict[str, Any]) -> None:
    for i, phase in enumerate(quality["phases"]):
        points = plotted(html, f"share-v1-{i}")
        windows = phase["windows"]
        for stream, doc in windows["streams"].items():
            mine = [p for p in points if p["data-series"] == stream]
            assert [float(p["data-value"]) for p in mine] == doc["realized"], stream
            assert [float(p["data-label"]) for p in mine] == windows["start_step"]
    acf = plotted(html, "autocorr-v1")
    for key, values in quality["autocorr"]["series"].items():
        assert [float(p["data-value"]) for p in acf if p["data-series"] == key] == values
    headline = dict(re.findall(r'data-key="(\w+)" data-value="([^"]*)"', html))
    for key in ("repeated_in_step", "max_share_deviation", "max_autocorr_beyond_batch"):
        assert float(headline[key]) == quality[key]


def check_drift_charts(html: str, report: dict[str, Any]) -> None:
    bars = plotted(html, "drift-histogram")
    for side in ("a", "b"):
        name = f"{side}: {report[f'version_{side}']}"
        assert [int(p["data-value"]) for p in bars if p["data-series"] == name] == report[
            "histogram"
        ][side]
    points = plotted(html, "kill-rate")
    shown = sorted((p["data-series"], float(p["data-value"])) for p in points)
    expected = sorted(
        (f"{r['source']} · {r['version']}", r["kill_rate"]) for r in report["kill_rate_over_time"]
    )
    assert shown == expected
    ks = "" if report["ks"] is None else report["ks"]
    assert f'data-key="ks" data-value="{ks}"' in html


def test_quality_charts_plot_the_report() -> None:
    html = quality_sections(1, QUALITY)
    check_quality_charts(html, QUALITY)
    assert "<b>web</b>" not in html
    # the threshold and the batch lag are drawn as reference lines
    assert 'data-label="batch lag" data-value="4.0"' in html
    assert 'data-label="threshold" data-value="0.1"' in html
    assert 'data-label="web target" data-value="0.75"' in html


def test_drift_charts_plot_the_report() -> None:
    html = drift_sections(DRIFT)
    check_drift_charts(html, DRIFT)
    assert "<b>web</b>" not in html and "&lt;b&gt;web&lt;/b&gt;" in html


def test_drift_page_draws_the_drift_report(client: TestClient) -> None:
    try:
        from service.drift import drift_report
    except ImportError:
        pytest.skip("service.drift not merged yet")
    assert client.get("/dashboard/drift").status_code == 200  # the form alone
    bad = client.get("/dashboard/drift", params={"filter": "no such", "a": "1", "b": "2"})
    assert bad.status_code == 422 and "<form" in bad.text
    missing = client.get("/dashboard/drift", params={"filter": "aesthetic", "a": "1", "b": "99"})
    assert missing.status_code == 404
    params = {"filter": "aesthetic", "a": "1", "b": "2", "threshold": "4.0"}
    r = client.get("/dashboard/drift", params=params)
    assert r.status_code == 200, r.text[-500:]
    services = client.app.state.services  # type: ignore[attr-defined]
    check_drift_charts(r.text, drift_report(services, "aesthetic", "1", "2", threshold=4.0))


# -- headless Chromium ------------------------------------------------------------------
def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHROMIUM, *BROWSER_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.browser
def test_chart_pages_in_headless_chromium(
    lake: tuple[Settings, VidlakeCatalog], tmp_path: Path
) -> None:
    """The browser's DOM carries the snapshot's, quality report's and drift report's
    numbers on the plotted elements, and the snapshot page renders (a non-blank PNG)."""
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"headless Chromium not found at {CHROMIUM}: see test_dashboard.py")
    static = tmp_path / "charts.html"
    css = (Path(__file__).parents[2] / "service" / "static" / "dashboard.css").read_text()
    static.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><style>{css}</style></head><body>"
        f"<main>{quality_sections(1, QUALITY)}{drift_sections(DRIFT)}</main></body></html>"
    )
    profile = tmp_path / "profile"
    shot = tmp_path / "snapshot.png"
    with serve(create_app(lake[0], catalog=lake[1])) as url:
        page = _chromium("--dump-dom", f"{url}/dashboard/snapshots/1", profile=profile)
        _chromium(
            f"--screenshot={shot}",
            "--window-size=1280,1600",
            f"{url}/dashboard/snapshots/1",
            profile=profile,
        )
    charts = _chromium("--dump-dom", static.as_uri(), profile=profile)
    assert page.returncode == 0 and charts.returncode == 0, page.stderr[-2000:]
    check_snapshot_charts(page.stdout, _snapshot(lake[1]))
    check_quality_charts(charts.stdout, QUALITY)
    check_drift_charts(charts.stdout, DRIFT)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_a_first_format_snapshot_still_draws(world: World) -> None:
    """Snapshots written before per-phase shares and bucket keys: the overall shares
    and the bucket counts as they were recorded, no failure."""
    with TestClient(create_app(world.settings(), catalog=world.catalog)) as c:
        r = c.get(f"/dashboard/snapshots/{world.versions[0]}")
    assert r.status_code == 200
    snap = dict(world.registry.get(world.versions[0]).snapshot)
    v = world.versions[0]
    shares = {p["data-label"]: float(p["data-value"]) for p in plotted(r.text, f"shares-v{v}-all")}
    assert shares == snap["stream_shares"]
    buckets = {p["data-label"]: int(p["data-value"]) for p in plotted(r.text, f"buckets-v{v}")}
    assert buckets == snap["bucket_histogram"]
    funnel = {p["data-label"]: int(p["data-value"]) for p in plotted(r.text, f"funnel-v{v}")}
    assert funnel["samples"] == snap["counts"]["samples"]
