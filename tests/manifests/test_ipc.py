"""manifests.ipc: checked memory-mapped reads, atomic uncompressed writes."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from catalog.errors import IntegrityError
from manifests.format import LINEAGE_SCHEMA, PLAN_SCHEMA
from manifests.ipc import ipc_writer, iter_batches, open_mapped, read_table, write_table


def _lineage(n: int) -> pa.Table:
    return pa.table(
        {"row": pa.array(range(n), pa.int64()), "steps": [[i, i + 1] for i in range(n)]},
        schema=LINEAGE_SCHEMA,
    )


def test_round_trip_keeps_batches_and_is_uncompressed(tmp_path: Path) -> None:
    path = tmp_path / "lineage.arrow"
    write_table(path, _lineage(10), max_chunksize=4)
    assert [b.num_rows for b in iter_batches(path, schema=LINEAGE_SCHEMA)] == [4, 4, 2]
    allocated = pa.total_allocated_bytes()
    table = read_table(path, schema=LINEAGE_SCHEMA, size=path.stat().st_size)
    # Uncompressed and memory-mapped: reading allocates nothing.
    assert pa.total_allocated_bytes() == allocated
    assert table.equals(_lineage(10))
    with open_mapped(path) as m:
        assert m.num_batches == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lineage.arrow"]


def test_wrong_size_is_an_integrity_error(tmp_path: Path) -> None:
    path = tmp_path / "plan.arrow"
    write_table(path, _lineage(3))
    with pytest.raises(IntegrityError, match=r"plan\.arrow .* bytes, expected 1"):
        read_table(path, size=1)


def test_a_file_that_is_not_arrow_is_an_integrity_error(tmp_path: Path) -> None:
    path = tmp_path / "index.arrow"
    path.write_bytes(b"PAR1 not an arrow file at all")
    with pytest.raises(IntegrityError, match=r"index\.arrow .* not an Arrow IPC file"):
        read_table(path)


def test_another_schema_is_an_integrity_error(tmp_path: Path) -> None:
    path = tmp_path / "x.arrow"
    write_table(path, _lineage(3))
    with pytest.raises(IntegrityError, match=r"plan .* has schema"):
        list(iter_batches(path, schema=PLAN_SCHEMA, what="plan"))


def test_a_failed_write_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "lineage.arrow"
    write_table(path, _lineage(2))
    with pytest.raises(RuntimeError), ipc_writer(path, LINEAGE_SCHEMA) as writer:
        writer.write_table(_lineage(5))
        raise RuntimeError("the cut failed half way")
    assert read_table(path).num_rows == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lineage.arrow"]


def test_batches_need_their_schema(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="schema"):
        write_table(tmp_path / "x.arrow", iter(_lineage(2).to_batches()))
