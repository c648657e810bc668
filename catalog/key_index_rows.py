"""What the on-disk key index (:mod:`catalog.key_index`) stores of each table's rows.

Pure conversions from Arrow rows (as scanned from Iceberg or as just committed) to the
rows of the index's SQLite tables, and the index's schema:

============ =================================================================
``assets``   key digest, ``asset_id``, ``split``, bitrate, leading fingerprint frames
``clips``    key digest of ``clip_id``
``latents``  key digest of (clip, rung, tokenizer, member SHA-256)
``edges``    recorded near-duplicate links, both directions, by source (``a``: the
             assets' ``near_duplicates``/``duplicate_of``; ``e``: link events)
``bands``    the near-duplicate search keys of every asset
             (:func:`catalog.rules.band_keys`) and the asset's key digest
============ =================================================================

A key digest is the first 16 bytes of the SHA-256 of the key's UTF-8 text: fixed
width (an index a third the size of hex text), and at 10^10 keys the chance of any
collision is about 10^-19, far below a disk's undetected error rate.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from catalog import rules
from catalog.keycache import latent_key, to_numpy

__all__ = ["SCHEMA", "Writes", "digests", "rows_for"]

#: (SQL statement, parameter rows) pairs, run with ``executemany`` in one transaction.
Writes: TypeAlias = list[tuple[str, Iterable[tuple[Any, ...]]]]

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    view TEXT PRIMARY KEY, table_uuid TEXT NOT NULL, snapshot_id INTEGER, rule TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS assets (
    k BLOB PRIMARY KEY, asset_id TEXT NOT NULL, split TEXT, bitrate REAL, frames BLOB
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS clips (k BLOB PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS latents (k BLOB PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS edges (
    a TEXT NOT NULL, b TEXT NOT NULL, src TEXT NOT NULL, PRIMARY KEY (a, b, src)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS bands (
    slot INTEGER NOT NULL, v INTEGER NOT NULL, k BLOB NOT NULL, PRIMARY KEY (slot, v, k)
) WITHOUT ROWID;
"""

#: The statements that empty one view before a rebuild.
CLEAR: dict[str, tuple[str, ...]] = {
    "assets": ("DELETE FROM assets", "DELETE FROM bands", "DELETE FROM edges WHERE src = 'a'"),
    "clips": ("DELETE FROM clips",),
    "latents": ("DELETE FROM latents",),
    "near_dup_events": ("DELETE FROM edges WHERE src = 'e'",),
}


def digests(keys: pa.Array | pa.ChunkedArray) -> list[bytes]:
    """The 16-byte key digest of each (non-null) key."""
    return [hashlib.sha256(k.encode()).digest()[:16] for k in keys.to_pylist()]


def rows_for(view: str, rows: pa.Table, rule: rules.NearDupRule) -> Writes:
    """The index rows of ``rows`` (a table's key columns) for ``view``."""
    if view == "clips":
        return [("INSERT OR IGNORE INTO clips VALUES (?)", _singles(rows["clip_id"]))]
    if view == "latents":
        key = latent_key(
            rows["clip_id"], rows["rung"], rows["tokenizer_version"], rows["member_sha256"]
        )
        return [("INSERT OR IGNORE INTO latents VALUES (?)", _singles(key))]
    if view == "near_dup_events":
        links = rows.filter(pc.equal(rows["event"], "near_duplicate"))
        pairs = _pairs(links["asset_id"].to_pylist(), links["related_asset_id"].to_pylist())
        return [("INSERT OR IGNORE INTO edges VALUES (?, ?, 'e')", pairs)]
    return _asset_rows(rows, rule)


def _singles(keys: pa.Array | pa.ChunkedArray) -> list[tuple[bytes]]:
    """One-column rows of key digests, sorted (B-tree inserts in key order)."""
    return [(d,) for d in sorted(digests(keys))]


def _pairs(a: list[Any], b: list[Any]) -> Iterator[tuple[str, str]]:
    """Both directions of every link whose ends are both named."""
    for x, y in zip(a, b, strict=True):
        if x is not None and y is not None and x != y:
            yield x, y
            yield y, x


def _asset_rows(rows: pa.Table, rule: rules.NearDupRule) -> Writes:
    """Assets: the key row, the link edges and the band keys of each asset."""
    ids = rows["asset_id"].to_pylist()
    frames, lengths = rules.fingerprint_matrix(rows["fingerprint"], rule.window)
    packed = [frames[i, : lengths[i]].astype(">u8").tobytes() for i in range(len(ids))]
    rate = rules.bitrates(rows).tolist()
    splits = rows["split"].to_pylist()
    keys = digests(rows["asset_id"])
    keyed = sorted(zip(keys, ids, splits, rate, packed, strict=True))
    near = rows["near_duplicates"]
    owner = to_numpy(pc.list_parent_indices(near)).astype(np.int64)
    others = pc.list_flatten(near).to_pylist()
    dup_of = rows["duplicate_of"].to_pylist()
    edge_a = [ids[i] for i in owner.tolist()] + ids
    edge_b = others + dup_of
    row, slot, value = rules.band_keys(frames, lengths, rule)
    bands = zip(slot.tolist(), value.tolist(), [keys[i] for i in row.tolist()], strict=True)
    return [
        ("INSERT OR IGNORE INTO assets VALUES (?, ?, ?, ?, ?)", keyed),
        ("INSERT OR IGNORE INTO edges VALUES (?, ?, 'a')", _pairs(edge_a, edge_b)),
        ("INSERT OR IGNORE INTO bands VALUES (?, ?, ?)", sorted(bands)),
    ]
