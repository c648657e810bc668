"""Seed a large embedded catalog fast: its tables and row groups, without its ingest checks.

``catalog.add_clips`` checks every row against the catalog (duplicate keys in the
SQLite key index, asset references, the eval carve-out), at ~30-40k clips/s here, so
10M clips take longer than a benchmark run may. The benchmarks that only *read* a
large catalog (``lineage.py``, ``service_load.py --bulk``) seed it with this module
instead: rows are built with vectorised Arrow/numpy (random hex ids; clip ids by the
catalog's rule, :func:`catalog.rules.clip_ids`), coerced and conformed to the table
schema as the catalog does (:func:`catalog.coerce.coerce_batch`), and committed by
pyiceberg's ``Table.append`` in chunks of ``chunk`` rows, under the table properties the
catalog set (so the row groups are :mod:`catalog.row_groups`'), one data file and one
snapshot per chunk, as an ingest of that batch would write. What it skips: the
duplicate and reference checks (the ids are unique by construction) and the key index
(so the seeded catalog must not be ingested into afterwards), and every asset is
``train``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Seeded", "bulk_fill", "hex_ids", "repeat"]

_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


def hex_ids(rng: np.random.Generator, n: int, width: int) -> pa.Array:
    """``n`` random lowercase hex strings of ``width`` characters, built without Python
    strings."""
    raw = rng.integers(0, 256, (n, width // 2), dtype=np.uint8)
    text = np.empty((n, width), np.uint8)
    text[:, 0::2], text[:, 1::2] = _HEX[raw >> 4], _HEX[raw & 15]
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width), n, [None, pa.py_buffer(text.tobytes())]
    )
    return fixed.cast(pa.binary()).cast(pa.string())


def repeat(value: str, n: int) -> pa.Array:
    """A string column of ``n`` copies of ``value``."""
    return pc.take(pa.array([value]), pa.array(np.zeros(n, np.int32)))


@dataclass
class Seeded:
    """What :func:`bulk_fill` wrote: every asset id, and each clip's id and asset."""

    asset_ids: pa.Array
    clip_ids: pa.Array
    clip_assets: pa.Array


def _chunks(n: int, chunk: int) -> Iterator[tuple[int, int]]:
    for lo in range(0, n, chunk):
        yield lo, min(n, lo + chunk)


def _append(catalog: object, table: str, rows: pa.Table) -> None:
    from catalog.coerce import coerce_batch, conform
    from catalog.tables import TABLES

    tbl = catalog.iceberg_table(table)  # type: ignore[attr-defined]
    batch = coerce_batch(TABLES[table], rows, tbl.schema())
    split = batch.schema.get_field_index("split")
    if split >= 0:
        batch = batch.set_column(
            split, "split", repeat("train", rows.num_rows).cast(pa.large_string())
        )
    tbl.append(conform(batch, tbl.schema()), {"vidlake.rows": str(rows.num_rows)})


def _assets(ids: pa.Array, lo: int) -> pa.Table:
    n = len(ids)
    k = np.arange(lo, lo + n)
    return pa.table(
        {
            "asset_id": ids,
            "uri": pc.binary_join_element_wise(
                "s3://raw/", pc.utf8_slice_codeunits(ids, 0, 12), ".mp4", ""
            ),
            "size": np.full(n, 10_000_000, np.int64),
            "source": pc.take(pa.array([f"src-{i}" for i in range(7)]), pa.array(k % 7)),
            "source_tier": repeat("licensed", n),
            "license_id": pc.take(pa.array([f"lic-{i}" for i in range(5)]), pa.array(k % 5)),
        }
    )


def _clips(asset_ids: pa.Array, lo: int, hi: int) -> pa.Table:
    from catalog import rules

    n_assets = len(asset_ids)
    k = np.arange(lo, hi)
    starts = (k // n_assets).astype(np.float64) * 4.0
    owners = pc.take(asset_ids, pa.array(k % n_assets))
    versions = repeat("v1", hi - lo)
    ids = rules.clip_ids(owners, starts, starts + 4.0, versions)
    return pa.table(
        {
            "clip_id": ids,
            "asset_id": owners,
            "t_start_s": starts,
            "t_end_s": starts + 4.0,
            "split_version": versions,
            "num_frames": np.full(hi - lo, 96, np.int32),
            "width": np.full(hi - lo, 1280, np.int32),
            "height": np.full(hi - lo, 720, np.int32),
        }
    )


def bulk_fill(catalog: object, clips: int, *, chunk: int = 1_000_000, seed: int = 0) -> Seeded:
    """Append ``clips`` clips over ``clips // 2`` assets to an empty ``catalog`` (a
    :class:`catalog.catalog.VidlakeCatalog`), ``chunk`` rows per commit."""
    rng = np.random.default_rng(seed)
    n_assets = max(1, clips // 2)
    asset_ids = hex_ids(rng, n_assets, 64)
    for lo, hi in _chunks(n_assets, chunk):
        _append(catalog, "assets", _assets(asset_ids.slice(lo, hi - lo), lo))
    clip_ids, clip_assets = [], []
    for lo, hi in _chunks(clips, chunk):
        rows = _clips(asset_ids, lo, hi)
        _append(catalog, "clips", rows)
        clip_ids.append(rows["clip_id"].combine_chunks())
        clip_assets.append(rows["asset_id"].combine_chunks())
    return Seeded(
        asset_ids=asset_ids,
        clip_ids=pa.concat_arrays(clip_ids),
        clip_assets=pa.concat_arrays(clip_assets),
    )
