"""Table metadata kept per SQL catalog, reused while the catalog row still names it.

pyiceberg's ``SqlCatalog.load_table`` reads the catalog row and then reads and parses
the table's whole metadata JSON, every snapshot so far, on every call. A table fed by
many commits pays that on each load: at 16M clips in 180 commits, two loads a
10k-clip batch cost ~25 ms of its ~106 (cProfile, 2 Dec 2026), while the row itself
takes a fraction of a millisecond to read. :func:`load` reads the row as pyiceberg
does and parses the metadata file only when the row names a location other than the
one it parsed last; :func:`remember` records the metadata a commit of this process
just wrote (:mod:`catalog._sql_commit`), so the next load after one's own commit
parses nothing.

Each call still returns a new :class:`~pyiceberg.table.Table` (a caller's commit
updates its own object in place, never the cached one); the metadata models are
frozen, so sharing them is safe. What is kept: one entry per table of each catalog
object (held weakly: it goes with the catalog), so its size is the tables', not the
commits'. Freshness is the row's: a commit by any process moves the row, and the
next load reads the new file, exactly as before.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io import FileIO
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from sqlalchemy import select
from sqlalchemy.orm import Session

__all__ = ["load", "remember"]


@dataclass(frozen=True)
class _Parsed:
    location: str
    metadata: TableMetadata
    io: FileIO


_LOCK = threading.Lock()
_PARSED: weakref.WeakKeyDictionary[SqlCatalog, dict[tuple[str, str], _Parsed]] = (
    weakref.WeakKeyDictionary()
)


def load(catalog: SqlCatalog, namespace: str, name: str) -> Table:
    """Table ``name`` of ``namespace`` at the location its catalog row names now.

    Raises:
        NoSuchTableError: No row names the table.
    """
    with Session(catalog.engine) as session:
        stmt = select(IcebergTables).where(
            IcebergTables.catalog_name == catalog.name,
            IcebergTables.table_namespace == namespace,
            IcebergTables.table_name == name,
        )
        if (type_filter := catalog._iceberg_type_filter()) is not None:
            stmt = stmt.where(type_filter)
        row = session.scalar(stmt)
        if row is None:
            raise NoSuchTableError(f"Table does not exist: {namespace}.{name}")
        location = row.metadata_location
        with _LOCK:
            parsed = _PARSED.get(catalog, {}).get((namespace, name))
        if parsed is None or parsed.location != location:
            table = catalog._convert_orm_to_iceberg(row)
            remember(catalog, namespace, name, table)
            return table
    return Table(
        identifier=(*Catalog.identifier_to_tuple(namespace), name),
        metadata=parsed.metadata,
        metadata_location=parsed.location,
        io=parsed.io,
        catalog=catalog,
    )


def remember(catalog: SqlCatalog, namespace: str, name: str, table: Table) -> None:
    """Keep ``table``'s metadata as what its current location holds."""
    if not table.metadata_location:
        return
    parsed = _Parsed(table.metadata_location, table.metadata, table.io)
    with _LOCK:
        _PARSED.setdefault(catalog, {})[(namespace, name)] = parsed
