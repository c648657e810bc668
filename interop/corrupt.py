"""Quarantine of samples whose latent member a loader found corrupt.

A training rank cannot write the catalog; when a member's stored bytes fail their
SHA-256 it records the member in the store (``refs/failed-members/<sha256>.json``,
:func:`catalog.objects.refs.record_member_failure`; the rule is in
:mod:`loader.corrupt`). :func:`quarantine_failed_members` turns those records into
catalog state: the assets whose latents hold a recorded member are quarantined (once;
repeating it adds no events), so later cuts leave them out. ``vidlake import
tar-shards-verify`` runs it beside the whole-shard check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from catalog.objects.refs import list_failed_members
from catalog.reads import one_of
from interop.tar_import import _quarantine

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog

__all__ = ["quarantine_failed_members"]


def quarantine_failed_members(catalog: VidlakeCatalog) -> dict[str, Any]:
    """Quarantine the assets of every recorded corrupt member.

    Returns:
        ``{"members": [sha256, ...], "clips": [clip_id, ...], "quarantined": n}``
        (``quarantined``: assets newly quarantined by this call).
    """
    members = list_failed_members(catalog.objects)
    if not members:
        return {"members": [], "clips": [], "quarantined": 0}
    lat = catalog.scan(
        "latents",
        columns=["clip_id"],
        row_filter=one_of("member_sha256", members),
        include_eval=True,
    )
    clips = sorted(set(lat["clip_id"].to_pylist()))
    assets: list[str] = []
    if clips:
        table = catalog.scan("clips", columns=["clip_id", "asset_id"], include_eval=True)
        mine = table.filter(pc.is_in(table["clip_id"], value_set=pa.array(clips)))
        assets = sorted(set(mine["asset_id"].to_pylist()))
    n = _quarantine(
        catalog,
        assets,
        "a latent member failed its SHA-256 when a loader read it",
        "loader-corrupt-members",
        {"member_sha256": members},
    )
    return {"members": members, "clips": clips, "quarantined": n}
