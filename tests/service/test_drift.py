"""Filter drift on the frozen reference slice: a planted shift shows, identical versions
do not; the REST route, both clients and ``vidlake drift`` answer the same shape."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import InvalidInput, NotFound
from service.app import create_app
from service.client import HttpClient
from service.client_local import LocalClient
from service.deps import Services
from service.drift import drift_report, ks_statistic, reference_slice
from service.settings import Settings
from tests.service.support import TestClient, assert_error

N_ASSETS = 40
DAY1 = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)
DAY2 = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, VidlakeCatalog]]:
    home = tmp_path_factory.mktemp("drift")
    config = CatalogConfig.embedded(home, eval_fraction=0.0, reference_fraction=0.5)
    catalog = VidlakeCatalog.open(config)
    assets = [
        {"asset_id": _sha(f"a{i}"), "uri": f"s3://raw/{i}.mp4", "size": 10,
         "source": "web" if i % 2 else "stock", "source_tier": "crawl"}
        for i in range(N_ASSETS)
    ] + [{"asset_id": _sha("eval"), "uri": "s3://raw/e.mp4", "size": 10, "source": "web",
          "source_tier": "crawl", "split": "eval"}]  # fmt: skip
    catalog.add_assets(assets)
    catalog.add_clips(
        [
            {
                "asset_id": a["asset_id"],
                "t_start_s": 2.0 * k,
                "t_end_s": 2.0 * k + 1,
                "split_version": "s1",
                "num_frames": 24,
                "width": 64,
                "height": 64,
                "fps": 24.0,
            }
            for a in assets
            for k in range(3)
        ]
    )
    clips = sorted(catalog.scan("clips", columns=["clip_id"])["clip_id"].to_pylist())
    rng = np.random.default_rng(3)
    base = rng.uniform(0.0, 1.0, len(clips))
    rows = []
    for i, c in enumerate(clips):
        at = DAY1 if i % 2 else DAY2
        for version, score in (("v1", base[i]), ("same", base[i]), ("shift", base[i] + 0.5)):
            rows.append({"clip_id": c, "filter_name": "aesthetic", "filter_version": version,
                         "score": float(score), "computed_at": at})  # fmt: skip
        if i % 5 < 3:  # a backfill that has reached 60 % of the clips
            rows.append({"clip_id": c, "filter_name": "aesthetic", "filter_version": "partial",
                         "score": float(base[i]), "computed_at": at})  # fmt: skip
    catalog.add_scores(rows)
    yield home, catalog
    catalog.close()


def test_ks_statistic_known_values() -> None:
    x = np.array([0.1, 0.2, 0.3, 0.4])
    assert ks_statistic(x, x) == 0.0
    assert ks_statistic(x, x + 10) == 1.0
    assert ks_statistic(x, np.array([0.15, 0.25, 0.35, 0.45])) == pytest.approx(0.25)
    assert ks_statistic(x, np.array([])) is None


def test_identical_versions_show_no_drift(lake: tuple[Path, VidlakeCatalog]) -> None:
    _, catalog = lake
    r = drift_report(catalog, "aesthetic", "v1", "same", threshold=0.5)
    assert r["ks"] == 0.0
    assert r["histogram"]["a"] == r["histogram"]["b"] and sum(r["histogram"]["a"]) > 0
    assert r["quantiles"]["a"] == r["quantiles"]["b"]
    assert r["coverage"] == {"a": 1.0, "b": 1.0}
    assert r["kill_rate"]["a"] == r["kill_rate"]["b"]


def test_planted_shift_shows(lake: tuple[Path, VidlakeCatalog]) -> None:
    _, catalog = lake
    r = drift_report(catalog, "aesthetic", "v1", "shift", threshold=0.5, bins=10)
    assert r["ks"] is not None and r["ks"] > 0.3
    assert len(r["histogram"]["edges"]) == 11
    assert all(b > a for a, b in zip(r["quantiles"]["a"], r["quantiles"]["b"], strict=True))
    assert r["kill_rate"]["b"] == 0.0 < r["kill_rate"]["a"]


def test_slice_is_the_frozen_train_sample(lake: tuple[Path, VidlakeCatalog]) -> None:
    _, catalog = lake
    r = drift_report(catalog, "aesthetic", "v1", "same")
    members = reference_slice(catalog, clips=True)
    expected = [
        a for a in (_sha(f"a{i}") for i in range(N_ASSETS)) if catalog.reference.contains([a])[0]
    ]
    assert members["assets"] == sorted(expected) and 0 < len(expected) < N_ASSETS
    assert _sha("eval") not in members["assets"]
    assert r["slice"] == {"assets": len(expected), "clips": 3 * len(expected)}
    assert len(members["clips"]) == 3 * len(expected)
    assert sum(r["histogram"]["a"]) == r["slice"]["clips"]
    assert r["kill_rate"] is None and r["kill_rate_over_time"] == []


def test_coverage_of_a_partial_backfill(lake: tuple[Path, VidlakeCatalog]) -> None:
    _, catalog = lake
    r = drift_report(catalog, "aesthetic", "v1", "partial")
    assert r["coverage"]["a"] == 1.0
    assert 0.3 < r["coverage"]["b"] < 0.9  # 60 % of all clips; the slice is a sample


def test_kill_rate_per_source_per_day(lake: tuple[Path, VidlakeCatalog]) -> None:
    _, catalog = lake
    r = drift_report(catalog, "aesthetic", "v1", "shift", threshold=0.5)
    rows = r["kill_rate_over_time"]
    assert {(x["source"], x["day"]) for x in rows} == {
        (s, d) for s in ("stock", "web") for d in ("2026-11-30", "2026-12-01")
    }
    assert sum(x["clips"] for x in rows if x["version"] == "v1") == 3 * N_ASSETS  # every train clip
    assert all(x["kill_rate"] == 0.0 for x in rows if x["version"] == "shift")
    assert rows == sorted(rows, key=lambda x: (x["source"], x["day"], x["version"]))


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("Bad-Name", "v1", "same"), InvalidInput),
        (("aesthetic", "v1", "v9"), NotFound),
        (("nothing", "v1", "v2"), NotFound),
        (("aesthetic", "v1", " "), InvalidInput),
    ],
)
def test_bad_arguments(
    lake: tuple[Path, VidlakeCatalog], args: tuple[str, str, str], error: type[Exception]
) -> None:
    with pytest.raises(error):
        drift_report(lake[1], *args)


def test_rest_and_both_clients(lake: tuple[Path, VidlakeCatalog]) -> None:
    home, catalog = lake
    settings = Settings(home=home)
    with TestClient(create_app(settings, catalog=catalog)) as http:
        r = http.get("/v1/drift/aesthetic", params={"a": "v1", "b": "shift", "threshold": 0.5})
        assert r.status_code == 200, r.text
        assert r.json() == drift_report(catalog, "aesthetic", "v1", "shift", threshold=0.5)
        assert_error(
            http.get("/v1/drift/aesthetic", params={"a": "v1", "b": "v9"}), 404, "not_found"
        )
        assert_error(
            http.get("/v1/drift/aesthetic", params={"a": "v1", "b": "same", "bins": 0}),
            422,
            "invalid_input",
        )
        remote = HttpClient("http://testserver", http=http)
        via_http = remote.drift("aesthetic", "v1", "same", bins=5)
        assert remote.reference_slice()["assets"] == reference_slice(catalog)["assets"]
    local = LocalClient(settings, services=Services(settings, catalog=catalog))
    assert local.drift("aesthetic", "v1", "same", bins=5) == via_http
    assert local.reference_slice(clips=True) == reference_slice(catalog, clips=True)


def test_bad_threshold_and_bins(lake: tuple[Path, VidlakeCatalog]) -> None:
    with pytest.raises(InvalidInput, match="threshold must be finite"):
        drift_report(lake[1], "aesthetic", "v1", "same", threshold=float("nan"))
    with pytest.raises(InvalidInput, match="bins"):
        drift_report(lake[1], "aesthetic", "v1", "same", bins=0)
