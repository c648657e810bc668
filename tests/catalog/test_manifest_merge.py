"""Manifest merging on the fast append (``catalog/manifest_merge.py``): the manifest list
stays bounded as the table ages, and every old snapshot, incremental append scan,
concurrent writer, crash and independent reader sees what it saw before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import ManifestContent, ManifestEntryStatus, ManifestFile
from pyiceberg.table import Table

from catalog import _append, idempotency, manifest_merge
from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.maintenance.orphans import remove_orphans, unreferenced_files
from tests.catalog._duckdb_reader import duckdb_read, reader_or_skip
from tests.catalog.test_append_commit import _assets, _clip_ids, _rows, _scores

MIN_COUNT = 4


@pytest.fixture
def cat(tmp_path: Path) -> VidlakeCatalog:
    c = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path, eval_fraction=0.0))
    c.add_assets(_assets(5))
    with c.iceberg_table("scores").transaction() as tx:
        tx.set_properties({"commit.manifest.min-count-to-merge": str(MIN_COUNT)})
    return c


def _entries(tbl: Table, sid: int | None = None) -> dict[str, tuple[Any, ...]]:
    """data file → (status, snapshot id, sequence number, file sequence number)."""
    snap = tbl.metadata.snapshot_by_id(sid) if sid else tbl.metadata.current_snapshot()
    assert snap is not None
    return {
        e.data_file.file_path: (e.status, e.snapshot_id, e.sequence_number, e.file_sequence_number)
        for m in snap.manifests(tbl.io)
        for e in m.fetch_manifest_entry(tbl.io, discard_deleted=False)
    }


def _manifests(tbl: Table, sid: int | None = None) -> list[ManifestFile]:
    snap = tbl.metadata.snapshot_by_id(sid) if sid else tbl.metadata.current_snapshot()
    assert snap is not None
    return snap.manifests(tbl.io)


def _sorted(t: pa.Table) -> list[dict[str, Any]]:
    return sorted(t.to_pylist(), key=lambda r: (r["clip_id"], r["filter_name"]))


def _grow(cat: VidlakeCatalog, ids: pa.Array, n: int) -> list[int]:
    sids = []
    for i in range(n):
        cat.add_scores(_scores(ids, f"f{i}"))
        sid = cat.iceberg_table("scores").metadata.current_snapshot_id
        assert sid is not None
        sids.append(sid)
    return sids


def _digit_sum(n: int, base: int) -> int:
    return n % base + _digit_sum(n // base, base) if n else 0


def test_the_manifest_list_stays_bounded_as_appends_go_on(cat: VidlakeCatalog) -> None:
    ids = _clip_ids(cat, 20)
    counts = []
    for i in range(4 * MIN_COUNT):
        cat.add_scores(_scores(ids, f"f{i}"))
        tbl = cat.iceberg_table("scores")
        snap = tbl.metadata.current_snapshot()
        assert snap is not None
        counts.append(len(snap.manifests(tbl.io)))
    # Tiers of MIN_COUNT: after n one-file commits the list holds as many manifests as
    # n's digits in base MIN_COUNT add up to (a fast append alone: n).
    assert counts == [_digit_sum(n, MIN_COUNT) for n in range(1, 4 * MIN_COUNT + 1)]
    assert counts[-1] == 1 and max(counts) == 2 * (MIN_COUNT - 1)
    assert cat.scan("scores").num_rows == 20 * 4 * MIN_COUNT
    # A merged table holds no file twice and no orphan manifest of a merged commit.
    assert [p for p, *_ in unreferenced_files(cat.iceberg_table("scores"))] == []


def test_merged_entries_keep_their_snapshot_and_sequence_numbers(cat: VidlakeCatalog) -> None:
    ids = _clip_ids(cat, 10)
    sids = _grow(cat, ids, MIN_COUNT**2)  # the last commit merges twice (a carry)
    tbl = cat.iceberg_table("scores")
    first_seen: dict[str, tuple[Any, ...]] = {}
    for sid in sids:  # each file as the snapshot that added it listed it
        for path, (status, snap_id, seq, file_seq) in _entries(tbl, sid).items():
            if status == ManifestEntryStatus.ADDED and snap_id == sid:
                first_seen[path] = (snap_id, seq, file_seq)
    now = _entries(tbl)
    assert set(now) == set(first_seen)
    for path, (_, snap_id, seq, file_seq) in now.items():  # the adding commit's number
        added_by = tbl.metadata.snapshot_by_id(snap_id)
        assert added_by is not None and seq == file_seq == added_by.sequence_number, path
    assert {path: v[1:] for path, v in now.items()} == first_seen
    snap = tbl.metadata.current_snapshot()
    assert snap is not None
    carried = 0
    for m in snap.manifests(tbl.io):  # a manifest adds only its own snapshot's files
        for e in m.fetch_manifest_entry(tbl.io):
            own = e.snapshot_id == m.added_snapshot_id
            assert e.status == (ManifestEntryStatus.ADDED if own else ManifestEntryStatus.EXISTING)
            carried += not own
    assert carried > 0  # merged: older files carried as EXISTING, not re-added


def test_every_old_snapshot_and_incremental_scan_reads_the_same_rows(
    cat: VidlakeCatalog,
) -> None:
    ids = _clip_ids(cat, 10)
    seen: dict[int, list[dict[str, Any]]] = {}
    sids = []
    for i in range(3 * MIN_COUNT):
        cat.add_scores(_scores(ids, f"f{i}"))
        tbl = cat.iceberg_table("scores")
        sid = tbl.metadata.current_snapshot_id
        assert sid is not None
        sids.append(sid)
        seen[sid] = _sorted(tbl.scan(snapshot_id=sid).to_arrow())
    tbl = cat.iceberg_table("scores")
    assert len(_entries(tbl)) == len(sids) > len(_manifests(tbl))  # merges happened
    for sid, rows in seen.items():
        assert _sorted(tbl.scan(snapshot_id=sid).to_arrow()) == rows
    # The key index advances a view by the appends between two snapshots: over a
    # merge, exactly the batches appended in that range, once each.
    for lo, hi in ((0, MIN_COUNT + 1), (2, 3 * MIN_COUNT - 1), (MIN_COUNT - 1, MIN_COUNT)):
        got = tbl.incremental_append_scan(
            from_snapshot_id_exclusive=sids[lo], to_snapshot_id_inclusive=sids[hi]
        ).to_arrow()
        names = sorted(got["filter_name"].to_pylist())
        assert names == sorted(f"f{i}" for i in range(lo + 1, hi + 1) for _ in range(10))


def test_a_merge_that_loses_a_commit_race_leaves_nothing_and_the_catalog_retries(
    cat: VidlakeCatalog, tmp_path: Path
) -> None:
    ids = _clip_ids(cat, 10)
    _grow(cat, ids, MIN_COUNT - 1)  # the next append merges
    stale = cat.iceberg_table("scores")
    cat.add_scores(_scores(ids, "fother"))  # moves the branch
    warehouse = tmp_path / "warehouse"
    before = set(warehouse.rglob("scores/metadata/*")) | set(warehouse.rglob("*.parquet"))
    with pytest.raises(CommitFailedException):
        _append.append(stale, _rows(stale, _scores(ids, "late")), {})
    after = set(warehouse.rglob("scores/metadata/*")) | set(warehouse.rglob("*.parquet"))
    assert after == before  # no data file, merged manifest or list left behind
    assert cat.add_scores(_scores(ids, "late"), idempotency_key="k-late").inserted == 10
    tbl = cat.iceberg_table("scores")
    snap = tbl.metadata.current_snapshot()
    assert snap is not None and snap.summary is not None
    assert snap.summary[idempotency.PROP_KEY] == "k-late"  # the summary stays on merges
    assert len(snap.manifests(tbl.io)) < MIN_COUNT
    assert cat.scan("scores").num_rows == 10 * (MIN_COUNT + 1)
    assert cat.add_scores(_scores(ids, "late"), idempotency_key="k-late").replayed


def test_a_crash_before_the_commit_leaves_only_orphans_maintenance_removes(
    cat: VidlakeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _clip_ids(cat, 10)
    _grow(cat, ids, MIN_COUNT - 1)
    tbl = cat.iceberg_table("scores")
    rows = _scores(ids, "crash")

    def crash(*args: object) -> None:
        raise OSError("killed")  # as if the process died before the catalog row moved

    monkeypatch.setattr(_append, "sql_commit", crash)
    with pytest.raises(OSError):
        _append.append(tbl, _rows(tbl, rows), {})
    monkeypatch.undo()
    tbl = cat.iceberg_table("scores")
    orphans = [p for p, *_ in unreferenced_files(tbl)]
    assert any(p.endswith("-m1.avro") for p in orphans)  # the merged manifest
    before = _sorted(cat.scan("scores"))
    assert remove_orphans(tbl, older_than_s=0)["orphans"] == len(orphans)
    assert unreferenced_files(cat.iceberg_table("scores")) == []
    assert _sorted(cat.scan("scores")) == before
    assert cat.add_scores(rows).inserted == 10  # and the next append merges cleanly


def test_duckdb_reads_merged_manifests_as_pyiceberg_does(
    cat: VidlakeCatalog, tmp_path: Path
) -> None:
    reader = reader_or_skip()
    ids = _clip_ids(cat, 10)
    sids = _grow(cat, ids, 2 * MIN_COUNT + 1)
    tbl = cat.iceberg_table("scores")
    assert len(_manifests(tbl, sids[MIN_COUNT - 1])) == 1  # that commit merged them all
    metadata = tbl.metadata_location.removeprefix("file://")
    picks = [sids[1], sids[MIN_COUNT - 1], None]  # before a merge, on one, the current
    got = duckdb_read(reader, [{"metadata": metadata, "snapshot_id": s} for s in picks], tmp_path)
    for sid, theirs in zip(picks, got, strict=True):
        ours = tbl.scan(snapshot_id=sid).to_arrow() if sid else tbl.scan().to_arrow()
        assert ours.num_rows > 0 and _sorted(theirs) == _sorted(ours), sid


def _m(files: int, length: int = 1000) -> ManifestFile:
    return ManifestFile.from_args(
        manifest_path=f"m-{files}-{length}.avro",
        manifest_length=length,
        partition_spec_id=0,
        content=ManifestContent.DATA,
        added_files_count=files,
        existing_files_count=0,
        deleted_files_count=0,
    )


def test_the_tier_rule() -> None:
    count = manifest_merge.merge_count
    assert count([_m(1)] * 3, 4, 1 << 20) == 0
    assert count([_m(1)] * 4, 4, 1 << 20) == 4  # four of tier 0
    assert count([_m(1), _m(4), _m(5), _m(1)], 4, 1 << 20) == 0  # tier 0 run is 1 long
    # Four of tier 1 with tier-0 passengers; the older tier-2 one is not in the run.
    tiers = [_m(1), _m(4), _m(2), _m(7), _m(15), _m(6), _m(16), _m(1)]
    assert count(tiers, 4, 1 << 20) == 6
    # Two or more reaching the target merge; a full manifest is never merged again.
    assert count([_m(1, 600), _m(1, 500)], 4, 1000) == 2
    assert count([_m(1, 1000)] * 8, 4, 1000) == 0
    assert count([_m(1), _m(1), _m(1), _m(1, 1000), _m(1)], 4, 1000) == 0


def test_merge_policy_properties() -> None:
    assert manifest_merge.policy({}) == (True, manifest_merge.MIN_COUNT_DEFAULT, 8 << 20)
    props = {
        "commit.manifest-merge.enabled": "false",
        "commit.manifest.min-count-to-merge": "1",
        "commit.manifest.target-size-bytes": "4096",
    }
    assert manifest_merge.policy(props) == (False, 2, 4096)
    for bad in (
        {"commit.manifest.min-count-to-merge": "0"},
        {"commit.manifest-merge.enabled": "x"},
    ):
        with pytest.raises(ValueError):
            manifest_merge.policy(bad)


def test_merging_off_keeps_every_manifest(cat: VidlakeCatalog) -> None:
    with cat.iceberg_table("scores").transaction() as tx:
        tx.set_properties({"commit.manifest-merge.enabled": "false"})
    ids = _clip_ids(cat, 5)
    _grow(cat, ids, MIN_COUNT + 1)
    assert len(_manifests(cat.iceberg_table("scores"))) == MIN_COUNT + 1
