"""The maintain job: what registered versions read, then the catalog's maintenance.

:func:`run_maintenance` derives the snapshots expiry must keep from the registry
(every registered version's ``catalog_snapshot_ids``, patches included, pinned or not;
tags in the tables protect theirs on their own) and runs
:func:`catalog.maintenance.maintain`. The service runs it as a background job (kind
``maintain``, :func:`submit_maintenance`), one at a time: a request while one is
queued or running joins it. Every step is idempotent and kill -9 safe, so a crashed
run is finished by the next.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from catalog.maintenance import MaintainOptions, maintain
from catalog.tables import TABLES

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog
    from manifests.registry import Registry
    from service.deps import Services
    from service.jobs import JobRecord

__all__ = ["registered_snapshot_ids", "run_maintenance", "submit_maintenance"]

Progress = Callable[[str, float], None]

#: The ``snapshot.json`` key holding the pin a version read (``Pin.to_dict()``).
_PIN_KEY = "catalog_snapshot_ids"


def registered_snapshot_ids(registry: Registry) -> dict[str, set[int]]:
    """Per table, the Iceberg snapshot ids some registered version read."""
    keep: dict[str, set[int]] = {name: set() for name in TABLES}
    for version in registry.versions():
        ids = registry.get(version).snapshot.get(_PIN_KEY) or {}
        for table, sid in ids.items():
            if table in keep and sid is not None:
                keep[table].add(int(sid))
    return keep


def run_maintenance(
    catalog: VidlakeCatalog,
    registry: Registry,
    options: MaintainOptions | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Maintain every table, keeping what registered versions read; the report of
    :func:`catalog.maintenance.maintain` plus ``versions_protected``."""
    report = progress or (lambda _stage, _fraction: None)
    report("registered versions", 0.0)
    keep = registered_snapshot_ids(registry)
    result = maintain(catalog, keep, options, progress)
    result["versions_protected"] = len(registry.versions())
    return result


def submit_maintenance(
    services: Services, options: MaintainOptions, *, by: str | None
) -> JobRecord:
    """Queue a maintain job, or return the one already queued or running."""
    runner = services.runner
    for state in ("running", "queued"):
        for job in runner.store.list(state=state, kind="maintain", limit=10):
            return job
    catalog, registry = services.catalog, services.registry

    def run(progress: Progress) -> dict[str, Any]:
        result = run_maintenance(catalog, registry, options, progress)
        services.forget_pin()
        return result

    params = {
        "retention_s": options.retention_s,
        "retain_last": options.retain_last,
        "orphan_age_s": options.orphan_age_s,
        "target_file_bytes": options.target_file_bytes,
        "tables": list(options.tables),
    }
    return runner.submit("maintain", run, params, owner=by)
