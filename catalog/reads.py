"""Pinned reads: a table at a :class:`~catalog.pins.Pin`, eval rows left out unless asked.

A pin maps each table to an Iceberg snapshot id (and embedding models to LanceDB
versions), so that a snapshot cut sees one consistent state and can be replayed months
later. :func:`scan_batches` reads a table at a pin with the schema its snapshot was
written with; without ``include_eval`` it applies the one eval policy of
:mod:`catalog.table_names`: a table that carries ``split`` is filtered on it, one keyed
by a clip or asset id drops the ids of eval clips or assets at the pin. The latest-row
reads (:func:`latest_scores`, :func:`latest_captions`) and the governance state of every
asset (:func:`asset_status`) are built on it. :func:`snapshot_dataset` gives a
snapshot's data files as a pyarrow dataset, for readers that push their own filters
down (the service's SQL views).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, EqualTo, In, NotEqualTo
from pyiceberg.expressions.parser import parse as parse_filter
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from catalog import rules
from catalog.errors import InvalidInput, NotFound
from catalog.keycache import combined, snapshot_id
from catalog.pins import Pin
from catalog.table_names import EVAL_SPLIT, SPLIT_COLUMN, TABLE_NAMES, eval_key
from catalog.tables import arrow_schema

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog

__all__ = [
    "RowFilter",
    "asset_status",
    "eval_ids",
    "latest_captions",
    "latest_scores",
    "one_of",
    "pin",
    "scan_batches",
    "snapshot_dataset",
]

#: A row filter: pyiceberg's string form (``"score > 0.5"``) or an expression
#: (:func:`one_of` builds one without importing pyiceberg).
RowFilter: TypeAlias = str | BooleanExpression


def one_of(column: str, values: Sequence[Any]) -> BooleanExpression:
    """The row filter ``column IN values``."""
    return _pred(In, column, list(values))


def pin(cat: VidlakeCatalog, embeddings: Sequence[str] = ()) -> Pin:
    """The current snapshot id of every table, and the current LanceDB version of
    each of ``embeddings`` (None for a model without a table)."""
    at = Pin({name: snapshot_id(cat.iceberg_table(name)) for name in TABLE_NAMES})
    if not embeddings:
        return at
    from catalog.embeddings import current_versions

    return at.with_embeddings(current_versions(cat.config.lance, embeddings))


def scan_batches(
    cat: VidlakeCatalog,
    table: str,
    at: Pin | None = None,
    columns: Sequence[str] | None = None,
    row_filter: RowFilter | None = None,
    *,
    include_eval: bool = False,
) -> pa.RecordBatchReader:
    """``table`` at ``at`` (the current state when None) as a stream of record batches.

    A pin reads with the schema its snapshot was written with. Without a pin the
    current schema applies: columns added after the current snapshot read as nulls.
    """
    current = at is None
    at = at if at is not None else pin(cat)
    tbl = cat.iceberg_table(table)  # loaded after the pin: it knows the pinned snapshot
    sid = at[table]
    if sid is not None and tbl.metadata.snapshot_by_id(sid) is None:
        raise missing_snapshot(cat, table, sid)
    written = schema_at(tbl, sid)
    schema = tbl.schema() if current else written
    wanted = list(columns) if columns is not None else [f.name for f in schema.fields]
    unknown = [c for c in wanted if c not in schema.column_names]
    if unknown:
        raise InvalidInput(f"{table} has no columns {unknown}", field="columns")
    out_schema = arrow_schema(schema)
    if sid is None:
        return pa.RecordBatchReader.from_batches(
            pa.schema([out_schema.field(c) for c in wanted]), iter(())
        )
    expr = parse_row_filter(row_filter)
    leave_out, key, drop = _eval_exclusion(cat, table, at, include_eval)
    expr = And(expr, leave_out)
    read = [c for c in wanted if c in written.column_names]
    read += [key] if key and key not in read else []
    try:
        reader = tbl.scan(
            row_filter=expr, selected_fields=tuple(read), snapshot_id=sid
        ).to_arrow_batch_reader()
    except ValueError as exc:  # a filter naming an unknown column, a bad literal
        raise InvalidInput(f"bad row filter for {table}: {exc}", field="row_filter") from exc
    if len(drop) == 0 and read == wanted:
        return reader
    return _reshaped(reader, wanted, read, out_schema, key, drop)


def _eval_exclusion(
    cat: VidlakeCatalog, table: str, at: Pin, include_eval: bool
) -> tuple[BooleanExpression, str | None, pa.Array]:
    """What leaves ``table``'s eval rows out at ``at``: a row filter, or the key column
    and the eval ids to drop from it (:mod:`catalog.table_names`)."""
    none = pa.array([], pa.large_string())
    ek = eval_key(table)
    if include_eval or ek is None:
        return AlwaysTrue(), None, none
    if ek.carries_split(table):
        return _pred(NotEqualTo, SPLIT_COLUMN, EVAL_SPLIT), None, none
    return AlwaysTrue(), ek.key, _eval_ids(cat, ek.owner, ek.key, at)


def _reshaped(
    reader: pa.RecordBatchReader,
    wanted: list[str],
    read: list[str],
    out_schema: pa.Schema,
    key: str | None,
    drop: pa.Array,
) -> pa.RecordBatchReader:
    """``reader``'s batches without the rows whose ``key`` is in ``drop``, with the
    ``wanted`` columns (nulls for those the snapshot does not have)."""
    fields = [
        reader.schema.field(c) if c in read else out_schema.field(c).with_nullable(True)
        for c in wanted
    ]

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in reader:
            if len(drop) and key is not None:
                batch = batch.filter(pc.invert(pc.is_in(batch[key], value_set=drop)))
            arrays = [
                batch[f.name] if f.name in read else pa.nulls(batch.num_rows, f.type)
                for f in fields
            ]
            yield pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))

    return pa.RecordBatchReader.from_batches(pa.schema(fields), batches())


def missing_snapshot(cat: VidlakeCatalog, table: str, sid: int) -> NotFound:
    """The error for a pin at a snapshot that is gone, naming the erasure that
    expired it when a hard-takedown erasure did (``catalog.erase``)."""
    from catalog.erase.records import expired_by

    eid = expired_by(cat.objects, table, sid)
    if eid is None:
        return NotFound(f"{table} has no snapshot {sid} (expired?)", table=table, snapshot_id=sid)
    return NotFound(
        f"{table} snapshot {sid} was expired by erasure {eid} (a hard takedown); "
        "a cut pinned there cannot be replayed",
        table=table,
        snapshot_id=sid,
        erasure_id=eid,
    )


def eval_ids(cat: VidlakeCatalog, table: str, at: Pin) -> pa.Array:
    """The ids of ``table``'s eval rows at ``at``, for a table that carries ``split``
    (``assets``: asset ids, ``clips``: clip ids).

    Raises:
        InvalidInput: ``table`` does not carry ``split`` (its eval rows are those of
            the table its eval key names: :mod:`catalog.table_names`).
    """
    ek = eval_key(table)
    if ek is None or not ek.carries_split(table):
        owner = "none" if ek is None else ek.owner
        raise InvalidInput(
            f"{table} carries no split (its eval rows follow {owner})", field="table"
        )
    sid = at[table]
    if sid is not None and not cat.has_snapshot(table, sid):
        raise missing_snapshot(cat, table, sid)
    return _eval_ids(cat, table, ek.key, at)


def _eval_ids(cat: VidlakeCatalog, table: str, key: str, at: Pin) -> pa.Array:
    """Ids of eval assets (or clips) at the pin."""
    sid = at[table]
    if sid is None:
        return pa.array([], pa.large_string())
    tbl = cat.iceberg_table(table)
    rows = tbl.scan(
        row_filter=_pred(EqualTo, SPLIT_COLUMN, EVAL_SPLIT),
        selected_fields=(key,),
        snapshot_id=sid,
    ).to_arrow()
    return combined(rows[key])


def latest_scores(
    cat: VidlakeCatalog,
    at: Pin | None = None,
    versions: Mapping[str, str] | None = None,
    *,
    include_eval: bool = False,
) -> pa.Table:
    """One score per (clip_id, filter_name): see :meth:`VidlakeCatalog.latest_scores`."""
    rows = cat.scan("scores", at, include_eval=include_eval)
    if versions:
        names = pa.array(list(versions), pa.large_string())
        wanted = pa.array([str(versions[n]) for n in versions], pa.large_string())
        found = pc.index_in(rows["filter_name"], value_set=names)
        keep = pc.or_kleene(
            pc.is_null(found), pc.equal(rows["filter_version"], pc.take(wanted, found))
        )
        rows = rows.filter(pc.fill_null(keep, True))
    return rules.latest_rows(
        rows,
        keys=("clip_id", "filter_name"),
        order=[(c, "descending") for c in ("computed_at", "filter_version", "score", "job_id")],
    )


def latest_captions(
    cat: VidlakeCatalog,
    at: Pin | None = None,
    version: str | None = None,
    kinds: Sequence[str] | None = None,
    *,
    include_eval: bool = False,
) -> pa.Table:
    """One caption per (clip_id, kind): see :meth:`VidlakeCatalog.latest_captions`."""
    expr: BooleanExpression = AlwaysTrue()
    if version is not None:
        expr = And(expr, _pred(EqualTo, "caption_version", version))
    if kinds is not None:
        expr = And(expr, one_of("kind", kinds))
    rows = cat.scan("captions", at, row_filter=expr, include_eval=include_eval)
    return rules.latest_rows(
        rows,
        keys=("clip_id", "kind"),
        order=[(c, "descending") for c in ("ingested_at", "caption_version", "text", "job_id")],
    )


def asset_status(cat: VidlakeCatalog, at: Pin | None = None, *, include_eval: bool) -> pa.Table:
    """Governance state of every asset at the pin: see :meth:`VidlakeCatalog.asset_status`."""
    at = at if at is not None else pin(cat)
    assets = cat.scan(
        "assets",
        at,
        ["asset_id", "split", "probe_bitrate", "duplicate_of", "near_duplicates"],
        include_eval=True,
    )
    tombs = cat.scan("tombstones", at, ["asset_id", "kind"], include_eval=True)
    events = cat.scan(
        "asset_events", at, ["asset_id", "event", "related_asset_id", "at"], include_eval=True
    )
    status = rules.asset_status(assets, tombs, events)
    if not include_eval:
        status = status.filter(pc.not_equal(status[SPLIT_COLUMN], EVAL_SPLIT))
    return status


def snapshot_dataset(cat: VidlakeCatalog, table: str, sid: int | None) -> ds.Dataset:
    """All rows of ``table`` at snapshot ``sid`` (eval rows included) as a pyarrow
    dataset over its Parquet data files, so that a reader's filters push down; an
    empty dataset of the table's schema for None.

    Raises:
        NotFound: ``table`` has no snapshot ``sid``.
    """
    tbl = cat.iceberg_table(table)
    if sid is None:
        return ds.dataset(arrow_schema(tbl.schema()).empty_table())
    if tbl.metadata.snapshot_by_id(sid) is None:
        raise NotFound(f"{table} has no snapshot {sid}", table=table, snapshot_id=sid)
    io = tbl.io
    tasks = list(tbl.scan(snapshot_id=sid).plan_files())
    fs_by_scheme = getattr(io, "fs_by_scheme", None)
    parse = getattr(io, "parse_location", None)
    if fs_by_scheme is None or parse is None or any(t.delete_files for t in tasks) or not tasks:
        # Not a pyarrow FileIO (or deletes to apply): let pyiceberg read it.
        return ds.dataset(cat.scan(table, Pin({table: sid}), include_eval=True))
    locations = [parse(t.file.file_path, io.properties) for t in tasks]
    scheme, netloc = locations[0][0], locations[0][1]
    filesystem = fs_by_scheme(scheme, netloc)
    return ds.dataset([path for _, _, path in locations], format="parquet", filesystem=filesystem)


# -- pyiceberg helpers ----------------------------------------------------------------
def _pred(kind: type[Any], column: str, value: Any) -> BooleanExpression:
    """A pyiceberg predicate (its pydantic signature defeats mypy's reading)."""
    expr: BooleanExpression = kind(column, value)
    return expr


def schema_at(tbl: Table, sid: int | None) -> Schema:
    """The schema a snapshot was written with (the current one for an empty table)."""
    snap = tbl.metadata.snapshot_by_id(sid) if sid is not None else None
    if snap is not None and snap.schema_id is not None:
        for schema in tbl.metadata.schemas:
            if schema.schema_id == snap.schema_id:
                return schema
    return tbl.schema()


def parse_row_filter(row_filter: RowFilter | None) -> BooleanExpression:
    """``row_filter`` as a pyiceberg expression (None: every row).

    Raises:
        InvalidInput: A string that does not parse.
    """
    if row_filter is None:
        return AlwaysTrue()
    if isinstance(row_filter, str):
        try:
            return parse_filter(row_filter)
        except Exception as exc:  # pyparsing's ParseException and friends
            raise InvalidInput(
                f"cannot parse row filter {row_filter!r}: {exc}", field="row_filter"
            ) from exc
    return row_filter
