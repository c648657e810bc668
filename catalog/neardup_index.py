"""The key index's near-duplicate search keys, compact and probed a batch at a time.

Every fingerprint's search keys (:func:`catalog.rules.band_keys`: for the default rule
75 pair keys, each two positions' bands) are kept in the key index file
(:mod:`catalog.key_index`) as ``nd_keys`` rows of two 8-byte blobs:

``code``  a 64-bit hash of the key's (slot, value), big-endian
``id``    the first 8 bytes of the asset's key digest (its id's bytes)

16 bytes of content a key, where the (slot, value, 32-byte digest) rows they replace
took ~40: a batch's inserts dirty fewer pages, and the table's pages are fewer to cache.
A hash collision of either column can only add a candidate; every candidate is read
back in full (all assets whose digest starts with ``id``) and verified with the rule
on its stored frames, so the answer stays exact. A batch is probed in one statement
over one packed blob of codes (:data:`catalog.key_index_rows.SERIES`) and inserted in
one more, with no Python object per key; the answer is the few (batch row, id) pairs
that share a key, which the pair keys keep near zero for unrelated assets however
many the catalog holds (docs/decisions/037-pair-keys.md).
"""

from __future__ import annotations

import sqlite3

import numpy as np
from numpy.typing import NDArray

from catalog import rules

__all__ = ["CLEAR", "INSERT", "SCHEMA", "candidates", "key_rows"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS nd_keys (
    code BLOB NOT NULL, id BLOB NOT NULL, PRIMARY KEY (code, id)
) WITHOUT ROWID;
DROP TABLE IF EXISTS bands;
"""
#: Empties the keys (with the ``assets`` view they belong to).
CLEAR = "DELETE FROM nd_keys"
#: Bytes of an asset id's digest kept per key.
ID_BYTES = 8

#: A packed statement over ``?1`` (the blob), ``?2`` (rows) and ``?3`` (bytes a row).
_SERIES = "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i + 1 < ?2) "
INSERT = (
    f"{_SERIES}INSERT OR IGNORE INTO nd_keys"
    " SELECT substr(?1, i * ?3 + 1, 8), substr(?1, i * ?3 + 9, 8) FROM s"
)
_PROBE = f"{_SERIES}SELECT s.i, n.id FROM s JOIN nd_keys n ON n.code = substr(?1, s.i * ?3 + 1, ?3)"
#: Keys per packed statement (a 16 MB blob at most).
_PART = 1 << 20


def _codes(
    frames: NDArray[np.uint64], lengths: NDArray[np.int64], rule: rules.NearDupRule
) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
    """(batch row, 64-bit code) of every search key, in code order."""
    row, slot, value = rules.band_keys(frames, lengths, rule)
    code = rules.key_codes(slot, value)
    order = np.argsort(code, kind="stable")
    return row[order], code[order]


def key_rows(
    frames: NDArray[np.uint64],
    lengths: NDArray[np.int64],
    keys: list[bytes],
    rule: rules.NearDupRule,
) -> list[tuple[bytes, NDArray[np.int64], int]]:
    """The ``nd_keys`` rows of assets (frames, lengths and key digests, each at least
    :data:`ID_BYTES` long), packed for :data:`INSERT` in key order: ``(blob, the asset
    of each row, bytes a row)`` parts."""
    row, code = _codes(frames, lengths, rule)
    if len(row) == 0:
        return []
    ids = np.frombuffer(b"".join(k[:ID_BYTES] for k in keys), f"S{ID_BYTES}")
    packed = np.empty(len(row), dtype=[("code", ">u8"), ("id", "S8")])
    packed["code"], packed["id"] = code, ids[row]
    blob = packed.tobytes()
    width = packed.dtype.itemsize
    return [
        (blob[start * width : (start + _PART) * width], row[start : start + _PART], width)
        for start in range(0, len(row), _PART)
    ]


def candidates(
    conn: sqlite3.Connection,
    frames: NDArray[np.uint64],
    lengths: NDArray[np.int64],
    rule: rules.NearDupRule,
) -> tuple[NDArray[np.int64], list[str]]:
    """(batch row, asset id) pairs sharing a search key, without repeats: the
    (batch row, id prefix) hits of one probe, then every asset with each prefix."""
    row, code = _codes(frames, lengths, rule)
    blob = code.astype(">u8").tobytes()
    hits: set[tuple[int, bytes]] = set()
    for start in range(0, len(row), _PART):
        part = blob[start * 8 : (start + _PART) * 8]
        found = conn.execute(_PROBE, (part, min(_PART, len(row) - start), 8))
        hits.update((int(row[start + i]), bytes(ident)) for i, ident in found)
    owners = {p: _assets_with_prefix(conn, p) for p in sorted({p for _, p in hits})}
    pairs = sorted({(r, a) for r, p in hits for a in owners[p]})
    return np.array([r for r, _ in pairs], dtype=np.int64), [a for _, a in pairs]


def _assets_with_prefix(conn: sqlite3.Connection, prefix: bytes) -> list[str]:
    """The ids of the assets whose key digest starts with ``prefix`` (a digest is at
    most 32 bytes, so ``prefix + ff…`` bounds them all)."""
    query = "SELECT asset_id FROM assets WHERE k BETWEEN ? AND ?"
    return [a for (a,) in conn.execute(query, (prefix, prefix + b"\xff" * 32))]
