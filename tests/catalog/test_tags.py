"""Version tags: ``vidlake-v{N}`` on the snapshots a version read, with retention."""

from __future__ import annotations

from pathlib import Path

import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import InvalidInput
from catalog.tags import VersionTags, parse_version_tag, version_tag
from tests.catalog.test_catalog import aid, asset, clip

DAY = 86_400_000


@pytest.fixture
def cat(tmp_path: Path) -> VidlakeCatalog:
    opened = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path, eval_fraction=0.0))
    opened.add_assets([asset(i) for i in range(4)])
    opened.add_clips([clip(aid(i)) for i in range(4)])
    return opened


def _ts(cat: VidlakeCatalog, table: str, sid: int) -> int:
    snap = cat.iceberg_table(table).metadata.snapshot_by_id(sid)
    assert snap is not None
    return snap.timestamp_ms


def test_names_round_trip_and_bad_versions_are_refused() -> None:
    assert version_tag(7) == "vidlake-v7" and parse_version_tag("vidlake-v7") == 7
    assert parse_version_tag("main") is None and parse_version_tag("vidlake-v7x") is None
    with pytest.raises(InvalidInput):
        version_tag(-1)


def test_a_pinned_version_tags_every_nonempty_table_forever(cat: VidlakeCatalog) -> None:
    pin = cat.pin()
    report = cat.tag_versions([VersionTags(1, dict(pin), None)])
    assert report.created == {"assets": ["vidlake-v1"], "clips": ["vidlake-v1"]}
    for table in ("assets", "clips"):
        assert cat.version_tags(table) == {1: pin[table]}
        ref = cat.iceberg_table(table).metadata.refs["vidlake-v1"]
        assert ref.max_ref_age_ms is None  # never expires
    assert cat.version_tags("scores") == {}  # empty table: nothing to tag
    # the tag keeps the snapshot readable after main moves on
    cat.add_assets([asset(9)])
    tbl = cat.iceberg_table("assets")
    snap = tbl.snapshot_by_name("vidlake-v1")
    assert snap is not None and snap.snapshot_id == pin["assets"]
    assert tbl.scan(snapshot_id=snap.snapshot_id).to_arrow().num_rows == 4
    assert cat.tagged_snapshot_ids("assets") == {pin["assets"], cat.current_snapshot_id("assets")}


def test_retagging_is_idempotent_and_commits_nothing(cat: VidlakeCatalog) -> None:
    pin = dict(cat.pin())
    cat.tag_versions([VersionTags(1, pin, None)])
    metadata = cat.locations("assets")[0]
    again = cat.tag_versions([VersionTags(1, pin, None)])
    assert again.created == {} and again.updated == {}
    assert cat.locations("assets")[0] == metadata


def test_an_unpinned_version_ages_and_expired_tags_are_dropped(cat: VidlakeCatalog) -> None:
    pin = dict(cat.pin())
    ts = _ts(cat, "assets", pin["assets"])  # type: ignore[arg-type]
    cat.tag_versions([VersionTags(2, pin, None)])  # pinned first
    keep_until = ts + 30 * DAY
    report = cat.tag_versions([VersionTags(2, pin, keep_until)], now_ms=ts)  # then unpinned
    assert report.updated["assets"] == ["vidlake-v2"]
    ref = cat.iceberg_table("assets").metadata.refs["vidlake-v2"]
    assert ref.max_ref_age_ms == 30 * DAY
    assert pin["assets"] in cat.tagged_snapshot_ids("assets", now_ms=ts + 29 * DAY)
    cat.add_assets([asset(9)])  # main moves on: only the tag held the old snapshot
    assert pin["assets"] not in cat.tagged_snapshot_ids("assets", now_ms=ts + 31 * DAY)
    assert cat.drop_aged_tags(now_ms=ts + 29 * DAY).removed == {}
    dropped = cat.drop_aged_tags(now_ms=ts + 31 * DAY)
    assert dropped.removed == {"assets": ["vidlake-v2"], "clips": ["vidlake-v2"]}
    assert cat.version_tags("assets") == {}
    # a version past its retention is not tagged again (the backfill cannot revive it)
    late = cat.tag_versions([VersionTags(2, pin, keep_until)], now_ms=ts + 31 * DAY)
    assert late.created == {} and cat.version_tags("assets") == {}


def test_a_snapshot_the_table_no_longer_holds_is_reported_missing(cat: VidlakeCatalog) -> None:
    report = cat.tag_versions([VersionTags(3, {"assets": 12345}, None)])
    assert report.missing == {"assets": ["vidlake-v3"]} and cat.version_tags("assets") == {}


def test_unknown_tables_are_refused_and_nothing_is_tagged(cat: VidlakeCatalog) -> None:
    pin = dict(cat.pin())
    with pytest.raises(InvalidInput, match="unknown tables"):
        cat.tag_versions([VersionTags(1, pin, None), VersionTags(2, {"nope": 1}, None)])
    assert cat.version_tags("assets") == {}
    with pytest.raises(InvalidInput, match="non-negative"):
        cat.tag_versions([VersionTags(1, pin, None), VersionTags(-2, pin, None)])
    assert cat.version_tags("assets") == {}


def test_a_commit_between_load_and_tag_keeps_both(
    cat: VidlakeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table.update.snapshot import ManageSnapshots

    pin = dict(cat.pin())
    real = ManageSnapshots.commit
    calls = {"n": 0}

    def racing(self: ManageSnapshots) -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            cat.add_assets([asset(8)])  # another writer commits first
        if calls["n"] == 2:
            raise CommitFailedException("lost the race")
        return real(self)

    monkeypatch.setattr(ManageSnapshots, "commit", racing)
    cat.tag_versions([VersionTags(1, pin, None)])
    assert cat.version_tags("assets") == {1: pin["assets"]}
    assert cat.version_tags("clips") == {1: pin["clips"]}  # retried after the lost race
    assert cat.row_count("assets") == 5  # the other writer's commit survives the tag
    assert calls["n"] == 3
