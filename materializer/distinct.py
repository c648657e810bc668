"""Exact distinct counts of a partitioned cut's selected samples, in bounded memory.

snapshot.json counts the selected samples' distinct clips and assets. A partitioned
driver counted them from per-row columns it held for the whole cut (the asset id as
32 bytes and a clip number: 36 B a kept sample) with a hash of every id (~90 B a row
more while it ran). The streamed write reads every partition's selected rows anyway
(:mod:`materializer.partition_merge`), so the counts are taken there, one partition at
a time (decision 059):

* clips: partitions hold disjoint ``clip_id`` ranges, so the partitions' distinct
  counts add up;
* assets: an asset's clips may fall in several partitions. Each partition's distinct
  ids are appended to one of :data:`BUCKETS` spill files chosen by the id's first two
  characters (an id is always in the same bucket), and each bucket is counted alone:
  memory is one bucket's ids, 1/256 of the assets for hex ids.
"""

from __future__ import annotations

import shutil
import zlib
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["BUCKETS", "DistinctCounts"]

#: Spill files of the distinct assets (by a CRC of the id's first two characters).
BUCKETS = 256
_SPILL = pa.ipc.IpcWriteOptions(compression=None)


class DistinctCounts:
    """Distinct clips and assets of rows added one partition at a time; spills under
    ``directory`` (removed by :meth:`close`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir()
        self.clips = 0
        self._writers: dict[int, Any] = {}
        self._stack = ExitStack()

    def add(self, rows: pa.Table) -> None:
        """Count one partition's rows (``clip_id`` and ``asset_id``; partitions hold
        disjoint ``clip_id`` ranges)."""
        self.clips += int(pc.count_distinct(rows["clip_id"]).as_py())
        ids = pc.unique(rows["asset_id"]).drop_null()  # count_distinct skips nulls too
        if len(ids) == 0:
            return
        buckets = _buckets(ids)
        order = np.argsort(buckets, kind="stable")
        ids, buckets = ids.take(pa.array(order)), buckets[order]
        bounds = np.flatnonzero(np.diff(buckets)) + 1
        starts, stops = np.r_[0, bounds].tolist(), np.r_[bounds, buckets.size].tolist()
        for lo, hi in zip(starts, stops, strict=True):
            self._writer(int(buckets[lo]), ids.type).write_batch(
                pa.record_batch([ids.slice(lo, hi - lo)], names=["id"])
            )

    def assets(self) -> int:
        """The distinct assets of every row added (closes the spill files)."""
        self._stack.close()
        total = 0
        for b in sorted(self._writers):
            with pa.memory_map(str(self._path(b)), "r") as source:
                ids = pa.ipc.open_stream(source).read_all()["id"]
            total += int(pc.count_distinct(ids).as_py())
            del ids
        return total

    def close(self) -> None:
        self._stack.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _writer(self, bucket: int, kind: pa.DataType) -> Any:
        if bucket not in self._writers:
            schema = pa.schema([("id", kind)])
            sink = self._stack.enter_context(pa.OSFile(str(self._path(bucket)), "wb"))
            writer = pa.ipc.new_stream(sink, schema, options=_SPILL)
            self._writers[bucket] = self._stack.enter_context(writer)
        return self._writers[bucket]

    def _path(self, bucket: int) -> Path:
        return self.directory / f"assets-{bucket:03d}.arrows"


def _buckets(ids: pa.Array) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Each id's bucket: a CRC-32 of its first two characters (or bytes), mod
    :data:`BUCKETS`: a function of the id alone, whatever partition it came from."""
    if pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type):
        heads = pc.utf8_slice_codeunits(ids, 0, 2)
    else:
        heads = pc.binary_slice(ids, 0, 2)
    encoded = pc.dictionary_encode(heads)
    keys = encoded.dictionary.to_pylist()
    of_key = np.array(
        [zlib.crc32(k.encode() if isinstance(k, str) else bytes(k)) % BUCKETS for k in keys],
        dtype=np.int64,
    )
    out: np.ndarray[Any, np.dtype[np.int64]] = of_key[encoded.indices.to_numpy()]
    return out
