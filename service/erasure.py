"""The erase job: a hard takedown's bytes erased from the catalog and the registry.

:func:`run_erasure` composes the catalog's erasure (:func:`catalog.erase.erase_asset`)
with the registry's step (:func:`manifests.erasure.erase_versions`); the service runs
it as a background job (kind ``erase``, :func:`submit_erasure`), whether a request
comes over HTTP or from the CLI's in-process client, so a rerun of either resumes
the other's interrupted run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from catalog.erase import erase_asset, erasure_id, get_erasure
from catalog.erase.plan import require_hard_tombstone
from catalog.errors import NotFound
from manifests.erasure import erase_versions

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog
    from manifests.registry import Registry
    from service.deps import Services
    from service.jobs import JobRecord

__all__ = [
    "ERASURE_ID_PATTERN",
    "check_erasure",
    "erasure_view",
    "run_erasure",
    "submit_erasure",
]

#: What an erasure id looks like (:func:`catalog.erase.erasure_id`).
ERASURE_ID_PATTERN = r"^er_[0-9a-f]{24}$"

Progress = Callable[[str, float], None]


def check_erasure(
    catalog: VidlakeCatalog, asset_id: str, *, tombstone: bool, reason: str, by: str | None
) -> str:
    """Refuse a request that cannot run (before a job is queued); returns the erasure id.

    With ``tombstone``, a hard tombstone is recorded first (idempotent per batch key).

    Raises:
        InvalidInput: a bad id, or no hard tombstone (and ``tombstone`` not asked).
        NotFound: the catalog never held the asset and no erasure of it exists.
    """
    eid = erasure_id(asset_id)
    try:
        if get_erasure(catalog, eid)["state"] == "done":
            return eid
    except NotFound:
        pass
    if tombstone:
        row = {"asset_id": asset_id, "reason": reason, "kind": "hard", "requested_by": by}
        catalog.add_tombstones([row])
    require_hard_tombstone(catalog, asset_id)
    return eid


def run_erasure(
    catalog: VidlakeCatalog,
    registry: Registry,
    asset_id: str,
    *,
    reason: str = "hard takedown",
    requested_by: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Erase ``asset_id`` everywhere (idempotent; resumes an interrupted run)."""

    def versions(
        plan: Mapping[str, Any],
        packs: Mapping[str, Any],
        expired: Mapping[str, list[int]],
        report: Progress,
    ) -> Mapping[str, Any]:
        return erase_versions(registry, plan, packs, expired, report)

    return erase_asset(
        catalog,
        asset_id,
        reason=reason,
        requested_by=requested_by,
        versions=versions,
        progress=progress,
    )


_TOP = ("erasure_id", "asset_id", "state", "reason", "requested_by", "requested_at", "completed_at")


def erasure_view(record: Mapping[str, Any]) -> dict[str, Any]:
    """An erasure record split into its request fields and its ``audit`` (the rest)."""
    view = {k: record.get(k) for k in _TOP}
    view["state"] = record.get("state", "done")
    view["audit"] = {k: v for k, v in record.items() if k not in _TOP}
    return view


def submit_erasure(
    services: Services, asset_id: str, *, tombstone: bool, reason: str, by: str | None
) -> JobRecord:
    """Queue the erase job of ``asset_id`` (after :func:`check_erasure`), or return the
    one already queued or running for it: one job per erasure at a time."""
    catalog, registry = services.catalog, services.registry
    eid = check_erasure(catalog, asset_id, tombstone=tombstone, reason=reason, by=by)
    runner = services.runner
    for state in ("running", "queued"):
        for job in runner.store.list(state=state, kind="erase", limit=1000):
            if job.params.get("erasure_id") == eid:
                return job

    def run(progress: Progress) -> dict[str, Any]:
        result = run_erasure(
            catalog, registry, asset_id, reason=reason, requested_by=by, progress=progress
        )
        services.reader.forget(result.get("versions", {}).get("artifacts_deleted", []))
        return erasure_view(result)

    return runner.submit("erase", run, {"erasure_id": eid, "asset_id": asset_id}, owner=by)
