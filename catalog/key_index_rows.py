"""What the on-disk key index (:mod:`catalog.key_index`) stores of each table's rows.

Pure conversions from Arrow rows (as scanned from Iceberg or as just committed) to the
rows of the index's SQLite tables, and the index's schema:

============ =================================================================
``assets``   key digest, ``asset_id``, ``split``, bitrate, leading fingerprint frames
``clips``    key digest of ``clip_id``, and of (asset prefix, ``clip_id``) for the
             duplicate check (in run files, :mod:`catalog.key_runs`)
``latents``  key digest of (clip, rung, tokenizer, member SHA-256) (run files too)
``edges``    recorded near-duplicate links, both directions, by source (``a``: the
             assets' ``near_duplicates``/``duplicate_of``; ``e``: link events)
``nd_keys``  the near-duplicate search keys of every asset, compact
             (:mod:`catalog.neardup_index`)
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
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from catalog import neardup_index, rules
from catalog.keycache import combined, latent_key, to_numpy

__all__ = [
    "ASSET_PREFIX",
    "SCHEMA",
    "SERIES",
    "Packed",
    "Writes",
    "asset_clip_digests",
    "asset_prefixes",
    "digests",
    "heads",
    "merge_sorted",
    "packed_digests",
    "rows_for",
    "view_groups",
    "view_keys",
]

_HEX_ID = re.compile(r"[0-9a-f]{32}|[0-9a-f]{64}")
_HEX_NIBBLE = np.full(256, 255, dtype=np.uint8)
_HEX_NIBBLE[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16, dtype=np.uint8)
#: A byte value per pair of lowercase hex digits (read as one little-endian ``uint16``),
#: 256 for any other pair: one 128 KiB table look-up per output byte, ~3x faster than
#: a look-up per digit and the shifts.
_HEX_PAIR = np.full(1 << 16, 256, dtype=np.uint16)
_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8).astype(np.uint16)
_HEX_PAIR[(_DIGITS[:, None] | (_DIGITS[None, :] << 8)).ravel()] = np.arange(256, dtype=np.uint16)

#: The row numbers ``i`` = 0 .. ``?2`` - 1 of a packed key list (:class:`Packed`): one
#: statement reads every key of a batch as ``substr(?1, i * ?3 + 1, ?3)``, with no
#: Python object, parameter list or statement text per key.
SERIES = "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i + 1 < ?2) "


#: Keys per packed statement: 1M keys are 16-32 MB of blob, far below SQLite's 1 GB
#: bound on a value (a batch may hold 50M cells).
PART_KEYS = 1 << 20


@dataclass(frozen=True)
class Packed:
    """Key digests of one width, back to back, and the batch row of each.

    Attributes:
        width: Bytes per digest.
        data: ``len(rows) * width`` bytes, key ``j`` at ``data[j * width:]``.
        rows: The batch row each digest belongs to.
    """

    width: int
    data: bytes
    rows: NDArray[np.int64]

    @property
    def params(self) -> tuple[bytes, int, int]:
        """``?1``, ``?2``, ``?3`` of a :data:`SERIES` statement."""
        return self.data, len(self.rows), self.width

    def sorted(self) -> Packed:
        """The same keys in the order of their first eight bytes (:func:`heads`):
        what a probe of the sorted runs and the in-memory searches want (needles in
        order: each search starts near the last one, ~5x faster than random)."""
        head = heads(np.frombuffer(self.data, np.uint8).reshape(-1, self.width))
        if len(head) < 2 or (head[1:] >= head[:-1]).all():
            return self
        order = np.argsort(head)
        flat = np.frombuffer(self.data, dtype=f"V{self.width}")
        return Packed(self.width, flat[order].tobytes(), self.rows[order])

    def parts(self) -> list[Packed]:
        """This group in parts of at most :data:`PART_KEYS` keys (SQLite bounds a
        blob's size)."""
        w, size = self.width, PART_KEYS
        return [
            Packed(w, self.data[j * w : (j + size) * w], self.rows[j : j + size])
            for j in range(0, len(self.rows), size)
        ]

    def take(self, picks: NDArray[np.int64]) -> Packed:
        """The keys at positions ``picks`` of this group."""
        flat = np.frombuffer(self.data, dtype=f"V{self.width}")
        return Packed(self.width, flat[picks].tobytes(), self.rows[picks])


#: (SQL statement, parameter rows) pairs run with ``executemany``, or (a
#: :data:`SERIES` statement, packed keys) pairs run once, in one transaction.
Writes: TypeAlias = list[tuple[str, Iterable[tuple[Any, ...]] | Packed]]

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    view TEXT PRIMARY KEY, table_uuid TEXT NOT NULL, snapshot_id INTEGER, rule TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS assets (
    k BLOB PRIMARY KEY, asset_id TEXT NOT NULL, split TEXT, bitrate REAL, frames BLOB
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS assets_split ON assets (k, split);
CREATE TABLE IF NOT EXISTS edges (
    a TEXT NOT NULL, b TEXT NOT NULL, src TEXT NOT NULL, PRIMARY KEY (a, b, src)
) WITHOUT ROWID;
"""
SCHEMA += neardup_index.SCHEMA

#: The statements that empty one view before a rebuild.
CLEAR: dict[str, tuple[str, ...]] = {
    "assets": ("DELETE FROM assets", neardup_index.CLEAR, "DELETE FROM edges WHERE src = 'a'"),
    "clips": (),  # run files (catalog.key_runs): cleared by the index itself
    "latents": (),
    "near_dup_events": ("DELETE FROM edges WHERE src = 'e'",),
}


def heads(keys: NDArray[np.uint8]) -> NDArray[np.uint64]:
    """The first eight bytes of each digest (one a row) as a big-endian integer: their
    order is the digests' byte order (ties: equal heads)."""
    return np.ascontiguousarray(keys[:, :8]).view(">u8").ravel().astype(np.uint64)


def merge_sorted(
    older: tuple[NDArray[np.uint64], NDArray[np.uint8]],
    newer: tuple[NDArray[np.uint64], NDArray[np.uint8]],
) -> tuple[NDArray[np.uint64], NDArray[np.uint8]]:
    """Two runs of digests (``heads``, digests one a row), each sorted by its heads, as
    one; among equal heads the older run's digests come first. The heads are not
    re-derived and a digest moves as one ``V<width>`` item: ~3x less CPU than sorting
    the rows' concatenation (the stable sort finds the two runs and merges them)."""
    head = np.concatenate([older[0], newer[0]])
    order = np.argsort(head, kind="stable")
    width = older[1].shape[1]
    rows = np.concatenate([older[1], newer[1]]).view(f"V{width}").ravel()[order]
    return head[order], rows.view(np.uint8).reshape(-1, width)


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


def packed_digests(keys: pa.Array | pa.ChunkedArray) -> list[Packed]:
    """The key digests of the non-null keys, as :func:`digests` makes them, packed by
    width (usually one group: a column of hex ids). Vectorised but for the SHA-256 of
    keys that are not hex ids (one ``hashlib`` call each, over the Arrow buffer)."""
    arr = combined(keys).cast(pa.large_string())
    n = len(arr)
    if n == 0:
        return []
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
    buffer = arr.buffers()[2]
    data = np.frombuffer(buffer, dtype=np.uint8) if buffer is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    valid = np.ones(n, dtype=np.bool_) if arr.null_count == 0 else to_numpy(pc.is_valid(arr))
    hashed = valid.copy()
    groups: list[Packed] = []
    for width in (32, 64):
        rows = np.flatnonzero(valid & (lengths == width))
        if len(rows) == 0:
            continue
        if len(rows) == n and offsets[-1] - offsets[0] == n * width:
            text = data[offsets[0] : offsets[-1]].reshape(n, width)  # contiguous: no copy
        else:
            text = data[offsets[rows][:, None] + np.arange(width)]
        raw, hexed = _unhex(text)
        if len(raw):
            groups.append(Packed(width // 2, raw.tobytes(), rows[hexed].astype(np.int64)))
            hashed[rows[hexed]] = False
    rows = np.flatnonzero(hashed)
    if len(rows):
        utf8 = memoryview(buffer if buffer is not None else b"")  # slices copy nothing
        starts, ends = offsets[rows].tolist(), offsets[rows + 1].tolist()
        sha = hashlib.sha256
        out = b"".join([sha(utf8[a:b]).digest()[:20] for a, b in zip(starts, ends, strict=True)])
        groups.append(Packed(20, out, rows.astype(np.int64)))
    return groups


def _unhex(text: NDArray[np.uint8]) -> tuple[NDArray[np.uint8], NDArray[np.bool_]]:
    """The bytes of each row of ``text`` (hex digits, an even number a row) that is a
    lowercase hex string, and which rows those are."""
    pairs = _HEX_PAIR[np.ascontiguousarray(text).view("<u2")]
    if pairs.max(initial=0) < 256:  # the usual column: every row a hex id
        return pairs.astype(np.uint8), np.ones(len(text), np.bool_)
    hexed = (pairs < 256).all(axis=1)
    return pairs[hexed].astype(np.uint8), hexed


def _digest(key: str) -> bytes:
    if _HEX_ID.fullmatch(key):
        return bytes.fromhex(key)
    return hashlib.sha256(key.encode()).digest()[:20]


#: Bytes that stand for a clip's asset at the head of its asset-keyed digest: with 2
#: bytes of the clip's own digest they make the 8-byte head a probe searches on, so
#: one asset's many clips rarely share a head.
ASSET_PREFIX = 6


def asset_prefixes(
    asset_ids: pa.Array | pa.ChunkedArray,
) -> tuple[NDArray[np.uint8], NDArray[np.bool_]]:
    """:data:`ASSET_PREFIX` bytes per asset id (one a row), and which rows have an
    id: the bytes of its first 12 digits when they are lowercase hex (every hex id's:
    no need to decode the other 52), else the first bytes of its SHA-256."""
    arr = combined(asset_ids).cast(pa.large_string())
    n, digits = len(arr), 2 * ASSET_PREFIX
    out = np.zeros((n, ASSET_PREFIX), np.uint8)
    valid = np.ones(n, np.bool_) if arr.null_count == 0 else to_numpy(pc.is_valid(arr))
    if n == 0:
        return out, valid
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
    buffer = arr.buffers()[2]
    data = np.frombuffer(buffer, np.uint8) if buffer is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    rows = np.flatnonzero(valid & (lengths >= digits))
    if len(rows) == n and (lengths == lengths[0]).all():  # one width: a strided view
        text = data[offsets[0] : offsets[-1]].reshape(n, -1)[:, :digits]
    else:
        text = data[offsets[rows][:, None] + np.arange(digits)]
    pairs = _HEX_PAIR[np.ascontiguousarray(text).view("<u2")]
    if len(rows) == n and pairs.max(initial=0) < 256:  # the usual batch: all hex ids
        return pairs.astype(np.uint8), valid
    hexed = (pairs < 256).all(axis=1)
    out[rows[hexed]] = pairs[hexed].astype(np.uint8)
    todo = valid.copy()
    todo[rows[hexed]] = False
    rest = np.flatnonzero(todo)
    utf8 = memoryview(buffer if buffer is not None else b"")
    for row in rest.tolist():
        digest = hashlib.sha256(utf8[offsets[row] : offsets[row + 1]]).digest()
        out[row] = np.frombuffer(digest[:ASSET_PREFIX], np.uint8)
    return out, valid


def asset_clip_digests(
    asset_ids: pa.Array | pa.ChunkedArray,
    clip_ids: pa.Array | pa.ChunkedArray,
    own: list[Packed] | None = None,
) -> list[Packed]:
    """The asset-keyed digest of each clip: its asset's prefix
    (:func:`asset_prefixes`), then its own digest (22 bytes for a hex clip id; 26 or
    38 for others: never a width of a clip id's own digest, 16, 20 or 32). A batch's
    clips of one asset sort next to each other and to that asset's stored clips, so a
    duplicate check reads about one run block per asset, not one per clip. Exact for
    duplicates because a clip id is derived from its asset (:func:`catalog.rules.
    clip_id`, checked on every ingest): one id never names clips of two assets. Rows
    whose asset or clip id is null have none. ``own``: the clip ids'
    :func:`packed_digests`, when the caller has them."""
    prefix, has_asset = asset_prefixes(asset_ids)
    out = []
    for group in packed_digests(clip_ids) if own is None else own:
        keep = np.flatnonzero(has_asset[group.rows])
        if len(keep) == 0:
            continue
        keys = np.frombuffer(group.data, np.uint8).reshape(-1, group.width)[keep]
        rows = group.rows[keep]
        data = np.concatenate([prefix[rows], keys], axis=1)
        out.append(Packed(ASSET_PREFIX + group.width, data.tobytes(), rows))
    return out


def view_groups(view: str, rows: pa.Table) -> tuple[list[Packed], list[Packed]]:
    """The digests of ``rows`` in a keyed view, and (``clips``) their asset-keyed
    digests (:func:`asset_clip_digests`; none for other views)."""
    own = packed_digests(view_keys(view, rows))
    if view != "clips":
        return own, []
    return own, asset_clip_digests(rows["asset_id"], rows["clip_id"], own)


def view_keys(view: str, rows: pa.Table) -> pa.Array | pa.ChunkedArray:
    """The keys of ``rows`` in a keyed view (``assets``, ``clips``, ``latents``)."""
    if view == "latents":
        return latent_key(
            rows["clip_id"], rows["rung"], rows["tokenizer_version"], rows["member_sha256"]
        )
    return rows["asset_id" if view == "assets" else "clip_id"]


def rows_for(view: str, rows: pa.Table, rule: rules.NearDupRule) -> Writes:
    """The SQLite rows of ``rows`` (a table's key columns) for ``view`` (``assets``,
    ``near_dup_events``; the ``clips`` and ``latents`` keys are run files,
    :mod:`catalog.key_runs`)."""
    if view == "near_dup_events":
        links = rows.filter(pc.equal(rows["event"], "near_duplicate"))
        pairs = _pairs(links["asset_id"].to_pylist(), links["related_asset_id"].to_pylist())
        return [("INSERT OR IGNORE INTO edges VALUES (?, ?, 'e')", pairs)]
    return _asset_rows(rows, rule)


def _pairs(a: list[Any], b: list[Any]) -> Iterator[tuple[str, str]]:
    """Both directions of every link whose ends are both named."""
    for x, y in zip(a, b, strict=True):
        if x is not None and y is not None and x != y:
            yield x, y
            yield y, x


def _asset_rows(rows: pa.Table, rule: rules.NearDupRule) -> Writes:
    """Assets: the key row, the link edges and the near-duplicate keys of each asset."""
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
    near_keys = neardup_index.key_rows(frames, lengths, keys, rule)
    return [
        ("INSERT OR IGNORE INTO assets VALUES (?, ?, ?, ?, ?)", keyed),
        ("INSERT OR IGNORE INTO edges VALUES (?, ?, 'a')", _pairs(edge_a, edge_b)),
        *((neardup_index.INSERT, Packed(w, blob, rows)) for blob, rows, w in near_keys),
    ]
