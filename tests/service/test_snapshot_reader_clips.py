"""SnapshotReader.clip_rows: a clip's manifest rows by binary search, equal to a scan."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from service.snapshot_reader import SnapshotReader, _ClipIndex


def _scan(ids: pa.ChunkedArray, clip: str) -> list[int]:
    return np.asarray(pc.indices_nonzero(pc.equal(ids, clip))).tolist()


def test_the_index_finds_what_a_scan_finds() -> None:
    rng = np.random.default_rng(1)
    hexes = [f"{x:032x}" for x in rng.integers(0, 2**62, 300).tolist()]
    # Repeats (a clip in several rows) and ids sharing their first 8 bytes.
    hexes += [hexes[3], hexes[3], hexes[10][:8] + "f" * 24, hexes[10][:8] + "0" * 24]
    ids = pa.chunked_array([hexes[:150], hexes[150:]])
    index = _ClipIndex(ids)
    assert index.keys is not None
    for clip in [*hexes, "0" * 32, hexes[10][:8] + "1" * 24, "short"]:
        assert index.rows(ids, clip).tolist() == _scan(ids, clip), clip


@pytest.mark.parametrize("hexes", [["clip-1", "clip-22", "clip-1"], []])
def test_ids_of_other_shapes_fall_back_to_the_scan(hexes: list[str]) -> None:
    ids = pa.chunked_array([pa.array(hexes, pa.string())])
    index = _ClipIndex(ids)
    assert index.keys is None
    for clip in [*hexes, "nope"]:
        assert index.rows(ids, clip).tolist() == _scan(ids, clip)


def test_clip_rows_searches_instead_of_scanning(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scan of the whole clip_id column per request grew with the snapshot (issue 16)."""
    hexes = [f"{i:032x}" for i in range(1000)]
    table = pa.table({"clip_id": hexes, "row": np.arange(1000), "stream": np.zeros(1000, np.int32)})
    reader: Any = SnapshotReader.__new__(SnapshotReader)
    reader.ipc_table = lambda version, name: table
    reader._clip_index = lambda version: index
    index = _ClipIndex(table.column("clip_id"))
    compared: list[int] = []
    real = pc.equal
    monkeypatch.setattr(pc, "equal", lambda a, b: compared.append(len(a)) or real(a, b))
    rows, streams = SnapshotReader.clip_rows(reader, 1, hexes[7])
    assert rows.tolist() == [7] and streams.tolist() == [0]
    assert max(compared) <= 1  # the candidate, not the column


def test_short_ids_of_one_width_are_indexed_too() -> None:
    ids = pa.chunked_array([pa.array(["a", "b", "a", "c"])])
    index = _ClipIndex(ids)
    assert index.keys is not None
    for clip in ["a", "b", "c", "d", "ab"]:
        assert index.rows(ids, clip).tolist() == _scan(ids, clip)
