"""Erasing rows from an Iceberg table: rewrite the files, expire the snapshots, purge.

Per table, :func:`erase_rows` runs three idempotent moves:

1. **Find** the data files of the current snapshot that hold a row to drop (or, for
   ``latents``, a row to repoint into a rewritten pack): the scan's file pruning gives
   candidates, a read of the key columns confirms them.
2. **Rewrite and expire, in one commit.** Each such file's other rows are written to a
   new file; the new snapshot's manifest list keeps every manifest that names none of
   the old files and replaces each one that does by a manifest of its live entries
   (as ``existing``) — old ``deleted`` entries are dropped, because a manifest entry
   carries the file's column bounds, which may hold erased values. The same commit
   removes every snapshot that references an old file (every snapshot since the
   asset's ingest; tags on them go too) and requires that ``main`` has not moved.
   Before committing, an attempt record lists the old data files, manifests and
   manifest lists (:mod:`catalog.erase.records`).
3. **Purge**: every path of every attempt record that the current metadata no longer
   references is deleted. A path still referenced (an attempt that never committed) is
   kept, so a crash at any point leaves files a rerun finds and removes.

Tables are append-only, so nearly every file an older snapshot names is also in the
current one; the exceptions are files an erasure replaced (that erasure expired every
snapshot naming them) and small files compaction replaced
(:mod:`catalog.maintenance.compact`), which kept snapshots still name: those holding a
row to drop are found too, their snapshots expired and the files purged. Snapshots older than the
asset's first row do not reference its files and stay; pins
at an expired snapshot can no longer time-travel (the erasure's audit record lists
them). Older ``metadata.json`` files stay: they hold snapshot summaries and paths,
never row values.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import (
    DataFile,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
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
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    RemoveSnapshotsUpdate,
    SetSnapshotRefUpdate,
)

from catalog._append import _key, _write_data_file
from catalog.coerce import conform
from catalog.erase.records import attempt_keys, get_record, put_once, record_key
from catalog.errors import Conflict, StorageError
from catalog.iceberg_files import added_entry, existing_entry, remove_files, write_manifest_file
from catalog.objects.base import ObjectStore

__all__ = ["TableErasure", "erase_rows"]

#: ``rows -> mask`` of the rows to drop; ``rows -> rows`` rewrites the kept rows.
Drop = Callable[[pa.Table], pa.Array]
Fix = Callable[[pa.Table], pa.Table]
_ATTEMPTS = 8


class TableErasure:
    """How to erase from one table: which rows go, which change, and how to find them."""

    def __init__(
        self,
        name: str,
        expr: BooleanExpression,
        key_columns: list[str],
        drop: Drop,
        touched: Drop | None = None,
        fix: Fix | None = None,
    ) -> None:
        self.name = name
        self.expr = expr
        self.key_columns = key_columns
        self.drop = drop
        self.touched = touched or drop
        self.fix = fix


def erase_rows(
    tbl_loader: Callable[[], Table], spec: TableErasure, store: ObjectStore, eid: str
) -> dict[str, Any]:
    """Erase ``spec``'s rows from one table (see the module docstring); idempotent.

    Returns:
        ``{"rows_dropped", "files_rewritten", "snapshots_expired": [...]}`` summed over
        every committed attempt of this erasure (so a rerun reports the same figures),
        and ``"paths_purged"``, the files this call deleted.
    """
    for _ in range(_ATTEMPTS):
        tbl = tbl_loader()
        bad = _bad_files(tbl, spec)
        stale = _stale_bad_files(tbl, spec, {f.file_path for f in bad})
        if not bad and not stale:
            break
        with contextlib.suppress(CommitFailedException):  # main moved: re-read, redo
            _rewrite(tbl, spec, bad, store, eid, stale)
    else:
        raise Conflict(
            f"could not rewrite {spec.name}: main kept moving ({_ATTEMPTS} attempts)",
            table=spec.name,
        )
    return _purge(tbl_loader(), store, eid, spec.name)


# -- 1. find -------------------------------------------------------------------------
def _bad_files(tbl: Table, spec: TableErasure) -> list[DataFile]:
    if tbl.metadata.current_snapshot() is None:
        return []
    schema = tbl.schema()
    keys = schema.select(*spec.key_columns)
    bad = []
    for task in tbl.scan(row_filter=spec.expr).plan_files():
        rows = ArrowScan(tbl.metadata, tbl.io, keys, AlwaysTrue()).to_table([task])
        if rows.num_rows and bool(pa.compute.any(spec.touched(rows)).as_py()):
            bad.append(task.file)
    return bad


def _stale_bad_files(tbl: Table, spec: TableErasure, current_bad: set[str]) -> set[str]:
    """Files holding a row to drop that only older snapshots name (compaction replaced
    them in the current one: :mod:`catalog.maintenance.compact`); their snapshots are
    expired and the files purged, nothing is rewritten."""
    current = tbl.metadata.current_snapshot()
    if current is None:
        return set()
    live = {t.file.file_path for t in tbl.scan().plan_files()}
    keys = tbl.schema().select(*spec.key_columns)
    seen, stale = set(live) | current_bad, set()
    for snap in tbl.metadata.snapshots:
        if snap.snapshot_id == current.snapshot_id:
            continue
        for task in tbl.scan(snapshot_id=snap.snapshot_id, row_filter=spec.expr).plan_files():
            path = task.file.file_path
            if path in seen:
                continue
            seen.add(path)
            rows = ArrowScan(tbl.metadata, tbl.io, keys, AlwaysTrue()).to_table([task])
            if rows.num_rows and bool(pa.compute.any(spec.touched(rows)).as_py()):
                stale.add(path)
    return stale


# -- 2. rewrite + expire -----------------------------------------------------------------
class _Walk:
    """Every manifest of every snapshot, read once: which snapshots name which files."""

    def __init__(self, tbl: Table) -> None:
        self.tbl = tbl
        self.entries: dict[str, list[ManifestEntry]] = {}
        self.manifests: dict[int, list[ManifestFile]] = {}
        for snap in tbl.metadata.snapshots:
            files = snap.manifests(io=tbl.io)
            self.manifests[snap.snapshot_id] = files
            for m in files:
                if m.manifest_path not in self.entries:
                    self.entries[m.manifest_path] = m.fetch_manifest_entry(
                        tbl.io, discard_deleted=False
                    )

    def manifests_naming(self, paths: set[str]) -> set[str]:
        return {
            m
            for m, entries in self.entries.items()
            if any(e.data_file.file_path in paths for e in entries)
        }

    def referenced(self) -> set[str]:
        out = {s.manifest_list for s in self.tbl.metadata.snapshots}
        out |= set(self.entries)
        out |= {e.data_file.file_path for es in self.entries.values() for e in es}
        return out


def _rewrite(
    tbl: Table,
    spec: TableErasure,
    bad: list[DataFile],
    store: ObjectStore,
    eid: str,
    stale: frozenset[str] | set[str] = frozenset(),
) -> None:
    meta = tbl.metadata
    walk = _Walk(tbl)
    bad_paths = {f.file_path for f in bad} | stale
    bad_manifests = walk.manifests_naming(bad_paths)
    expired = sorted(
        sid
        for sid, ms in walk.manifests.items()
        if any(m.manifest_path in bad_manifests for m in ms)
    )
    branches = [
        n
        for n, r in meta.refs.items()
        if r.snapshot_id in expired
        and r.snapshot_ref_type == SnapshotRefType.BRANCH
        and n != MAIN_BRANCH
    ]
    if branches:
        raise Conflict(
            f"{spec.name}: branches {branches} point at snapshots holding erased rows; "
            "remove them first",
            table=spec.name,
        )
    lists = sorted(s.manifest_list for s in meta.snapshots if s.snapshot_id in expired)
    written: list[str] = []
    try:
        new_files, dropped = _new_files(tbl, spec, bad, written)
        updates, requirements, snapshot_id = _commit_plan(
            tbl, walk, bad, bad_manifests, new_files, expired, written, eid
        )
        n = len(attempt_keys(store, eid, spec.name))
        put_once(
            store,
            record_key(eid, f"iceberg/{spec.name}/a{n:04d}.json"),
            {
                "table": spec.name,
                "snapshot_id": snapshot_id,
                "rows_dropped": dropped,
                "data_files": sorted(bad_paths),
                "manifests": sorted(bad_manifests),
                "manifest_lists": lists,
                "snapshots": expired,
            },
        )
    except BaseException:
        remove_files(tbl, written)
        raise
    try:
        response = tbl.catalog.commit_table(tbl, requirements, updates)
    except CommitFailedException:
        remove_files(tbl, written)
        raise
    tbl.metadata = response.metadata
    tbl.metadata_location = response.metadata_location


def _new_files(
    tbl: Table, spec: TableErasure, bad: list[DataFile], written: list[str]
) -> tuple[list[DataFile], int]:
    meta = tbl.metadata
    schema = meta.schema()
    pspec = meta.spec()
    out: list[DataFile] = []
    dropped = 0
    for i, old in enumerate(bad):
        if old.spec_id != meta.default_spec_id:
            raise StorageError(
                f"{spec.name}: {old.file_path} has partition spec {old.spec_id}; erasing "
                "from files of an older spec is not supported",
                table=spec.name,
            )
        rows = ArrowScan(meta, tbl.io, schema, AlwaysTrue()).to_table([FileScanTask(old)])
        mask = spec.drop(rows)
        dropped += int(pa.compute.sum(mask).as_py() or 0)
        kept = rows.filter(pa.compute.invert(mask))
        if spec.fix is not None:
            kept = spec.fix(kept)
        if not kept.num_rows:
            continue
        key = None
        if not pspec.is_unpartitioned():
            key = _key(pspec, schema, [old.partition[j] for j in range(len(pspec.fields))])
        out.append(_write_data_file(tbl, conform(kept, schema), key, i, written))
    return out, dropped


def _commit_plan(
    tbl: Table,
    walk: _Walk,
    bad: list[DataFile],
    bad_manifests: set[str],
    new_files: list[DataFile],
    expired: list[int],
    written: list[str],
    eid: str,
) -> tuple[tuple[Any, ...], tuple[Any, ...], int]:
    meta = tbl.metadata
    current = meta.current_snapshot()
    assert current is not None
    snapshot_id = meta.new_snapshot_id()
    commit = uuid.uuid4()
    codec = meta.properties.get(
        TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
    )
    bad_paths = {f.file_path for f in bad}
    manifests: list[ManifestFile] = []
    for i, m in enumerate(walk.manifests[current.snapshot_id]):
        if m.manifest_path not in bad_manifests:
            manifests.append(m)
            continue
        if m.content != ManifestContent.DATA:
            raise StorageError(f"delete manifests are not supported ({m.manifest_path})")
        live = [
            e
            for e in walk.entries[m.manifest_path]
            if e.status != ManifestEntryStatus.DELETED and e.data_file.file_path not in bad_paths
        ]
        if live:
            manifests.append(
                write_manifest_file(
                    tbl,
                    f"{commit}-r{i}.avro",
                    m.partition_spec_id,
                    snapshot_id,
                    codec,
                    written,
                    [existing_entry(e) for e in live],
                )
            )
    if new_files:
        added = [added_entry(snapshot_id, f) for f in new_files]
        manifests.append(
            write_manifest_file(
                tbl, f"{commit}-m0.avro", meta.default_spec_id, snapshot_id, codec, written, added
            )
        )
    summary = _summary(tbl, bad, new_files, current.summary, eid)
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
        summary=summary,
        schema_id=meta.current_schema_id,
    )
    updates = (
        AddSnapshotUpdate(snapshot=snapshot),
        SetSnapshotRefUpdate(
            snapshot_id=snapshot_id,
            parent_snapshot_id=current.snapshot_id,
            ref_name=MAIN_BRANCH,
            type=SnapshotRefType.BRANCH,
            max_ref_age_ms=None,
            max_snapshot_age_ms=None,
            min_snapshots_to_keep=None,
        ),
        RemoveSnapshotsUpdate(snapshot_ids=expired),
    )
    requirement = AssertRefSnapshotId(snapshot_id=current.snapshot_id, ref=MAIN_BRANCH)
    return updates, (requirement,), snapshot_id


def _summary(
    tbl: Table, bad: list[DataFile], new: list[DataFile], previous: Summary | None, eid: str
) -> Summary:
    meta = tbl.metadata
    schema, spec = meta.schema(), meta.spec()
    collector = SnapshotSummaryCollector()
    for f in new:
        collector.add_file(data_file=f, partition_spec=spec, schema=schema)
    for f in bad:
        collector.remove_file(data_file=f, partition_spec=meta.specs()[f.spec_id], schema=schema)
    return update_snapshot_summaries(
        summary=Summary(
            operation=Operation.OVERWRITE, **collector.build(), **{"vidlake.erasure": eid}
        ),
        previous_summary=previous,
    )


# -- 3. purge ----------------------------------------------------------------------------
def _purge(tbl: Table, store: ObjectStore, eid: str, table: str) -> dict[str, Any]:
    """Delete what committed attempts replaced; sum up what they did."""
    done: dict[str, Any] = {
        "rows_dropped": 0,
        "files_rewritten": 0,
        "snapshots_expired": [],
        "paths_purged": 0,
    }
    keys = attempt_keys(store, eid, table)
    if not keys:
        return done
    referenced = _Walk(tbl).referenced()
    records = [get_record(store, key) or {} for key in keys]
    for rec in _committed(tbl, records, referenced):
        done["rows_dropped"] += int(rec.get("rows_dropped", 0))
        done["files_rewritten"] += len(rec.get("data_files", []))
        done["snapshots_expired"] += list(rec.get("snapshots", []))
    for rec in records:
        paths = [
            *rec.get("data_files", []),
            *rec.get("manifests", []),
            *rec.get("manifest_lists", []),
        ]
        done["paths_purged"] += sum(_delete(tbl, p) for p in paths if p not in referenced)
    return done


def _committed(
    tbl: Table, records: list[dict[str, Any]], referenced: set[str]
) -> list[dict[str, Any]]:
    """The attempts that committed: their snapshot is in the table. (An attempt killed
    before its commit left a record too; its files went with the next attempt's.) If a
    later erasure expired even those snapshots, the last attempt whose files are gone
    stands for them."""
    live = {s.snapshot_id for s in tbl.metadata.snapshots}
    found = [r for r in records if r.get("snapshot_id") in live]
    if found:
        return found
    gone = [r for r in records if not any(p in referenced for p in r.get("data_files", []))]
    return gone[-1:]


def _delete(tbl: Table, path: str) -> bool:
    try:
        tbl.io.delete(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if "not found" in str(exc).lower() or "no such" in str(exc).lower():
            return False
        raise StorageError(f"cannot delete {path}: {exc}", path=path) from exc
    return True
