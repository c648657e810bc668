"""Zero-copy access to a memory-mapped IPC artifact located by a ``0..n-1`` key column.

:class:`MappedFile` keeps one mapping of ``plan.arrow`` or ``index.arrow`` open per
process (:func:`manifests.ipc.open_mapped`) and finds the record batch holding key
``k`` in O(1) when batches hold a fixed number of records (all but the last), falling
back to binary search over per-batch offsets, built on the first miss, when they do
not. Each hit is confirmed on the key column. :func:`int_view` and
:func:`list_views` expose Arrow buffers as numpy views without copying.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from catalog.errors import IntegrityError
from manifests.ipc import iter_batches, open_mapped

__all__ = ["MappedFile", "int_view", "list_views"]


def int_view(arr: pa.Array, dtype: type[np.generic]) -> NDArray[Any]:
    """A zero-copy numpy view of a fixed-width, null-free Arrow array."""
    buf = arr.buffers()[1]
    if buf is None or len(arr) == 0:
        return np.empty(0, dtype=dtype)
    return np.frombuffer(
        buf, dtype=dtype, count=len(arr), offset=arr.offset * np.dtype(dtype).itemsize
    )


def list_views(arr: pa.Array, dtype: type[np.generic]) -> tuple[NDArray[np.int32], NDArray[Any]]:
    """Zero-copy (offsets, values) of a ``list<fixed width>`` array."""
    offsets = np.frombuffer(
        arr.buffers()[1], dtype=np.int32, count=len(arr) + 1, offset=arr.offset * 4
    )
    return offsets, int_view(arr.values, dtype)


class MappedFile:
    """An Arrow IPC file mapped into memory, located by a 0..n-1 key column."""

    def __init__(self, path: Path, schema: pa.Schema, key: str, what: str) -> None:
        self.path = path
        self.key = key
        self.what = what
        self._last: tuple[int, pa.RecordBatch] | None = None
        self._offsets: NDArray[np.int64] | None = None
        self._stride = 1
        self.length = 0
        self._whole: pa.Buffer | None = None
        self._whole_lock = threading.Lock()  # seek + read: one thread at a time
        self._file = open_mapped(path, schema=schema, what=what)
        try:
            self.num_batches = self._file.num_batches
            if self.num_batches:
                # Read through a short-lived private mapping: this rank may never use
                # the first and last batches, so their pages need not stay resident.
                with open_mapped(path, what=what) as private:
                    first = private.batch(0).num_rows
                    last = private.batch(self.num_batches - 1).num_rows
                self._stride = max(first, 1)
                # Assumes equal batches; locate() confirms each hit on the key column.
                self.length = (self.num_batches - 1) * first + last
        except BaseException:
            self._file.close()
            raise

    def close(self) -> None:
        self._last = self._whole = None
        self._file.close()

    @property
    def schema(self) -> pa.Schema:
        return self._file.schema

    def _whole_buffer(self) -> pa.Buffer:
        with self._whole_lock:
            if self._whole is None:
                source = self._file.source
                source.seek(0)
                self._whole = source.read_buffer()  # zero-copy: the mapping itself
            return self._whole

    def whole(self) -> NDArray[np.uint8]:
        """The whole mapped file as a read-only byte array (no copy; only the pages
        read through it become resident). It pins the mapping: drop it with the file."""
        return np.frombuffer(self._whole_buffer(), dtype=np.uint8)

    def whole_address(self) -> int:
        """The address of the file's first byte in this process (buffer addresses of
        its record batches minus this are offsets in the file)."""
        return int(self._whole_buffer().address)

    def batch(self, b: int) -> pa.RecordBatch:
        last = self._last
        if last is not None and last[0] == b:
            return last[1]
        batch = self._file.batch(b)
        self._last = (b, batch)
        return batch

    def scan(self) -> Iterator[pa.RecordBatch]:
        """Every record batch, read through a private, short-lived mapping.

        Whole-file passes touch every page; doing them on a mapping that is unmapped
        right after keeps those pages out of this process's resident set.
        """
        yield from iter_batches(self.path, what=self.what)

    def build_offsets(self) -> None:
        """Start offsets of every batch: the fallback for unevenly sized batches."""
        if self._offsets is not None:
            return
        sizes = [batch.num_rows for batch in self.scan()]
        self._offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self.length = int(self._offsets[-1])

    def split(self, keys: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """(batch index, position in batch) for each key, assuming the current layout."""
        if self._offsets is None:
            b = keys // self._stride
            return b, keys - b * self._stride
        b = np.searchsorted(self._offsets, keys, side="right").astype(np.int64) - 1
        return b, keys - self._offsets[b]

    def locate(self, k: int) -> tuple[pa.RecordBatch, int]:
        """The batch holding key ``k`` and its position there, checked on the key column."""
        for _ in range(2):
            bs, pos = self.split(np.array([k], dtype=np.int64))
            b, p = int(bs[0]), int(pos[0])
            if 0 <= b < self.num_batches:
                batch = self.batch(b)
                if p < batch.num_rows and int_view(batch.column(self.key), np.int64)[p] == k:
                    return batch, p
            if self._offsets is not None:
                break
            self.build_offsets()
        raise IntegrityError(
            f"{self.what} at {self.path}: {self.key} {k} is not where the file says it is",
            path=str(self.path),
        )
