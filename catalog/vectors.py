"""Exact vector math over embeddings: unit rows and every pair within a cosine distance.

Pure numpy, no LanceDB: :func:`pairs_within_vectors` answers "every pair within cosine
distance d" by a blocked matrix product (the query vectors cut into blocks of ``block``
rows, each multiplied with the candidate matrix), so memory stays at ``O(block^2)``
floats beyond the inputs while time is ``O(n * m * dim)``. :mod:`catalog.embeddings`
and :mod:`materializer.dedup` build on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from catalog.errors import InvalidBatch, InvalidInput

__all__ = ["BLOCK", "PAIRS_SCHEMA", "pairs_within_vectors", "rows_of", "unit_rows"]

PAIRS_SCHEMA = pa.schema(
    [
        pa.field("clip_id", pa.string(), nullable=False),
        pa.field("other_id", pa.string(), nullable=False),
        pa.field("distance", pa.float32(), nullable=False),
    ]
)
#: Query rows multiplied at once (a ``BLOCK x BLOCK`` float32 scratch matrix).
BLOCK = 2048


def pairs_within_vectors(
    ids: Sequence[str],
    vectors: NDArray[np.floating[Any]],
    distance: float,
    *,
    other_ids: Sequence[str] | None = None,
    other_vectors: NDArray[np.floating[Any]] | None = None,
    block: int = BLOCK,
) -> pa.Table:
    """Exact pairs within cosine ``distance`` by a blocked matrix product.

    With no ``other_*``, pairs among ``ids`` (``i < j`` by position, each once);
    otherwise pairs of each id with each other id (equal ids never pair). Vectors are
    normalised here, so callers may pass raw embeddings.

    Cost: ``n * m * dim`` multiply-adds (half that among themselves) and, beyond the
    inputs, ``block x block`` float32 scratch. Output is ordered by the position of
    ``clip_id`` in ``ids``, then by the position of ``other_id``.

    Returns:
        A table with :data:`PAIRS_SCHEMA`: ``clip_id``, ``other_id``, ``distance``.
    """
    if (
        isinstance(distance, bool)
        or not isinstance(distance, int | float)
        or not 0 <= distance <= 2
    ):
        raise InvalidInput(
            f"distance must be a cosine distance in [0, 2], got {distance!r}", field="distance"
        )
    self_join = other_ids is None
    oid = list(ids) if other_ids is None else list(other_ids)
    if not len(ids) or not len(oid):
        return PAIRS_SCHEMA.empty_table()
    q = unit_rows(rows_of(vectors, len(ids), "vectors"), "vectors")
    o = q
    if not self_join:
        if other_vectors is None:
            raise InvalidInput("other_ids needs other_vectors", field="other_vectors")
        o = unit_rows(rows_of(other_vectors, len(oid), "other_vectors"), "other_vectors")
        if o.shape[1] != q.shape[1]:
            raise InvalidInput(f"dimension {o.shape[1]} != {q.shape[1]}", field="other_vectors")
    qi_all: list[NDArray[np.int64]] = []
    oj_all: list[NDArray[np.int64]] = []
    d_all: list[NDArray[np.float32]] = []
    ids_arr = np.asarray(list(ids), dtype=object)
    oid_arr = np.asarray(oid, dtype=object)
    # The threshold test runs on similarities in float32; widen it by a few ulps so a
    # pair exactly at the threshold is not lost to rounding, then decide on distance.
    min_sim = np.float32(1.0 - distance) - np.float32(1e-6)
    for a in range(0, len(q), block):
        qa = q[a : a + block]
        start = a if self_join else 0
        for b in range(start, len(o), block):
            sims = qa @ o[b : b + block].T
            hit = sims >= min_sim
            if self_join and a == b:
                hit &= np.triu(np.ones(hit.shape, dtype=bool), k=1)
            r, c = np.nonzero(hit)
            if not len(r):
                continue
            dist = np.clip(1.0 - sims[r, c].astype(np.float64), 0.0, 2.0)
            ok = dist <= distance
            r, c, dist = r[ok] + a, c[ok] + b, dist[ok]
            if not self_join:
                same = ids_arr[r] == oid_arr[c]
                r, c, dist = r[~same], c[~same], dist[~same]
            qi_all.append(r.astype(np.int64))
            oj_all.append(c.astype(np.int64))
            d_all.append(dist.astype(np.float32))
    if not qi_all:
        return PAIRS_SCHEMA.empty_table()
    qi, oj, dd = np.concatenate(qi_all), np.concatenate(oj_all), np.concatenate(d_all)
    order = np.lexsort((oj, qi))
    qi, oj, dd = qi[order], oj[order], dd[order]
    return pa.table(
        {
            "clip_id": pa.array(ids_arr[qi].tolist(), pa.string()),
            "other_id": pa.array(oid_arr[oj].tolist(), pa.string()),
            "distance": pa.array(dd, pa.float32()),
        },
        schema=PAIRS_SCHEMA,
    )


def rows_of(vectors: NDArray[np.floating[Any]], n: int, field: str) -> NDArray[np.float64]:
    """``vectors`` as an ``(n, dim)`` float64 matrix; InvalidInput for another shape."""
    mat = np.asarray(vectors, dtype=np.float64)
    if mat.ndim != 2 or mat.shape[0] != n:
        raise InvalidInput(f"{field} must be an ({n}, dim) array, got {mat.shape}", field=field)
    return mat


def unit_rows(mat: NDArray[np.float64], field: str) -> NDArray[np.float32]:
    """The rows of ``mat`` scaled to unit length (float32); InvalidBatch for a row
    that is not finite or has no direction."""
    if mat.ndim != 2 or (len(mat) and mat.shape[1] == 0):
        raise InvalidBatch(f"{field} must be a non-empty (n, dim) array", row=0, field=field)
    if not np.isfinite(mat).all():
        row = int(np.nonzero(~np.isfinite(mat).all(axis=1))[0][0])
        raise InvalidBatch(f"{field} row {row} is not finite", row=row, field=field)
    norms = np.linalg.norm(mat, axis=1)
    if len(norms) and (norms == 0).any():
        row = int(np.nonzero(norms == 0)[0][0])
        raise InvalidBatch(
            f"{field} row {row} is a zero vector (no direction)", row=row, field=field
        )
    unit: NDArray[np.float32] = (mat / norms[:, None]).astype(np.float32)
    return unit
