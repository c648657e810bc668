"""The one-process cut's kept rows, gathered once: in manifest order.

The clip view query returns every candidate row, unsorted. A cut needs its kept
rows twice in different orders: sorted by ``(rung, clip_id)`` for selection's later
drops, pools and clip count, then scattered into manifest order for the artifacts.
Gathering every column (~40, a few hundred bytes a row) into the sorted order and
then again into the scattered one copied each kept row's wide columns twice (~0.9 s
of wall time on two threads at 1M clips, ~1.5 CPU-s). Instead the sorted table holds
only the narrow columns selection reads (:func:`sorted_narrow`) with each row's
position ``_at`` in the query's rows, and the scatter gathers the wide columns once,
straight from the query's rows by the composed index (:func:`gather_scattered`).
The result equals the sorted table scattered: the same sample view, the same bytes
(decision 063).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from materializer.key_order import rung_clip_order

__all__ = ["AT", "gather_scattered", "sorted_narrow"]

#: The narrow sorted rows' position in the query's rows.
AT = "_at"


def sorted_narrow(rows: pa.Table, keep: pa.ChunkedArray, columns: tuple[str, ...]) -> pa.Table:
    """The rows of ``rows`` where ``keep``, sorted by ``(rung, clip_id)`` (stable), as
    ``columns`` (those that exist, in ``rows``' order) and :data:`AT`, each row's
    position in ``rows``."""
    at = pc.indices_nonzero(keep)
    keys = rows.select(["rung", "clip_id"]).take(at)
    fast = rung_clip_order(keys["rung"], keys["clip_id"])  # integer keys (decision 057)
    if fast is not None:
        positions = pc.take(at, pa.array(fast))
    else:
        order = pc.sort_indices(keys, sort_keys=[("rung", "ascending"), ("clip_id", "ascending")])
        positions = pc.take(at, order)
    wanted = set(columns)
    narrow = rows.select([c for c in rows.column_names if c in wanted]).take(positions)
    return narrow.append_column(AT, pc.cast(positions, pa.int64()))


def gather_scattered(rows: pa.Table, selected: pa.Table, order: pa.Array) -> pa.Table:
    """The sample view in manifest order: ``rows``' columns gathered at ``selected``'s
    positions (:data:`AT`) taken in ``order``, then the columns selection added to its
    narrow rows (``bucket``), as the full sorted table taken in ``order`` would be."""
    at = pc.take(selected[AT], order)
    added = [c for c in selected.column_names if c != AT and c not in rows.column_names]
    scattered = rows.take(at)
    for name in added:
        scattered = scattered.append_column(selected.field(name), selected[name].take(order))
    return scattered
