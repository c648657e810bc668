"""Idempotency keys of ingest batches: a rerun of a committed batch is a no-op.

A producer killed after its commit landed but before it learnt so reruns the batch;
for an append-only table (scores, captions, jobs, tombstones, asset events) that would
append every row a second time. So every ingest batch carries a key, recorded in the
snapshot summary of the commit that wrote it, next to the counts of its result:

=============================== ===================================================
summary property                value
=============================== ===================================================
``vidlake.idempotency-key``     the caller's key, else ``sha256:<batch SHA-256>``
``vidlake.batch-sha256``        :func:`batch_sha256` of the batch, always
``vidlake.inserted`` …          the result's counts (``inserted``, ``duplicates``,
                                ``eval``, ``near-duplicates``), decimal strings
``vidlake.near-duplicate-events`` (assets) link events planned for ``asset_events``
=============================== ===================================================

Before planning, and again after a lost commit race (another writer may have
committed the same key), the catalog looks the key up among the snapshots of the
table's current ancestry (:class:`KeyIndex`: the snapshot log walked once, then only
the snapshots added since, like the key caches) and returns the recorded result,
marked ``replayed``, without writing.

**Canonical bytes.** ``batch_sha256`` hashes the batch *after* normalisation to the
table schema (:func:`catalog.coerce.coerce_batch`: every column of the table, cast to
its type, defaults filled, absent values null, the ingest timestamp left null where the
producer gave none, so that a rerun a minute later has the same bytes), with columns
sorted by name and chunks combined, written as one Arrow IPC stream (no compression,
no schema metadata). The same rows sent as JSON or as Arrow IPC, with columns in any
order, hash alike; rows in another order are another batch.

**What a key does not do.** A key is remembered as long as its snapshot is in the
table's ancestry: expiring snapshots forgets their keys. A caller's key is
authoritative: reusing it for different rows makes them a no-op too (the summary keeps
the first batch's SHA-256 for audit; the catalog logs a warning when they differ).
Keys are per table.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

from catalog.errors import InvalidInput

__all__ = [
    "PROP_BATCH",
    "PROP_EVENTS",
    "PROP_KEY",
    "KeyIndex",
    "Recorded",
    "batch_sha256",
    "check_key",
    "derived_key",
    "summary_properties",
]

PROP_KEY = "vidlake.idempotency-key"
PROP_BATCH = "vidlake.batch-sha256"
PROP_EVENTS = "vidlake.near-duplicate-events"
#: result field -> summary property
_COUNTS: Mapping[str, str] = {
    "inserted": "vidlake.inserted",
    "duplicates": "vidlake.duplicates",
    "eval": "vidlake.eval",
    "near_duplicates": "vidlake.near-duplicates",
}
KEY_MAX_LENGTH = 200
_KEY = re.compile(r"[\x21-\x7e]{1,200}")


def check_key(key: object) -> str:
    """Return a caller's key if valid: 1-200 printable ASCII characters, no spaces.

    Raises:
        InvalidInput: anything else (``field="idempotency_key"``).
    """
    if not isinstance(key, str) or _KEY.fullmatch(key) is None:
        raise InvalidInput(
            f"an idempotency key is 1-{KEY_MAX_LENGTH} printable ASCII characters "
            f"without spaces, got {key!r}",
            field="idempotency_key",
        )
    return key


def batch_sha256(batch: pa.Table) -> str:
    """SHA-256 (hex) of a normalised batch's canonical bytes (module docstring).

    The IPC stream is hashed as it is written (never held whole in memory)."""
    cols = sorted(batch.column_names)
    table = batch.select(cols).combine_chunks()
    schema = pa.schema([table.schema.field(c).remove_metadata() for c in cols])
    table = pa.Table.from_arrays(table.columns, schema=schema)  # zero-copy
    sink = _HashSink()
    with pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), schema) as writer:
        for chunk in table.to_batches():
            writer.write_batch(chunk)
    return sink.digest.hexdigest()


class _HashSink:
    """A write-only file object that hashes what it is given."""

    closed = False

    def __init__(self) -> None:
        self.digest = hashlib.sha256()

    def write(self, data: bytes | memoryview) -> int:
        self.digest.update(data)
        return len(data)

    def flush(self) -> None:
        """Nothing is buffered."""


def derived_key(batch_sha: str) -> str:
    """The key of a batch whose caller gave none."""
    return f"sha256:{batch_sha}"


def summary_properties(key: str, batch_sha: str, counts: Mapping[str, int]) -> dict[str, str]:
    """Snapshot summary properties recording a batch's key and result counts."""
    props = {PROP_KEY: key, PROP_BATCH: batch_sha}
    props.update({prop: str(int(counts.get(name, 0))) for name, prop in _COUNTS.items()})
    return props


@dataclass(frozen=True)
class Recorded:
    """A committed batch as its snapshot summary records it."""

    key: str
    snapshot_id: int
    batch_sha256: str | None
    counts: Mapping[str, int]


@dataclass
class KeyIndex:
    """The keys recorded in one table's current ancestry, refreshed incrementally.

    Attributes:
        tip: The snapshot walked up to (None: nothing walked yet).
        keys: key -> the first commit that recorded it.
        planned_events: assets snapshot id -> near-duplicate events it planned.
    """

    tip: int | None = None
    keys: dict[str, Recorded] = field(default_factory=dict)
    planned_events: dict[int, int] = field(default_factory=dict)

    def lookup(self, meta: TableMetadata, key: str) -> Recorded | None:
        """The recorded commit of ``key`` at ``meta``'s current snapshot, or None."""
        self.refresh(meta)
        return self.keys.get(key)

    def refresh(self, meta: TableMetadata) -> None:
        """Walk the snapshots added since :attr:`tip` (all of them after a rollback)."""
        current = meta.current_snapshot_id
        if current == self.tip:
            return
        by_id = {s.snapshot_id: s for s in meta.snapshots}
        added: list[Snapshot] = []
        sid = current
        while sid is not None and sid != self.tip:
            snap = by_id.get(sid)
            if snap is None:  # an expired ancestor: older keys are forgotten
                break
            added.append(snap)
            sid = snap.parent_snapshot_id
        if sid != self.tip or self.tip is None:
            self.keys, self.planned_events = {}, {}
        for snap in reversed(added):
            self._record(snap)
        self.tip = current

    def _record(self, snap: Snapshot) -> None:
        summary = snap.summary
        props = summary.additional_properties if summary is not None else {}
        key = props.get(PROP_KEY)
        if key is not None and key not in self.keys:
            counts = {name: _int(props.get(prop)) for name, prop in _COUNTS.items()}
            self.keys[key] = Recorded(key, snap.snapshot_id, props.get(PROP_BATCH), counts)
        events = _int(props.get(PROP_EVENTS))
        if events:
            self.planned_events[snap.snapshot_id] = events


def _int(text: str | None) -> int:
    try:
        return int(text) if text is not None else 0
    except ValueError:
        return 0
