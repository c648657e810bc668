"""A hard takedown after compaction: the files compaction replaced are still named by
kept (registered, pinned) snapshots, so the erasure must find the asset's rows there
too, not only in the current snapshot's files."""

from __future__ import annotations

from pathlib import Path

from catalog.config import CatalogConfig
from catalog.maintenance import MaintainOptions, maintain
from service.maintenance import registered_snapshot_ids
from tests.catalog.test_erase import NO_HITS, Lake, lake_hits


def test_erase_after_compaction_leaves_no_marker(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    lake = Lake(root, CatalogConfig.embedded(root, eval_salt="00" * 16), tombstone=False)
    others = [
        c
        for c in lake.catalog.scan("clips", columns=["clip_id"])["clip_id"].to_pylist()
        if c not in lake.clips
    ][:4]
    for clip in others:  # small commits in the marker's partition: compaction merges them
        lake.catalog.add_captions(
            [{"clip_id": clip, "caption_version": "3", "kind": "dense", "text": f"plain {clip}"}]
        )
    report = maintain(
        lake.catalog,
        registered_snapshot_ids(lake.registry),
        MaintainOptions(retention_s=0, orphan_age_s=0),
    )
    assert report["tables"]["captions"]["compaction"]["files_removed"] >= 2
    lake.catalog.add_tombstones([{"asset_id": lake.asset, "reason": "test", "kind": "hard"}])
    lake.erase(requested_by="legal")
    assert lake_hits(lake) == NO_HITS
