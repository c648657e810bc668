"""Write-time scatter: the seeded order of a snapshot's manifest rows.

Sorting rows by a seeded key of their content puts neighbours in the source (one
asset, one crawl) far apart in the manifest, so a contiguous slice of it is a fair
sample. The keys depend on the set of ids and the seed, never on the order a query
returned them in.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from catalog.errors import InvalidInput
from materializer.plan.rng import TAG_SCATTER, check_seed, derive, mix

__all__ = ["scatter_keys", "scatter_order", "scatter_permutation"]


def scatter_order(n: int, seed: int) -> NDArray[np.int64]:
    """The write-time scatter permutation of ``n`` rows.

    Manifest row ``i`` is input row ``scatter_order(n, seed)[i]``. Use it when the input
    order is already canonical (e.g. sorted by clip id); otherwise order by content
    with :func:`scatter_permutation`.
    """
    if n < 0:
        raise InvalidInput(f"n must be >= 0, got {n}", field="n")
    keys = np.arange(n, dtype=np.uint64)
    keys += np.uint64(derive(check_seed(seed), TAG_SCATTER))
    return np.argsort(mix(keys)).astype(np.int64, copy=False)  # no second n-row copy


def scatter_keys(ids: pa.Array | pa.ChunkedArray | Sequence[str], seed: int) -> NDArray[np.uint64]:
    """A seeded 64-bit key per id (a clip id), independent of the input order.

    Sorting rows by ``(key, id)`` scatters them: neighbours in the source (one asset,
    one crawl) land far apart in the manifest. Vectorised over 8-byte words of the
    UTF-8 ids, 1M ids at a time.
    """
    arr = ids if isinstance(ids, pa.Array | pa.ChunkedArray) else pa.array(ids, pa.string())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        raise InvalidInput("ids must not be null", field="ids")
    binary = arr.cast(pa.large_binary())
    base = np.uint64(derive(check_seed(seed), TAG_SCATTER, 1))
    out = np.empty(len(binary), dtype=np.uint64)
    step = 1 << 20
    for lo in range(0, len(binary), step):
        part = binary.slice(lo, step)
        offsets = np.frombuffer(part.buffers()[1], dtype=np.int64)[part.offset :][: len(part) + 1]
        data = np.frombuffer(part.buffers()[2] or b"", dtype=np.uint8)
        lengths = np.diff(offsets)
        width = max(8, int(-(-int(lengths.max(initial=0)) // 8) * 8))
        padded = np.zeros((len(part), width), dtype=np.uint8)
        owner = np.repeat(np.arange(len(part)), lengths)
        col = np.arange(int(lengths.sum())) - np.repeat(offsets[:-1] - offsets[0], lengths)
        padded[owner, col] = data[offsets[0] : offsets[-1]]
        words = padded.view("<u8")
        h = lengths.astype(np.uint64) + base
        mix(h)
        for w in range(words.shape[1]):
            h ^= words[:, w]
            h += base
            mix(h)
        out[lo : lo + len(part)] = h
    return out


def scatter_permutation(
    ids: pa.Array | pa.ChunkedArray | Sequence[str], seed: int
) -> NDArray[np.int64]:
    """Input positions in manifest order: manifest row ``i`` is input row ``perm[i]``.

    Orders by ``(scatter_keys(ids, seed), id)``, so the result depends on the set of
    ids and the seed, never on the order a query returned them in.
    """
    arr = ids if isinstance(ids, pa.Array | pa.ChunkedArray) else pa.array(ids, pa.string())
    keys = scatter_keys(arr, seed)
    table = pa.table({"k": pa.array(keys, pa.uint64()), "id": arr})
    order = pc.sort_indices(table, sort_keys=[("k", "ascending"), ("id", "ascending")])
    return np.asarray(order.to_numpy(zero_copy_only=False), dtype=np.int64)
