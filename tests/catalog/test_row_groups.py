"""Rows per Parquet row group (``catalog/row_groups.py``): the point-lookup tables get
small ones at creation, and an old catalog's tables get them on their next write."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from catalog import row_groups, rules
from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.row_groups import LOOKUP_ROWS, PROPERTY, SCAN_ROWS

N = LOOKUP_ROWS + 3_000  # one batch that spans two lookup-sized row groups


def _assets(n: int) -> pa.Table:
    ids = [hashlib.sha256(f"a{i}".encode()).hexdigest() for i in range(n)]
    return pa.table(
        {
            "asset_id": ids,
            "uri": [f"s3://raw/{a}.mp4" for a in ids],
            "size": np.full(n, 1000, dtype=np.int64),
            "source_tier": ["crawl"] * n,
        }
    )


def _clips(asset_ids: list[str], n: int, start: int = 0) -> pa.Table:
    k = np.arange(start, start + n)
    t0 = k * 4.0
    table = pa.table(
        {
            "asset_id": [asset_ids[i % len(asset_ids)] for i in k],
            "t_start_s": t0,
            "t_end_s": t0 + 2.5,
            "split_version": ["v1"] * n,
            "num_frames": np.full(n, 60, dtype=np.int32),
            "width": np.full(n, 640, dtype=np.int32),
            "height": np.full(n, 360, dtype=np.int32),
        }
    )
    ids = rules.clip_ids(table["asset_id"], t0, t0 + 2.5, table["split_version"])
    return table.add_column(0, "clip_id", ids)


def _row_groups(cat: VidlakeCatalog, table: str) -> list[int]:
    """Rows of every row group of every live data file of ``table``."""
    sizes = []
    for task in cat.iceberg_table(table).scan().plan_files():
        meta = pq.ParquetFile(task.file.file_path.removeprefix("file://")).metadata
        sizes += [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    return sizes


def test_new_catalog_writes_lookup_tables_in_small_row_groups(tmp_path: Path) -> None:
    with VidlakeCatalog.open(CatalogConfig.embedded(tmp_path, eval_fraction=0.0)) as cat:
        assets = _assets(N)
        cat.add_assets(assets)
        cat.add_clips(_clips(assets["asset_id"].to_pylist(), N))
        for table in ("assets", "clips"):
            sizes = _row_groups(cat, table)
            assert sum(sizes) == N and max(sizes) == LOOKUP_ROWS and len(sizes) == 2
            assert cat.iceberg_table(table).properties[PROPERTY] == str(LOOKUP_ROWS)
        for table in ("scores", "captions", "latents"):
            assert cat.iceberg_table(table).properties[PROPERTY] == str(SCAN_ROWS)


def test_an_old_catalog_gets_the_limit_on_its_next_write(tmp_path: Path) -> None:
    config = CatalogConfig.embedded(tmp_path, eval_fraction=0.0)
    assets = _assets(64)
    with VidlakeCatalog.open(config) as cat:
        cat.add_assets(assets)
        # A catalog from before the limit: no property, i.e. pyiceberg's 1M rows.
        tx = cat.iceberg_table("clips").transaction()
        tx.remove_properties(PROPERTY)
        tx.commit_transaction()
        assert PROPERTY not in cat.iceberg_table("clips").properties
    with VidlakeCatalog.open(config) as cat:
        cat.add_clips(_clips(assets["asset_id"].to_pylist(), N))
        assert max(_row_groups(cat, "clips")) == LOOKUP_ROWS
        assert cat.iceberg_table("clips").properties[PROPERTY] == str(LOOKUP_ROWS)
        assert cat.scan("clips").num_rows == N


def test_stale_and_capped_limits() -> None:
    clips = {"vidlake.table": "clips"}
    assert row_groups.stale(clips) == {PROPERTY: str(LOOKUP_ROWS)}
    assert row_groups.row_group_rows(clips) == LOOKUP_ROWS
    assert row_groups.stale({**clips, PROPERTY: "65536"}) == {PROPERTY: str(LOOKUP_ROWS)}
    assert row_groups.row_group_rows({**clips, PROPERTY: "65536"}) == LOOKUP_ROWS
    # An operator's smaller limit is kept; so is a table that is not the catalog's.
    assert row_groups.stale({**clips, PROPERTY: "4096"}) is None
    assert row_groups.row_group_rows({**clips, PROPERTY: "4096"}) == 4096
    assert row_groups.stale({PROPERTY: "999999"}) is None
    assert row_groups.row_group_rows({PROPERTY: "999999"}) == 999999
    assert row_groups.stale({"vidlake.table": "scores", PROPERTY: "65536"}) is None
    # An unreadable value is treated as absent (pyiceberg's default) and replaced.
    assert row_groups.row_group_rows({**clips, PROPERTY: "lots"}) == LOOKUP_ROWS
    assert row_groups.stale({**clips, PROPERTY: "lots"}) == {PROPERTY: str(LOOKUP_ROWS)}
