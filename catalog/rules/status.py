"""Resolution of append-only facts: the latest row per key, and an asset's status.

:func:`latest_rows` picks one row per key by a total order, so that "the latest score"
does not depend on file order. An asset's status is its latest event of
:data:`STATUS_EVENTS`; at one instant the event listed first wins ("quarantined": the
safe side). The catalog (:func:`asset_status`) and the cut's SQL
(``materializer/select.py``) both rank by that one tuple.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from catalog.rules.links import bitrates, canonical_indices, connected_components, link_edges

__all__ = ["STATUS_EVENTS", "asset_status", "latest_rows", "latest_status_events"]

#: The events that set an asset's status, in the order they win a tie at the same
#: ``at``: the latest event decides, and at one instant "quarantined" wins (the safe
#: side). Every reader of the status ranks by this tuple (``list_position`` in SQL).
STATUS_EVENTS = ("quarantined", "released")


def latest_rows(rows: pa.Table, keys: Sequence[str], order: Sequence[tuple[str, str]]) -> pa.Table:
    """The first row of each ``keys`` group after sorting by ``order`` within groups.

    Args:
        rows: Any table holding ``keys`` and the ``order`` columns.
        keys: Group columns; the result is sorted by them.
        order: ``(column, "ascending" | "descending")`` pairs ranking rows in a group;
            the first wins. Rank by every column that can differ so that the result does
            not depend on file order.
    """
    n = rows.num_rows
    if n == 0:
        return rows
    sort_keys = [(k, "ascending", "at_end") for k in keys]
    sort_keys += [(c, d, "at_end") for c, d in order if c in rows.column_names]
    ordered = rows.take(pc.sort_indices(rows, sort_keys=sort_keys))
    first = np.zeros(n, dtype=np.bool_)
    first[0] = True
    for k in keys:
        col = ordered[k]
        first[1:] |= np.asarray(
            pc.not_equal(col.slice(1), col.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        )
    return ordered.filter(pa.array(first))


def latest_status_events(events: pa.Table) -> pa.Table:
    """Each asset's status event (``asset_id``, ``event``, ``at``): its latest event of
    :data:`STATUS_EVENTS`, ties at one ``at`` to the event listed first."""
    kinds = pa.array(STATUS_EVENTS, events.schema.field("event").type)
    status = events.filter(pc.is_in(events["event"], value_set=kinds))
    ranked = status.append_column("_rank", pc.index_in(status["event"], value_set=kinds))
    latest = latest_rows(ranked, ["asset_id"], [("at", "descending"), ("_rank", "ascending")])
    return latest.drop_columns(["_rank"])


def asset_status(assets: pa.Table, tombstones: pa.Table, events: pa.Table) -> pa.Table:
    """Per-asset governance state from the append-only facts (see
    ``VidlakeCatalog.asset_status`` for the columns)."""
    ids = assets["asset_id"].combine_chunks()
    n = len(ids)
    tomb = np.zeros(n, dtype=np.bool_)
    hard = np.zeros(n, dtype=np.bool_)
    at = np.asarray(
        pc.fill_null(pc.index_in(tombstones["asset_id"], value_set=ids), -1).to_numpy(),
        dtype=np.int64,
    )
    is_hard = np.asarray(
        pc.equal(tombstones["kind"], "hard").to_numpy(zero_copy_only=False), dtype=np.bool_
    )
    tomb[at[at >= 0]] = True
    hard[at[(at >= 0) & is_hard]] = True

    latest = latest_status_events(events)
    latest = latest.filter(pc.equal(latest["event"], "quarantined"))
    quarantined = np.zeros(n, dtype=np.bool_)
    q_at = np.asarray(
        pc.fill_null(pc.index_in(latest["asset_id"], value_set=ids), -1).to_numpy(), dtype=np.int64
    )
    quarantined[q_at[q_at >= 0]] = True

    links = events.filter(pc.equal(events["event"], "near_duplicate"))
    u, v = link_edges(
        ids,
        assets["near_duplicates"],
        assets["duplicate_of"],
        links["asset_id"],
        links["related_asset_id"],
    )
    duplicate_of = np.full(n, None, dtype=object)
    of_eval = np.zeros(n, dtype=np.bool_)
    is_eval = np.asarray(
        pc.equal(assets["split"], "eval").to_numpy(zero_copy_only=False), dtype=np.bool_
    )
    if len(u):
        nodes = np.unique(np.concatenate([u, v]))
        labels = connected_components(
            len(nodes), np.searchsorted(nodes, u), np.searchsorted(nodes, v)
        )
        rate = bitrates(assets)
        node_ids = np.asarray(ids.take(pa.array(nodes)).to_pylist(), dtype="U64")
        canon = canonical_indices(labels, rate[nodes], node_ids)
        linked = canon != np.arange(len(nodes))
        duplicate_of[nodes[linked]] = node_ids[canon[linked]]
        eval_labels = np.unique(labels[is_eval[nodes]])
        of_eval[nodes] = np.isin(labels, eval_labels) & ~is_eval[nodes]
    tomb_kind = np.full(n, None, dtype=object)
    tomb_kind[tomb] = "soft"
    tomb_kind[hard] = "hard"
    return pa.table(
        {
            "asset_id": ids,
            "split": assets["split"],
            "tombstoned": pa.array(tomb),
            "tombstone_kind": pa.array(tomb_kind.tolist(), pa.large_string()),
            "quarantined": pa.array(quarantined),
            "duplicate_of": pa.array(duplicate_of.tolist(), pa.large_string()),
            "near_dup_of_eval": pa.array(of_eval),
        }
    )
