"""The catalog's own fast append (``catalog/_append.py``): what it writes is what
pyiceberg would have written (readable, mapped by field id, pruned by partition and
column bounds), and a rejected or lost commit leaves no snapshot and no stray files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import EqualTo

from catalog import _append, rules
from catalog.catalog import VidlakeCatalog
from catalog.coerce import coerce_batch, conform
from catalog.config import CatalogConfig
from catalog.errors import InvalidBatch
from catalog.tables import TABLES


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


def _data_files(root: Path, table: str) -> set[Path]:
    return set((root / "warehouse").rglob(f"{table}/data/**/*.parquet"))


@pytest.fixture
def cat(tmp_path: Path) -> VidlakeCatalog:
    c = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path, eval_fraction=0.0))
    c.add_assets(_assets(20))
    return c


def test_appended_rows_read_back_by_field_id_with_stats(cat: VidlakeCatalog) -> None:
    assets = _assets(20)["asset_id"].to_pylist()
    clips = _clips(assets, 500)
    assert cat.add_clips(clips).inserted == 500
    got = cat.scan("clips").sort_by("t_start_s")
    assert got["clip_id"].to_pylist() == clips["clip_id"].to_pylist()
    assert got["asset_id"].to_pylist() == clips["asset_id"].to_pylist()
    assert set(got["split"].to_pylist()) == {"train"}
    tbl = cat.iceberg_table("clips")
    (task,) = list(tbl.scan().plan_files())
    # Field ids travel in the file, so an id-mapped reader finds every column.
    schema = pq.read_schema(task.file.file_path.removeprefix("file://"))
    assert schema.field("clip_id").metadata[b"PARQUET:field_id"] == b"1"
    assert task.file.record_count == 500
    # The identifier column (a distinct value per row) skips the dictionary attempt.
    meta = pq.ParquetFile(task.file.file_path.removeprefix("file://")).metadata.row_group(0)
    dictionary = {
        meta.column(i).path_in_schema: meta.column(i).has_dictionary_page
        for i in range(meta.num_columns)
    }
    assert dictionary["clip_id"] is False
    assert dictionary["asset_id"] is True
    lower = task.file.lower_bounds[1].decode()
    assert lower == min(clips["clip_id"].to_pylist())[: len(lower)]
    snap = tbl.current_snapshot()
    assert snap is not None and snap.summary is not None
    assert snap.summary["added-records"] == "500"
    assert snap.summary["vidlake.rows"] == "500"


def _dictionary_pages(path: str) -> dict[str, bool]:
    meta = pq.ParquetFile(path.removeprefix("file://")).metadata.row_group(0)
    return {
        meta.column(i).path_in_schema: meta.column(i).has_dictionary_page
        for i in range(meta.num_columns)
    }


def test_clip_keyed_tables_write_clip_ids_without_a_dictionary(cat: VidlakeCatalog) -> None:
    # A score batch holds a clip's id once per filter: nearly every value is new, so a
    # dictionary overflows its page limit and is thrown away (~6 ms of a 100k-row
    # write). The low-cardinality columns keep theirs.
    clips = _clips(_assets(20)["asset_id"].to_pylist(), 300)
    cat.add_clips(clips)
    cat.add_scores(
        pa.table(
            {
                "clip_id": clips["clip_id"],
                "filter_name": ["aesthetic"] * 300,
                "filter_version": ["v1"] * 300,
                "score": np.linspace(0, 1, 300),
            }
        )
    )
    (task,) = list(cat.iceberg_table("scores").scan().plan_files())
    pages = _dictionary_pages(task.file.file_path)
    assert pages["clip_id"] is False
    assert pages["filter_version"] is True
    got = cat.scan("scores").sort_by("score")
    assert got["clip_id"].to_pylist() == clips["clip_id"].to_pylist()


def test_a_batch_over_several_partitions_writes_one_file_each(cat: VidlakeCatalog) -> None:
    clips = _clips(_assets(20)["asset_id"].to_pylist(), 30)
    cat.add_clips(clips)  # scores need existing clips
    ids = clips["clip_id"]
    names = ["aesthetic", "motion", "ocr"] * 10
    cat.add_scores(
        pa.table(
            {
                "clip_id": ids,
                "filter_name": names,
                "filter_version": ["v1"] * 30,
                "score": np.linspace(0, 1, 30),
            }
        )
    )
    cat.add_scores(
        pa.table(
            {
                "clip_id": ids[:5],
                "filter_name": ["motion"] * 5,
                "filter_version": ["v2"] * 5,
                "score": np.zeros(5),
            }
        )
    )
    tbl = cat.iceberg_table("scores")
    files = list(tbl.scan().plan_files())
    assert sorted(f.file.partition[0] for f in files) == ["aesthetic", "motion", "motion", "ocr"]
    # Partition pruning sees the partition values.
    motion = list(tbl.scan(row_filter=EqualTo("filter_name", "motion")).plan_files())
    assert len(motion) == 2
    rows = cat.scan("scores", row_filter="filter_name == 'motion'")
    assert rows.num_rows == 15
    assert set(cat.scan("scores")["filter_name"].to_pylist()) == {"aesthetic", "motion", "ocr"}


def test_a_wrong_clip_id_found_during_the_write_commits_nothing(
    cat: VidlakeCatalog, tmp_path: Path
) -> None:
    assets = _assets(20)["asset_id"].to_pylist()
    cat.add_clips(_clips(assets, 50))
    before, files = cat.pin(), _data_files(tmp_path, "clips")
    bad = _clips(assets, 50, start=50)
    ids = bad["clip_id"].to_pylist()
    ids[37] = "0" * 32
    bad = bad.set_column(0, "clip_id", pa.array(ids))
    with pytest.raises(InvalidBatch) as exc:
        cat.add_clips(bad)
    assert (exc.value.row, exc.value.field) == (37, "clip_id")
    assert cat.pin() == before
    assert _data_files(tmp_path, "clips") == files
    # A wrong id outranks a later check's error, as if it were checked first.
    owners = bad["asset_id"].to_pylist()
    owners[40] = "f" * 64  # unknown asset (row 40's id now disagrees too)
    unknown = bad.set_column(1, "asset_id", pa.array(owners))
    with pytest.raises(InvalidBatch) as exc:
        cat.add_clips(unknown)
    assert (exc.value.row, exc.value.field) == (37, "clip_id")
    # Even when every row is a duplicate (nothing to write), every id is checked.
    dup = _clips(assets, 50)
    wrong = dup.set_column(0, "clip_id", pc.utf8_replace_slice(dup["clip_id"], 0, 1, "z"))
    with pytest.raises(InvalidBatch):
        cat.add_clips(wrong)
    assert cat.add_clips(dup, idempotency_key="second-pass").duplicates == 50


def test_a_lost_commit_race_removes_its_files_and_the_catalog_retries(
    cat: VidlakeCatalog, tmp_path: Path
) -> None:
    assets = _assets(20)["asset_id"].to_pylist()
    stale = cat.iceberg_table("clips")
    other = VidlakeCatalog.open(cat.config)
    other.add_clips(_clips(assets, 10))
    files = _data_files(tmp_path, "clips")
    batch = coerce_batch(TABLES["clips"], _clips(assets, 10, start=10), stale.schema())
    split = batch.schema.get_field_index("split")
    batch = batch.set_column(split, "split", pa.array(["train"] * 10, pa.large_string()))
    rows = conform(batch, stale.schema())
    with pytest.raises(CommitFailedException):
        _append.append(stale, rows, {})
    assert _data_files(tmp_path, "clips") == files  # the loser's file is gone
    # Through the catalog, a stale view re-plans against the winner's state.
    result = cat.add_clips(_clips(assets, 20))
    assert (result.inserted, result.duplicates) == (10, 10)
    assert cat.scan("clips").num_rows == 20
    other.close()
