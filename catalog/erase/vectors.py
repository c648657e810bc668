"""Erasing an asset's vectors from every LanceDB embedding table (a hard takedown).

:func:`asset_vector_counts` says which tables hold rows of an asset;
:func:`erase_asset_vectors` deletes them and every older table version that still
holds their bytes (see its docstring for why the table is rewritten whole).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from catalog.embeddings import connect_lance
from catalog.errors import InvalidInput

__all__ = ["asset_vector_counts", "erase_asset_vectors"]


def asset_vector_counts(uri_or_dir: str | os.PathLike[str], asset_id: str) -> dict[str, int]:
    """Rows of ``asset_id`` per embedding table (tables without any are left out)."""
    db = _erasure_db(uri_or_dir, asset_id)
    counts: dict[str, int] = {}
    for name in db.table_names():
        table = db.open_table(name)
        if "asset_id" in table.schema.names:
            n = int(table.count_rows(f"asset_id = '{asset_id}'"))
            if n:
                counts[name] = n
    return counts


def erase_asset_vectors(
    uri_or_dir: str | os.PathLike[str], asset_id: str, tables: Sequence[str]
) -> None:
    """Delete ``asset_id``'s rows from ``tables`` and erase their old versions.

    A LanceDB delete only writes a deletion file, and compaction rewrites a fragment
    only once a tenth of it is deleted: the vectors would stay in the fragment files.
    So each table is rewritten whole from its remaining rows (a new version of new
    fragment files; ``O(table)`` work, the price of a guarantee LanceDB's API offers
    no cheaper way to) and every version but the latest is cleaned up. Idempotent: a
    rerun rewrites the same rows again.

    A reader or writer holding an older version of such a table at that moment fails
    (the version it reads is gone), and pins of older table versions no longer
    resolve; an erasure's record says so. The table has no vector index to rebuild
    (see the module docstring: reads are exact scans).
    """
    import warnings

    db = _erasure_db(uri_or_dir, asset_id)
    present = set(db.table_names())
    for name in tables:
        if name not in present:
            continue
        table = db.open_table(name)
        table.delete(f"asset_id = '{asset_id}'")
        rows = table.to_arrow()
        db.create_table(name, rows, schema=rows.schema, mode="overwrite")
        with warnings.catch_warnings():
            # "removes every version except the latest": exactly the point here.
            warnings.simplefilter("ignore", UserWarning)
            db.open_table(name).optimize(cleanup_older_than=timedelta(0))


def _erasure_db(uri_or_dir: str | os.PathLike[str], asset_id: str) -> Any:
    if not re.fullmatch(r"[0-9a-f]{64}", asset_id):
        raise InvalidInput(f"asset id must be 64 lowercase hex, got {asset_id!r}")
    return connect_lance(os.fspath(uri_or_dir))
