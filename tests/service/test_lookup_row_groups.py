"""A point lookup over the catalog's small row groups (``catalog/row_groups.py``) finds
the same rows as a filtered scan: first, last and boundary rows of every row group,
across several data files, and a key that is absent; its per-file key indexes hold
12 bytes a row (hashes), and a hash collision never leaks a wrong row."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.row_groups import LOOKUP_ROWS
from service.sql import CatalogViews
from service.sql import views as views_module
from tests.catalog.test_row_groups import _assets, _clips, _row_groups

N = LOOKUP_ROWS + 3_000


def _sorted(table: pa.Table, key: str) -> list[dict[str, object]]:
    return table.sort_by(key).to_pylist()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def cat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VidlakeCatalog]:
    home = tmp_path_factory.mktemp("lookup")
    with VidlakeCatalog.open(CatalogConfig.embedded(home, eval_fraction=0.0)) as c:
        assets = _assets(N)
        c.add_assets(assets)
        ids = assets["asset_id"].to_pylist()
        c.add_clips(_clips(ids, N))
        c.add_clips(_clips(ids, 500, start=N))  # a second, smaller data file
        yield c


def _wanted() -> tuple[list[str], list[str]]:
    ids = _assets(N)["asset_id"].to_pylist()
    # Rows of the first file in write order: row-group edges sit at LOOKUP_ROWS.
    edges = [0, 1, LOOKUP_ROWS - 1, LOOKUP_ROWS, N - 1, N, N + 499]
    clips = [_clips(ids, 1, start=k)["clip_id"][0].as_py() for k in edges]
    return clips, [ids[k] for k in (0, LOOKUP_ROWS - 1, LOOKUP_ROWS, N - 1)]


def _check(cat: VidlakeCatalog, views: CatalogViews) -> None:
    pin = cat.pin()
    clips, assets = _wanted()
    for table, column, keys in (("clips", "clip_id", clips), ("assets", "asset_id", assets)):
        got = views.lookup(table, pin, column, [*keys, "f" * len(keys[0])])
        full = cat.scan(table, include_eval=True)
        expected = full.filter(pc.is_in(full[column], pa.array(keys)))
        assert got.num_rows == len(keys)
        assert _sorted(got.select(expected.column_names), column) == _sorted(expected, column)


def test_lookup_matches_a_filtered_scan(cat: VidlakeCatalog) -> None:
    assert len(_row_groups(cat, "clips")) == 3
    views = CatalogViews(cat)
    _check(cat, views)
    # The indexes hold a hash and a row number per key, not the key (40-72 bytes).
    rows = sum(len(index.keys) for index in views._indexes.values())
    assert rows and views._index_bytes <= 12 * rows


def test_hash_collisions_never_leak_rows(
    cat: VidlakeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every key hashes alike: every row is a candidate, and only the keys asked for
    # may come back.
    monkeypatch.setattr(
        views_module, "_key_hashes", lambda values: np.zeros(len(values), np.uint64)
    )
    _check(cat, CatalogViews(cat))
