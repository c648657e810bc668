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

A key digest is the key itself for the tables' hex ids (asset ids: 64 digits, clip ids:
32; their bytes, half the size of the text, exact), and the first 20 bytes of the
SHA-256 of any other key's UTF-8 text (latent keys): at 10^10 keys the chance of any
collision is about 10^-28. The lengths differ, so the two kinds never meet.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from catalog import rules
from catalog.keycache import combined, latent_key, to_numpy

__all__ = ["SCHEMA", "Writes", "digests", "rows_for"]

_HEX_ID = re.compile(r"[0-9a-f]{32}|[0-9a-f]{64}")
_HEX_NIBBLE = np.full(256, 255, dtype=np.uint8)
_HEX_NIBBLE[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16, dtype=np.uint8)

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
    """The key digest of each (non-null) key: its bytes for a lowercase hex id of 32
    or 64 digits (vectorised), else the first 20 bytes of its SHA-256."""
    arr = combined(keys).cast(pa.large_string())
    n = len(arr)
    if n == 0:
        return []
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
    width = int(offsets[1] - offsets[0])
    if arr.null_count == 0 and width in (32, 64) and (np.diff(offsets) == width).all():
        data = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
        nibbles = _HEX_NIBBLE[data.reshape(n, width)]
        if (nibbles != 255).all():
            raw = ((nibbles[:, 0::2] << 4) | nibbles[:, 1::2]).tobytes()
            w = width // 2
            return [raw[i * w : (i + 1) * w] for i in range(n)]
    return [_digest(k) for k in arr.to_pylist()]


def _digest(key: str) -> bytes:
    if _HEX_ID.fullmatch(key):
        return bytes.fromhex(key)
    return hashlib.sha256(key.encode()).digest()[:20]


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
