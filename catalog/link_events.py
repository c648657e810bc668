"""Near-duplicate link events: built at ingest, re-derived after a crash.

``add_assets`` commits the assets first and their ``near_duplicate`` events second, on
another table: a process killed between the two commits would lose the events for
good, because a rerun finds every asset present. The assets' commit records how many
events it planned (``vidlake.near-duplicate-events`` in its snapshot summary) and the
events' commit carries the idempotency key :func:`events_key` of that snapshot. Any
later ``add_assets`` (the rerun included) finds an assets snapshot with planned events
and no events commit, and :func:`rederive` rebuilds them exactly: the new assets'
``near_duplicates`` column holds every direct match the batch made (with existing
assets and within the batch), so :func:`catalog.rules.plan_links` over the assets as
they were before that snapshot gives the same links, hence the same events, without
matching a fingerprint again. Two processes repairing at once append one copy: the
events commit is keyed, and a lost commit race re-checks the key.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from catalog import rules

__all__ = ["event_rows", "events_key", "rederive"]


def events_key(assets_snapshot_id: int) -> str:
    """The idempotency key of the events commit of an assets snapshot."""
    return f"near-duplicate-events:{assets_snapshot_id}"


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
    rates = np.concatenate([_rates(old), _rates(new)])
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


def _rates(rows: pa.Table) -> NDArray[np.float64]:
    return np.asarray(
        pc.cast(rows["probe_bitrate"], pa.float64()).to_numpy(zero_copy_only=False),
        dtype=np.float64,
    )


def _np(col: pa.ChunkedArray | pa.Array) -> NDArray[np.int64]:
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64)
