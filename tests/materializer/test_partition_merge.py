"""The streaming merge of a partitioned cut (:mod:`materializer.partition_merge`):
the manifest and index written chunk by chunk from the partitions' files equal the
files written from the whole table at once."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import materializer.partition_merge as pm
from manifests.ipc import write_table

INDEX_SCHEMA = pa.schema(
    [
        ("row", pa.int64()),
        ("clip_id", pa.string()),
        ("bucket", pa.int32()),
        ("tags", pa.list_(pa.string())),
    ]
)
_OPTIONS = {"compression": "zstd", "row_group_size": 4, "use_dictionary": True}


def _partition(rng: np.random.Generator, lo: int, n: int, *, null_text: bool) -> pa.Table:
    """A partition's kept rows, sorted by ``(rung, clip_id)`` (ids ascend across
    partitions, as the ``clip_id`` ranges do)."""
    ids = [f"{lo + i:08x}" for i in range(n)]
    rungs = np.sort(rng.choice(["256p", "512p"], n))
    text = pa.nulls(n) if null_text else pa.array([f"caption {i}" for i in range(n)])
    table = pa.table(
        {
            "clip_id": pa.array(ids, pa.string()),
            # Assets shared across partitions (an asset's clips fall in several).
            "asset_id": pa.array([f"{(lo + i) % 17:064x}" for i in range(n)], pa.string()),
            "rung": rungs,
            "tokens": rng.integers(1, 100, n),
            "text": text,
            "tags": pa.array([[f"t{i % 3}"] for i in range(n)], pa.list_(pa.string())),
        }
    )
    return table.sort_by([("rung", "ascending"), ("clip_id", "ascending")])


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_streamed_manifest_and_index_equal_the_whole_table_written_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pm, "CHUNK_ROWS", 8)  # several chunks of two row groups each
    rng = np.random.default_rng(7)
    tables = [
        _partition(rng, 0, 9, null_text=False),
        _partition(rng, 100, 0, null_text=True),  # an empty partition
        _partition(rng, 200, 11, null_text=True),  # a column all null here
        _partition(rng, 300, 13, null_text=False),
    ]
    parts = pm.new_parts(str(tmp_path))
    narrow = []
    for t in tables:
        kept, path = pm.spill_kept(t, parts.directory, ("rung", "tokens"))
        assert kept.column_names == ["rung", "tokens", "_pos"]  # the wide ones stay out
        narrow.append(kept)
        parts.files.append(path)
    merged = pm.merge_order(narrow)
    whole = pa.concat_tables(tables, promote_options="permissive")
    whole = whole.sort_by([("rung", "ascending"), ("clip_id", "ascending")])
    assert merged["tokens"].equals(whole["tokens"])  # (rung, _part, _pos) is the order

    # The driver drops some rows and adds the bucket; the scatter permutes the rest.
    keep = rng.random(whole.num_rows) < 0.8
    selected = merged.filter(pa.array(keep))
    selected = selected.append_column(
        "bucket", pa.array(rng.integers(0, 3, selected.num_rows), pa.int32())
    )
    order = rng.permutation(selected.num_rows).astype(np.int64)

    def index_of(chunk: pa.Table) -> pa.Table:
        return chunk.select(INDEX_SCHEMA.names).cast(INDEX_SCHEMA)

    streamed_index, streamed_manifest = tmp_path / "s.arrow", tmp_path / "s.parquet"
    dest = np.empty_like(order)
    dest[order] = np.arange(order.size)  # each sorted sample's manifest row
    clips, assets = pm.stream_artifacts(
        parts,
        selected,
        dest,
        index=(streamed_index, index_of),
        manifest=(streamed_manifest, lambda chunk: chunk, _OPTIONS),
    )
    samples = whole.filter(pa.array(keep))
    # Counted on the way, exactly: the partitions' clips add up, their assets overlap.
    assert clips == len(set(samples["clip_id"].to_pylist()))
    assert assets == len(set(samples["asset_id"].to_pylist())) < sum(len(t) for t in tables)
    samples = samples.append_column("bucket", selected["bucket"]).take(pa.array(order))
    samples = samples.add_column(0, "row", pa.array(np.arange(samples.num_rows)))
    samples = samples.combine_chunks()
    write_table(tmp_path / "w.arrow", pm.compact_batches(index_of(samples), 8), INDEX_SCHEMA)
    pq.write_table(samples, str(tmp_path / "w.parquet"), **_OPTIONS)
    assert _sha(streamed_index) == _sha(tmp_path / "w.arrow")
    assert _sha(streamed_manifest) == _sha(tmp_path / "w.parquet")
    assert pq.read_table(streamed_manifest).num_rows == selected.num_rows
    assert list(Path(parts.directory).iterdir()) == []  # read once, the files are gone
    parts.close()
    assert not Path(parts.directory).exists()


def test_driver_columns_hold_what_the_recipe_needs_only() -> None:
    from materializer.recipe import load_recipe
    from tests.fixtures.recipes import small_corpus_demo

    doc = small_corpus_demo()
    doc.pop("semantic_dedup", None)
    doc.setdefault("exclusions", {}).pop("eval_near_duplicates", None)
    plain = pm.driver_columns(load_recipe(doc))
    assert "clip_id" not in plain and "captions" not in plain and "object_sha256" not in plain
    assert {"rung", "tier", "stream", "tokens"} <= set(plain)
    # The counts and the quality report's keys come from the partitions' files.
    assert not {"asset_id", "source", "cluster"} & set(plain)


def test_packed_ids_are_the_bytes_the_hex_spells_and_others_stay_as_they_are() -> None:
    ids = [hashlib.sha256(str(i % 3).encode()).hexdigest() for i in range(7)]
    column = pa.chunked_array([pa.array(ids[:2]), pa.array(ids[2:])]).slice(1)
    packed = pm.packed_ids(column)
    assert packed.type == pa.binary(32)
    assert [b.hex() for b in packed.to_pylist()] == ids[1:]
    for odd in (["abc", "abcd"], ["xyz0"], [ids[0], None]):
        kept = pa.chunked_array([pa.array(odd, pa.string())])
        assert pm.packed_ids(kept) is kept


def test_parts_of_one_rung_merge_without_a_copy_and_interleaved_rungs_are_sorted() -> None:
    """Partitions hold ascending ``clip_id`` ranges: with one rung their concatenation
    is the order, so the merge keeps the parts' buffers (a gathered copy doubled the
    driver's peak at the join); rungs that interleave across parts are sorted."""
    rng = np.random.default_rng(3)

    def part(rungs: list[str], lo: int) -> pa.Table:
        table = pa.table(
            {
                "rung": pa.array(sorted(rungs), pa.string()),
                "tokens": pa.array(rng.integers(1, 100, len(rungs))),
                "_pos": pa.array(np.arange(len(rungs), dtype=np.int64) + lo),
            }
        )
        return table

    one = [part(["256p"] * 5, 0), part([], 0), part(["256p"] * 4, 0)]
    merged = pm.merge_order(one)
    expect = np.concatenate([t["tokens"].to_numpy() for t in one])
    assert np.array_equal(merged["tokens"].to_numpy(), expect)
    first = one[0]["tokens"].chunk(0).buffers()[1]
    assert merged["tokens"].chunk(0).buffers()[1].address == first.address  # not copied
    mixed = [part(["256p", "512p", "512p"], 0), part(["256p", "512p"], 0)]
    merged = pm.merge_order(mixed)
    assert merged["rung"].to_pylist() == ["256p", "256p", "512p", "512p", "512p"]
    assert merged[pm.PART].to_pylist() == [0, 1, 0, 0, 1]
    assert merged["_pos"].to_pylist() == [0, 0, 1, 2, 1]


def test_distinct_assets_are_exact_across_partitions_and_buckets(tmp_path: Path) -> None:
    """Every id lands in the same bucket whatever partition adds it, so overlapping
    partitions, nulls and ids that are not hex are counted exactly."""
    from materializer.distinct import DistinctCounts

    rng = np.random.default_rng(3)
    pool = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(3000)]
    pool += ["x", "é1", "a b"]
    counts = DistinctCounts(tmp_path / "d")
    seen: set[str] = set()
    for p in range(5):
        ids = [pool[i] for i in rng.integers(0, len(pool), 900)] + [None]
        clips = [f"{p:02x}{i:06x}" for i in range(len(ids))]
        counts.add(pa.table({"clip_id": clips, "asset_id": pa.array(ids, pa.string())}))
        seen |= {i for i in ids if i is not None}
    assert counts.clips == 5 * 901
    assert counts.assets() == len(seen)
    assert len(list((tmp_path / "d").iterdir())) > 100  # spread over the buckets
    counts.close()
    assert not (tmp_path / "d").exists()
