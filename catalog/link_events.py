"""Near-duplicate link events: built at ingest, re-derived after a crash.

``add_assets`` commits the assets first and their ``near_duplicate`` events second, on
another table: a process killed between the two commits would lose the events for
good, because a rerun finds every asset present. The assets' commit records how many
events it planned (``vidlake.near-duplicate-events`` in its snapshot summary) and the
events' commit carries the idempotency key :func:`events_key` of that snapshot. Any
later ``add_assets`` (the rerun included) finds an assets snapshot with planned events
and no events commit (:func:`missing`), reads that snapshot's batch and the assets
before it (:func:`committed_batch`), and :func:`rederive` rebuilds the events exactly:
the new assets' ``near_duplicates`` column holds every direct match the batch made (with existing
assets and within the batch), so :func:`catalog.rules.plan_links` over the assets as
they were before that snapshot gives the same links, hence the same events, without
matching a fingerprint again. Two processes repairing at once append one copy: the
events commit is keyed (:func:`append_once`), and a lost commit race re-checks the key.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from catalog import idempotency, rules
from catalog._append import append as fast_append
from catalog.coerce import conform
from catalog.errors import Conflict, StorageError
from catalog.tables import arrow_schema

__all__ = [
    "append_once",
    "committed_batch",
    "event_rows",
    "events_key",
    "missing",
    "rederive",
]

_COLUMNS = ("asset_id", "probe_bitrate", "near_duplicates", "duplicate_of")


def events_key(assets_snapshot_id: int) -> str:
    """The idempotency key of the events commit of an assets snapshot."""
    return f"near-duplicate-events:{assets_snapshot_id}"


def append_once(
    load: Callable[[], Table],
    recorded: idempotency.KeyIndex,
    events: pa.Table,
    assets_snapshot: int,
    attempts: int,
) -> None:
    """Commit ``events`` to ``asset_events`` under :func:`events_key` unless that key
    is recorded; a lost commit race reloads and re-checks the key.

    Raises:
        Conflict: every attempt lost a race (the next repair tries again).
    """
    key = events_key(assets_snapshot)
    for attempt in range(attempts):
        tbl = load()
        if recorded.lookup(tbl.metadata, key) is not None:
            return
        rows = conform(events, tbl.schema())
        props = idempotency.summary_properties(
            key, idempotency.batch_sha256(rows), {"inserted": rows.num_rows}
        )
        try:
            fast_append(tbl, rows, {"vidlake.rows": str(rows.num_rows), **props})
            return
        except CommitFailedException:
            time.sleep(min(2.0, 0.02 * 2**attempt) * (1 + random.random()))
    raise Conflict(f"asset_events: gave up after {attempts} concurrent commits")


def missing(
    assets: Table, planned: idempotency.KeyIndex, recorded: idempotency.KeyIndex, events: Table
) -> Iterator[int]:
    """Assets snapshots that planned link events whose events commit is absent."""
    planned.refresh(assets.metadata)
    if not planned.planned_events:
        return
    recorded.refresh(events.metadata)
    for sid in sorted(planned.planned_events):
        if events_key(sid) not in recorded.keys:
            yield sid


def committed_batch(assets: Table, sid: int) -> tuple[pa.Table, pa.Table]:
    """The assets before snapshot ``sid`` and the rows ``sid`` added (the columns
    :func:`rederive` reads).

    Raises:
        StorageError: the backend failed.
    """
    snap = assets.metadata.snapshot_by_id(sid)
    parent = snap.parent_snapshot_id if snap is not None else None
    try:
        if parent is None:
            old = arrow_schema(assets.schema()).empty_table().select(list(_COLUMNS))
        else:
            old = assets.scan(selected_fields=_COLUMNS, snapshot_id=parent).to_arrow()
        new = assets.incremental_append_scan(
            from_snapshot_id_exclusive=parent,
            to_snapshot_id_inclusive=sid,
            selected_fields=_COLUMNS,
        ).to_arrow()
    except OSError as exc:
        raise StorageError(f"reading assets failed: {exc}", table="assets") from exc
    return old, new


def event_rows(assets: NDArray[np.str_], canonical: NDArray[np.str_]) -> pa.Table:
    """``near_duplicate`` events: ``assets[k]`` is linked to ``canonical[k]``."""
    k = len(assets)
    return pa.table(
        {
            "asset_id": pa.array(assets.tolist(), pa.large_string()),
            "event": pa.array(["near_duplicate"] * k, pa.large_string()),
            "related_asset_id": pa.array(canonical.tolist(), pa.large_string()),
            "reason": pa.array(["fingerprint match at ingest"] * k, pa.large_string()),
            "at": pa.array([dt.datetime.now(dt.UTC)] * k, pa.timestamp("us", tz="UTC")),
        }
    )


def rederive(old: pa.Table, old_events: pa.Table, new: pa.Table) -> pa.Table:
    """The events a batch of ``new`` assets made when it was committed onto ``old``.

    Args:
        old: The assets before the batch (``asset_id``, ``probe_bitrate``,
            ``near_duplicates``, ``duplicate_of``).
        old_events: Recorded ``near_duplicate`` events (``asset_id``,
            ``related_asset_id``); links to assets outside ``old`` are ignored.
        new: The batch's rows as committed (``asset_id``, ``probe_bitrate``,
            ``near_duplicates``).
    """
    old_ids = _ids(old["asset_id"])
    new_ids = _ids(new["asset_id"])
    n_old, m = len(old_ids), len(new_ids)
    edges = rules.link_edges(
        old_ids,
        old["near_duplicates"],
        old["duplicate_of"],
        old_events["asset_id"],
        old_events["related_asset_id"],
    )
    with_old, in_batch = _matches(new["near_duplicates"], old_ids, new_ids)
    rates = np.concatenate([rules.bitrates(old), rules.bitrates(new)])
    every = pa.concat_arrays([old_ids, new_ids])

    def ids_of(nodes: NDArray[np.int64]) -> NDArray[np.str_]:
        return np.asarray(every.take(pa.array(nodes, pa.int64())).to_pylist(), dtype="U64")

    links = rules.plan_links(
        n_old, m, edges, with_old, in_batch, lambda nodes: rates[nodes], ids_of
    )
    return event_rows(ids_of(links.event_asset), ids_of(links.event_canonical))


_Pairs = tuple[NDArray[np.int64], NDArray[np.int64]]


def _matches(
    near: pa.ChunkedArray | pa.Array, old_ids: pa.Array, new_ids: pa.Array
) -> tuple[_Pairs, _Pairs]:
    """Direct matches of the batch from its ``near_duplicates`` lists: ``(new i, old
    j)`` and ``(new i, new j)`` with ``i < j`` (each in-batch match is listed twice)."""
    flat = pc.list_flatten(near)
    owner = _np(pc.list_parent_indices(near))
    at_old = _np(pc.fill_null(pc.index_in(flat, value_set=old_ids), -1))
    at_new = _np(pc.fill_null(pc.index_in(flat, value_set=new_ids), -1))
    is_old = at_old >= 0
    is_new = ~is_old & (at_new > owner)
    return (owner[is_old], at_old[is_old]), (owner[is_new], at_new[is_new])


def _ids(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return arr.cast(pa.large_string())


def _np(col: pa.ChunkedArray | pa.Array) -> NDArray[np.int64]:
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64)
