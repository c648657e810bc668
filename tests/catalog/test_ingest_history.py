"""``ingest_history``: each commit's time and record counts, from snapshot summaries."""

from __future__ import annotations

import time
from pathlib import Path

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig


def test_each_commit_is_one_point_with_its_added_records(tmp_path: Path) -> None:
    before = int(time.time() * 1000)
    with VidlakeCatalog.open(CatalogConfig.embedded(tmp_path, eval_fraction=0.0)) as catalog:
        assert catalog.ingest_history("assets") == []
        for batch in range(2):
            rows = [
                {
                    "asset_id": f"{batch}{i:063x}",
                    "uri": f"s3://raw/{batch}-{i}.mp4",
                    "size": 10,
                    "source": "stock",
                    "source_tier": "licensed",
                }
                for i in range(3 + batch)
            ]
            catalog.add_assets(rows)
        history = catalog.ingest_history("assets")
        assert [p.added_records for p in history] == [3, 4]
        assert all(p.operation == "append" and p.deleted_records == 0 for p in history)
        stamps = [p.timestamp_ms for p in history]
        assert stamps == sorted(stamps) and stamps[0] >= before - 1000
        assert sum(p.added_records for p in history) == catalog.row_count("assets")
