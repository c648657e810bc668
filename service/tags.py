"""Iceberg tags of registered versions, as the service answers them.

:func:`list_tags` reads every table's ``vidlake-v{N}`` tags; :func:`backfill_tags`
gives every registered version the tags the registry says it should have
(:func:`manifests.tags.sync_version_tags`): versions published before tags existed,
and any whose tagging a crash interrupted. Both are idempotent and read-mostly; the
backfill commits only the tags that are missing or wrong.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from catalog.table_names import TABLE_NAMES
from manifests.tags import sync_version_tags

if TYPE_CHECKING:
    from service.deps import Services

__all__ = ["TagsBackfillPublic", "TagsPublic", "backfill_tags", "list_tags"]

TagNames = dict[str, list[str]]


class TagsPublic(BaseModel):
    """Every table's version tags: table -> {version: tagged snapshot id}."""

    tables: dict[str, dict[int, int]] = Field(
        description="table -> version -> the Iceberg snapshot id its tag vidlake-v{N} names"
    )


class TagsBackfillPublic(BaseModel):
    """What a backfill changed, per table (tag names)."""

    versions: int = Field(description="registered versions checked")
    created: TagNames
    updated: TagNames = Field(description="tags moved or given a new retention")
    missing: TagNames = Field(
        description="tags not made: the table no longer holds the snapshot (expired, erased)"
    )


def list_tags(services: Services) -> TagsPublic:
    """Every table's ``vidlake-v{N}`` tags."""
    catalog = services.catalog
    return TagsPublic(tables={t: catalog.version_tags(t) for t in TABLE_NAMES})


def backfill_tags(services: Services) -> TagsBackfillPublic:
    """Tag every registered version as the registry says (idempotent)."""
    registry = services.registry
    versions = registry.versions()
    report = sync_version_tags(services.catalog, registry, versions)
    return TagsBackfillPublic(
        versions=len(versions),
        created=report.created,
        updated=report.updated,
        missing=report.missing,
    )
