"""Lake maintenance (catalog.maintenance): compaction, manifest rewrite, expiry and
orphan removal change how a table is stored, never what any pinned read returns."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import InvalidInput
from catalog.maintenance import MaintainOptions, maintain
from catalog.maintenance.compact import compact_table
from catalog.maintenance.orphans import referenced_paths
from catalog.pins import Pin
from service.demo.corpus import generate_corpus

NOW = MaintainOptions(retention_s=0, orphan_age_s=0)
SCORE_COLUMNS = ("clip_id", "filter_name", "filter_version", "score", "job_id", "computed_at")


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by([(c, "ascending") for c in t.column_names if c in SCORE_COLUMNS])


def small_commits(catalog: VidlakeCatalog, n: int, start: int = 0) -> None:
    """``n`` one-row score commits (two partitions), like a producer feeding daily."""
    clips = catalog.scan("clips", columns=["clip_id"])["clip_id"].to_pylist()
    for i in range(start, start + n):
        catalog.add_scores(
            [
                {
                    "clip_id": clips[i % len(clips)],
                    "filter_name": ("aesthetic", "motion")[i % 2],
                    "filter_version": "1",
                    "score": float(i),
                }
            ]
        )


@pytest.fixture
def lake(tmp_path: Path) -> VidlakeCatalog:
    catalog = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path / "lake", eval_salt="00" * 16))
    generate_corpus(catalog, assets=10, seed=1)
    small_commits(catalog, 24)
    return catalog


def _files(catalog: VidlakeCatalog, table: str) -> int:
    return len(list(catalog.iceberg_table(table).scan().plan_files()))


def test_compaction_keeps_every_row_and_every_pinned_read(lake: VidlakeCatalog) -> None:
    pin = lake.pin()
    rows = _sorted(lake.scan("scores", include_eval=True))
    files = _files(lake, "scores")
    report = maintain(lake, {"scores": {pin["scores"]}}, NOW)  # type: ignore[arg-type]
    scores = report["tables"]["scores"]
    assert scores["compaction"]["files_removed"] >= 20
    assert scores["after"]["data_files"] <= files // 5
    assert scores["after"]["manifests"] <= 2 < scores["before"]["manifests"]
    assert _sorted(lake.scan("scores", include_eval=True)).equals(rows)
    assert _sorted(lake.scan("scores", pin=pin, include_eval=True)).equals(rows)
    for table in ("assets", "clips", "latents"):
        assert lake.scan(table, pin=pin).num_rows == lake.scan(table).num_rows


def test_a_rerun_changes_nothing(lake: VidlakeCatalog) -> None:
    maintain(lake, {}, NOW)
    snaps = {t: lake.snapshot_ids(t) for t in ("scores", "clips")}
    again = maintain(lake, {}, NOW)
    assert again["totals"]["snapshots_expired"] == 0
    assert again["totals"]["orphans_removed"] == 0
    assert {t: lake.snapshot_ids(t) for t in snaps} == snaps


def test_expiry_spares_kept_tagged_current_and_young_snapshots(lake: VidlakeCatalog) -> None:
    ids = lake.snapshot_ids("scores")
    kept, tagged = ids[3], ids[5]
    tbl = lake.iceberg_table("scores")
    tbl.manage_snapshots().create_tag(snapshot_id=tagged, tag_name="vidlake-v9").commit()
    young = maintain(lake, {"scores": {kept}}, MaintainOptions(orphan_age_s=0))
    assert young["tables"]["scores"]["snapshots_expired"] == 0
    maintain(lake, {"scores": {kept}}, NOW)
    left = set(lake.snapshot_ids("scores"))
    assert {kept, tagged, lake.current_snapshot_id("scores")} <= left
    assert len(left) == 3
    pin = Pin({"scores": kept})
    assert lake.scan("scores", pin=pin).num_rows > 0


def test_orphans_younger_than_the_safety_age_stay(lake: VidlakeCatalog) -> None:
    _, location = lake.locations("scores")
    data = Path(location.removeprefix("file://")) / "data"
    old, young = data / "crashed-old.parquet", data / "crashed-young.parquet"
    for path in (old, young):
        path.write_bytes(b"PAR1 truncated")
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    report = maintain(lake, {}, MaintainOptions(tables=("scores",), orphan_age_s=600))
    assert not old.exists() and young.exists()
    assert report["tables"]["scores"]["orphans"]["young"] >= 1


def test_orphan_removal_keeps_every_referenced_file(lake: VidlakeCatalog) -> None:
    maintain(lake, {}, NOW)
    for table in ("scores", "clips", "latents"):
        tbl = lake.iceberg_table(table)
        for path in referenced_paths(tbl):
            assert Path(path).exists(), path
        assert lake.scan(table, include_eval=True).num_rows == tbl.scan().to_arrow().num_rows


def test_a_concurrent_ingest_wins_and_compaction_leaves_no_file(lake: VidlakeCatalog) -> None:
    stale = lake.iceberg_table("scores")
    rows = lake.scan("scores", include_eval=True).num_rows
    small_commits(lake, 1, start=100)
    _, location = lake.locations("scores")
    before = set(Path(location.removeprefix("file://")).rglob("*"))
    done = compact_table(stale, sort_by=("clip_id",), target_bytes=2**20)
    assert done["conflict"] is True
    assert set(Path(location.removeprefix("file://")).rglob("*")) == before
    assert lake.scan("scores", include_eval=True).num_rows == rows + 1


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"retention_s": -1}, "retention_s"),
        ({"retain_last": 0}, "retain_last"),
        ({"target_file_bytes": 10}, "target_file_bytes"),
        ({"tables": ("nope",)}, "tables"),
    ],
)
def test_bad_options_are_refused(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        MaintainOptions(**kw)
    assert err.value.details["field"] == field


def test_expiry_keeps_the_events_commit_of_every_planned_assets_snapshot(
    lake: VidlakeCatalog,
) -> None:
    # An events commit expired while its assets snapshot lives would look missing to
    # the next ingest, which would append the link events a second time.
    events_before = lake.scan("asset_events", include_eval=True).num_rows
    assert events_before > 0  # the corpus has near-duplicates
    asset = lake.scan("assets", columns=["asset_id"])["asset_id"][0].as_py()
    lake.add_asset_events([{"asset_id": asset, "event": "quarantined", "reason": "test"}])
    maintain(lake, {}, NOW)
    assert len(lake.snapshot_ids("asset_events")) == 2
    reopened = VidlakeCatalog.open(lake.config)  # a fresh process's view of the keys
    reopened.add_asset_events([{"asset_id": asset, "event": "released", "reason": "test"}])
    assert reopened.scan("asset_events", include_eval=True).num_rows == events_before + 2


def test_compaction_carries_kept_files_as_existing_with_their_own_snapshots(
    lake: VidlakeCatalog,
) -> None:
    """A replace commit lists the files it kept as EXISTING under the snapshot that added
    them (Iceberg's rule): only its own rewritten files are ADDED by it, so incremental
    readers and the manifests' added-file counts see what it really added."""
    from pyiceberg.manifest import ManifestEntryStatus

    tbl = lake.iceberg_table("clips")  # one big data file: kept, not rewritten
    added_by = {
        e.data_file.file_path: e.snapshot_id
        for m in tbl.current_snapshot().manifests(io=tbl.io)  # type: ignore[union-attr]
        for e in m.fetch_manifest_entry(tbl.io, discard_deleted=True)
    }
    report = compact_table(tbl, sort_by=("clip_id",), target_bytes=1, max_manifests=0)
    sid = report["snapshot_id"]
    assert isinstance(sid, int)
    tbl = lake.iceberg_table("clips")
    manifests = tbl.current_snapshot().manifests(io=tbl.io)  # type: ignore[union-attr]
    entries = [e for m in manifests for e in m.fetch_manifest_entry(tbl.io)]
    assert entries and {e.status for e in entries} == {ManifestEntryStatus.EXISTING}
    assert {e.data_file.file_path: e.snapshot_id for e in entries} == added_by
    assert sum(m.added_files_count or 0 for m in manifests) == 0
