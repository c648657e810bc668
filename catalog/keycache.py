"""Key helpers of ingest: snapshot ids, first occurrences, latent keys, Arrow to numpy.

The keys themselves live on disk, in the catalog's key index (:mod:`catalog.key_index`);
this module holds the small pure helpers the index and the ingest planners
(:mod:`catalog.ingest`) share.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray
from pyiceberg.table import Table

__all__ = ["combined", "first_occurrence", "latent_key", "snapshot_id", "to_numpy"]


def snapshot_id(tbl: Table) -> int | None:
    """``tbl``'s current snapshot id (None: the table is empty)."""
    snap = tbl.current_snapshot()
    return None if snap is None else snap.snapshot_id


def first_occurrence(
    keys: pa.ChunkedArray | pa.Array, digests: NDArray[np.uint64] | None = None
) -> NDArray[np.bool_]:
    """True at the first row of each distinct key. ``digests`` (equal keys have equal
    digests) give a cheap answer for the usual batch, which repeats nothing."""
    n = len(keys)
    if digests is not None:
        ordered = np.sort(digests)
        if not (ordered[1:] == ordered[:-1]).any():
            return np.ones(n, dtype=np.bool_)
    elif pc.count_distinct(keys).as_py() == n:
        return np.ones(n, dtype=np.bool_)
    grouped = (
        pa.table({"k": keys, "i": pa.array(np.arange(n, dtype=np.int64))})
        .group_by("k")
        .aggregate([("i", "min")])
    )
    first = np.zeros(n, dtype=np.bool_)
    first[grouped["i_min"].to_numpy()] = True
    return first


def latent_key(*cols: pa.ChunkedArray | pa.Array) -> pa.Array:
    """One string per latent: clip, rung, tokenizer, member SHA-256 (unit-separated)."""
    joined = pc.binary_join_element_wise(
        *(c.cast(pa.large_string()) for c in cols), pa.scalar("\x1f", pa.large_string())
    )
    return combined(joined)


def combined(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """``col`` as one contiguous array."""
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def to_numpy(col: pa.ChunkedArray | pa.Array) -> NDArray[Any]:
    """``col`` as a numpy array (copying where Arrow cannot share the buffer)."""
    return np.asarray(col.to_numpy(zero_copy_only=False))
