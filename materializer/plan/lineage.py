"""``lineage.arrow`` (manifest row -> the steps that serve it) by an external sort.

The plan lists rows by step; lineage inverts it. Holding every (row, step) pair of a
plan of 10^8+ rows costs gigabytes, so the inversion is a bucket sort on disk: one pass
over ``plan.arrow`` appends each batch's pairs to the spill file of their row range
(a fixed number of manifest rows each), then each
range is read back alone, sorted by (row, step) and written as the next lineage batches.
Peak memory is one range's pairs plus one plan batch, whatever the plan's size.

A pair is spilled as one sort key, ``(row - range start) * span + step`` (``span``: the
plan's steps, read first from its ``step`` column): ``uint32`` when every key of a range
fits in 32 bits (608k rows x 9,765 steps, the benchmark's 1M-clip cut, fits in two
ranges), else ``int64``. A 4-byte key quarters the spill and its reads against a
(row, step) pair of int64s and sorts about twice as fast.

The output is the same as sorting every pair at once: rows ascending, steps ascending
within a row (a row a step holds twice lists that step twice), in batches of
:data:`manifests.ipc.DEFAULT_CHUNK` rows, so the file's bytes do not depend on the range
size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from manifests.format import LINEAGE_SCHEMA
from manifests.ipc import DEFAULT_CHUNK, ipc_writer, iter_batches

__all__ = ["PAIRS_PER_RANGE", "write_lineage"]

#: The (row, step) pairs one range should hold (a 4- or 8-byte key each: 64 MiB at
#: most, sorted in place), unless more ranges than :data:`_MAX_RANGES` would be needed.
PAIRS_PER_RANGE = 8 << 20
_MAX_RANGES = 256  # open spill files at once, well under the usual 1024 descriptors


def write_lineage(
    path: Path,
    plan_path: Path,
    num_rows: int,
    plan_rows: int,
    spill: Path,
    *,
    pairs_per_range: int = PAIRS_PER_RANGE,
) -> None:
    """Write ``lineage.arrow`` at ``path`` for the ``num_rows`` manifest rows of the plan
    at ``plan_path`` (``plan_rows`` pairs in all), spilling into directory ``spill``."""
    per_range = _rows_per_range(num_rows, plan_rows, pairs_per_range)
    ranges = max(1, -(-num_rows // per_range))
    span = _step_span(plan_path)
    dtype = _key_dtype(per_range, span)
    spill.mkdir(parents=True, exist_ok=True)
    files = [spill / f"lineage-{r:05d}.bin" for r in range(ranges)]
    _spill(plan_path, files, per_range, span, dtype)
    with ipc_writer(path, LINEAGE_SCHEMA) as writer:
        out = _Batches(writer)
        for r, file in enumerate(files):
            lo, hi = r * per_range, min(num_rows, (r + 1) * per_range)
            counts, steps = _sorted_range(file, hi - lo, span, dtype)
            file.unlink(missing_ok=True)
            out.add(counts, steps)
        out.flush()


def _rows_per_range(num_rows: int, plan_rows: int, pairs_per_range: int) -> int:
    """Rows per range: about ``pairs_per_range`` pairs each, at most _MAX_RANGES ranges."""
    mean = plan_rows / max(1, num_rows)
    wanted = max(int(pairs_per_range / max(mean, 1e-9)), -(-num_rows // _MAX_RANGES), 1)
    return wanted


#: Keys of a range below this bound are spilled and sorted as ``uint32``.
NARROW_KEYS = 1 << 32


def _key_dtype(per_range: int, span: int) -> np.dtype[Any]:
    """``uint32`` when every key ``(row - lo) * span + step`` of a range fits, else int64."""
    return np.dtype(np.uint32 if per_range * span <= NARROW_KEYS else np.int64)


def _step_span(plan_path: Path) -> int:
    """The plan's steps (its largest step + 1; 1 for an empty plan): the key's radix."""
    span = 1
    for batch in iter_batches(plan_path, what="plan.arrow"):
        steps = batch.column("step").to_numpy()
        if len(steps):
            span = max(span, int(steps.max()) + 1)
    return span


def _spill(plan_path: Path, files: list[Path], per_range: int, span: int, dtype: Any) -> None:
    """Append every (row, step) pair's key to its range's file."""
    sinks: list[BinaryIO] = [open(f, "wb") for f in files]  # noqa: SIM115 - closed below
    try:
        for batch in iter_batches(plan_path, what="plan.arrow"):
            lists = batch.column("rows")
            rows = np.asarray(pc.list_flatten(lists).to_numpy(), dtype=np.int64)
            lengths = pc.list_value_length(lists).to_numpy()
            steps = np.repeat(batch.column("step").to_numpy().astype(np.int64), lengths)
            _append(sinks, rows, steps, per_range, span, dtype)
    finally:
        for sink in sinks:
            sink.close()


#: Up to this many ranges a batch's pairs are split by one mask per range (linear);
#: beyond, by one stable sort of the range numbers.
_MASKED_RANGES = 8


def _append(
    sinks: list[BinaryIO],
    rows: NDArray[np.int64],
    steps: NDArray[np.int64],
    per: int,
    span: int,
    dtype: Any,
) -> None:
    which = rows // per
    keys = ((rows - which * per) * span + steps).astype(dtype)
    if len(sinks) <= _MASKED_RANGES:
        for r, sink in enumerate(sinks):
            mask = which == r
            if mask.any():
                keys[mask].tofile(sink)
        return
    order = np.argsort(which, kind="stable")
    keys = keys[order]
    cuts = np.searchsorted(which[order], np.arange(len(sinks) + 1))
    for r, sink in enumerate(sinks):
        if cuts[r + 1] > cuts[r]:
            keys[cuts[r] : cuts[r + 1]].tofile(sink)


def _sorted_range(
    file: Path, rows: int, span: int, dtype: Any
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """A range of ``rows`` rows: each row's step count, and all their steps in
    (row, step) order."""
    keys = np.fromfile(file, dtype=dtype)
    keys.sort()
    counts = np.bincount(keys // dtype.type(span), minlength=rows).astype(np.int64)
    return counts, (keys % dtype.type(span)).astype(np.int64)


class _Batches:
    """Lineage rows appended range by range, written in batches of DEFAULT_CHUNK rows
    (the same boundaries whatever the ranges are)."""

    def __init__(self, writer: pa.ipc.RecordBatchFileWriter) -> None:
        self.writer = writer
        self.next_row = 0
        self.counts: list[NDArray[np.int64]] = []
        self.steps: list[NDArray[np.int64]] = []
        self.pending = 0

    def add(self, counts: NDArray[np.int64], steps: NDArray[np.int64]) -> None:
        self.counts.append(counts)
        self.steps.append(steps)
        self.pending += len(counts)
        while self.pending >= DEFAULT_CHUNK:
            self._write(DEFAULT_CHUNK)

    def flush(self) -> None:
        if self.pending or self.next_row == 0:
            self._write(self.pending)

    def _write(self, n: int) -> None:
        counts = np.concatenate(self.counts) if self.counts else np.zeros(0, np.int64)
        steps = np.concatenate(self.steps) if self.steps else np.zeros(0, np.int64)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts[:n], out=offsets[1:])
        used = int(offsets[-1])
        lists = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(steps[:used]))
        rows = pa.array(np.arange(self.next_row, self.next_row + n, dtype=np.int64))
        self.writer.write_batch(pa.record_batch([rows, lists], schema=LINEAGE_SCHEMA))
        self.next_row += n
        self.pending -= n
        self.counts, self.steps = [counts[n:]], [steps[used:]]
