"""Batch coercion: a producer's batch as columns of a table's types, checked row by row.

:func:`coerce_batch` turns a producer's batch (a ``pyarrow.Table`` or a list of dicts)
into columns of the table's types (:mod:`catalog.tables`), fills defaults and runs the
row checks that need no catalog state, vectorised with ``pyarrow.compute``; the first
bad row raises :class:`~catalog.errors.InvalidBatch` naming the row and the field.
:func:`fill_time` stamps the ingest time where a table's time column is absent, and
:func:`conform` casts rows about to be appended to a table's current schema. Checks
against the catalog (duplicates, references, objects) live in :mod:`catalog.ingest`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema

from catalog.errors import InvalidBatch
from catalog.rules import pack_fingerprint
from catalog.tables import PROBE_FIELDS, TableDef, arrow_schema

__all__ = ["coerce_batch", "conform", "fill_time"]


def _first_false(mask: pa.ChunkedArray | pa.Array) -> int | None:
    """Index of the first False (nulls count as good), or None."""
    bad = pc.invert(pc.fill_null(mask, True))
    if not pc.any(bad).as_py():
        return None
    return int(pc.index(bad, True).as_py())


def _bad(row: int | None, name: str, what: str) -> InvalidBatch:
    where = f"row {row}" if row is not None else "batch"
    return InvalidBatch(f"{where}, field {name!r}: {what}", row=row, field=name)


def _cast(name: str, values: pa.Array | pa.ChunkedArray, typ: pa.DataType) -> pa.ChunkedArray:
    """Cast a column, naming the first row that does not convert."""
    chunked = values if isinstance(values, pa.ChunkedArray) else pa.chunked_array([values])
    if chunked.type == typ:
        return chunked
    if _is_text(chunked.type) and _is_number(typ):
        # Arrow would parse "12" into 12; a JSON body with "12" is refused. One rule for
        # both: numbers arrive as numbers (times may still be ISO strings, as in JSON).
        row = _first_false(pc.is_null(chunked)) if chunked.null_count else 0
        raise _bad(row, name, f"a {chunked.type} column cannot fill {typ}: send numbers")
    # Timestamps below a microsecond are truncated (Iceberg stores microseconds).
    safe = not pa.types.is_timestamp(typ)
    try:
        return pc.cast(chunked, typ, safe=safe)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        for i, value in enumerate(chunked.to_pylist()):
            try:
                pc.cast(pa.array([value], type=chunked.type), typ, safe=safe)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                raise _bad(i, name, f"cannot convert {value!r} to {typ}") from exc
        raise _bad(None, name, f"cannot convert {chunked.type} to {typ}") from exc


def _is_text(typ: pa.DataType) -> bool:
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    return bool(
        pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
    )


def _is_number(typ: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(typ)
        or pa.types.is_floating(typ)
        or pa.types.is_boolean(typ)
        or pa.types.is_decimal(typ)
    )


def _pylist_column(name: str, values: list[Any], typ: pa.DataType) -> pa.ChunkedArray:
    if pa.types.is_timestamp(typ):
        values = [_parse_time(i, name, v) for i, v in enumerate(values)]
    elif name == "fingerprint":
        values = [_packed(i, v) for i, v in enumerate(values)]
    try:
        return pa.chunked_array([pa.array(values, type=typ)])
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        for i, value in enumerate(values):
            try:
                pa.array([value], type=typ)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                raise _bad(i, name, f"cannot convert {value!r} to {typ}") from exc
        raise _bad(None, name, str(exc)) from exc


def _packed(row: int, value: Any) -> Any:
    """A fingerprint given as frame hashes, packed (each an unsigned 64-bit int)."""
    if not isinstance(value, list | tuple | np.ndarray):
        return value
    try:
        return pack_fingerprint(value)
    except (OverflowError, TypeError, ValueError) as exc:
        raise _bad(row, "fingerprint", "frame hashes are unsigned 64-bit integers") from exc


def _parse_time(row: int, name: str, value: Any) -> Any:
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError as exc:
            raise _bad(row, name, f"not an ISO 8601 time: {value!r}") from exc
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)  # naive times are UTC
    return value


def _columns_from_rows(rows: Sequence[Mapping[str, Any]], target: pa.Schema) -> dict[str, Any]:
    names: dict[str, int] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise _bad(i, "*", f"a row must be a mapping, got {type(row).__name__}")
        for key in row:
            names.setdefault(key, i)
    cols: dict[str, Any] = {}
    for name, first_row in names.items():
        if name == "probe" and "probe_width" in target.names:
            for sub in PROBE_FIELDS:
                vals = [_probe_get(i, r, sub) for i, r in enumerate(rows)]
                cols[f"probe_{sub}"] = _pylist_column(
                    f"probe_{sub}", vals, target.field(f"probe_{sub}").type
                )
            continue
        if name not in target.names:
            raise _bad(first_row, name, "unknown column")
        cols[name] = _pylist_column(name, [r.get(name) for r in rows], target.field(name).type)
    return cols


def _probe_get(row: int, r: Mapping[str, Any], sub: str) -> Any:
    probe = r.get("probe")
    if probe is None:
        return None
    if not isinstance(probe, Mapping):
        raise _bad(row, "probe", "probe must be a mapping")
    unknown = set(probe) - set(PROBE_FIELDS)
    if unknown:
        raise _bad(row, "probe", f"unknown probe fields {sorted(unknown)}")
    return probe.get(sub)


def _columns_from_table(data: pa.Table, target: pa.Schema) -> dict[str, Any]:
    cols: dict[str, Any] = {}

    def put(name: str, col: Any) -> None:
        # Two columns for one field (a repeated name, or ``probe.width`` next to
        # ``probe_width``): which one would win is arbitrary, so neither does.
        if name in cols:
            raise _bad(0, name, "the column is given twice")
        cols[name] = _cast(name, col, target.field(name).type)

    for i, name in enumerate(data.column_names):
        col = data.column(i)  # by position: a repeated name is not an index
        if name == "probe" and pa.types.is_struct(col.type) and "probe_width" in target.names:
            sub_names = [col.type.field(j).name for j in range(col.type.num_fields)]
            for sub in sub_names:
                if sub not in PROBE_FIELDS:
                    raise _bad(0, "probe", f"unknown probe field {sub!r}")
                put(f"probe_{sub}", pc.struct_field(col, sub))
            continue
        if name not in target.names:
            raise _bad(0, name, "unknown column")
        put(name, col)
    return cols


def coerce_batch(
    tdef: TableDef,
    data: pa.Table | Sequence[Mapping[str, Any]],
    schema: Schema | None = None,
    now: dt.datetime | None = None,
    *,
    fill_time: bool = True,
) -> pa.Table:
    """A producer's batch as a table of the table's column types, checked row by row.

    Args:
        tdef: The table.
        data: A ``pyarrow.Table`` or a list of dicts (times may be ISO strings; a
            fingerprint may be a list of ints; assets may nest ``probe``).
        schema: The table's current Iceberg schema (columns added by schema evolution
            are accepted); ``tdef.schema`` when None.
        now: The ingest time for absent timestamps (UTC now when None).
        fill_time: False leaves absent timestamps of ``tdef.time_column`` null (the
            batch's canonical form, :mod:`catalog.idempotency`); :func:`fill_time`
            fills them later.

    Returns:
        Every column of the table, cast; nulls where the producer gave nothing.

    Raises:
        InvalidBatch: The first bad row: unknown or unconvertible column, missing
            required value, failed check.
    """
    target = arrow_schema(schema if schema is not None else tdef.schema)
    if isinstance(data, pa.Table):
        cols = _columns_from_table(data, target)
        n = data.num_rows
    elif isinstance(data, Sequence) and not isinstance(data, str | bytes):
        cols = _columns_from_rows(data, target)
        n = len(data)
    else:
        raise InvalidBatch(
            f"a batch is a pyarrow.Table or a list of dicts, got {type(data).__name__}",
            row=None,
            field=None,
        )
    fills: dict[str, Any] = dict(tdef.defaults)
    if tdef.time_column and fill_time:
        fills[tdef.time_column] = _ingest_time(now)
    for name, value in fills.items():
        typ = target.field(name).type
        if name in cols:
            cols[name] = pc.fill_null(cols[name], pa.scalar(value, type=typ))
        else:
            cols[name] = pa.chunked_array(
                [pa.nulls(n, typ).fill_null(pa.scalar(value, type=typ))], type=typ
            )
    for fld in target:
        if fld.nullable or fld.name in tdef.derived:
            continue
        if fld.name == tdef.time_column and not fill_time:
            continue
        if fld.name not in cols:
            raise _bad(0 if n else None, fld.name, "required column is missing")
        if cols[fld.name].null_count:
            row = _first_false(pc.is_valid(cols[fld.name]))
            raise _bad(row, fld.name, "required value is null")
    # Absent columns become nulls, so every check sees every column.
    table = pa.table({f.name: cols.get(f.name, pa.nulls(n, f.type)) for f in target})
    for name, check in tdef.checks:
        row = _first_false(check(table))
        if row is not None:
            raise _bad(
                row, name, f"value {table[name][row].as_py()!r} fails the {tdef.name}.{name} rule"
            )
    for name in tdef.json_columns:
        if name in table.column_names:
            _check_json(name, table[name])
    return table


def fill_time(tdef: TableDef, table: pa.Table, now: dt.datetime | None = None) -> pa.Table:
    """``table`` (from ``coerce_batch(..., fill_time=False)``) with the absent values of
    its time column set to ``now`` (UTC now when None)."""
    name = tdef.time_column
    if name is None or table[name].null_count == 0:
        return table
    filled = pc.fill_null(table[name], _ingest_time(now).cast(table[name].type))
    at = table.schema.get_field_index(name)
    return table.set_column(at, table.schema.field(at), filled)


def _ingest_time(now: dt.datetime | None) -> pa.Scalar:
    return pa.scalar(now or dt.datetime.now(dt.UTC), type=pa.timestamp("us", tz="UTC"))


def _check_json(name: str, col: pa.ChunkedArray) -> None:
    if col.null_count == len(col):
        return
    for i, text in enumerate(col.to_pylist()):
        if text is None:
            continue
        try:
            json.loads(text)
        except ValueError as exc:
            raise _bad(i, name, "not valid JSON") from exc


def conform(table: pa.Table, schema: Schema) -> pa.Table:
    """Order and complete columns to the Arrow schema of ``schema`` (absent optional
    columns become nulls) so that the table can be appended as is."""
    target = arrow_schema(schema)
    n = table.num_rows
    arrays = []
    for fld in target:
        if fld.name in table.column_names:
            arrays.append(_cast(fld.name, table[fld.name], fld.type))
        elif fld.nullable:
            arrays.append(pa.chunked_array([pa.nulls(n, fld.type)], type=fld.type))
        else:
            raise _bad(0 if n else None, fld.name, "required column is missing")
    return pa.Table.from_arrays(arrays, schema=target)
