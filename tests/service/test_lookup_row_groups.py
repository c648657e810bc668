"""A point lookup over the catalog's small row groups (``catalog/row_groups.py``) finds
the same rows as a filtered scan: first, last and boundary rows of every row group,
across several data files, and a key that is absent."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.row_groups import LOOKUP_ROWS
from service.sql import CatalogViews
from tests.catalog.test_row_groups import _assets, _clips, _row_groups

N = LOOKUP_ROWS + 3_000


def _sorted(table: pa.Table, key: str) -> list[dict[str, object]]:
    return table.sort_by(key).to_pylist()  # type: ignore[no-any-return]


def test_lookup_matches_a_filtered_scan(tmp_path: Path) -> None:
    with VidlakeCatalog.open(CatalogConfig.embedded(tmp_path, eval_fraction=0.0)) as cat:
        assets = _assets(N)
        ids = assets["asset_id"].to_pylist()
        cat.add_assets(assets)
        cat.add_clips(_clips(ids, N))
        cat.add_clips(_clips(ids, 500, start=N))  # a second, smaller data file
        assert len(_row_groups(cat, "clips")) == 3
        views, pin = CatalogViews(cat), cat.pin()
        clips = cat.scan("clips", include_eval=True)
        # Rows of the first file in write order: row-group edges sit at LOOKUP_ROWS.
        edges = [0, 1, LOOKUP_ROWS - 1, LOOKUP_ROWS, N - 1, N, N + 499]
        wanted = [_clips(ids, 1, start=k)["clip_id"][0].as_py() for k in edges]
        for table, column, keys in (
            ("clips", "clip_id", wanted),
            ("assets", "asset_id", [ids[k] for k in (0, LOOKUP_ROWS - 1, LOOKUP_ROWS, N - 1)]),
        ):
            got = views.lookup(table, pin, column, [*keys, "f" * len(keys[0])])
            full = clips if table == "clips" else cat.scan("assets", include_eval=True)
            expected = full.filter(pc.is_in(full[column], pa.array(keys)))
            assert got.num_rows == len(keys)
            assert _sorted(got.select(expected.column_names), column) == _sorted(expected, column)
