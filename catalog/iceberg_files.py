"""Manifest-level pieces of the catalog's own replace commits (erasure rewrites and
compaction): carry an entry over, write one manifest, remove files a failed commit
wrote. pyiceberg 0.12 has no public API for a replace commit; both callers build
one from these."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from pyiceberg.manifest import (
    DataFile,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    write_manifest,
)
from pyiceberg.table import Table

__all__ = ["added_entry", "existing_entry", "remove_files", "write_manifest_file"]


def added_entry(snapshot_id: int, f: DataFile) -> ManifestEntry:
    """``f`` as added by ``snapshot_id`` (its sequence numbers inherited at commit)."""
    return ManifestEntry.from_args(
        status=ManifestEntryStatus.ADDED,
        snapshot_id=snapshot_id,
        sequence_number=None,
        file_sequence_number=None,
        data_file=f,
    )


def existing_entry(e: ManifestEntry) -> ManifestEntry:
    """``e`` carried into a new manifest as EXISTING (its sequence numbers kept)."""
    return ManifestEntry.from_args(
        status=ManifestEntryStatus.EXISTING,
        snapshot_id=e.snapshot_id,
        sequence_number=e.sequence_number,
        file_sequence_number=e.file_sequence_number,
        data_file=e.data_file,
    )


def write_manifest_file(
    tbl: Table,
    name: str,
    spec_id: int,
    snapshot_id: int,
    codec: str,
    written: list[str],
    entries: Iterable[ManifestEntry],
) -> ManifestFile:
    """Write ``entries`` as manifest ``name`` of ``tbl``, each with the status,
    snapshot id and sequence numbers it carries (its path appended to ``written``, so
    a failed commit can remove it).

    ``add_entry``, not pyiceberg's ``add``: ``add`` rewrites every entry as ADDED by
    ``snapshot_id``, which would list the files a replace commit merely kept as added
    by it.
    """
    meta = tbl.metadata
    path = tbl.location_provider().new_metadata_location(name)
    written.append(path)
    with write_manifest(
        format_version=meta.format_version,
        spec=meta.specs()[spec_id],
        schema=meta.schema(),
        output_file=tbl.io.new_output(path),
        snapshot_id=snapshot_id,
        avro_compression=codec,  # type: ignore[arg-type]
    ) as writer:
        for entry in entries:
            writer.add_entry(entry)
    return writer.to_manifest_file()


def remove_files(tbl: Table, paths: list[str]) -> None:
    """Best-effort removal of files a failed commit wrote (orphan removal sweeps any
    that survive)."""
    for path in paths:
        with contextlib.suppress(Exception):
            tbl.io.delete(path)
