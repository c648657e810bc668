"""Our tables are ordinary Iceberg: DuckDB's iceberg extension reads what pyiceberg reads.

The reader is a second implementation of the spec in its own process
(``tests/catalog/_duckdb_reader.py``): it reads a version's tag, resolved from the
table's own metadata file, and the current state after more appends, and each read
must equal pyiceberg's row for row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.tags import VersionTags
from tests.catalog._duckdb_reader import Reader, duckdb_read, find_reader, reader_or_skip
from tests.catalog.test_catalog import aid, asset, clip

KEYS = {"assets": "asset_id", "clips": "clip_id", "scores": "clip_id"}


@pytest.fixture(scope="module")
def reader() -> Reader:
    return reader_or_skip()


def _rows(table: pa.Table, key: str) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: (r[key], repr(sorted(r.items()))))


def _metadata(cat: VidlakeCatalog, table: str) -> str:
    return cat.locations(table)[0].removeprefix("file://")


def _pyiceberg(cat: VidlakeCatalog, table: str, sid: int | None = None) -> pa.Table:
    tbl = cat.iceberg_table(table)
    return (tbl.scan(snapshot_id=sid) if sid is not None else tbl.scan()).to_arrow()


def test_duckdb_reads_a_tagged_version_and_the_table_after_appends(
    tmp_path: Path, reader: Reader
) -> None:
    cat = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path / "home", eval_fraction=0.5))
    cat.add_assets([asset(i) for i in range(6)])
    cat.add_clips([clip(aid(i), k) for i in range(6) for k in range(2)])
    cat.add_scores(
        [
            {"clip_id": c, "filter_name": "aesthetic", "filter_version": "1", "score": 0.5}
            for c in cat.scan("clips", include_eval=True).column("clip_id").to_pylist()
        ]
    )
    pin = cat.pin()
    cat.tag_versions([VersionTags(1, dict(pin), None)])
    cat.add_assets([asset(i) for i in range(6, 10)])  # main moves on past the tag
    cat.add_clips([clip(aid(i)) for i in range(6, 10)])
    reads = [{"metadata": _metadata(cat, t), "tag": "vidlake-v1"} for t in KEYS]
    reads += [{"metadata": _metadata(cat, t)} for t in ("assets", "clips")]
    got = duckdb_read(reader, reads, tmp_path)
    assert got[0].num_rows == 6  # the tag, not main
    for (table, key), theirs in zip(KEYS.items(), got[:3], strict=True):
        ours = _pyiceberg(cat, table, pin[table])
        assert ours.num_rows > 0 and _rows(theirs, key) == _rows(ours, key), table
    assert got[3].num_rows == 10 and _rows(got[3], "asset_id") == _rows(
        _pyiceberg(cat, "assets"), "asset_id"
    )
    assert got[4].num_rows == 16 and _rows(got[4], "clip_id") == _rows(
        _pyiceberg(cat, "clips"), "clip_id"
    )


def test_the_reader_says_why_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    found = find_reader()
    if isinstance(found, str):
        pytest.skip(found)
    if found.pythonpath is None:
        pytest.skip("the project's DuckDB loads the extension itself")
    monkeypatch.setenv("VIDLAKE_DUCKDB_READER", "/nonexistent")
    reason = find_reader()
    assert isinstance(reason, str) and "pip install --no-deps --target /nonexistent" in reason
