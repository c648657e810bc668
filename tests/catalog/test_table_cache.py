"""Table metadata reused while the catalog row still names it (``catalog/table_cache.py``):
a load after one's own commit parses nothing, a commit by another process is seen at
once, and a caller's in-place commit never changes what another load returns."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.serializers import FromInputFile

from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig


def _assets(lo: int, hi: int) -> pa.Table:
    ids = [hashlib.sha256(f"cache-{i}".encode()).hexdigest() for i in range(lo, hi)]
    return pa.table(
        {
            "asset_id": ids,
            "uri": [f"s3://raw/{a}.mp4" for a in ids],
            "size": np.full(len(ids), 1000, dtype=np.int64),
            "source_tier": ["crawl"] * len(ids),
        }
    )


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The metadata files parsed, in order (counted, not changed)."""
    seen: list[str] = []
    real = FromInputFile.table_metadata

    def counted(input_file: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(input_file.location)
        return real(input_file, *args, **kwargs)

    monkeypatch.setattr(FromInputFile, "table_metadata", staticmethod(counted))
    return seen


def test_loads_parse_only_when_the_row_moved(tmp_path: Path, parses: list[str]) -> None:
    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as cat:
        cat.add_assets(_assets(0, 10))
        first = cat.iceberg_table("assets")
        parses.clear()
        again = cat.iceberg_table("assets")
        assert parses == []  # the row did not move: nothing parsed
        assert again is not first
        assert again.metadata is first.metadata
        cat.add_assets(_assets(10, 20))  # one's own commit: remembered as it is written
        parses.clear()
        after = cat.iceberg_table("assets")
        assert parses == []
        assert after.metadata_location != first.metadata_location
        assert after.scan().to_arrow().num_rows == 20


def test_another_writers_commit_is_seen_at_once(tmp_path: Path, parses: list[str]) -> None:
    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as cat, VidlakeCatalog.open(config) as other:
        cat.add_assets(_assets(0, 10))
        seen = cat.iceberg_table("assets")
        other.add_assets(_assets(10, 15))  # another catalog object: another process's cache
        parses.clear()
        now = cat.iceberg_table("assets")
        assert parses == [now.metadata_location]  # the row moved: parsed once
        assert now.metadata_location != seen.metadata_location
        assert now.scan().to_arrow().num_rows == 15
        assert seen.scan().to_arrow().num_rows == 10  # the old object still reads its own


def test_a_callers_commit_leaves_other_loads_alone(tmp_path: Path) -> None:
    config = CatalogConfig.embedded(tmp_path / "lake")
    with VidlakeCatalog.open(config) as cat:
        cat.add_assets(_assets(0, 10))
        mine = cat.iceberg_table("assets")
        held = cat.iceberg_table("assets")
        before = held.metadata_location
        mine.append(mine.scan().to_arrow().slice(0, 0))  # pyiceberg's commit moves `mine`
        assert held.metadata_location == before  # a load's object is its caller's alone
        fresh = cat.iceberg_table("assets")
        assert fresh.metadata_location == mine.metadata_location
