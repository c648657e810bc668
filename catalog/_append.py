"""A lean Iceberg fast append: one Parquet file per partition and one snapshot.

pyiceberg's ``Table.append`` costs 3-4x a bare ``pyarrow.parquet.write_table`` of the
same batch, and little of that is the Parquet write: it filters the batch once per
partition through Acero, re-derives and re-checks the schema, and stages the snapshot
in a ``Transaction`` whose ``table_metadata`` property deep-copies the whole table
metadata (every snapshot so far) a dozen times per commit, so that a commit gets
slower as the table ages. The catalog hands us batches already conformed to the table
schema (:func:`catalog.coerce.conform`), so this module does only what an append needs:

1. split the batch by partition value (identity transforms: a sort-free
   ``group_by`` over the partition columns; one group is the usual case);
2. write each part with ``pyarrow.parquet.ParquetWriter`` under the table's Parquet
   properties (rows per row group capped by :mod:`catalog.row_groups`, which this
   commit records as the table's property when an old table lacks it), the Iceberg
   field ids in the Arrow field metadata (``PARQUET:field_id``) so that readers map
   columns by id, and read the column statistics of the
   ``DataFile`` from the writer's footer (pyiceberg's own helpers, so the table's
   ``write.metadata.metrics.*`` modes apply);
3. write one manifest and a manifest list that keeps the parent's manifests (a fast
   append) and commit ``AddSnapshot`` + ``SetSnapshotRef`` with the requirement that
   the branch still points at the parent: a concurrent writer makes the commit fail
   with ``CommitFailedException``, exactly as pyiceberg's append does, and the files
   written for it are deleted. On a SQL catalog the commit is the catalog's own
   conditional UPDATE without pyiceberg's reload and deep copy of the metadata
   (:mod:`catalog._sql_commit`); there, any other commit since the table was loaded
   fails it.

Tables this path does not cover (format v3 row lineage, non-identity partition
transforms) go through pyiceberg's ``Table.append`` unchanged.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import (
    _get_parquet_writer_kwargs,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestFile,
    write_manifest_list,
)
from pyiceberg.partitioning import PartitionFieldValue, PartitionKey, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
)
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record

from catalog import manifest_merge, row_groups
from catalog._sql_commit import commit as sql_commit
from catalog.iceberg_files import added_entry, remove_files, write_manifest_file

__all__ = ["append"]


def append(
    tbl: Table,
    rows: pa.Table,
    snapshot_properties: Mapping[str, str],
    *,
    alongside: Callable[[], object] | None = None,
) -> None:
    """Append ``rows`` (already in the Arrow form of ``tbl``'s schema) in one commit.

    ``tbl`` is updated in place to the committed metadata, as ``Table.append`` does.

    Args:
        tbl: The table (its metadata is the parent of the new snapshot).
        rows: The rows, conformed to the table schema.
        snapshot_properties: Extra snapshot summary properties.
        alongside: A check to run in this thread while the data files are written in
            another (the Parquet write releases the GIL); if it raises, nothing is
            committed, the files are removed and its exception propagates.

    Raises:
        CommitFailedException: Another writer moved the branch since ``tbl`` was loaded
            (nothing is committed; the files written for this attempt are removed).
    """
    meta = tbl.metadata
    spec = meta.spec()
    if meta.format_version >= 3 or not all(
        isinstance(f.transform, IdentityTransform) for f in spec.fields
    ):
        if alongside is not None:
            alongside()
        tbl.append(rows, snapshot_properties=dict(snapshot_properties))
        return
    written: list[str] = []
    try:
        parts = _partitions(rows, spec, meta.schema())

        def write() -> list[DataFile]:
            return [_write_data_file(tbl, p, k, i, written) for i, (k, p) in enumerate(parts)]

        if alongside is None:
            files = write()
        else:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="vidlake-write") as pool:
                pending = pool.submit(write)
                try:
                    alongside()
                finally:
                    wait([pending])  # its files are listed in `written` either way
            files = pending.result()
        updates, requirements = _snapshot(tbl, files, snapshot_properties, written)
    except BaseException:
        remove_files(tbl, written)
        raise
    try:
        sql_commit(tbl, requirements, updates)  # updates tbl in place
    except CommitFailedException:
        remove_files(tbl, written)  # rejected: nothing references the files
        raise
    # Any other failure of the commit may have landed it: its files stay (an orphan
    # file is harmless, a missing one is not).


def _partitions(
    rows: pa.Table, spec: PartitionSpec, schema: Schema
) -> list[tuple[PartitionKey | None, pa.Table]]:
    """The batch split by identity partition values (one part when unpartitioned)."""
    if spec.is_unpartitioned():
        return [(None, rows)]
    names = [schema.find_column_name(f.source_id) for f in spec.fields]
    cols = [n for n in names if n is not None]
    if len(cols) != len(spec.fields):
        raise ValueError(f"partition source columns missing from the schema: {spec}")
    # Usual case: the whole batch is one partition (a score batch of one filter).
    firsts = [rows[c][0].as_py() if rows.num_rows else None for c in cols]
    if all(
        rows[c].null_count == 0 and pc.all(pc.equal(rows[c], v)).as_py()
        for c, v in zip(cols, firsts, strict=True)
    ):
        return [(_key(spec, schema, firsts), rows)]
    parts: list[tuple[PartitionKey | None, pa.Table]] = []
    for values in rows.select(cols).group_by(cols).aggregate([]).to_pylist():
        mask = None
        for c in cols:
            v = values[c]
            m = pc.is_null(rows[c]) if v is None else pc.fill_null(pc.equal(rows[c], v), False)
            mask = m if mask is None else pc.and_(mask, m)
        parts.append((_key(spec, schema, [values[c] for c in cols]), rows.filter(mask)))
    return parts


def _key(spec: PartitionSpec, schema: Schema, values: list[Any]) -> PartitionKey:
    return PartitionKey(
        field_values=[
            PartitionFieldValue(field=f, value=v) for f, v in zip(spec.fields, values, strict=True)
        ],
        partition_spec=spec,
        schema=schema,
    )


#: Top-level columns written without a dictionary wherever they appear: a batch holds
#: few rows per value (see :func:`_new_file_plan`).
_PER_ROW_KEYS = frozenset({"clip_id"})

_FilePlan = tuple[pa.Schema, dict[str, Any], int, dict[int, Any], dict[str, int]]
_PLANS: dict[tuple[str, int, tuple[tuple[str, str], ...]], _FilePlan] = {}


def _file_plan(meta: TableMetadata) -> _FilePlan:
    """Per (table, schema, properties): the Arrow schema with field ids, writer
    options, row group size, statistics plan and column-path → field-id map."""
    key = (str(meta.table_uuid), meta.current_schema_id, tuple(sorted(meta.properties.items())))
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) > 256:
            _PLANS.clear()
        plan = _PLANS[key] = _new_file_plan(meta.schema(), meta.properties)
    return plan


def _new_file_plan(schema: Schema, props: Mapping[str, str]) -> _FilePlan:
    props = dict(props)
    row_group = row_groups.row_group_rows(props)  # an old table's limit, capped
    paths = parquet_path_to_id_mapping(schema)
    kwargs = _get_parquet_writer_kwargs(props)
    unique = set(schema.identifier_field_ids) | {
        f.field_id for f in schema.fields if f.name in _PER_ROW_KEYS
    }
    if unique:
        # An identifier column holds a distinct value per row, and a clip-keyed table
        # (scores, captions, latents) a clip's id once per filter, caption or rung, so
        # the writer would build a dictionary page up to its limit and then throw it
        # away (~12 % of a clip batch's write, ~6 ms of a 100k-row score batch's):
        # dictionary-encode every other column only.
        kwargs["use_dictionary"] = [p for p, fid in paths.items() if fid not in unique]
    return (
        schema_to_pyarrow(schema, include_field_ids=True),
        kwargs,
        row_group,
        compute_statistics_plan(schema, props),
        paths,
    )


def _write_data_file(
    tbl: Table, rows: pa.Table, key: PartitionKey | None, task: int, written: list[str]
) -> DataFile:
    meta = tbl.metadata
    target, kwargs, row_group, stats_plan, paths = _file_plan(meta)
    # Same types, field ids added as metadata: no data is copied.
    rows = pa.Table.from_arrays(rows.columns, schema=target)
    path = tbl.location_provider().new_data_location(
        data_file_name=f"00000-{task}-{uuid.uuid4()}.parquet", partition_key=key
    )
    out = tbl.io.new_output(path)
    written.append(path)
    with out.create(overwrite=False) as stream:
        writer = pq.ParquetWriter(stream, schema=target, store_decimal_as_integer=True, **kwargs)
        try:
            writer.write_table(rows, row_group_size=row_group)
        finally:
            writer.close()
        size = stream.tell()
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=writer.writer.metadata,
        stats_columns=stats_plan,
        parquet_column_mapping=paths,
    )
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=key.partition if key is not None else Record(),
        file_size_in_bytes=size,
        sort_order_id=None,
        spec_id=meta.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **stats.to_serialized_dict(),
    )


def _manifests(
    tbl: Table,
    files: list[DataFile],
    snapshot_id: int,
    commit: uuid.UUID,
    codec: str,
    written: list[str],
) -> list[ManifestFile]:
    """The new snapshot's manifests: one for ``files``, then the parent's live ones,
    merged by :func:`catalog.manifest_merge.merge` (which bounds their number)."""
    meta = tbl.metadata
    parent = meta.snapshot_by_name(MAIN_BRANCH)
    entries = [added_entry(snapshot_id, data_file) for data_file in files]
    new = write_manifest_file(
        tbl, f"{commit}-m0.avro", meta.default_spec_id, snapshot_id, codec, written, entries
    )
    if parent is None:
        return [new]
    kept = [m for m in parent.manifests(io=tbl.io) if m.has_added_files() or m.has_existing_files()]
    # Of the manifests this commit writes: path → (manifest, its entries). A merge reads
    # them from memory: read back, this commit's entries would carry the list's
    # unassigned sequence number (-1) instead of inheriting the commit's.
    own = {written[-1]: (new, entries)}

    def read(m: ManifestFile) -> list[ManifestEntry]:
        for mine, its_entries in own.values():
            if m is mine:
                return its_entries
        return m.fetch_manifest_entry(tbl.io, discard_deleted=False)

    def write(spec_id: int, merged_entries: list[ManifestEntry]) -> ManifestFile:
        name = f"{commit}-m{len(own)}.avro"
        m = write_manifest_file(tbl, name, spec_id, snapshot_id, codec, written, merged_entries)
        own[written[-1]] = (m, merged_entries)
        return m

    out = manifest_merge.merge([new, *kept], snapshot_id, meta.properties, read, write)
    # Merged away (the new manifest, or a tier merged again in the same commit):
    # nothing will reference them.
    unused = [path for path, (m, _) in own.items() if all(m is not o for o in out)]
    for path in unused:
        written.remove(path)
    remove_files(tbl, unused)
    return out


def _snapshot(
    tbl: Table, files: list[DataFile], properties: Mapping[str, str], written: list[str]
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Manifest, manifest list and the commit updates of a fast append of ``files``."""
    meta = tbl.metadata
    schema, spec = meta.schema(), meta.spec()
    codec = meta.properties.get(
        TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
    )
    snapshot_id = meta.new_snapshot_id()
    parent = meta.snapshot_by_name(MAIN_BRANCH)
    parent_id = parent.snapshot_id if parent is not None else None
    commit = uuid.uuid4()
    locations = tbl.location_provider()
    manifests = _manifests(tbl, files, snapshot_id, commit, codec, written)
    collector = SnapshotSummaryCollector(
        partition_summary_limit=int(
            meta.properties.get(
                TableProperties.WRITE_PARTITION_SUMMARY_LIMIT,
                TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT,
            )
        )
    )
    for data_file in files:
        collector.add_file(data_file=data_file, partition_spec=spec, schema=schema)
    summary = update_snapshot_summaries(
        summary=Summary(operation=Operation.APPEND, **collector.build(), **properties),
        previous_summary=parent.summary if parent is not None else None,
    )
    sequence_number = meta.next_sequence_number()
    list_path = locations.new_metadata_location(f"snap-{snapshot_id}-0-{commit}.avro")
    written.append(list_path)
    with write_manifest_list(
        format_version=meta.format_version,
        output_file=tbl.io.new_output(list_path),
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent_id,
        sequence_number=sequence_number,
        avro_compression=codec,  # type: ignore[arg-type]
    ) as manifest_list:
        manifest_list.add_manifests(manifests)
    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent_id,
        manifest_list=list_path,
        sequence_number=sequence_number,
        summary=summary,
        schema_id=meta.current_schema_id,
    )
    updates: tuple[Any, ...] = (
        AddSnapshotUpdate(snapshot=snapshot),
        SetSnapshotRefUpdate(
            snapshot_id=snapshot_id,
            parent_snapshot_id=parent_id,
            ref_name=MAIN_BRANCH,
            type=SnapshotRefType.BRANCH,
            max_ref_age_ms=None,
            max_snapshot_age_ms=None,
            min_snapshots_to_keep=None,
        ),
    )
    fix = row_groups.stale(meta.properties)
    if fix is not None:  # an old table: record the limit its new files were written under
        updates += (SetPropertiesUpdate(updates=fix),)
    requirements = (AssertRefSnapshotId(snapshot_id=parent_id, ref=MAIN_BRANCH),)
    return updates, requirements
