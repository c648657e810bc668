"""Which Iceberg tags each registered version should have, and putting them there.

Every registered version ``N`` tags the snapshots it read (its ``catalog_snapshot_ids``)
``vidlake-v{N}`` in each table (:mod:`catalog.tags`). The registry decides the tags'
retention (``docs/decisions/017-pin-tags.md``):

* a pinned version's tags never expire;
* an unpinned version's tags hold until ``retention_ms`` (default 30 days) after the
  later of its registration and its last unpin, then age out (``vidlake maintain``
  drops them and may expire the snapshots).

The retention is a pure function of the registry, so :func:`sync_version_tags` is
idempotent: the cut and the pin routes call it for one version after they publish or
pin, and the backfill (``vidlake tags backfill``) calls it for every version, which
also repairs a crash between a publish and its tagging. A version whose retention has
passed is never tagged again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from catalog.errors import VidlakeError
from catalog.pins import split_pin_keys
from catalog.table_names import TABLE_NAMES
from catalog.tags import TagReport, VersionTags

if TYPE_CHECKING:
    from catalog.catalog import VidlakeCatalog
    from manifests.registry import Registry, SnapshotRecord

__all__ = ["DEFAULT_RETENTION_MS", "sync_version_tags", "tag_published", "wanted_tags"]

log = logging.getLogger("vidlake.manifests.tags")

#: How long an unpinned version's tags hold after its registration or last unpin.
DEFAULT_RETENTION_MS = 30 * 86_400_000


def wanted_tags(
    registry: Registry,
    versions: Iterable[int] | None = None,
    *,
    retention_ms: int = DEFAULT_RETENTION_MS,
) -> list[VersionTags]:
    """The tags ``versions`` (default: every registered one) should have."""
    pinned = {p.version for p in registry.pins()}
    wanted = []
    for version in registry.versions() if versions is None else versions:
        record = registry.get(version)
        keep_until = None if version in pinned else _released_ms(registry, record) + retention_ms
        wanted.append(VersionTags(version, _tables(record), keep_until))
    return wanted


def sync_version_tags(
    catalog: VidlakeCatalog,
    registry: Registry,
    versions: Iterable[int] | None = None,
    *,
    retention_ms: int = DEFAULT_RETENTION_MS,
    now_ms: int | None = None,
) -> TagReport:
    """Make the tags of ``versions`` (default: all) what the registry says they are."""
    wanted = wanted_tags(registry, versions, retention_ms=retention_ms)
    return catalog.tag_versions(wanted, now_ms=now_ms)


def tag_published(catalog: VidlakeCatalog, registry: Registry, version: int) -> None:
    """Tag a version just published or (un)pinned; a failure is logged, not raised.

    The version is registered (or pinned) already: failing the request now would
    report a success as an error. The backfill repairs the missing tags.
    """
    try:
        sync_version_tags(catalog, registry, [version])
    except VidlakeError as exc:
        log.warning("tagging version %d failed (the backfill repairs it): %s", version, exc)


def _tables(record: SnapshotRecord) -> dict[str, int | None]:
    """The Iceberg part of a version's pin (embedding versions have no tags)."""
    tables, _ = split_pin_keys(record.snapshot.get("catalog_snapshot_ids") or {})
    unknown = sorted(set(tables) - set(TABLE_NAMES))
    if unknown:  # a table this catalog no longer has: nothing there to tag
        log.warning("version %d pins tables %s the catalog lacks", record.version, unknown)
    return {t: sid for t, sid in tables.items() if t in TABLE_NAMES}


def _released_ms(registry: Registry, record: SnapshotRecord) -> int:
    """When ``record`` stopped being protected: its registration or its last unpin."""
    times = [record.entry.created_at]
    times += [e.at for e in registry.pin_history(record.version) if e.action == "unpin"]
    return max(int(datetime.fromisoformat(t).timestamp() * 1000) for t in times)
