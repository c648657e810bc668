"""Rows per Parquet row group, per table: small where a point lookup reads one.

The lineage of one clip (``GET /v1/lineage/clips/{id}``) finds the clip's row by a
binary search on a cached key index, then decodes the whole row group that holds it,
every column (:meth:`service.sql.views.CatalogViews.lookup`). That decode is the
lookup's cost, and it grows with the row group, not the table: measured on 150k-clip
files (CPU time, one thread), a ``clips`` row group costs 10.2 ms at 65,536 rows and
3.2 ms at 16,384, an ``assets`` one 14.3 and 4.7 ms; a full scan of the same file costs
12 to 24 % more CPU at 16,384 (8,192: up to 45 % more). So:

* the tables read by key one row at a time (``assets``, ``clips``, ``asset_events``,
  ``tombstones``) get :data:`LOOKUP_ROWS`;
* the tables every cut scans in bulk (``scores``, ``captions``, ``latents``, ``jobs``)
  keep :data:`SCAN_ROWS`.

The limit is the Iceberg property ``write.parquet.row-group-limit``, set at creation
(:meth:`catalog.tables.TableDef.properties`). A table made before this limit (no
property, i.e. pyiceberg's 1M rows, or a larger value) is brought to it by its next
write: the fast append writes its files under the catalog's limit and records the
property in the same commit (:func:`catalog._append.append`). A smaller limit that an
operator set on purpose is kept.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyiceberg.table import TableProperties

__all__ = ["LOOKUP_ROWS", "PROPERTY", "SCAN_ROWS", "limit_for", "row_group_rows", "stale"]

PROPERTY = TableProperties.PARQUET_ROW_GROUP_LIMIT
LOOKUP_ROWS = 16_384
SCAN_ROWS = 65_536
_LOOKUP_TABLES = frozenset({"assets", "clips", "asset_events", "tombstones"})
# Tables are named by this property (catalog.tables.TableDef.properties).
_TABLE_PROPERTY = "vidlake.table"


def limit_for(table: str) -> int:
    """The catalog's row-group limit for ``table``."""
    return LOOKUP_ROWS if table in _LOOKUP_TABLES else SCAN_ROWS


def _declared(props: Mapping[str, str]) -> int | None:
    table = props.get(_TABLE_PROPERTY)
    return limit_for(table) if table is not None else None


def _current(props: Mapping[str, str]) -> int:
    try:
        return int(props.get(PROPERTY, TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT))
    except ValueError:
        return TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT


def row_group_rows(props: Mapping[str, str]) -> int:
    """Rows per row group for a data file of the table with properties ``props``: its
    own limit, capped by the catalog's for a catalog table."""
    declared, current = _declared(props), _current(props)
    return current if declared is None or current <= declared else declared


def stale(props: Mapping[str, str]) -> dict[str, str] | None:
    """The property update that brings a catalog table's row-group limit down to the
    catalog's, or None when it is there (or the table is not the catalog's)."""
    declared = _declared(props)
    if declared is None or (PROPERTY in props and _current(props) <= declared):
        return None
    return {PROPERTY: str(declared)}
