"""Snapshot expiry that never drops what a reader can still name.

A snapshot is expired only when it is older than the retention cut-off and is neither
the head of a branch or tag (``metadata.refs``: the ``vidlake-v{N}`` tags among them),
nor named by a registered snapshot version (``keep``), nor among the newest
``retain_last`` snapshots of ``main``'s ancestry. Expiry only edits metadata (one
commit); the files the expired snapshots alone referenced become orphans that
:mod:`catalog.maintenance.orphans` removes after its safety age. Expiring a snapshot
also forgets the idempotency keys it recorded (:mod:`catalog.idempotency`): the
retention is the window in which a producer may replay a batch.
"""

from __future__ import annotations

from collections.abc import Set

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

__all__ = ["expirable", "expire_table"]


def expirable(tbl: Table, keep: Set[int], older_than_ms: int, retain_last: int) -> list[int]:
    """The ids of ``tbl``'s snapshots that expiry may remove, oldest first."""
    meta = tbl.metadata
    protected = set(keep) | {ref.snapshot_id for ref in meta.refs.values()}
    protected |= set(_main_ancestry(tbl)[: max(retain_last, 1)])
    snaps = sorted(meta.snapshots, key=lambda s: s.timestamp_ms)
    return [
        s.snapshot_id
        for s in snaps
        if s.timestamp_ms < older_than_ms and s.snapshot_id not in protected
    ]


def expire_table(tbl: Table, keep: Set[int], older_than_ms: int, retain_last: int) -> list[int]:
    """Expire :func:`expirable` snapshots in one commit; the ids expired (none when a
    concurrent commit won: the next run retries)."""
    ids = expirable(tbl, keep, older_than_ms, retain_last)
    if not ids:
        return []
    try:
        tbl.maintenance.expire_snapshots().by_ids(ids).commit()
    except CommitFailedException:
        return []
    return ids


def _main_ancestry(tbl: Table) -> list[int]:
    """``main``'s snapshot ids, newest first (stops at an expired parent)."""
    meta = tbl.metadata
    out: list[int] = []
    snap = meta.current_snapshot()
    while snap is not None:
        out.append(snap.snapshot_id)
        parent = snap.parent_snapshot_id
        snap = meta.snapshot_by_id(parent) if parent is not None else None
    return out
