"""Compaction and manifest rewrite: one Iceberg ``replace`` commit per table.

The current snapshot's small data files (under half the target size) are read per
partition, sorted by the table's key, and written as files of about the target size;
in the same commit the snapshot's manifests are rewritten into one manifest of the
files kept (as ``existing``, their sequence numbers unchanged) plus one of the new
files, so a full scan plans from two manifests instead of one per ingest commit.
Deleted entries are dropped. The commit requires that ``main`` has not moved: a
concurrent ingest wins and this run leaves the table alone (the next run retries).

The rows of the new snapshot are exactly those of the old one (operation ``replace``:
incremental readers skip it); older snapshots keep their own files until they expire,
so a pinned read is untouched. Files written by a run killed before its commit are
orphans: :mod:`catalog.maintenance.orphans` removes them after its safety age.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import Any

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import (
    DataFile,
    ManifestContent,
    ManifestEntry,
    ManifestFile,
    write_manifest_list,
)
from pyiceberg.table import FileScanTask, Table, TableProperties
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate

from catalog._append import _key, _write_data_file
from catalog.iceberg_files import added_entry, existing_entry, remove_files, write_manifest_file

__all__ = ["PROP_MAINTENANCE", "compact_table"]

#: Snapshot summary property of a maintenance commit.
PROP_MAINTENANCE = "vidlake.maintenance"


def compact_table(
    tbl: Table, *, sort_by: tuple[str, ...], target_bytes: int, max_manifests: int = 2
) -> dict[str, Any]:
    """Compact ``tbl``'s small files and rewrite its manifests (see the module doc).

    Returns ``files_removed``, ``files_added``, ``manifests_before``, ``manifests_after``
    and ``snapshot_id`` (None when nothing was worth doing, or ``conflict`` when a
    concurrent commit won).
    """
    current = tbl.metadata.current_snapshot()
    done: dict[str, Any] = {"files_removed": 0, "files_added": 0, "snapshot_id": None}
    if current is None:
        return done
    manifests = current.manifests(io=tbl.io)
    done["manifests_before"] = done["manifests_after"] = len(manifests)
    if any(m.content != ManifestContent.DATA for m in manifests):
        return {**done, "skipped": "the table has delete files"}
    entries = [e for m in manifests for e in m.fetch_manifest_entry(tbl.io, discard_deleted=True)]
    groups = _small_groups(tbl, entries, target_bytes)
    if not groups and len(manifests) <= max_manifests:
        return done
    written: list[str] = []
    try:
        new_files = [
            f
            for group in groups
            for f in _rewrite_group(tbl, group, sort_by, target_bytes, written)
        ]
        old = {f.file_path for group in groups for f in group}
        kept = [e for e in entries if e.data_file.file_path not in old]
        sid = _commit(tbl, kept, [f for g in groups for f in g], new_files, written)
    except CommitFailedException:
        remove_files(tbl, written)
        return {**done, "conflict": True}
    except BaseException:
        remove_files(tbl, written)
        raise
    after = 0 if not kept else len({e.data_file.spec_id for e in kept})
    return {
        **done,
        "files_removed": len(old),
        "files_added": len(new_files),
        "manifests_after": after + (1 if new_files else 0),
        "snapshot_id": sid,
    }


def _small_groups(
    tbl: Table, entries: list[ManifestEntry], target_bytes: int
) -> list[list[DataFile]]:
    """Bins of small files of the default spec, one partition each, at most about
    ``target_bytes`` of input per bin; bins of a single file are left alone."""
    spec_id = tbl.metadata.default_spec_id
    by_partition: dict[tuple[Any, ...], list[DataFile]] = defaultdict(list)
    for e in entries:
        f = e.data_file
        if f.spec_id == spec_id and f.file_size_in_bytes < target_bytes // 2:
            by_partition[_values(f)].append(f)
    bins: list[list[DataFile]] = []
    for _, files in sorted(by_partition.items(), key=lambda kv: repr(kv[0])):
        files.sort(key=lambda f: f.file_path)
        current: list[DataFile] = []
        size = 0
        for f in files:
            if current and size + f.file_size_in_bytes > target_bytes:
                bins.append(current)
                current, size = [], 0
            current.append(f)
            size += f.file_size_in_bytes
        bins.append(current)
    return [b for b in bins if len(b) > 1]


def _values(f: DataFile) -> tuple[Any, ...]:
    """A data file's partition values (``Record`` indexes, but is not typed iterable)."""
    record = f.partition
    return tuple(record[i] for i in range(len(record)))


def _rewrite_group(
    tbl: Table,
    files: list[DataFile],
    sort_by: tuple[str, ...],
    target_bytes: int,
    written: list[str],
) -> list[DataFile]:
    meta = tbl.metadata
    scan = ArrowScan(meta, tbl.io, meta.schema(), AlwaysTrue())
    rows = scan.to_table([FileScanTask(f) for f in files])
    if rows.num_rows == 0:
        return []
    keys = [c for c in sort_by if c in rows.column_names]
    rows = rows.sort_by([(c, "ascending") for c in keys]) if keys else rows
    spec = meta.spec()
    key = _key(spec, meta.schema(), list(_values(files[0]))) if spec.fields else None
    in_bytes = sum(f.file_size_in_bytes for f in files)
    per_file = max(1, rows.num_rows * target_bytes // max(in_bytes, 1))
    return [
        _write_data_file(tbl, rows.slice(start, per_file), key, i, written)
        for i, start in enumerate(range(0, rows.num_rows, per_file))
    ]


def _commit(
    tbl: Table,
    kept: list[ManifestEntry],
    removed: list[DataFile],
    added: list[DataFile],
    written: list[str],
) -> int:
    meta = tbl.metadata
    current = meta.current_snapshot()
    assert current is not None
    snapshot_id, commit = meta.new_snapshot_id(), uuid.uuid4()
    codec = meta.properties.get(
        TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
    )
    manifests: list[ManifestFile] = []
    by_spec: dict[int, list[ManifestEntry]] = defaultdict(list)
    for e in kept:
        by_spec[e.data_file.spec_id].append(existing_entry(e))
    for spec_id, group in sorted(by_spec.items()):
        name = f"{commit}-k{spec_id}.avro"
        manifests.append(
            write_manifest_file(tbl, name, spec_id, snapshot_id, codec, written, group)
        )
    if added:
        new = [added_entry(snapshot_id, f) for f in added]
        name = f"{commit}-m0.avro"
        manifests.append(
            write_manifest_file(tbl, name, meta.default_spec_id, snapshot_id, codec, written, new)
        )
    sequence_number = meta.next_sequence_number()
    list_path = tbl.location_provider().new_metadata_location(f"snap-{snapshot_id}-0-{commit}.avro")
    written.append(list_path)
    with write_manifest_list(
        format_version=meta.format_version,
        output_file=tbl.io.new_output(list_path),
        snapshot_id=snapshot_id,
        parent_snapshot_id=current.snapshot_id,
        sequence_number=sequence_number,
        avro_compression=codec,  # type: ignore[arg-type]
    ) as manifest_list:
        manifest_list.add_manifests(manifests)
    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=current.snapshot_id,
        manifest_list=list_path,
        sequence_number=sequence_number,
        summary=_summary(tbl, removed, added, current.summary),
        schema_id=meta.current_schema_id,
    )
    ref = SetSnapshotRefUpdate(
        snapshot_id=snapshot_id,
        parent_snapshot_id=current.snapshot_id,
        ref_name=MAIN_BRANCH,
        type=SnapshotRefType.BRANCH,
        max_ref_age_ms=None,
        max_snapshot_age_ms=None,
        min_snapshots_to_keep=None,
    )
    requirement = AssertRefSnapshotId(snapshot_id=current.snapshot_id, ref=MAIN_BRANCH)
    tbl.catalog.commit_table(tbl, (requirement,), (AddSnapshotUpdate(snapshot=snapshot), ref))
    return snapshot_id


def _summary(
    tbl: Table, removed: list[DataFile], added: list[DataFile], previous: Summary | None
) -> Summary:
    """The totals as an overwrite would compute them, under operation ``replace``."""
    meta = tbl.metadata
    schema = meta.schema()
    collector = SnapshotSummaryCollector()
    for f in added:
        collector.add_file(data_file=f, partition_spec=meta.spec(), schema=schema)
    for f in removed:
        collector.remove_file(data_file=f, partition_spec=meta.specs()[f.spec_id], schema=schema)
    props = {**collector.build(), PROP_MAINTENANCE: "compact"}
    summary = update_snapshot_summaries(
        summary=Summary(operation=Operation.OVERWRITE, **props), previous_summary=previous
    )
    return Summary(operation=Operation.REPLACE, **summary.additional_properties)
