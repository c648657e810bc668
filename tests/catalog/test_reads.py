"""The facade's eval id read and the table-state methods other packages use instead of
pyiceberg tables."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.errors import InvalidInput, NotFound
from catalog.pins import Pin
from catalog.reads import one_of
from tests.catalog.test_catalog import aid, asset, clip


@pytest.fixture
def cat(tmp_path: Path) -> VidlakeCatalog:
    opened = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path, eval_fraction=0.5))
    ids = [aid(i) for i in range(40)]
    opened.add_assets([asset(i, asset_id=a) for i, a in enumerate(ids)])
    opened.add_clips([clip(a) for a in ids])
    return opened


def test_eval_ids_are_the_rows_scan_hides(cat: VidlakeCatalog) -> None:
    pin = cat.pin()
    for table, key in (("assets", "asset_id"), ("clips", "clip_id")):
        every = set(cat.scan(table, pin, [key], include_eval=True)[key].to_pylist())
        shown = set(cat.scan(table, pin, [key])[key].to_pylist())
        hidden = set(cat.eval_ids(table, pin).to_pylist())
        assert hidden and shown and hidden == every - shown
    assert len(cat.eval_ids("clips", Pin({}))) == 0  # nothing pinned: none


def test_eval_ids_of_a_table_without_split_or_at_a_gone_snapshot_are_refused(
    cat: VidlakeCatalog,
) -> None:
    with pytest.raises(InvalidInput, match="latents carries no split"):
        cat.eval_ids("latents")
    with pytest.raises(NotFound, match="no snapshot 12345"):
        cat.eval_ids("clips", Pin({"clips": 12345}))


def test_table_state_without_pyiceberg_types(cat: VidlakeCatalog) -> None:
    sid = cat.current_snapshot_id("clips")
    assert sid is not None and cat.snapshot_ids("clips")[-1] == sid
    assert cat.has_snapshot("clips", sid) and not cat.has_snapshot("clips", 12345)
    assert cat.row_count("clips") == 40 and cat.row_count("jobs") == 0
    assert cat.current_snapshot_id("jobs") is None
    metadata, location = cat.locations("clips")
    assert metadata.startswith(location) and metadata.endswith(".metadata.json")
    assert "vidlake.eval-salt" in cat.namespace_properties()
    assert cat.snapshot_dataset("clips", sid).count_rows() == 40
    assert cat.snapshot_dataset("jobs", None).count_rows() == 0
    with pytest.raises(NotFound):
        cat.snapshot_dataset("clips", 12345)


def test_one_of_filters_without_importing_pyiceberg(cat: VidlakeCatalog) -> None:
    ids = cat.scan("assets", columns=["asset_id"])["asset_id"].to_pylist()[:3]
    got = cat.scan("assets", row_filter=one_of("asset_id", ids), columns=["asset_id"])
    assert sorted(got["asset_id"].to_pylist()) == sorted(ids)
    assert pc.count(got["asset_id"]).as_py() == 3
