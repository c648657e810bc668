"""The fast append's own SQL commit (``catalog/_sql_commit.py``): no reload and no deep
copy of the metadata per commit, the same metadata pyiceberg would write, and any
other writer's commit since the table was loaded fails it cleanly."""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg import catalog as iceberg_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from catalog import _append, metadata_json, rules
from catalog.catalog import VidlakeCatalog
from catalog.coerce import coerce_batch, conform
from catalog.config import CatalogConfig
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


def _clip_ids(cat: VidlakeCatalog, n: int) -> pa.Array:
    assets = _assets(5)["asset_id"].to_pylist()
    t0 = np.arange(n) * 4.0
    a = pa.array([assets[i % 5] for i in range(n)])
    v = pa.array(["v1"] * n)
    ids = rules.clip_ids(a, t0, t0 + 2.0, v)
    clips = pa.table({"clip_id": ids, "asset_id": a, "t_start_s": t0, "t_end_s": t0 + 2.0})
    frames = pa.array(np.full(n, 48, dtype=np.int32))
    for col, values in (("split_version", v), ("num_frames", frames)):
        clips = clips.append_column(col, values)
    for col in ("width", "height"):
        clips = clips.append_column(col, pa.array(np.full(n, 64, dtype=np.int32)))
    cat.add_clips(clips)
    return ids


def _rows(tbl: Table, batch: pa.Table) -> pa.Table:
    return conform(coerce_batch(TABLES["scores"], batch, tbl.schema()), tbl.schema())


def _scores(ids: pa.Array, name: str) -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            "clip_id": ids,
            "filter_name": [name] * n,
            "filter_version": ["v1"] * n,
            "score": np.linspace(0, 1, n),
        }
    )


@pytest.fixture
def cat(tmp_path: Path) -> VidlakeCatalog:
    c = VidlakeCatalog.open(CatalogConfig.embedded(tmp_path, eval_fraction=0.0))
    c.add_assets(_assets(5))
    return c


def _counting(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    calls: list[int] = []
    real: Callable[..., Any] = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_a_commit_neither_reloads_nor_deep_copies_the_metadata(
    cat: VidlakeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _clip_ids(cat, 50)
    tbl = cat.iceberg_table("scores")
    rows = _rows(tbl, _scores(ids, "aesthetic"))
    loads = _counting(monkeypatch, SqlCatalog, "load_table")
    updates = _counting(monkeypatch, iceberg_catalog, "update_table_metadata")
    _append.append(tbl, rows, {})
    assert (len(loads), len(updates)) == (0, 0)
    assert cat.iceberg_table("scores").metadata == tbl.metadata  # what the row points at


def test_own_commits_write_the_metadata_pyiceberg_would(cat: VidlakeCatalog) -> None:
    ids = _clip_ids(cat, 40)
    locations = [cat.iceberg_table("scores").metadata_location]
    for name in ("aesthetic", "motion", "ocr"):
        cat.add_scores(_scores(ids, name))
        locations.append(cat.iceberg_table("scores").metadata_location)
    tbl = cat.iceberg_table("scores")
    versions = [int(Path(loc).name.split("-")[0]) for loc in locations]
    assert versions == list(range(versions[0], versions[0] + 4))
    assert [e.metadata_file for e in tbl.metadata.metadata_log] == locations[:-1]
    snaps = tbl.metadata.snapshots
    assert [e.snapshot_id for e in tbl.metadata.snapshot_log] == [s.snapshot_id for s in snaps]
    assert tbl.metadata.last_sequence_number == snaps[-1].sequence_number == 3
    assert tbl.metadata.current_snapshot_id == snaps[-1].snapshot_id
    # pyiceberg's own commit path carries on from it, and both read every row.
    tbl.append(_rows(tbl, _scores(ids, "late")))
    assert cat.scan("scores").num_rows == 160
    assert len(cat.iceberg_table("scores").metadata.metadata_log) == 4


def test_each_commit_writes_pyicebergs_bytes_and_encodes_only_its_new_snapshot(
    cat: VidlakeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metadata file is byte for byte ``model_dump_json`` (decision 058), and a
    commit encodes its own snapshot only: earlier ones come from the process's cache
    (a whole-metadata encoding at every commit grows with the snapshot count)."""
    ids = _clip_ids(cat, 30)
    encoded = _counting(monkeypatch, Snapshot, "model_dump_json")
    for k, name in enumerate(("aesthetic", "motion", "ocr", "blur", "faces")):
        before = len(encoded)
        cat.add_scores(_scores(ids, name))
        tbl = cat.iceberg_table("scores")
        assert len(tbl.metadata.snapshots) == k + 1
        if k:  # the first commit of this process encodes what it finds, once
            assert len(encoded) - before == 1
        written = Path(tbl.metadata_location.removeprefix("file://")).read_bytes()
        assert written == tbl.metadata.model_dump_json().encode()
        assert metadata_json.encode(tbl.metadata) == written  # from the cache, too


def test_metadata_json_leaves_v1_and_compressed_files_as_pyiceberg_writes_them(
    cat: VidlakeCatalog, tmp_path: Path
) -> None:
    ids = _clip_ids(cat, 20)
    cat.add_scores(_scores(ids, "aesthetic"))
    meta = cat.iceberg_table("scores").metadata
    assert metadata_json.encode(meta.model_copy(update={"format_version": 1})) is None
    io = cat.iceberg_table("scores").io
    out = str(tmp_path / "00009-x.gz.metadata.json")
    metadata_json.write(meta, io, out)
    assert FromInputFile.table_metadata(io.new_input(out)) == meta
    assert gzip.decompress(Path(out).read_bytes()) == meta.model_dump_json().encode()


def test_any_other_commit_since_the_load_fails_the_append_cleanly(
    cat: VidlakeCatalog, tmp_path: Path
) -> None:
    ids = _clip_ids(cat, 30)
    cat.add_scores(_scores(ids, "aesthetic"))
    stale = cat.iceberg_table("scores")
    # Another writer changes a property: the branch does not move, the metadata does.
    other = cat.iceberg_table("scores")
    with other.transaction() as tx:
        tx.set_properties({"owner": "someone-else"})
    metadata_dir = tmp_path / "warehouse"
    before = set(metadata_dir.rglob("scores/metadata/*")) | set(metadata_dir.rglob("*.parquet"))
    rows = _rows(stale, _scores(ids, "motion"))
    with pytest.raises(CommitFailedException):
        _append.append(stale, rows, {})
    after = set(metadata_dir.rglob("scores/metadata/*")) | set(metadata_dir.rglob("*.parquet"))
    assert after == before  # no data file, manifest or metadata JSON left behind
    assert cat.iceberg_table("scores").properties["owner"] == "someone-else"
    # Through the catalog the batch lands, and the other writer's change stays.
    assert cat.add_scores(_scores(ids, "motion")).inserted == 30
    assert cat.iceberg_table("scores").properties["owner"] == "someone-else"
