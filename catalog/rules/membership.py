"""Exact membership against a growing key set, through 64-bit digests.

:func:`hex_prefix64` digests hex ids to 64 bits; a sorted digest index
(:func:`sorted_index`, :func:`index_merge`, :func:`digest_matches`) finds candidate rows
in ``O(log n)`` per key, and callers compare the full keys, so a digest collision can
never fake a match.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

__all__ = ["digest_matches", "hex_prefix64", "index_merge", "sorted_index"]

_HEX_NIBBLE = np.full(256, 255, dtype=np.uint8)
_HEX_NIBBLE[np.frombuffer(b"0123456789", dtype=np.uint8)] = np.arange(10, dtype=np.uint8)
_HEX_NIBBLE[np.frombuffer(b"abcdef", dtype=np.uint8)] = np.arange(10, 16, dtype=np.uint8)


def hex_prefix64(ids: pa.Array | pa.ChunkedArray) -> NDArray[np.uint64]:
    """The first 16 hex digits of each id as an unsigned 64-bit int, vectorised.

    Ids must be lowercase hex of at least 16 characters (validated by the caller);
    used as a digest for :func:`digest_matches`, never as an identity.
    """
    arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    arr = arr.cast(pa.large_string())
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8)
    width = int(offsets[1] - offsets[0])
    if width >= 16 and (np.diff(offsets) == width).all():
        # Equal widths (the usual batch of ids): a 2-D view, 16 digits packed into 8
        # bytes read as one big-endian integer: ~6x faster than digit by digit.
        grid = data[offsets[0] : offsets[-1]].reshape(n, width)[:, :16]
        nibbles = _HEX_NIBBLE[grid]
        packed = np.ascontiguousarray((nibbles[:, 0::2] << 4) | nibbles[:, 1::2])
        return packed.view(">u8").reshape(n).astype(np.uint64)
    offsets = offsets[:n]
    out = np.zeros(n, dtype=np.uint64)
    for k in range(16):  # one hex digit at a time keeps every temporary one column wide
        out = (out << np.uint64(4)) | _HEX_NIBBLE[data[offsets + k]].astype(np.uint64)
    return out


def sorted_index(digests: NDArray[np.uint64]) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    """``(sorted digests, row of each)``: a searchable index of ``digests``."""
    # Not a stable sort: rows sharing a digest are all candidates anyway, and the
    # default sort is ~6x faster on 64-bit keys.
    order = np.argsort(digests).astype(np.int64)
    return digests[order], order


def index_merge(
    index: tuple[NDArray[np.uint64], NDArray[np.int64]],
    more: tuple[NDArray[np.uint64], NDArray[np.int64]],
    row_offset: int,
) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    """Merge the index of rows appended after ``index``'s (their rows shift by
    ``row_offset``): one linear merge, never a re-sort of the whole set."""
    keys, rows = index
    at = np.searchsorted(keys, more[0], side="right")
    return np.insert(keys, at, more[0]), np.insert(rows, at, more[1] + row_offset)


def digest_matches(
    index: tuple[NDArray[np.uint64], NDArray[np.int64]], query: NDArray[np.uint64]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Every ``(query position, indexed row)`` pair with equal digests."""
    keys, rows = index
    if len(keys) == 0 or len(query) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    # Sorted queries walk the index in order (cache-friendly); most find nothing, so
    # the right edge is only searched for the hits.
    order = np.argsort(query)
    q = query[order]
    left = np.searchsorted(keys, q, side="left")
    hit = np.flatnonzero(keys[np.minimum(left, len(keys) - 1)] == q)
    right = np.searchsorted(keys, q[hit], side="right")
    counts = (right - left[hit]).astype(np.int64)
    total = int(counts.sum())
    qi = np.repeat(order[hit].astype(np.int64), counts)
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return qi, rows[np.repeat(left[hit], counts) + within]
