"""Query results as bytes, capped in rows and in bytes.

The sandbox worker turns DuckDB's Arrow batches into the response body itself, inside
the query's deadline and memory cap: JSON rows (times ISO 8601, bytes hex, NaN null)
or an Arrow IPC stream. Either stops at ``max_rows`` rows or before ``max_bytes``
bytes, whichever comes first, and says that it was truncated.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from catalog.errors import InvalidSQL

__all__ = ["Encoded", "encode_arrow", "encode_json", "to_json_rows"]

Check = Callable[[], None] | None

#: Values (rows x columns) converted at a time: the deadline is checked between
#: chunks, so a chunk must take milliseconds even for a very wide result.
_CHUNK_VALUES = 32_768


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)


def to_json_rows(table: pa.Table | pa.RecordBatch) -> list[list[Any]]:
    """Rows of ``table`` as JSON-ready lists (times ISO 8601, bytes hex, NaN null)."""
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return [[_jsonable(col[r]) for col in columns] for r in range(table.num_rows)]


@dataclass(frozen=True)
class Encoded:
    """An encoded result: ``body`` holds ``rows`` rows; ``truncated`` when more
    matched than the caps let through."""

    body: bytes
    rows: int
    truncated: bool


def _too_large(max_bytes: int) -> InvalidSQL:
    return InvalidSQL(
        f"a single result row is larger than the result limit of {max_bytes} bytes",
        reason="result_too_large",
        limit_bytes=max_bytes,
    )


def _slices(batches: Iterable[pa.RecordBatch], check: Check) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        size = max(1, _CHUNK_VALUES // max(1, batch.num_columns))
        for start in range(0, batch.num_rows, size):
            if check is not None:
                check()
            yield batch.slice(start, size)


def encode_json(
    batches: Iterable[pa.RecordBatch], max_rows: int, max_bytes: int, check: Check = None
) -> Encoded:
    """A JSON array of row arrays; raises ``result_too_large`` when not even one row
    fits in ``max_bytes``. ``check`` is called before every chunk of a few thousand
    values (the caller's deadline: it raises to stop)."""
    parts: list[bytes] = [b"["]
    size, rows = 2, 0
    for chunk in _slices(batches, check):
        for row in to_json_rows(chunk):
            if rows == max_rows:
                return Encoded(b"".join([*parts, b"]"]), rows, True)
            text = json.dumps(row, separators=(",", ":"), ensure_ascii=False).encode()
            size += len(text) + (1 if rows else 0)
            if size > max_bytes:
                if rows == 0:
                    raise _too_large(max_bytes)
                return Encoded(b"".join([*parts, b"]"]), rows, True)
            parts.append(b"," + text if rows else text)
            rows += 1
    return Encoded(b"".join([*parts, b"]"]), rows, False)


def encode_arrow(
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    max_rows: int,
    max_bytes: int,
    check: Check = None,
) -> Encoded:
    """An Arrow IPC stream; the row and byte caps as :func:`encode_json`."""
    sink = pa.BufferOutputStream()
    rows, truncated = 0, False
    with pa.ipc.new_stream(sink, schema) as writer:
        for chunk in _slices(batches, check):
            take = chunk.slice(0, max_rows - rows)
            if take.num_rows < chunk.num_rows:
                truncated = True
            if sink.tell() + take.nbytes > max_bytes:
                take = _fit(take, max_bytes - sink.tell())
                if take.num_rows == 0 and rows == 0:
                    raise _too_large(max_bytes)
                truncated = True
            if take.num_rows:
                writer.write_batch(take)
                rows += take.num_rows
            if truncated:
                break
    return Encoded(sink.getvalue().to_pybytes(), rows, truncated)


def _fit(batch: pa.RecordBatch, room: int) -> pa.RecordBatch:
    """The longest prefix of ``batch`` whose buffers fit in ``room`` bytes."""
    lo, hi = 0, batch.num_rows
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if batch.slice(0, mid).nbytes <= room:
            lo = mid
        else:
            hi = mid - 1
    return batch.slice(0, lo)
