"""Planned scans: the data files pyiceberg plans for a pinned read, shipped to a worker.

A partitioned cut (:mod:`materializer.partition`) plans each partition's scan here, in
the driver, and a worker process or Ray task on another host reads it with
:func:`read_plan` without opening the catalog: a :class:`ScanPlan` carries the table
metadata at the pin, the planned file scan tasks (column-bound pruning already done,
delete files included), the FileIO properties and the row filter, and it pickles.
What :func:`read_plan` returns equals ``catalog.scan(table, pin, columns, row_filter,
include_eval=True)`` row for row and type for type: the schema the snapshot was written
with, nulls for the asked columns it lacks. :func:`split_plan` cuts one plan into key
ranges by the files' column bounds, so a table is planned once for any number of them.

:func:`key_range` and :func:`all_of` build row filters without importing pyiceberg
(only ``catalog`` does): ``key_range("clip_id", "4000", "8000")`` keeps the ids with
that leading range, which Iceberg's column bounds prune to the files that hold them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    GreaterThanOrEqual,
    LessThan,
)
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow
from pyiceberg.types import StringType

from catalog.pins import Pin
from catalog.reads import RowFilter, _pred, _reshaped, missing_snapshot, parse_row_filter
from catalog.reads import schema_at as _schema_at
from catalog.tables import arrow_schema

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog

__all__ = [
    "ScanPlan",
    "all_of",
    "key_range",
    "plan_scan",
    "proven_pairs",
    "read_plan",
    "split_plan",
]


def key_range(column: str, lo: str | None, hi: str | None) -> BooleanExpression:
    """The row filter ``lo <= column < hi`` (an open end where None)."""
    expr: BooleanExpression = AlwaysTrue()
    if lo is not None:
        expr = And(expr, _pred(GreaterThanOrEqual, column, lo))
    if hi is not None:
        expr = And(expr, _pred(LessThan, column, hi))
    return expr


def all_of(*filters: RowFilter | None) -> BooleanExpression:
    """The conjunction of ``filters`` (None entries are ignored)."""
    expr: BooleanExpression = AlwaysTrue()
    for f in filters:
        if f is not None:
            expr = And(expr, parse_row_filter(f))
    return expr


@dataclass(frozen=True)
class ScanPlan:
    """One pinned read, planned: everything a worker needs to read it, picklable.

    Attributes:
        table: The table name.
        files: How many data files the plan reads (after pruning).
        rows: Their record count before row filtering (an upper bound of the rows).
    """

    table: str
    files: int
    rows: int
    _metadata: Any
    _metadata_location: str
    _io_properties: dict[str, str]
    _projection: Any
    _row_filter: Any
    _tasks: tuple[Any, ...]
    _wanted: tuple[str, ...]
    _out_fields: tuple[pa.Field, ...]


def plan_scan(
    cat: VidlakeCatalog,
    table: str,
    at: Pin,
    columns: list[str],
    row_filter: RowFilter | None = None,
) -> ScanPlan:
    """Plan ``table``'s ``columns`` at ``at`` under ``row_filter``, eval rows included.

    Raises:
        NotFound: The pin names a snapshot ``table`` no longer has.
    """
    tbl = cat.iceberg_table(table)
    sid = at[table]
    if sid is not None and tbl.metadata.snapshot_by_id(sid) is None:
        raise missing_snapshot(cat, table, sid)
    written = _schema_at(tbl, sid)
    out_schema = arrow_schema(written if sid is not None else tbl.schema())
    read = [c for c in columns if c in written.column_names]
    fields = tuple(
        out_schema.field(c) if c in out_schema.names else pa.field(c, pa.null()) for c in columns
    )
    at_sid: dict[str, Any] = {"snapshot_id": sid} if sid is not None else {}
    scan = tbl.scan(row_filter=parse_row_filter(row_filter), selected_fields=tuple(read), **at_sid)
    tasks = tuple(scan.plan_files()) if sid is not None else ()
    return ScanPlan(
        table=table,
        files=len(tasks),
        rows=sum(t.file.record_count for t in tasks),
        _metadata=tbl.metadata,
        _metadata_location=tbl.metadata_location,
        _io_properties=dict(tbl.io.properties),
        _projection=scan.projection(),
        _row_filter=scan.row_filter,
        _tasks=tasks,
        _wanted=tuple(columns),
        _out_fields=fields,
    )


def split_plan(
    plan: ScanPlan, column: str, ranges: list[tuple[str | None, str | None]]
) -> list[ScanPlan]:
    """``plan`` cut into one plan per ``[lo, hi)`` range of the string ``column``: each
    keeps the files whose column bounds can hold the range (all, where a file has no
    bounds) and adds the range to its row filter. The metadata is planned once, however
    many ranges there are."""
    field_id = plan._metadata.schema().find_field(column).field_id
    bounds = [_bounds(t.file, field_id) for t in plan._tasks]
    out = []
    for lo, hi in ranges:
        tasks = tuple(
            t
            for t, (low, high) in zip(plan._tasks, bounds, strict=True)
            if (hi is None or low is None or low < hi)
            and (lo is None or high is None or high >= lo)
        )
        out.append(
            replace(
                plan,
                files=len(tasks),
                rows=sum(t.file.record_count for t in tasks),
                _row_filter=And(plan._row_filter, key_range(column, lo, hi)),
                _tasks=tasks,
            )
        )
    return out


def proven_pairs(plan: ScanPlan, key: str, value: str) -> tuple[list[tuple[str, str]], ScanPlan]:
    """The ``(key, value)`` pairs of the planned files whose manifest proves each holds
    one pair (:func:`_proven_pair`), and the plan of the other files, to be read.

    Most files of ``scores``, ``captions`` and ``latents`` are one ingest job's rows of
    one filter, caption version or tokenizer: a cut's recipe check then reads none of
    them (decision 063)."""
    ids = [_string_field_id(plan, key), _string_field_id(plan, value)]
    pairs: list[tuple[str, str]] = []
    unproven = []
    for task in plan._tasks:
        pair = _proven_pair(task, ids)
        if pair is None:
            unproven.append(task)
        else:
            pairs.append(pair)
    rest = replace(
        plan,
        files=len(unproven),
        rows=sum(t.file.record_count for t in unproven),
        _tasks=tuple(unproven),
    )
    return pairs, rest


def _string_field_id(plan: ScanPlan, column: str) -> int | None:
    """The Iceberg field id of the string ``column`` in ``plan``'s table (None: no
    such column, or not a string: only a string's bounds are its UTF-8 bytes)."""
    try:
        found = plan._metadata.schema().find_field(column)
    except ValueError:
        return None
    return int(found.field_id) if isinstance(found.field_type, StringType) else None


def _proven_pair(task: Any, ids: list[int | None]) -> tuple[str, str] | None:
    """The one ``(key, value)`` pair of a planned file whose manifest proves it: no
    delete files, at least one row, no nulls in either column, and each column's
    lower bound equal to its upper bound (a truncated string bound never equals
    its upper bound, which is rounded up past it); else None (the file is read)."""
    data = task.file
    if task.delete_files or not data.record_count or None in ids:
        return None
    lower, upper = data.lower_bounds or {}, data.upper_bounds or {}
    nulls = data.null_value_counts or {}
    values = []
    for field_id in ids:
        low, high = lower.get(field_id), upper.get(field_id)
        if low is None or high is None or bytes(low) != bytes(high) or nulls.get(field_id, 1):
            return None
        try:
            values.append(bytes(low).decode("utf-8"))
        except UnicodeDecodeError:
            return None
    return values[0], values[1]


def _overlaps(low: str | None, high: str | None, lo: str | None, hi: str | None) -> bool:
    """Whether values in ``[low, high]`` (None: unbounded) can fall in ``[lo, hi)``."""
    return (hi is None or low is None or low < hi) and (lo is None or high is None or high >= lo)


def _bounds(data_file: Any, field_id: int) -> tuple[str | None, str | None]:
    """A data file's lower and upper bound of a string column (None: unknown). Iceberg
    truncates string bounds so that they still bound every value."""
    low = (data_file.lower_bounds or {}).get(field_id)
    high = (data_file.upper_bounds or {}).get(field_id)
    lower = bytes(low).decode("utf-8", "replace") if low is not None else None
    upper = bytes(high).decode("utf-8", "replace") if high is not None else None
    # Were an upper bound a bare prefix, values with that prefix would sort after it.
    return lower, (upper + "\U0010ffff" if upper is not None else None)


def read_plan(plan: ScanPlan) -> pa.Table:
    """The rows of ``plan`` (see the module docstring), read where this runs."""
    read = [c for c in plan._wanted if c in plan._projection.column_names]
    target = schema_to_pyarrow(plan._projection)
    if plan._tasks:
        io = load_file_io(plan._io_properties, plan._metadata_location)
        scan = ArrowScan(plan._metadata, io, plan._projection, plan._row_filter, True)
        batches = [b.cast(target) for b in scan.to_record_batches(plan._tasks)]
    else:
        batches = []
    reader = pa.RecordBatchReader.from_batches(target, iter(batches))
    empty = pa.array([], pa.large_string())
    if read == list(plan._wanted):
        return reader.read_all()
    out = pa.schema(plan._out_fields)
    return _reshaped(reader, list(plan._wanted), read, out, None, empty).read_all()
