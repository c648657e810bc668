"""What the plan quality report reads of the manifest: only the rows the plan draws.

Every number of the report (:mod:`materializer.quality`) is a function of the plan's
draws and, per drawn row, its stream, bucket, tokens and key values, except the epochs'
row counts, which are per ``(stream, bucket)``. So the report needs O(plan) per-row
state, not O(manifest): :func:`drawn_rows` reads the manifest in consecutive slices
(an in-memory table, or ``manifest.parquet`` one row group at a time,
:func:`manifest_slices`), keeps the drawn rows' values and counts the rest. A
partitioned cut's driver then holds no per-kept-sample column for the report
(docs/scale-out.md, round 7; decision 059).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from numpy.typing import NDArray

from catalog.errors import InvalidInput

__all__ = [
    "AUTOCORR_KEYS",
    "DrawnRows",
    "codes",
    "drawn_rows",
    "manifest_slices",
    "whole_table",
]

#: The manifest columns whose autocorrelation is reported, when present.
AUTOCORR_KEYS = ("source", "asset_id", "cluster")
_COLUMNS = ("stream", "bucket", "tokens")

Ints = NDArray[np.int64]


@dataclass(frozen=True)
class DrawnRows:
    """The manifest as the quality report reads it.

    Attributes:
        rows: The manifest rows whose values are kept, sorted, each once: the rows
            the plan draws, or every row (:func:`whole_table`).
        stream: Stream id per drawn row.
        bucket: Bucket id per drawn row.
        tokens: Latent tokens per drawn row.
        keys: Per :data:`AUTOCORR_KEYS` column present, integer codes per drawn row,
            equal exactly where the values are (their numbering is arbitrary).
        available: Manifest rows per ``(stream, bucket)``, every row counted.
    """

    rows: Ints
    stream: Ints
    bucket: Ints
    tokens: Ints
    keys: Mapping[str, Ints]
    available: Mapping[tuple[int, int], int]

    @classmethod
    def of_arrays(
        cls, plan_rows: Ints, stream: Ints, bucket: Ints, tokens: Ints, keys: Mapping[str, Ints]
    ) -> DrawnRows:
        """Whole per-manifest-row arrays (``keys`` already codes), every row kept:
        ``rows`` is ``0 … n-1``, so the plan's rows need no renumbering. The report is
        the same as over the drawn rows alone: it compares and counts values only at
        the plan's rows.

        Raises:
            InvalidInput: The plan draws a row the manifest does not have.
        """
        n = stream.size
        if plan_rows.size:
            _check_rows(np.array([plan_rows.min(), plan_rows.max()]), n)
        return cls(
            rows=np.arange(n, dtype=np.int64),
            stream=stream,
            bucket=bucket,
            tokens=tokens,
            keys={k: np.asarray(c) for k, c in keys.items()},
            available=_pair_counts(stream, bucket, {}),
        )


def whole_table(plan_rows: Ints, table: pa.Table) -> DrawnRows:
    """:class:`DrawnRows` of a manifest held whole in memory (the one-process cut), by
    :meth:`DrawnRows.of_arrays`: sorting 10M plan rows for the drawn ones and searching
    them back cost ~3 s of the 1M-clip cut for no memory saved, the table being held
    anyway.

    Raises:
        InvalidInput: The plan draws a row the manifest does not have.
    """
    return DrawnRows.of_arrays(
        plan_rows,
        _ints(table["stream"]),
        _ints(table["bucket"]),
        _ints(table["tokens"]),
        {k: codes(table[k]) for k in AUTOCORR_KEYS if k in table.column_names},
    )


def drawn_rows(plan_rows: Ints, slices: Iterable[pa.Table]) -> DrawnRows:
    """:class:`DrawnRows` of a manifest given as consecutive ``slices`` in row order
    (each with ``stream``, ``bucket``, ``tokens`` and the :data:`AUTOCORR_KEYS` it has):
    the drawn rows' values are taken from each slice as it comes, so no more than one
    slice of the manifest is held beside them.

    Raises:
        InvalidInput: The plan draws a row the manifest does not have.
    """
    rows = np.unique(plan_rows)
    taken: list[pa.Table] = []
    available: dict[tuple[int, int], int] = {}
    first = 0
    for table in slices:
        m = table.num_rows
        lo, hi = np.searchsorted(rows, [first, first + m])
        names = [c for c in (*_COLUMNS, *AUTOCORR_KEYS) if c in table.column_names]
        taken.append(table.select(names).take(pa.array(rows[lo:hi] - first)))
        _pair_counts(_ints(table["stream"]), _ints(table["bucket"]), available)
        first += m
    _check_rows(rows, first)
    if not taken:
        empty = np.zeros(0, np.int64)
        return DrawnRows(rows, empty, empty, empty, {}, available)
    drawn = pa.concat_tables(taken)
    return DrawnRows(
        rows=rows,
        stream=_ints(drawn["stream"]),
        bucket=_ints(drawn["bucket"]),
        tokens=_ints(drawn["tokens"]),
        keys={k: codes(drawn[k]) for k in AUTOCORR_KEYS if k in drawn.column_names},
        available=available,
    )


def manifest_slices(path: Path) -> Iterator[pa.Table]:
    """``manifest.parquet``'s columns that the report reads, one row group at a time."""
    reader = pq.ParquetFile(str(path))
    names = [c for c in (*_COLUMNS, *AUTOCORR_KEYS) if c in reader.schema_arrow.names]
    for group in range(reader.num_row_groups):
        yield reader.read_row_group(group, columns=names)


def codes(column: pa.ChunkedArray | pa.Array) -> Ints:
    """Integer codes of a categorical column (nulls are one more category)."""
    if pa.types.is_integer(column.type):
        values = pc.fill_null(column, -1).to_numpy()
        return np.unique(values, return_inverse=True)[1].astype(np.int64)
    encoded = pc.dictionary_encode(column).combine_chunks()
    indices = pc.fill_null(encoded.indices, len(encoded.dictionary))
    return np.asarray(indices.to_numpy(), dtype=np.int64)


def _ints(column: pa.ChunkedArray) -> Ints:
    return np.asarray(column.to_numpy(), dtype=np.int64)


def _pair_counts(
    stream: Ints, bucket: Ints, into: dict[tuple[int, int], int]
) -> dict[tuple[int, int], int]:
    """``into`` plus the rows per ``(stream, bucket)`` of these rows (ids >= 0)."""
    if stream.size:
        pair = stream * (int(bucket.max()) + 1) + bucket
        found, counts = np.unique(pair, return_counts=True)
        width = int(bucket.max()) + 1
        for p, c in zip(found.tolist(), counts.tolist(), strict=True):
            key = (p // width, p % width)
            into[key] = into.get(key, 0) + c
    return into


def _check_rows(rows: Ints, count: int) -> None:
    if rows.size and (rows[0] < 0 or rows[-1] >= count):
        raise InvalidInput(
            f"the plan draws manifest row {int(rows[-1])} but the manifest has {count} rows",
            field="rows",
        )
