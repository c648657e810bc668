"""Adding a column later must not break reads of old snapshots, nor ingest."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from pyiceberg.types import DoubleType, StringType

from catalog import rules
from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig


def _clip(asset_id: str, k: int, **extra: Any) -> dict[str, Any]:
    return {
        "asset_id": asset_id,
        "t_start_s": float(k),
        "t_end_s": k + 0.5,
        "split_version": "v1",
        "num_frames": 12,
        "width": 640,
        "height": 360,
        **extra,
    }


def test_added_columns_keep_old_snapshots_readable(tmp_path: Path) -> None:
    config = CatalogConfig.embedded(tmp_path, eval_fraction=0.0)
    with VidlakeCatalog.open(config) as cat:
        a = hashlib.sha256(b"evolving").hexdigest()
        cat.add_assets(
            [{"asset_id": a, "uri": "file:///a.mp4", "size": 1, "source_tier": "licensed"}]
        )
        cat.add_clips([_clip(a, k) for k in range(3)])
        old = cat.pin()
        old_columns = cat.scan("clips", old).column_names

        with cat.iceberg_table("clips").update_schema() as update:
            update.add_column("motion", DoubleType(), doc="mean optical flow")
            update.add_column("camera", StringType())

        # The old snapshot reads with the schema it was written with.
        then = cat.scan("clips", old)
        assert then.column_names == old_columns and then.num_rows == 3
        # The current state has the new columns, null for the old rows.
        now = cat.scan("clips")
        assert now.column_names == [*old_columns, "motion", "camera"]
        assert now["motion"].null_count == 3

        # New rows may carry the new columns through the ordinary ingest path.
        res = cat.add_clips([_clip(a, k, motion=0.25 * k, camera="static") for k in range(3, 6)])
        assert res.inserted == 3
        now = cat.scan("clips")
        assert now.num_rows == 6
        assert sorted(pc.drop_null(now["motion"]).to_pylist()) == [0.75, 1.0, 1.25]
        assert cat.scan("clips", old).num_rows == 3
        ids = cat.scan("clips", old, columns=["clip_id"])["clip_id"].to_pylist()
        assert sorted(ids) == sorted(rules.clip_id(a, float(k), k + 0.5, "v1") for k in range(3))

    # Reopening accepts the evolved table (its original columns are all still there).
    with VidlakeCatalog.open(config) as cat:
        assert "motion" in cat.iceberg_table("clips").schema().column_names
        assert cat.scan("clips", columns=["clip_id", "motion"]).num_rows == 6
