"""Snapshots expiry must keep for near-duplicate link events (:mod:`catalog.link_events`).

An ``assets`` commit that planned link events (``vidlake.near-duplicate-events`` in its
summary) is followed by an ``asset_events`` commit keyed ``events_key(sid)``; a later
ingest re-derives the events of any planned commit whose events commit it cannot find,
reading the assets at the planned snapshot's *parent*. So expiry keeps:

* in ``assets``, the parent of every planned snapshot whose events commit is missing
  (a crash between the two commits), so the re-derivation can still read it;
* in ``asset_events``, every events commit whose assets snapshot still exists, so a
  planned snapshot kept (a registered version read it) never looks unrecorded, which
  would append its events a second time.
"""

from __future__ import annotations

from pyiceberg.table import Table

from catalog.idempotency import PROP_EVENTS, PROP_KEY
from catalog.link_events import events_key

__all__ = ["keep_for_events"]


def keep_for_events(assets: Table, events: Table) -> dict[str, set[int]]:
    """``{"assets": ids, "asset_events": ids}`` expiry must keep (see the module doc)."""
    by_key = {
        s.summary.additional_properties.get(PROP_KEY): s.snapshot_id
        for s in events.metadata.snapshots
        if s.summary is not None
    }
    keep: dict[str, set[int]] = {"assets": set(), "asset_events": set()}
    for snap in assets.metadata.snapshots:
        key = events_key(snap.snapshot_id)
        if key in by_key:
            keep["asset_events"].add(by_key[key])
            continue
        planned = snap.summary is not None and snap.summary.additional_properties.get(PROP_EVENTS)
        if planned and planned != "0" and snap.parent_snapshot_id is not None:
            keep["assets"].add(snap.parent_snapshot_id)
    return keep
