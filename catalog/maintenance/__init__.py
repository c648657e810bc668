"""Lake maintenance of the catalog's Iceberg tables: compaction, manifest rewrite,
snapshot expiry, orphan removal; never breaking what a reader can name.

:func:`maintain` runs, per table, four idempotent steps, each either one Iceberg
commit or deletes of unreferenced files, so a kill -9 at any point leaves a table a
rerun finishes (and never a table that reads differently):

1. **Compact** (:mod:`.compact`): small data files rewritten, sorted by the table's
   key, into files of about ``target_file_bytes``; manifests rewritten into one per
   partition spec plus one of the new files (operation ``replace``: same rows).
2. **Expire** (:mod:`.expire`): snapshots older than ``retention_s``, except branch
   and tag heads, snapshots named in ``keep`` (what registered versions read), the
   newest ``retain_last`` of ``main``, and what near-duplicate link events need
   (:mod:`.links`).
3. **Orphans** (:mod:`.orphans`): files no live snapshot references, older than
   ``orphan_age_s``.

What it did comes back per table: data files, bytes, manifests and full-scan planning
seconds before and after (:mod:`.stats`), snapshots expired, files compacted, orphans
removed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from catalog.errors import InvalidInput
from catalog.maintenance.compact import compact_table
from catalog.maintenance.expire import expire_table
from catalog.maintenance.links import keep_for_events
from catalog.maintenance.orphans import remove_orphans
from catalog.maintenance.stats import table_stats
from catalog.objects.s3_client import S3Connection
from catalog.tables import TABLES

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog

__all__ = ["MaintainOptions", "maintain", "sort_key"]

Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class MaintainOptions:
    """What :func:`maintain` may do.

    Attributes:
        retention_s: Snapshots younger than this are never expired (7 days).
        retain_last: The newest snapshots of ``main`` always kept (at least 1).
        orphan_age_s: Unreferenced files younger than this are never deleted (1 day).
        target_file_bytes: Size compacted data files aim at (128 MiB).
        tables: The tables to maintain (default: all).
    """

    retention_s: float = 7 * 86400.0
    retain_last: int = 1
    orphan_age_s: float = 86400.0
    target_file_bytes: int = 128 * 2**20
    tables: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("retention_s", "orphan_age_s"):
            if getattr(self, name) < 0:
                raise InvalidInput(f"{name} must not be negative", field=name)
        if self.retain_last < 1:
            raise InvalidInput("retain_last must be at least 1", field="retain_last")
        if self.target_file_bytes < 2**16:
            raise InvalidInput(
                "target_file_bytes must be at least 64 KiB", field="target_file_bytes"
            )
        unknown = sorted(set(self.tables) - set(TABLES))
        if unknown:
            raise InvalidInput(
                f"unknown table(s) {unknown}; known: {sorted(TABLES)}", field="tables"
            )


def sort_key(table: str) -> tuple[str, ...]:
    """The columns compacted files of ``table`` are sorted by: its id column, then its
    time column (rows of one id together, in ingest order)."""
    tdef = TABLES[table]
    first = tdef.schema.fields[0].name
    return (first, tdef.time_column) if tdef.time_column else (first,)


def maintain(
    catalog: VidlakeCatalog,
    keep: Mapping[str, Set[int]],
    options: MaintainOptions | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Maintain every table (see the module doc); ``keep`` maps a table to the snapshot
    ids that must survive expiry. Returns the report per table and totals."""
    options = options or MaintainOptions()
    report = progress or (lambda _stage, _fraction: None)
    names = list(options.tables or TABLES)
    s3 = _s3_connection(catalog)
    tables: dict[str, Any] = {}
    for i, name in enumerate(names):
        report(f"maintain {name}", i / len(names))
        kept = set(keep.get(name, set()))
        if name in ("assets", "asset_events"):
            links = keep_for_events(
                catalog.iceberg_table("assets"), catalog.iceberg_table("asset_events")
            )
            kept |= links[name]
        tables[name] = _maintain_table(catalog, name, kept, options, s3)
    report("maintain", 1.0)
    return {"tables": tables, "totals": _totals(tables)}


def _maintain_table(
    catalog: VidlakeCatalog,
    name: str,
    keep: Set[int],
    options: MaintainOptions,
    s3: S3Connection,
) -> dict[str, Any]:
    tbl = catalog.iceberg_table(name)
    before = table_stats(tbl)
    compacted = compact_table(tbl, sort_by=sort_key(name), target_bytes=options.target_file_bytes)
    tbl = catalog.iceberg_table(name)
    cutoff_ms = int((time.time() - options.retention_s) * 1000)
    expired = expire_table(tbl, keep, cutoff_ms, options.retain_last)
    tbl = catalog.iceberg_table(name)
    orphans = remove_orphans(tbl, older_than_s=options.orphan_age_s, s3=s3)
    after = table_stats(catalog.iceberg_table(name))
    return {
        "before": before,
        "after": after,
        "compaction": compacted,
        "snapshots_expired": len(expired),
        "orphans": orphans,
    }


def _totals(tables: Mapping[str, Any]) -> dict[str, Any]:
    def total(side: str, key: str) -> Any:
        return sum(t[side][key] for t in tables.values())

    return {
        "data_files_before": total("before", "data_files"),
        "data_files_after": total("after", "data_files"),
        "data_bytes_before": total("before", "data_bytes"),
        "data_bytes_after": total("after", "data_bytes"),
        "manifests_before": total("before", "manifests"),
        "manifests_after": total("after", "manifests"),
        "planning_s_before": round(total("before", "planning_s"), 6),
        "planning_s_after": round(total("after", "planning_s"), 6),
        "snapshots_expired": sum(t["snapshots_expired"] for t in tables.values()),
        "orphans_removed": sum(t["orphans"]["orphans"] for t in tables.values()),
        "orphan_bytes": sum(t["orphans"]["bytes"] for t in tables.values()),
    }


def _s3_connection(catalog: VidlakeCatalog) -> S3Connection:
    config = catalog.config
    return S3Connection(
        endpoint_url=config.s3_endpoint_url,
        path_style=config.s3_path_style,
        region_name=config.s3_region,
    )
