"""Ingest history of a table, from its Iceberg snapshot summaries (no data read).

Every commit leaves a snapshot whose summary counts the records it added and deleted;
the dashboard's ingest-rate chart bins these by time. Only the snapshots the table's
metadata still holds are seen (expiry drops older ones), which the chart says.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.table import Table

__all__ = ["IngestPoint", "ingest_history"]


@dataclass(frozen=True)
class IngestPoint:
    """One commit: when, which operation, and the records it added and deleted."""

    timestamp_ms: int
    operation: str
    added_records: int
    deleted_records: int


def ingest_history(table: Table) -> list[IngestPoint]:
    """Every snapshot of ``table`` still in its metadata, oldest first."""
    out = []
    for snap in sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms):
        summary = snap.summary
        props = summary.additional_properties if summary is not None else {}
        op = summary.operation.value if summary is not None else "unknown"
        out.append(
            IngestPoint(
                timestamp_ms=int(snap.timestamp_ms),
                operation=str(op),
                added_records=int(props.get("added-records", 0) or 0),
                deleted_records=int(props.get("deleted-records", 0) or 0),
            )
        )
    return out
