"""``loader.rowlists``: index records read straight from the mapped buffers equal
Arrow's own reading, whatever the batches, and cost no per-batch Arrow call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from catalog.errors import IntegrityError
from loader.mapped import MappedFile
from loader.plan import open_plan
from loader.rowlists import RowLists
from manifests.format import INDEX_SCHEMA
from manifests.ipc import write_table
from manifests.synthetic import write_snapshot

NAMES = [n for n in INDEX_SCHEMA.names if n not in ("asset_id", "bucket", "tokens")]


def _record(r: int) -> dict[str, Any]:
    """Rows unlike each other: empty strings and lists, non-ASCII text, several keys."""
    return {
        "row": r,
        "clip_id": f"clip-{r}" if r % 7 else "",
        "asset_id": "a",
        "stream": r % 3,
        "bucket": 0,
        "num_frames": 9 - r % 2,
        "tokens": r,
        "object_sha256": f"{r // 10:064x}",
        "offset": r * 16_208 + (1 << 33),  # past 32 bits
        "length": 16_208 + r % 5,
        "member_sha256": f"{r:064x}",
        "format": "safetensors" if r % 4 else "npy",
        "tensor_keys": ["latent", "audio"][: 1 + r % 2],
        "captions": [f"cap {r} v{v} é✓" if r % 3 else f"cap {r}" for v in range(r % 4)],
        "text_embedding_sha256": [f"{r:064x}"] * (r % 2),
    }


def _index(path: Path, rows: int, chunk: int) -> pa.Table:
    table = pa.Table.from_pylist([_record(r) for r in range(rows)], schema=INDEX_SCHEMA)
    write_table(path, table, max_chunksize=chunk)
    return table


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_lists_equal_arrows_reading_in_the_order_asked(tmp_path: Path, chunk: int) -> None:
    table = _index(tmp_path / "index.arrow", 150, chunk)
    file = MappedFile(tmp_path / "index.arrow", INDEX_SCHEMA, "row", "index.arrow")
    lists = RowLists(file, NAMES)
    rng = np.random.default_rng(chunk)
    for keys in (rng.permutation(150), np.array([149, 0, 0, 3, 3, 77]), np.arange(0)):
        got = lists.gather(keys.astype(np.int64))
        want = table.take(keys).select(NAMES).to_pydict()
        assert got.row.tolist() == keys.tolist()
        for name in NAMES:
            assert got.values(name) == want[name], name
        counts = got.counts("captions")
        assert counts.tolist() == [len(c) for c in want["captions"]]
        item = np.where(counts > 0, np.asarray(keys) % np.maximum(counts, 1), -1)
        picked = [c[i] if i >= 0 else None for c, i in zip(want["captions"], item, strict=True)]
        assert got.pick("captions", item) == picked
    file.close()


def test_rows_not_where_the_layout_says_come_back_as_minus_one(tmp_path: Path) -> None:
    _index(tmp_path / "index.arrow", 30, 10)
    file = MappedFile(tmp_path / "index.arrow", INDEX_SCHEMA, "row", "index.arrow")
    got = RowLists(file, ["row", "clip_id"]).gather(np.array([5, 29, 30, 45, -1]))
    assert got.row.tolist() == [5, 29, -1, -1, -1]
    file.close()


def test_a_buffer_address_outside_the_file_is_an_integrity_error(tmp_path: Path) -> None:
    _index(tmp_path / "index.arrow", 30, 10)
    file = MappedFile(tmp_path / "index.arrow", INDEX_SCHEMA, "row", "index.arrow")
    lists = RowLists(file, ["row", "clip_id"])
    got = lists.gather(np.array([3, 4]))
    got._where[:, 2] = len(file.whole()) + 100  # the clip ids' bytes past the end
    with pytest.raises(IntegrityError, match="outside the file"):
        got.values("clip_id")
    file.close()


def test_a_step_over_many_index_batches_reads_each_batch_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Arrow takes cost one call per index batch a step touches (~250 of them for 256
    # shuffled rows of a 16M-clip index); the lists learn each batch's buffers once.
    snap = write_snapshot(tmp_path / "store", num_rows=256, num_steps=2, index_rows_per_batch=4)
    plan = open_plan(snap.url, 1, tmp_path / "cache")
    index = plan._index
    reads: list[int] = []
    real = index.batch
    monkeypatch.setattr(index, "batch", lambda b: reads.append(b) or real(b))
    keys = np.random.default_rng(0).permutation(256).astype(np.int64)
    names = ["clip_id", "member_sha256", "offset", "tensor_keys"]
    for _ in range(3):
        got = plan.index_rows(keys, names)
        want = snap.index.take(keys).select(names).to_pydict()
        assert {n: got.values(n) for n in names} == want
    assert sorted(reads) == list(range(64))  # each of the 64 batches, once
    plan.close()


def test_an_index_whose_buffers_are_not_in_the_mapping_is_refused(tmp_path: Path) -> None:
    table = pa.Table.from_pylist([_record(r) for r in range(20)], schema=INDEX_SCHEMA)
    options = pa.ipc.IpcWriteOptions(compression="zstd")  # decoded outside the map
    with (
        pa.OSFile(str(tmp_path / "index.arrow"), "wb") as sink,
        pa.ipc.new_file(sink, INDEX_SCHEMA, options=options) as writer,
    ):
        writer.write_table(table, max_chunksize=10)
    file = MappedFile(tmp_path / "index.arrow", INDEX_SCHEMA, "row", "index.arrow")
    with pytest.raises(IntegrityError, match="not readable in place"):
        RowLists(file, ["row", "clip_id"]).gather(np.array([1, 15]))
    file.close()


@pytest.mark.parametrize("odd_row", [None, 13])
def test_a_column_of_one_value_gives_it_to_every_row(tmp_path: Path, odd_row: int | None) -> None:
    # Layout columns (format, tensor keys) are mostly one value: no bytes gathered a
    # step then; one odd row in one batch sends that batch's rows down the gather path.
    records = []
    for r in range(40):
        rec = {**_record(r), "format": "safetensors", "tensor_keys": ["latent", "é"]}
        rec.update(captions=[], text_embedding_sha256=["ab"] * 2)
        if r == odd_row:
            rec.update(format="npy", tensor_keys=["latent"], captions=["x"])
        records.append(rec)
    table = pa.Table.from_pylist(records, schema=INDEX_SCHEMA)
    write_table(tmp_path / "index.arrow", table, max_chunksize=8)
    file = MappedFile(tmp_path / "index.arrow", INDEX_SCHEMA, "row", "index.arrow")
    lists = RowLists(file, NAMES)
    for keys in (np.array([39, 1, 20, 8]), np.array([12, 13, 14]), np.arange(40)[::-1]):
        got = lists.gather(keys.astype(np.int64))
        want = table.take(keys).select(NAMES).to_pydict()
        for name in NAMES:
            assert got.values(name) == want[name], name
    file.close()
